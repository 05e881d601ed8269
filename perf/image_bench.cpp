// Images on demand, measured (docs/images.md, docs/performance.md): one
// batch of SWE-like tasks on a controller and three nodes, three ways, each
// on a fresh cluster of real processes on this machine:
//
//   lazy   --image-fetch lazy: chunks fetched when first read (the default)
//   whole  --image-fetch whole: a node copies the whole EROFS file first
//   pull   as `docker pull` does it: at a node's first task of an image,
//          its layer (the tree as a .tar.gz) is copied to the node and
//          unpacked to its disk; the task then runs (dsec runs it from the
//          image already on the node, registered outside the timing)
//
//   build/bin/image_bench [--tasks 200] [--concurrency 6] [--source /var/tmp/dsec-image-bench]
//                         [--modes lazy,whole,pull] [--mirror URL]
//
// The images (four, from Debian's packages: a shared base of build-essential,
// python3 and git, each with a stack of its own; 300 MB or more each) are
// built once into --source (dsec-image build --debian) and reused. Prints,
// from one run: batch completion time and the image bytes written to the
// nodes' disks per mode; first-exec latency (create + first task) cold,
// warm and on a locally built image; the fraction of each image the batch
// read (lazy); the chunk dedup ratio across the four images.
#include <CLI/CLI.hpp>
#include <sys/mount.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "drivers/images/chunks.hpp"
#include "dsec/client.hpp"
#include "dsec/cluster/v1/cluster.pb.h"
#include "harness/daemon.hpp"
#include "perf/bench_daemon.hpp"
#include "perf/bench_util.hpp"
#include "runtime/files.hpp"

namespace {

using namespace dsec::bench;  // NOLINT: the benchmark helpers
using dsec::testing::BinDir;
using dsec::testing::RunProcess;
using dsec::testing::TestDaemon;

struct ImageDef {
  std::string name, packages, task;
};

// A shared base (build-essential, python3, git) and a stack each; each
// task touches a small part of its image.
const std::vector<ImageDef> kImages = {
    {"swe-py", "build-essential,python3,git,python3-numpy,python3-pytest",
     "python3 -c 'import numpy, json, email.parser; print(int(numpy.arange(100).sum()))' && git --version"},
    {"swe-c", "build-essential,python3,git,cmake,libssl-dev",
     "printf '#include <openssl/sha.h>\\n#include <stdio.h>\\nint main(void){printf(\"%d\\\\n\", SHA256_DIGEST_LENGTH);"
     "return 0;}\\n' > /tmp/t.c && gcc -O1 /tmp/t.c -o /tmp/t && /tmp/t"},
    {"swe-js", "build-essential,python3,git,nodejs",
     "node -e 'console.log(require(\"crypto\").createHash(\"sha256\").update(\"x\").digest(\"hex\"))' && git --version"},
    {"swe-rb", "build-essential,python3,git,ruby",
     "ruby -e 'require \"json\"; puts JSON.generate({\"a\" => 1})' && python3 -c 'import sqlite3; print(1)'"},
};

std::string Hex(const std::string& digest) { return digest.substr(digest.find(':') + 1); }

// name -> manifest JSON of the images in a data dir.
std::map<std::string, nlohmann::json> Listed(const std::string& data) {
  std::map<std::string, nlohmann::json> out;
  auto ls = RunProcess({BinDir() + "/dsec-image", "--data-dir", data, "ls", "--json"});
  std::istringstream lines(ls.out);
  for (std::string line; std::getline(lines, line);) {
    auto m = nlohmann::json::parse(line, nullptr, false);
    if (m.is_object()) out[m.value("name", "")] = m;
  }
  return out;
}

// Bytes on disk under `path` (du -s -B1); 0 when it is not there.
uint64_t DiskBytes(const std::string& path) {
  auto du = RunProcess({"/usr/bin/du", "-s", "-B1", path});
  return du.exit_code == 0 ? std::stoull(du.out) : 0;
}

// The four images in `src` (built when missing) and each one's tree as a
// .tar.gz (the pull baseline's layer), made from the image itself.
bool PrepareImages(const std::string& src, const std::string& mirror) {
  auto have = Listed(src);
  for (const auto& im : kImages) {
    if (!have.count(im.name)) {
      std::fprintf(stderr, "image_bench: building %s from Debian's packages (%s)...\n", im.name.c_str(),
                   im.packages.c_str());
      std::vector<std::string> args = {BinDir() + "/dsec-image", "--data-dir", src,    "build", "--debian",
                                       "bookworm",              "--packages", im.packages, im.name};
      if (!mirror.empty()) args.insert(args.end() - 1, {"--mirror", mirror});
      auto b = RunProcess(args);
      if (b.exit_code != 0) return std::fprintf(stderr, "image_bench: %s\n", b.err.c_str()), false;
    }
    std::string layer = src + "/layers/" + im.name + ".tar.gz";
    if (dsec::ReadFileToString(layer + ".done").ok()) continue;
    (void)dsec::MakeDirs(src + "/layers");
    auto m = Listed(src)[im.name];
    std::string mnt = src + "/layers/mnt";
    (void)dsec::MakeDirs(mnt);
    if (::mount(m.value("file", "").c_str(), mnt.c_str(), "erofs", MS_RDONLY, nullptr) < 0)
      return std::fprintf(stderr, "image_bench: mount %s: %s\n", m.value("file", "").c_str(), std::strerror(errno)),
             false;
    std::fprintf(stderr, "image_bench: packing %s's layer (tar.gz, as a registry serves it)...\n", im.name.c_str());
    auto t = RunProcess({"/bin/tar", "-C", mnt, "-czf", layer, "."});
    ::umount2(mnt.c_str(), MNT_DETACH);
    if (t.exit_code > 1) return std::fprintf(stderr, "image_bench: tar: %s\n", t.err.c_str()), false;
    (void)dsec::WriteFileAtomic(layer + ".done", "ok\n");
  }
  return true;
}

struct Cluster {
  std::unique_ptr<TestDaemon> controller;
  std::vector<std::unique_ptr<TestDaemon>> nodes;
  std::unique_ptr<dsec::Client> client;
};

bool StartCluster(const std::string& fetch, const std::string& src, Cluster* c) {
  dsec::testing::TestDaemonOptions co;
  co.role = "controller";
  co.cgroup_parent = "dsec-bench";
  co.test_hooks = false;
  co.extra_args = {"--image-fetch", fetch == "lazy" ? "lazy" : "whole"};
  auto ctl = TestDaemon::Start(co);
  if (!ctl.ok()) return std::fprintf(stderr, "controller: %s\n", ctl.status().ToString().c_str()), false;
  c->controller = std::move(*ctl);
  for (const auto& im : kImages) {
    auto p = RunProcess({BinDir() + "/dsec-image", "--data-dir", c->controller->data_dir(), "push",
                         Listed(src)[im.name].value("file", ""), im.name});
    if (p.exit_code != 0) return std::fprintf(stderr, "push: %s\n", p.err.c_str()), false;
  }
  for (int i = 0; i < 3; ++i) {
    dsec::testing::TestDaemonOptions o;
    o.cgroup_parent = "dsec-bench";
    o.test_hooks = false;
    o.extra_args = {"--role", "node", "--join", c->controller->cluster_addr(), "--cluster-secret",
                    c->controller->data_dir() + "/cluster.secret", "--slots", "1000"};
    auto n = TestDaemon::Start(o);
    if (!n.ok()) return std::fprintf(stderr, "node: %s\n", n.status().ToString().c_str()), false;
    if (fetch == "pull")  // the images are on the node already: the pull is timed at first use
      for (const auto& im : kImages)
        RunProcess({BinDir() + "/dsec-image", "--data-dir", (*n)->data_dir(), "push",
                    Listed(src)[im.name].value("file", ""), im.name});
    c->nodes.push_back(std::move(*n));
  }
  auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    int up = 0;
    for (const auto& node : c->controller->Admin("nodes").value("nodes", nlohmann::json::array()))
      up += node.value("state", "") == "up";
    if (up == 3) break;
    if (Clock::now() > deadline) return std::fprintf(stderr, "the nodes did not join\n"), false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // another process's state
  }
  auto cl = BenchClient(*c->controller);
  if (!cl.ok()) return std::fprintf(stderr, "client: %s\n", cl.status().ToString().c_str()), false;
  c->client = std::move(*cl);
  return true;
}

struct ModeResult {
  double batch_s = 0;
  uint64_t bytes_written = 0;
  int failed = 0;
  std::string first_error;
  std::vector<double> cold_ms, warm_ms;      // create + first task: first of its image on its node, or later
  std::map<std::string, double> read_share;  // lazy: what the batch read of each image (the most of any node)
};

ModeResult RunMode(const std::string& mode, const std::string& src, int tasks, int conc) {
  ModeResult out;
  Cluster c;
  if (!StartCluster(mode, src, &c)) {
    out.failed = tasks;
    return out;
  }
  std::vector<int> order(tasks);
  for (int i = 0; i < tasks; ++i) order[i] = i % static_cast<int>(kImages.size());
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::mutex mu;
  std::set<std::string> seen;                   // node/image pairs that had a task
  std::map<std::string, std::once_flag> pulls;  // pull: node/image -> its pull
  for (const auto& n : c.nodes)
    for (const auto& im : kImages) pulls[n->Admin("status").value("node", "") + "/" + im.name];
  std::map<std::string, std::string> node_dir;
  for (const auto& n : c.nodes) node_dir[n->Admin("status").value("node", "")] = n->data_dir();
  out.batch_s = Parallel(tasks, conc, [&](int i) {
    const ImageDef& im = kImages[order[i]];
    auto t0 = Clock::now();
    auto sb = c.client->Create(dsec::ContainerSpec(im.name));
    std::string node = sb.ok() ? sb->Get()->node_id() : "";
    if (sb.ok() && mode == "pull")
      std::call_once(pulls[node + "/" + im.name], [&] {
        std::string dir = node_dir[node] + "/pulled";
        (void)dsec::MakeDirs(dir + "/" + im.name);
        RunProcess({"/bin/cp", src + "/layers/" + im.name + ".tar.gz", dir + "/"});
        RunProcess({"/bin/tar", "-C", dir + "/" + im.name, "-xzf", dir + "/" + im.name + ".tar.gz"});
      });
    auto r = sb.ok() ? sb->Exec(dsec::Command({"/bin/sh", "-c", im.task})) : dsec::Result<dsec::v1::ExecResult>(sb.status());
    double ms = Ms(t0, Clock::now());
    std::lock_guard<std::mutex> lk(mu);
    bool first = seen.insert(node + "/" + im.name).second;
    if (!r.ok() || r->exit_code() != 0) {
      if (!out.failed++)
        out.first_error = im.name + ": " + (r.ok() ? "exit " + std::to_string(r->exit_code()) + ": " + r->stderr()
                                                   : r.status().ToString());
    } else {
      (first ? out.cold_ms : out.warm_ms).push_back(ms);
    }
    if (sb.ok()) (void)sb->Destroy();
  });
  for (const auto& n : c.nodes) {
    out.bytes_written += mode == "lazy"    ? DiskBytes(n->data_dir() + "/image-cache")
                         : mode == "whole" ? DiskBytes(n->data_dir() + "/images")
                                           : DiskBytes(n->data_dir() + "/pulled");
    if (mode == "lazy")
      for (const auto& [name, m] : Listed(n->data_dir()))
        if (m.value("lazy", false) && m.value("size_bytes", uint64_t{0}) > 0)
          out.read_share[name] = std::max(out.read_share[name], double(m.value("cached_bytes", uint64_t{0})) /
                                                                    double(m.value("size_bytes", uint64_t{1})));
  }
  return out;
}

// Create + first task on an image pushed straight into a dsecd --role all
// (what "locally built" means: the whole file on its own disk, cold).
double LocalFirstExecMs(const std::string& src) {
  auto d = StartBenchDaemon();
  if (!d.ok()) return -1;
  const ImageDef& im = kImages[0];
  std::string file = Listed(src)[im.name].value("file", "");
  RunProcess({BinDir() + "/dsec-image", "--data-dir", (*d)->data_dir(), "push", file, im.name});
  std::string local = Listed((*d)->data_dir())[im.name].value("file", "");
  RunProcess({"/usr/bin/dd", "if=" + local, "iflag=nocache", "count=0", "status=none"});  // drop its cached pages
  auto cl = BenchClient(**d);
  if (!cl.ok()) return -1;
  auto t0 = Clock::now();
  auto sb = (*cl)->Create(dsec::ContainerSpec(im.name));
  if (!sb.ok()) return -1;
  auto r = sb->Exec(dsec::Command({"/bin/sh", "-c", im.task}));
  double ms = Ms(t0, Clock::now());
  (void)sb->Destroy();
  return r.ok() && r->exit_code() == 0 ? ms : -1;
}

// Sum of the images' sizes over the bytes of their distinct chunks.
void PrintDedup(const std::string& src) {
  std::set<std::string> seen;
  uint64_t all = 0, unique = 0;
  for (const auto& im : kImages) {
    std::string digest = Listed(src)[im.name].value("digest", "");
    dsec::images::ChunkIndex index(src + "/images");
    auto map = index.MapOf(digest, src + "/images/" + Hex(digest) + ".erofs");
    if (!map.ok()) continue;
    uint64_t own = 0;
    for (const auto& ch : map->chunks()) {
      all += ch.length();
      if (seen.insert(ch.digest()).second) unique += ch.length(), own += ch.length();
    }
    std::printf("  %-8s %7.1f MB, %7.1f MB of chunks no image before it has\n", im.name.c_str(),
                map->size_bytes() / 1e6, own / 1e6);
  }
  std::printf("dedup across the four images: %.1f MB of images in %.1f MB of distinct chunks (%.2fx)\n", all / 1e6,
              unique / 1e6, unique ? double(all) / double(unique) : 0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"images on demand: a batch of tasks on 3 nodes, lazy vs whole-file copy vs a docker-style pull"};
  int tasks = 200, conc = 6;
  std::string src = "/var/tmp/dsec-image-bench", modes = "lazy,whole,pull", mirror;
  app.add_option("--tasks", tasks, "tasks in the batch (spread over the four images)")->capture_default_str();
  app.add_option("--concurrency", conc, "tasks at once")->capture_default_str();
  app.add_option("--source", src, "where the four images are built once and kept")->capture_default_str();
  app.add_option("--modes", modes, "which of lazy,whole,pull to run")->capture_default_str();
  app.add_option("--mirror", mirror, "the Debian mirror for the first build");
  CLI11_PARSE(app, argc, argv);
  if (!PrepareImages(src, mirror)) return 1;
  PrintDedup(src);
  std::map<std::string, ModeResult> results;
  for (const auto& mode : {"lazy", "whole", "pull"}) {
    if (modes.find(mode) == std::string::npos) continue;
    std::fprintf(stderr, "image_bench: %s, %d tasks, %d at once...\n", mode, tasks, conc);
    results[mode] = RunMode(mode, src, tasks, conc);
    const auto& r = results[mode];
    auto cold = Percentiles(r.cold_ms), warm = Percentiles(r.warm_ms);
    std::printf("%-6s batch %7.1f s, image bytes written to the nodes %8.1f MB, failed %d%s%s\n", mode, r.batch_s,
                r.bytes_written / 1e6, r.failed, r.failed ? ": " : "", r.first_error.substr(0, 200).c_str());
    std::printf("       first exec (create + task) cold p50 %.0f ms (n=%zu), warm p50 %.0f ms (n=%zu)\n", cold.p50,
                r.cold_ms.size(), warm.p50, r.warm_ms.size());
    for (const auto& [name, share] : r.read_share)
      std::printf("       %s: the batch read %.1f%% of it (the most any node fetched)\n", name.c_str(), share * 100);
  }
  std::printf("local image (dsecd --role all, the file on its disk): first exec %.0f ms\n", LocalFirstExecMs(src));
  if (results.count("lazy") && results.count("whole") && results.count("pull")) {
    const auto &l = results["lazy"], &w = results["whole"], &p = results["pull"];
    std::printf("lazy vs pull: %.2fx faster, %.0f%% fewer bytes written; lazy vs whole: %.2fx faster, %.0f%% fewer\n",
                p.batch_s / l.batch_s, 100.0 * (1.0 - double(l.bytes_written) / double(p.bytes_written)),
                w.batch_s / l.batch_s, 100.0 * (1.0 - double(l.bytes_written) / double(w.bytes_written)));
  }
  return 0;
}
