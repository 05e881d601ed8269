#include "runtime/metrics.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dsec::metrics {

void Histogram::Observe(double seconds) {
  if (!(seconds >= 0)) seconds = 0;  // NaN too
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  char le[32];
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    if (i < kBounds.size()) std::snprintf(le, sizeof le, "%g", kBounds[i]);
    Line(out, name + "_bucket", labels + sep + "le=\"" + (i < kBounds.size() ? le : "+Inf") + "\"",
         static_cast<double>(cumulative));
  }
  Line(out, name + "_sum", labels, static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9);
  Line(out, name + "_count", labels, static_cast<double>(cumulative));
}

std::string Labels(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string out;
  for (const auto& [k, v] : kv) {
    if (!out.empty()) out += ',';
    out += k + "=\"";
    for (char c : v) {
      if (c == '\\' || c == '"') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    out += '"';
  }
  return out;
}

Family<Counter>& SandboxesCreated() {
  static auto* f = new Family<Counter>;
  return *f;
}
Family<Counter>& SandboxCreateFailures() {
  static auto* f = new Family<Counter>;
  return *f;
}
Family<Counter>& NetworkRefusals() {
  static auto* f = new Family<Counter>;
  return *f;
}
Family<Counter>& DnsAnswers() {
  static auto* f = new Family<Counter>;
  return *f;
}
Family<Counter>& Flags() {
  static auto* f = new Family<Counter>;
  return *f;
}
Family<Counter>& Grades() {
  static auto* f = new Family<Counter>;
  return *f;
}

Family<Counter>& E2bRequests() {
  static auto* f = new Family<Counter>;
  return *f;
}
Family<Counter>& ImageChunks() {
  static auto* f = new Family<Counter>;
  return *f;
}
Family<Counter>& ImageBytes() {
  static auto* f = new Family<Counter>;
  return *f;
}
void CountImageChunks(const char* event, uint64_t n) { ImageChunks().At(Labels({{"event", event}})).Add(n); }
std::map<std::string, CallCounts> E2bCalls() {
  std::map<std::string, CallCounts> out;
  auto value = [](const std::string& labels, const std::string& key) {
    size_t at = labels.find(key + "=\"");
    if (at == std::string::npos) return std::string();
    at += key.size() + 2;
    return labels.substr(at, labels.find('"', at) - at);
  };
  E2bRequests().ForEach([&](const std::string& l, const Counter& c) {
    auto& n = out[value(l, "call")];
    uint64_t v = c.value.load();
    std::string code = value(l, "code");
    n.answered += v;
    if (!code.empty() && code[0] == '4') n.client_errors += v;
    if (!code.empty() && code[0] == '5') n.server_errors += v;
  });
  return out;
}

Family<Gauge>& Sandboxes() {
  static auto* f = new Family<Gauge>;
  return *f;
}
Family<Histogram>& ExecSeconds() {
  static auto* f = new Family<Histogram>;
  return *f;
}
Histogram& StepSeconds() {
  static auto* h = new Histogram;
  return *h;
}
Histogram& PlacementSeconds() {
  static auto* h = new Histogram;
  return *h;
}

PhaseGauge::~PhaseGauge() {
  if (at_) at_->Add(-1);
}

void PhaseGauge::Set(const std::string& kind, const std::string& phase) {
  Gauge* next = &Sandboxes().At(Labels({{"kind", kind}, {"phase", phase}}));
  if (next == at_) return;
  next->Add(1);
  if (at_) at_->Add(-1);
  at_ = next;
}

HostFigures ReadHostFigures() {
  HostFigures h;
  std::ifstream mem("/proc/meminfo");
  for (std::string key; mem >> key;) {
    uint64_t kib = 0;
    mem >> kib;
    if (key == "MemTotal:") h.memory_total = kib * 1024;
    if (key == "MemAvailable:") h.memory_available = kib * 1024;
    mem.ignore(64, '\n');
  }
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  h.cpus = n > 0 ? static_cast<uint32_t>(n) : 0;
  std::ifstream("/proc/loadavg") >> h.load1;
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::ifstream stat("/proc/stat");
  std::string cpu;
  if (stat >> cpu && cpu == "cpu") {
    uint64_t v[8] = {};  // user nice system idle iowait irq softirq steal
    for (auto& x : v) stat >> x;
    h.cpu_idle_s = static_cast<double>(v[3] + v[4]) / hz;
    h.cpu_busy_s = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz;
  }
  // /proc/self/stat: after the command's closing paren, field 14 (utime)
  // and 15 (stime) are the 12th and 13th; 24 (rss, pages) the 22nd.
  std::ifstream self("/proc/self/stat");
  std::string line;
  std::getline(self, line);
  size_t paren = line.rfind(')');
  if (paren != std::string::npos) {
    std::istringstream rest(line.substr(paren + 2));
    std::string field;
    for (int i = 3; rest >> field; ++i) {
      if (i == 14) h.process_cpu_s += std::strtod(field.c_str(), nullptr) / hz;
      if (i == 15) h.process_cpu_s += std::strtod(field.c_str(), nullptr) / hz;
      if (i == 24) {
        h.process_rss = std::strtoull(field.c_str(), nullptr, 10) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
        break;
      }
    }
  }
  return h;
}

void Line(std::string* out, const std::string& name, const std::string& labels, double value) {
  char v[48];
  std::snprintf(v, sizeof v, "%.17g", value);
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += ' ';
  *out += v;
  *out += '\n';
}

void Describe(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

std::string Render() {
  std::string out;
  Describe(&out, "dsec_sandboxes_created_total", "counter", "Sandboxes created (running), by kind.");
  SandboxesCreated().ForEach(
      [&](const std::string& l, const Counter& c) { Line(&out, "dsec_sandboxes_created_total", l, c.value.load()); });
  Describe(&out, "dsec_sandbox_create_failures_total", "counter", "Sandbox creations that failed, by kind.");
  SandboxCreateFailures().ForEach([&](const std::string& l, const Counter& c) {
    Line(&out, "dsec_sandbox_create_failures_total", l, c.value.load());
  });
  Describe(&out, "dsec_sandboxes", "gauge", "Live sandboxes on this node, by kind and phase.");
  Sandboxes().ForEach([&](const std::string& l, const Gauge& g) { Line(&out, "dsec_sandboxes", l, g.value.load()); });
  Describe(&out, "dsec_exec_seconds", "histogram",
           "Exec latency in a sandbox and one-shot runs, from the request to the result, by kind.");
  ExecSeconds().ForEach([&](const std::string& l, const Histogram& h) { h.Render("dsec_exec_seconds", l, &out); });
  Describe(&out, "dsec_step_seconds", "histogram", "Session step latency, until the step is durable.");
  StepSeconds().Render("dsec_step_seconds", "", &out);
  Describe(&out, "dsec_placement_seconds", "histogram",
           "Placement latency: from a creation request to the choice of its node and kind.");
  PlacementSeconds().Render("dsec_placement_seconds", "", &out);
  Describe(&out, "dsec_network_refusals_total", "counter",
           "Sandboxes' refusals: unlisted names (each), refused packets (those logged: at most 10 a second per "
           "sandbox).");
  NetworkRefusals().ForEach(
      [&](const std::string& l, const Counter& c) { Line(&out, "dsec_network_refusals_total", l, c.value.load()); });
  Describe(&out, "dsec_dns_answers_total", "counter", "The sandboxes' resolver's answers, by kind.");
  DnsAnswers().ForEach(
      [&](const std::string& l, const Counter& c) { Line(&out, "dsec_dns_answers_total", l, c.value.load()); });
  Describe(&out, "dsec_flags_total", "counter",
           "Misbehaviour flags logged with session steps (the task guard's, the network policy's), by what.");
  Flags().ForEach([&](const std::string& l, const Counter& c) { Line(&out, "dsec_flags_total", l, c.value.load()); });
  Describe(&out, "dsec_grades_total", "counter", "Session grades logged, by how the grader ended.");
  Grades().ForEach([&](const std::string& l, const Counter& c) { Line(&out, "dsec_grades_total", l, c.value.load()); });
  Describe(&out, "dsec_e2b_requests_total", "counter",
           "Requests the E2B door answered, by call (docs/running.md lists them) and HTTP status.");
  E2bRequests().ForEach(
      [&](const std::string& l, const Counter& c) { Line(&out, "dsec_e2b_requests_total", l, c.value.load()); });
  Describe(&out, "dsec_image_chunks_total", "counter",
           "Image chunks (docs/images.md) by event: a node's fetches, cache hits and misses, prefetches, digest "
           "failures, evictions, failed fetches; the image service's chunks served.");
  ImageChunks().ForEach(
      [&](const std::string& l, const Counter& c) { Line(&out, "dsec_image_chunks_total", l, c.value.load()); });
  Describe(&out, "dsec_image_bytes_total", "counter", "Bytes of image chunks a node fetched, the image service served.");
  ImageBytes().ForEach(
      [&](const std::string& l, const Counter& c) { Line(&out, "dsec_image_bytes_total", l, c.value.load()); });
  HostFigures h = ReadHostFigures();
  Describe(&out, "dsec_node_memory_bytes", "gauge", "The host's memory: total and available.");
  Line(&out, "dsec_node_memory_bytes", "state=\"total\"", static_cast<double>(h.memory_total));
  Line(&out, "dsec_node_memory_bytes", "state=\"available\"", static_cast<double>(h.memory_available));
  Describe(&out, "dsec_node_cpus", "gauge", "The host's online CPUs.");
  Line(&out, "dsec_node_cpus", "", h.cpus);
  Describe(&out, "dsec_node_load1", "gauge", "The host's 1-minute load average.");
  Line(&out, "dsec_node_load1", "", h.load1);
  Describe(&out, "dsec_node_cpu_seconds_total", "counter", "CPU time of all the host's CPUs since boot, busy or idle.");
  Line(&out, "dsec_node_cpu_seconds_total", "mode=\"busy\"", h.cpu_busy_s);
  Line(&out, "dsec_node_cpu_seconds_total", "mode=\"idle\"", h.cpu_idle_s);
  Describe(&out, "dsec_process_cpu_seconds_total", "counter", "CPU time dsecd has used.");
  Line(&out, "dsec_process_cpu_seconds_total", "", h.process_cpu_s);
  Describe(&out, "dsec_process_resident_memory_bytes", "gauge", "dsecd's resident memory.");
  Line(&out, "dsec_process_resident_memory_bytes", "", static_cast<double>(h.process_rss));
  return out;
}

}  // namespace dsec::metrics
