// What dsecd counts for its /metrics endpoint, in Prometheus' text format
// (version 0.0.4): counters and histograms that any thread updates without
// a lock, gauges that live objects hold (a sandbox actor counts itself
// under its kind and phase while it lives), and the host's and process's
// memory and CPU read from /proc at a scrape. Process-wide: one dsecd per
// process. docs/running.md lists every metric.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dsec::metrics {

struct Counter {
  std::atomic<uint64_t> value{0};
  void Add(uint64_t n = 1) { value.fetch_add(n, std::memory_order_relaxed); }
};

struct Gauge {
  std::atomic<int64_t> value{0};
  void Add(int64_t n) { value.fetch_add(n, std::memory_order_relaxed); }
};

// Latencies, in seconds, in fixed buckets from 1 ms to 60 s.
class Histogram {
 public:
  static constexpr std::array<double, 16> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                     0.5,   1,      2.5,   5,    10,    20,   30,  60};
  void Observe(double seconds);
  // Appends `name`_bucket/_sum/_count lines, each with `labels` (`k="v",...`
  // or empty) and `le`.
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};  // the last: above every bound
  std::atomic<uint64_t> sum_ns_{0};
};

// One metric per label set (`kind="container"`), made on first use; the
// reference stays valid for the process's life.
template <class T>
class Family {
 public:
  T& At(const std::string& labels) {
    std::lock_guard<std::mutex> lk(mu_);
    auto& slot = items_[labels];
    if (!slot) slot = std::make_unique<T>();
    return *slot;
  }
  template <class Fn>
  void ForEach(Fn fn) const {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [labels, item] : items_) fn(labels, *item);
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<T>> items_;
};

// `k1="v1",k2="v2"`, the values escaped as the text format wants.
std::string Labels(const std::vector<std::pair<std::string, std::string>>& kv);

// ---- what dsec keeps ----------------------------------------------------------
Family<Counter>& SandboxesCreated();        // dsec_sandboxes_created_total{kind}
Family<Counter>& SandboxCreateFailures();   // dsec_sandbox_create_failures_total{kind}
Family<Gauge>& Sandboxes();                 // dsec_sandboxes{kind,phase}
Family<Histogram>& ExecSeconds();           // dsec_exec_seconds{kind}
Histogram& StepSeconds();                   // dsec_step_seconds
Histogram& PlacementSeconds();              // dsec_placement_seconds
Family<Counter>& NetworkRefusals();         // dsec_network_refusals_total{what}: "name", "packet" (logged ones)
Family<Counter>& DnsAnswers();              // dsec_dns_answers_total{answer}
Family<Counter>& Flags();                   // dsec_flags_total{what}: flags logged with session steps
Family<Counter>& Grades();                  // dsec_grades_total{outcome}: "passed", "failed", "time_limit", ...
Family<Counter>& E2bRequests();             // dsec_e2b_requests_total{call,code}: the E2B door's answers
// Images on demand (docs/images.md): chunks by event (a node's: fetched,
// fetched_again, cache_hit, cache_miss, prefetched, digest_failure,
// evicted, fetch_failure; the image service's: served) and their bytes
// (fetched, served).
Family<Counter>& ImageChunks();             // dsec_image_chunks_total{event}
Family<Counter>& ImageBytes();              // dsec_image_bytes_total{what}
void CountImageChunks(const char* event, uint64_t n = 1);

// E2bRequests() by call (the status page): answered, of which 4xx, 5xx.
struct CallCounts {
  uint64_t answered = 0, client_errors = 0, server_errors = 0;
};
std::map<std::string, CallCounts> E2bCalls();

// A sandbox's place in Sandboxes() while it lives: Set moves it, the
// destructor takes it out.
class PhaseGauge {
 public:
  PhaseGauge() = default;
  PhaseGauge(const PhaseGauge&) = delete;
  PhaseGauge& operator=(const PhaseGauge&) = delete;
  ~PhaseGauge();
  void Set(const std::string& kind, const std::string& phase);

 private:
  Gauge* at_ = nullptr;
};

// The host's memory and CPU, and this process's (from /proc).
struct HostFigures {
  uint64_t memory_total = 0, memory_available = 0;  // bytes
  uint32_t cpus = 0;
  double load1 = 0;
  double cpu_busy_s = 0, cpu_idle_s = 0;  // all CPUs since boot (idle includes iowait)
  double process_cpu_s = 0;
  uint64_t process_rss = 0;  // bytes
};
HostFigures ReadHostFigures();

// Everything above in the text format (HELP and TYPE lines included).
std::string Render();

// One sample line: `name{labels} value`.
void Line(std::string* out, const std::string& name, const std::string& labels, double value);
// HELP and TYPE lines of a metric.
void Describe(std::string* out, const std::string& name, const char* type, const char* help);

}  // namespace dsec::metrics
