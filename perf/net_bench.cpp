// Sandbox networking's costs, each next to its reference from the same run:
//
//   build/bin/net_bench [--creates 100] [--concurrency 8] [--rounds 2]
//
// It makes its own network namespaces (a "host" with a dsecd of its own and
// an "internet", 198.51.100.0/24, with a listener and a DNS server; no
// packet leaves them) and prints:
//   - container creations/s with network none and with an allow-list
//     (rounds alternate the two; the median round of each);
//   - connect latency from a container through its filter to an allowed
//     address, against a connect to its own loopback (mode none);
//   - policy update latency (SetNetwork through the SDK, replacing a list);
//   - the resolver's answer latency, asked from the container through glibc,
//     for a name the first time (through the upstream) and again (cached);
//   - a container flooding denied addresses: another container's connect
//     latency during the flood against before it, the refusals counted, and
//     dsecd's memory before and after.
// Needs root, ip(8), containers.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dsec/client.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "perf/bench_util.hpp"
#include "tests/support/dns_server.hpp"
#include "tests/support/netns.hpp"

namespace {

using dsec::bench::Clock;
using dsec::bench::Ms;
using dsec::bench::Percentiles;
using dsec::testing::Sh;

const std::string kPid = std::to_string(::getpid());
const std::string kHost = "dsb" + kPid + "h", kNet = "dsb" + kPid + "i";

double RssMiB(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1;
}

dsec::v1::SandboxSpec Spec(const std::string& image, std::vector<std::string> allow) {
  auto spec = dsec::ContainerSpec(image);
  if (!allow.empty()) {
    spec.mutable_network()->set_mode(dsec::v1::NETWORK_MODE_ALLOW);
    for (auto& a : allow) spec.mutable_network()->add_allow(a);
  }
  return spec;
}

// A python3 program's stdout, parsed as JSON (null on failure, said on stderr).
nlohmann::json Py(const dsec::Sandbox& sb, const std::string& program) {
  auto r = sb.Exec(dsec::Command({"python3", "-c", program}));
  if (!r.ok() || r->exit_code() != 0) {
    std::fprintf(stderr, "net_bench: python in %s: %s %s\n", sb.id().c_str(), r.ok() ? "" : r.status().ToString().c_str(),
                 r.ok() ? r->stderr().c_str() : "");
    return nullptr;
  }
  return nlohmann::json::parse(r->stdout(), nullptr, false);
}

// Connects to ip:port `n` times (each closed at once); p50 and p99 in ms.
std::string ConnectTimes(const std::string& ip, int port, int n) {
  return "import socket, time, json\n"
         "t = []\n"
         "for i in range(" + std::to_string(n) + "):\n"
         "  a = time.perf_counter(); s = socket.create_connection(('" + ip + "', " + std::to_string(port) + "), 3)\n"
         "  t.append((time.perf_counter() - a) * 1000); s.close()\n"
         "t.sort(); print(json.dumps([t[len(t)//2], t[len(t)*99//100]]))\n";
}

int Run(int creates, int conc, int rounds) {
  const std::string h = "ip -n " + kHost + " ", i = "ip -n " + kNet + " ";
  for (const auto& s : {"ip netns add " + kHost, "ip netns add " + kNet, h + "link set lo up",
                        h + "link add up0 type veth peer name eth0 netns " + kNet,
                        h + "addr add 198.51.100.1/24 dev up0", h + "link set up0 up",
                        i + "addr add 198.51.100.2/24 dev eth0", i + "addr add 198.51.100.3/24 dev eth0",
                        i + "link set eth0 up", i + "link set lo up"}) {
    std::string err;
    if (!Sh(s, &err)) return std::fprintf(stderr, "net_bench: %s: %s\n", s.c_str(), err.c_str()), 1;
  }
  // The internet's server: accepts and closes every connection.
  auto listener = dsec::testing::ListenIn(kNet, "198.51.100.2", 80);
  std::atomic<bool> stop{false};
  std::thread acceptor([&] {
    while (!stop) {
      pollfd p{listener.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) == 1) {
        int a = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (a >= 0) ::close(a);
      }
    }
  });
  struct Join {
    std::atomic<bool>* stop;
    std::thread* t;
    ~Join() {
      *stop = true;
      t->join();
    }
  } join{&stop, &acceptor};
  std::map<std::string, dsec::testing::DnsServer::Record> names;
  for (int n = 0; n < 200; ++n) names["n" + std::to_string(n) + ".pypi.test"] = {"198.51.100.2", 300};
  dsec::testing::DnsServer dns(kNet, "198.51.100.2", 53, names);
  // From here this process (and dsecd, and the SDK's threads) is in the
  // host namespace.
  int fd = ::open(("/run/netns/" + kHost).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) return std::perror("net_bench: setns"), 1;
  ::close(fd);
  dsec::testing::TestDaemonOptions o;
  o.network = true;
  o.extra_args = {"--sandbox-dns-upstream", "198.51.100.2:53"};
  auto d = dsec::testing::TestDaemon::Start(o);
  if (!d.ok()) return std::fprintf(stderr, "net_bench: dsecd: %s\n", d.status().ToString().c_str()), 1;
  char tmpl[] = "/tmp/dsec-net-bench-XXXXXX";
  if (!::mkdtemp(tmpl) || !dsec::testing::MakeRootfs(tmpl).ok()) return std::fprintf(stderr, "rootfs\n"), 1;
  auto built = dsec::testing::RunProcess({dsec::testing::BinDir() + "/dsec-image", "--data-dir", (*d)->data_dir(),
                                          "build", tmpl, "netbench"});
  dsec::testing::RunProcess({"/bin/rm", "-rf", tmpl});
  if (built.exit_code != 0) return std::fprintf(stderr, "dsec-image: %s\n", built.err.c_str()), 1;
  dsec::ClientOptions co;
  co.address = (*d)->sdk_addr();
  co.data_dir = (*d)->data_dir();
  auto client = dsec::Client::Connect(co);
  if (!client.ok()) return std::fprintf(stderr, "net_bench: %s\n", client.status().ToString().c_str()), 1;
  dsec::Client& c = **client;
  const std::string image = "netbench";

  // 1. Creations/s, none and allow, rounds alternating.
  std::map<std::string, std::vector<double>> rate;
  for (int r = 0; r < rounds; ++r)
    for (const char* mode : {"none", "allow"}) {
      auto spec = Spec(image, std::string(mode) == "allow" ? std::vector<std::string>{"198.51.100.2:80/tcp", "*.pypi.test:443"}
                                                           : std::vector<std::string>{});
      std::mutex mu;
      std::vector<dsec::Sandbox> made;
      std::atomic<int> next{0}, failed{0};
      auto t0 = Clock::now();
      std::vector<std::thread> ts;
      for (int t = 0; t < conc; ++t)
        ts.emplace_back([&] {
          while (next.fetch_add(1) < creates) {
            auto sb = c.Create(spec);
            if (!sb.ok()) {
              if (failed++ == 0) std::fprintf(stderr, "net_bench: create: %s\n", sb.status().ToString().c_str());
              continue;
            }
            std::lock_guard<std::mutex> lk(mu);
            made.push_back(*sb);
          }
        });
      for (auto& t : ts) t.join();
      rate[mode].push_back(creates / (Ms(t0, Clock::now()) / 1000));
      for (auto& sb : made) (void)sb.Destroy();
      if (failed) return 1;
    }
  auto median = [](std::vector<double> v) { return Percentiles(v).p50; };
  std::printf("# net_bench: %d creations per round at concurrency %d, %d rounds\n", creates, conc, rounds);
  std::printf("creations/s  none %.1f  allow %.1f  (allow/none %.2f)\n", median(rate["none"]), median(rate["allow"]),
              median(rate["allow"]) / median(rate["none"]));

  // 2. Connect latency: through the filter, against the container's own loopback.
  auto open = c.Create(Spec(image, {"198.51.100.2:80/tcp", "*.pypi.test:80/tcp"}));
  auto closed = c.Create(Spec(image, {}));
  if (!open.ok() || !closed.ok()) return std::fprintf(stderr, "net_bench: create\n"), 1;
  auto through = Py(*open, ConnectTimes("198.51.100.2", 80, 500));
  auto loop = Py(*closed, "import socket\nl = socket.socket(); l.bind(('127.0.0.1', 9000)); l.listen(1024)\n" +
                              ConnectTimes("127.0.0.1", 9000, 500));
  if (through.is_array() && loop.is_array())
    std::printf("connect ms     through the filter p50 %.3f p99 %.3f | own loopback (none) p50 %.3f p99 %.3f "
                "(ratio p50 %.2f)\n",
                through[0].get<double>(), through[1].get<double>(), loop[0].get<double>(), loop[1].get<double>(),
                through[0].get<double>() / loop[0].get<double>());

  // 3. Policy updates through the SDK.
  std::vector<double> upd;
  for (int n = 0; n < 200; ++n) {
    dsec::v1::NetworkPolicy p;
    p.set_mode(dsec::v1::NETWORK_MODE_ALLOW);
    p.add_allow(n % 2 ? "198.51.100.2:80/tcp" : "198.51.100.3:80/tcp");
    p.add_allow("*.pypi.test:80/tcp");
    auto t0 = Clock::now();
    auto rec = open->SetNetwork(p, dsec::v1::NETWORK_CHANGE_REPLACE);
    upd.push_back(Ms(t0, Clock::now()));
    if (!rec.ok()) return std::fprintf(stderr, "net_bench: %s\n", rec.status().ToString().c_str()), 1;
  }
  auto up = Percentiles(upd);
  std::printf("policy update  SetNetwork round trip p50 %.2f ms p99 %.2f ms (200 replaces)\n", up.p50, up.p99);

  // 4. The resolver from the container, first ask and again.
  auto res = Py(*open,
                "import socket, time, json\n"
                "def ask(names):\n"
                "  t = []\n"
                "  for n in names:\n"
                "    a = time.perf_counter(); socket.gethostbyname(n); t.append((time.perf_counter() - a) * 1000)\n"
                "  t.sort(); return t[len(t)//2]\n"
                "names = ['n%d.pypi.test' % i for i in range(150)]\n"
                "print(json.dumps([ask(names), ask(names)]))\n");
  if (res.is_array())
    std::printf("resolver ms    first ask (upstream) p50 %.3f | again (cached) p50 %.3f (150 names, glibc in the "
                "container; the upstream was asked %zu times; each answer pins its address, as a cached one does)\n",
                res[0].get<double>(), res[1].get<double>(), dns.asked().size());

  // 5. A flood of denied connects against another container's connects.
  auto flooder = c.Create(Spec(image, {"198.51.100.2:80/tcp"}));
  if (!flooder.ok()) return 1;
  auto before = Py(*open, ConnectTimes("198.51.100.2", 80, 300));
  double rss0 = RssMiB((*d)->pid());
  std::thread flood([&] {
    (void)Py(*flooder,
             "import socket, time, json\n"
             "end = time.time() + 4; n = 0\n"
             "while time.time() < end:\n"
             "  s = socket.socket(); s.setblocking(False)\n"
             "  try: s.connect(('198.51.100.3', 80 + n % 1000))\n"
             "  except OSError: pass\n"
             "  s.close(); n += 1\n"
             "print(json.dumps(n))\n");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the flood under way (a measurement window)
  auto during = Py(*open, ConnectTimes("198.51.100.2", 80, 300));
  flood.join();
  auto rec = flooder->Get();
  double rss1 = RssMiB((*d)->pid());
  if (before.is_array() && during.is_array() && rec.ok())
    std::printf("denied flood   neighbour's connect p50 %.3f ms during vs %.3f ms before (ratio %.2f); flooder "
                "refused %llu packets, %d kept in its record; dsecd RSS %.1f -> %.1f MiB\n",
                during[0].get<double>(), before[0].get<double>(), during[0].get<double>() / before[0].get<double>(),
                static_cast<unsigned long long>(rec->network().refused_packets()), rec->network().recent_size(), rss0,
                rss1);
  for (auto* sb : {&*open, &*closed, &*flooder}) (void)sb->Destroy();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"net_bench: sandbox networking's costs against same-run references (docs/performance.md)"};
  int creates = 100, conc = 8, rounds = 2;
  app.add_option("--creates", creates, "containers per round and mode")->capture_default_str();
  app.add_option("--concurrency", conc, "creations at once")->capture_default_str();
  app.add_option("--rounds", rounds, "rounds of none then allow")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (::geteuid() != 0) return std::fprintf(stderr, "net_bench: needs root (network namespaces, containers)\n"), 1;
  int rc = Run(creates, conc, rounds);
  for (const auto& ns : {kHost, kNet}) Sh("ip netns del " + ns + " 2>/dev/null");
  return rc;
}
