// Cluster macro benchmark with real processes on this machine: sandbox
// creations through a controller with 1 and with 3 nodes, next to the same
// creations against one dsecd --role all (a controller with its node in
// the same process: no network hop), each set up fresh by the bench:
//
//   build/bin/cluster_bench [--kind fncall|container] [--creates 2000] [--concurrency 32] [--memory 10000]
//                           [--setups 0 1 3] [--tls]
//
// Prints, from this one run:
//   - creations/s (each create answered, then its sandbox destroyed after
//     the phase) for: role all, controller + 1 node, controller + 3 nodes;
//   - create latency p50/p99 one at a time (the controller's placement and
//     the hop to the node included);
//   - the controller's CPU per placement (its process's CPU over the phase,
//     divided by the creates);
//   - the controller's resident memory per 10 000 sandboxes in its
//     directory (--memory fncall sandboxes, which cost a node little).
// All processes share this machine's cores: 3 nodes do not add CPUs here,
// so the figure shows the controller's overhead, not a cluster's scaling.
#include <CLI/CLI.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dsec/client.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "perf/bench_util.hpp"
#include "runtime/files.hpp"

namespace {

using namespace dsec::bench;  // NOLINT: the benchmark helpers
using dsec::testing::TestDaemon;

std::unique_ptr<dsec::Client> Connect(const TestDaemon& d) {
  dsec::ClientOptions o;
  o.address = d.sdk_addr();
  o.data_dir = d.data_dir();
  auto c = dsec::Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "cluster_bench: %s\n", c.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*c);
}

double RssMiB(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1;
}

struct Setup {
  std::unique_ptr<TestDaemon> controller;  // null for role all
  std::vector<std::unique_ptr<TestDaemon>> nodes;
  std::unique_ptr<dsec::Client> client;
  int entry_pid = -1;
};

// A controller with `n` nodes (0: one dsecd --role all), the image built
// into each node when `rootfs` is given.
bool Start(int n, const std::string& rootfs, bool tls, Setup* s) {
  std::vector<std::string> more;
  if (tls) more.push_back("--tls");
  if (n == 0) {
    dsec::testing::TestDaemonOptions ao;
    ao.extra_args = more;
    auto d = TestDaemon::Start(ao);
    if (!d.ok()) return std::fprintf(stderr, "dsecd: %s\n", d.status().ToString().c_str()), false;
    s->nodes.push_back(std::move(*d));
  } else {
    dsec::testing::TestDaemonOptions co;
    co.role = "controller";
    co.extra_args = more;
    auto c = TestDaemon::Start(co);
    if (!c.ok()) return std::fprintf(stderr, "controller: %s\n", c.status().ToString().c_str()), false;
    s->controller = std::move(*c);
    for (int i = 0; i < n; ++i) {
      dsec::testing::TestDaemonOptions o;
      o.extra_args = {"--role", "node", "--join", s->controller->cluster_addr(), "--cluster-secret",
                      s->controller->data_dir() + "/cluster.secret", "--slots", "100000"};
      o.extra_args.insert(o.extra_args.end(), more.begin(), more.end());
      auto d = TestDaemon::Start(o);
      if (!d.ok()) return std::fprintf(stderr, "node: %s\n", d.status().ToString().c_str()), false;
      s->nodes.push_back(std::move(*d));
    }
  }
  if (!rootfs.empty())
    for (auto& d : s->nodes) {
      auto b = dsec::testing::RunProcess({dsec::testing::BinDir() + "/dsec-image", "--data-dir", d->data_dir(), "build",
                                          rootfs, "bench"});
      if (b.exit_code != 0) return std::fprintf(stderr, "dsec-image: %s\n", b.err.c_str()), false;
    }
  if (s->controller) {
    // Every node joined, with its image in a heartbeat.
    auto deadline = Clock::now() + std::chrono::seconds(30);
    for (;;) {
      int ready = 0;
      for (const auto& node : s->controller->Admin("nodes").value("nodes", nlohmann::json::array())) {
        bool image = rootfs.empty();
        for (const auto& i : node["load"].value("images", nlohmann::json::array()))
          image = image || i.get<std::string>().rfind("bench@", 0) == 0;
        ready += node.value("state", "") == "up" && image;
      }
      if (ready == n) break;
      if (Clock::now() > deadline) return std::fprintf(stderr, "the nodes did not join\n"), false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // another process's state
    }
  }
  const TestDaemon& entry = s->controller ? *s->controller : *s->nodes[0];
  s->entry_pid = entry.pid();
  s->client = Connect(entry);
  return s->client != nullptr;
}

// `count` creates, `conc` at a time (callback form); the sandboxes made.
std::vector<dsec::Sandbox> Creates(dsec::Client& c, const dsec::v1::SandboxSpec& spec, int count, int conc,
                                   int* failed, std::string* first_error) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<dsec::Sandbox> made;
  int issued = 0, answered = 0;
  std::function<void()> issue = [&] {
    c.CreateAsync(spec, dsec::CreateOptions{}, [&](dsec::Result<dsec::Sandbox> r) {
      std::lock_guard<std::mutex> lk(mu);
      ++answered;
      if (r.ok()) made.push_back(*r);
      else if (!(*failed)++) *first_error = r.status().ToString();
      if (issued < count) {
        ++issued;
        issue();
      }
      cv.notify_all();
    });
  };
  {
    std::lock_guard<std::mutex> lk(mu);
    for (; issued < std::min(conc, count);) {
      ++issued;
      issue();
    }
  }
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return answered == count; });
  return made;
}

void DestroyAll(const std::vector<dsec::Sandbox>& made) {
  std::vector<std::future<void>> f;
  std::atomic<size_t> next{0};
  std::vector<std::thread> t;
  for (int i = 0; i < 16; ++i)
    t.emplace_back([&] {
      for (size_t k; (k = next++) < made.size();) (void)made[k].Destroy();
    });
  for (auto& th : t) th.join();
}

}  // namespace

int main(int argc, char** argv) {
  std::string kind = "fncall";
  int creates = 2000, conc = 32, latency = 300, memory = 10000;
  bool tls = false;
  std::vector<int> setups{0, 1, 3};
  CLI::App app{"cluster_bench: creations through a controller with 1 and 3 nodes vs one dsecd --role all"};
  app.add_option("--kind", kind, "fncall or container")->check(CLI::IsMember({"fncall", "container"}))->capture_default_str();
  app.add_option("--creates", creates, "creates per setup")->capture_default_str();
  app.add_option("--concurrency", conc, "creates in flight")->capture_default_str();
  app.add_option("--latency", latency, "creates one at a time, for p50/p99")->capture_default_str();
  app.add_option("--memory", memory, "fncall sandboxes for the controller's memory figure (0: skip)")
      ->capture_default_str();
  app.add_option("--setups", setups, "which setups: 0 (dsecd --role all), 1 and 3 (a controller and that many nodes)")
      ->check(CLI::IsMember({0, 1, 3}))
      ->capture_default_str();
  app.add_flag("--tls", tls, "every dsecd with --tls (anonymous): trainers' and nodes' connections over TLS");
  CLI11_PARSE(app, argc, argv);

  std::string rootfs;
  dsec::v1::SandboxSpec spec = dsec::FncallSpec();
  if (kind == "container") {
    char tmpl[] = "/tmp/dsec-bench-rootfs-XXXXXX";
    if (!::mkdtemp(tmpl)) return 1;
    rootfs = tmpl;
    if (auto st = dsec::testing::MakeRootfs(rootfs); !st.ok()) {
      std::fprintf(stderr, "rootfs: %s\n", st.ToString().c_str());
      return 1;
    }
    spec = dsec::ContainerSpec("bench");
  }
  std::printf("cluster_bench: %s sandboxes, %d creates %d at a time, %d one at a time; all processes on this "
              "machine (%u CPUs)%s\n",
              kind.c_str(), creates, conc, latency, std::thread::hardware_concurrency(),
              tls ? "; every connection TLS (dsecd --tls)" : "");
  std::printf("%-22s %12s %10s %10s %16s\n", "setup", "creates/s", "p50 ms", "p99 ms", "entry CPU/create");
  int rc = 0;
  for (int n : setups) {
    Setup s;
    if (!Start(n, rootfs, tls, &s)) {
      rc = 1;
      break;
    }
    int failed = 0;
    std::string err;
    // Warm up (first connections to the nodes, pools).
    DestroyAll(Creates(*s.client, spec, std::min(64, creates), conc, &failed, &err));
    std::vector<double> lat;
    std::vector<dsec::Sandbox> one;
    for (int i = 0; i < latency; ++i) {
      auto t0 = Clock::now();
      auto sb = s.client->Create(spec);
      lat.push_back(Ms(t0, Clock::now()));
      if (sb.ok()) one.push_back(*sb);
      else if (!failed++) err = sb.status().ToString();
    }
    DestroyAll(one);
    double cpu0 = CpuSeconds(s.entry_pid);
    auto t0 = Clock::now();
    auto made = Creates(*s.client, spec, creates, conc, &failed, &err);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    double cpu = CpuSeconds(s.entry_pid) - cpu0;
    DestroyAll(made);
    auto p = Percentiles(lat);
    std::string name = n == 0 ? "dsecd --role all" : "controller + " + std::to_string(n) + " node" + (n > 1 ? "s" : "");
    std::printf("%-22s %12.0f %10.2f %10.2f %13.0f us%s\n", name.c_str(), made.size() / secs, p.p50, p.p99,
                cpu / creates * 1e6, n == 0 ? " (its controller and node)" : "");
    if (failed) std::printf("  %d creates failed, the first: %s\n", failed, err.c_str());
    if (n == 3 && memory > 0) {
      auto fn = dsec::FncallSpec();
      double before = RssMiB(s.entry_pid);
      auto many = Creates(*s.client, fn, memory, conc, &failed, &err);
      // The directory holds them once the creates are answered.
      double after = RssMiB(s.entry_pid);
      std::printf("controller memory: %.1f MiB resident before, %.1f MiB with %zu more sandboxes in its directory: "
                  "%.1f MiB per 10 000\n",
                  before, after, many.size(), (after - before) / (many.size() / 10000.0));
      DestroyAll(many);
    }
  }
  if (!rootfs.empty()) dsec::testing::RunProcess({"/bin/rm", "-rf", rootfs});
  return rc;
}
