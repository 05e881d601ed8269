// Images on demand (docs/images.md) with real processes: a controller
// whose registry is the image service, three nodes that join it, images
// pushed to the controller only. Every node runs containers on them at
// once, fetching chunks as they are read through dsec-lazyfs (FUSE) under
// the usual EROFS mount and overlay; what a sandbox reads is the source's
// bytes; a node fetches each chunk once however many containers read it;
// a second image of a family fetches only the chunks it does not share.
#include <gmock/gmock.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "actors/node/image_worker.hpp"
#include "drivers/images/lazy_wire.hpp"
#include "dsec/cluster/v1/cluster.pb.h"
#include "sdk/src/client_agent.hpp"
#include "wire/wire.hpp"
#include "harness/rootfs.hpp"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"
#include "tests/support/chromium.hpp"
#include "tests/support/cluster_probes.hpp"
#include "tests/support/daemon_fixture.hpp"
#include "tests/support/host_probes.hpp"
#include "tests/support/http_probe.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
constexpr int kNodes = 3;

class LazyImages : public ::testing::Test {
 protected:
  struct Image {
    std::string name, digest, dir;
    std::map<std::string, std::string> sums;  // file in the image -> sha256 hex
  };

  static void SetUpTestSuite() {
    if (auto gap = ContainerHostGap(); !gap.empty()) return Skip("container sandboxes unavailable: " + gap);
    if (::access("/dev/fuse", R_OK | W_OK) != 0) return Skip("FUSE is unavailable on this host (no /dev/fuse)");
    TestDaemonOptions co;
    co.role = "controller";
    auto c = TestDaemon::Start(co);
    if (!c.ok()) return Fail("the controller did not start: " + c.status().ToString());
    controller_ = std::move(*c);
    for (int i = 0; i < kNodes; ++i) {
      TestDaemonOptions o;
      o.extra_args = {"--role", "node", "--join", controller_->cluster_addr(), "--cluster-secret",
                      controller_->data_dir() + "/cluster.secret", "--slots", "200", "--image-record-s", "2"};
      auto n = TestDaemon::Start(o);
      if (!n.ok()) return Fail("node " + std::to_string(i) + " did not start: " + n.status().ToString());
      nodes_[i] = std::move(*n);
      ids_[i] = nodes_[i]->Admin("status").value("node", "");
    }
    // A family: fam2 is fam1 plus a file; solo shares nothing but its tools.
    char tmpl[] = "/tmp/dsec-lazy-XXXXXX";
    if (!::mkdtemp(tmpl)) return Fail("mkdtemp");
    work_ = tmpl;
    RootfsOptions ro;
    ro.python = false;
    ro.programs = {"sh", "cat", "sha256sum", "head", "true", "sleep"};
    Status made = MakeRootfs(work_ + "/fam1", ro);
    if (made.code() == Status::Code::kFailedPrecondition) return Skip("cannot make the rootfs: " + made.ToString());
    if (!made.ok()) return Fail(made.ToString());
    fam1_ = {"fam1", "", work_ + "/fam1", {}};
    std::string e = AddRandom(&fam1_, "data/shared", 6 << 20) + AddRandom(&fam1_, "data/one", 1 << 20);
    RunProcess({"/bin/cp", "-a", work_ + "/fam1", work_ + "/fam2"});
    fam2_ = {"fam2", "", work_ + "/fam2", fam1_.sums};
    fam2_.sums.erase("data/one");
    RunProcess({"/bin/rm", work_ + "/fam2/data/one"});
    e += AddRandom(&fam2_, "data/two", 1 << 20);
    RunProcess({"/bin/cp", "-a", work_ + "/fam1", work_ + "/solo"});
    RunProcess({"/bin/rm", "-rf", work_ + "/solo/data"});
    solo_ = {"solo", "", work_ + "/solo", {}};
    e += AddRandom(&solo_, "data/solo", 4 << 20);
    RunProcess({"/bin/cp", "-a", work_ + "/solo", work_ + "/late"});
    RunProcess({"/bin/rm", "-rf", work_ + "/late/data"});
    late_ = {"late", "", work_ + "/late", {}};  // cold on every node until the last test
    e += AddRandom(&late_, "data/late", 4 << 20);
    RunProcess({"/bin/cp", "-a", work_ + "/late", work_ + "/pre"});
    RunProcess({"/bin/rm", "-rf", work_ + "/pre/data"});
    pre_ = {"pre", "", work_ + "/pre", {}};  // the prefetch test's alone
    e += AddRandom(&pre_, "data/pre", 3 << 20);
    for (Image* im : {&fam1_, &fam2_, &solo_, &late_, &pre_}) e += Build(im);
    if (!e.empty()) return Fail(e);
    if (!WaitUntil([] { return UpNodes() == kNodes; }, std::chrono::seconds(20)))
      return Fail("the nodes did not all join: " + controller_->Admin("nodes").dump());
    if (auto err = ConnectClient(*controller_, &client_); !err.empty()) return Fail("the controller: " + err);
  }
  static void TearDownTestSuite() {
    client_.reset();
    for (auto& n : nodes_) n.reset();
    controller_.reset();
    if (!work_.empty()) RunProcess({"/bin/rm", "-rf", work_});
  }
  static void Skip(const std::string& why) { skip_ = why; }
  static void Fail(const std::string& why) { failure_ = why; }
  void SetUp() override {
    ASSERT_TRUE(failure_.empty()) << failure_;
    if (!client_) GTEST_SKIP() << skip_;
  }

  // `bytes` random bytes at `rel` of the image's tree; "" or what failed.
  static std::string AddRandom(Image* im, const std::string& rel, size_t bytes) {
    std::string path = im->dir + "/" + rel;
    (void)MakeDirs(path.substr(0, path.rfind('/')));
    auto dd = RunProcess({"/bin/sh", "-c", "head -c " + std::to_string(bytes) + " /dev/urandom > " + path});
    auto sum = RunProcess({"/usr/bin/sha256sum", path});
    if (dd.exit_code != 0 || sum.exit_code != 0) return "cannot write " + path + ": " + dd.err + sum.err + "\n";
    im->sums[rel] = sum.out.substr(0, 64);
    return "";
  }
  // Pushed to the controller (its registry: the image service).
  static std::string Build(Image* im) {
    auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", controller_->data_dir(), "build", im->dir,
                             im->name});
    if (built.exit_code != 0) return "dsec-image build " + im->name + ": " + built.err + "\n";
    auto at = built.out.find("sha256:");
    if (at == std::string::npos) return "dsec-image build " + im->name + " printed no digest: " + built.out + "\n";
    im->digest = built.out.substr(at, 71);
    return "";
  }
  static int UpNodes() {
    int n = 0;
    for (const auto& node : controller_->Admin("nodes").value("nodes", nlohmann::json::array()))
      n += node.value("state", "") == "up";
    return n;
  }

  // Placement lands on node i alone while the others drain.
  static void Steer(int i, bool on) {
    for (int j = 0; j < kNodes; ++j)
      if (j != i) {
        ASSERT_TRUE(controller_->Admin(std::string(on ? "drain " : "undrain ") + ids_[j]).value("ok", false));
      }
  }
  static Result<Sandbox> CreateOn(int i, const Image& im) {
    Steer(i, true);
    auto sb = client_->Create(ContainerSpec(im.name));
    Steer(i, false);
    if (sb.ok() && sb->Get()->node_id() != ids_[i])
      return Status::Internal("placed on " + sb->Get()->node_id() + ", not " + ids_[i]);
    return sb;
  }
  static nlohmann::json Lazy(int i) { return nodes_[i]->Admin("stats")["lazy_images"]; }
  static uint64_t Stat(int i, const char* what) { return Lazy(i).value(what, uint64_t{0}); }
  // The image's chunk map as the image service cut it.
  static cluster::v1::ChunkMap MapOf(const Image& im) {
    cluster::v1::ChunkMap m;
    auto text = ReadFileToString(controller_->data_dir() + "/images/" + im.digest.substr(7) + ".chunks");
    if (text.ok()) m.ParseFromString(*text);
    return m;
  }
  static std::set<std::string> Chunks(const Image& im) {
    std::set<std::string> out;
    cluster::v1::ChunkMap map = MapOf(im);
    for (const auto& c : map.chunks()) out.insert(c.digest());
    return out;
  }
  // The node's lazy file of the image, read whole on the host: its digest.
  static std::string DigestOfLazyFile(int i, const Image& im) {
    auto sum = RunProcess({"/usr/bin/sha256sum", nodes_[i]->data_dir() + "/run/lazy/" + im.digest.substr(7) + ".erofs"});
    return sum.exit_code == 0 ? "sha256:" + sum.out.substr(0, 64) : "(" + sum.err + ")";
  }
  // The kernel's copy of the node's lazy file goes: its next reads ask dsecd.
  static bool DropPageCache(int i, const Image& im) {
    std::string lazy = nodes_[i]->data_dir() + "/run/lazy/" + im.digest.substr(7) + ".erofs";
    int fd = ::open(lazy.c_str(), O_RDONLY);
    if (fd < 0) return false;
    bool ok = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    ::close(fd);
    return ok;
  }
  static std::string SumIn(const Sandbox& sb, const std::string& rel) {
    auto r = sb.Exec(Command({"/bin/sha256sum", "/" + rel}));
    if (!r.ok()) return r.status().ToString();
    return r->exit_code() == 0 ? r->stdout().substr(0, 64) : "exit " + std::to_string(r->exit_code()) + ": " + r->stderr();
  }

  static inline std::unique_ptr<TestDaemon> controller_;
  static inline std::unique_ptr<TestDaemon> nodes_[kNodes];
  static inline std::string ids_[kNodes];
  static inline std::unique_ptr<Client> client_;
  static inline std::string work_, skip_, failure_;
  static inline Image fam1_, fam2_, solo_, late_, pre_;
};

// Acceptance 1: a container on each node runs from an image no node had;
// what it reads is the source's bytes, and so is the whole lazy file.
TEST_F(LazyImages, AnImageOnlyTheControllerHasRunsOnEveryNodeAndReadsTheSourcesBytes) {
  for (int i = 0; i < kNodes; ++i) {
    auto sb = CreateOn(i, fam1_);
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    EXPECT_EQ(SumIn(*sb, "data/shared"), fam1_.sums.at("data/shared")) << "node " << i;
    EXPECT_GT(Stat(i, "chunks_fetched"), 0u) << Lazy(i).dump();
    EXPECT_LT(Stat(i, "bytes_fetched"), MapOf(fam1_).size_bytes()) << "node " << i << " fetched the whole image";
    auto ls = RunProcess({BinDir() + "/dsec-image", "--data-dir", nodes_[i]->data_dir(), "ls", "--json"});
    bool lazy = false;
    std::istringstream lines(ls.out);
    for (std::string line; std::getline(lines, line);) {
      auto m = nlohmann::json::parse(line, nullptr, false);
      if (m.is_object() && m.value("name", "") == "fam1")
        lazy = m.value("lazy", false) && m.value("cached_bytes", uint64_t{0}) > 0;
    }
    EXPECT_TRUE(lazy) << "dsec-image ls on node " << i << ": " << ls.out << ls.err;
    EXPECT_TRUE(sb->Destroy().ok());
  }
  EXPECT_EQ(DigestOfLazyFile(0, fam1_), fam1_.digest);
  EXPECT_EQ(Stat(0, "digest_failures"), 0u);
  // The controller's list says what each node holds (from their heartbeats).
  std::string listed;
  EXPECT_TRUE(WaitUntil(
      [&] {
        listed = RunProcess({BinDir() + "/dsec-image", "--data-dir", controller_->data_dir(), "ls", "--json"}).out;
        std::istringstream lines(listed);
        for (std::string line; std::getline(lines, line);) {
          auto m = nlohmann::json::parse(line, nullptr, false);
          if (!m.is_object() || m.value("name", "") != "fam1" || !m["cached_on"].is_object()) continue;
          int held = 0;
          for (const auto& id : ids_) held += m["cached_on"].value(id, uint64_t{0}) > 0;
          return held == kNodes;
        }
        return false;
      },
      std::chrono::seconds(10)))
      << listed;
  EXPECT_THAT(RunProcess({BinDir() + "/dsec-image", "--data-dir", controller_->data_dir(), "ls"}).out,
              HasSubstr("  on " + ids_[0] + ": "));
}

// The controller's status page and /metrics show what nodes fetched: each
// node's lazy images in /status.json and drawn in Chromium, chunks served
// by the image service and fetched by the nodes in /metrics.
TEST_F(LazyImages, TheStatusPageAndMetricsShowWhatEachNodeFetched) {
  auto status = HttpGet(controller_->http_addr(), "/status.json");
  ASSERT_EQ(status.code, 200) << status.raw;
  auto j = nlohmann::json::parse(status.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j["nodes"].is_array()) << status.body;
  int shown = 0;
  for (const auto& node : j["nodes"])
    shown += node.contains("lazy_images") && node["lazy_images"].value("chunks_fetched", uint64_t{0}) > 0;
  EXPECT_EQ(shown, kNodes) << status.body;
  std::string bad;
  auto served = ParseMetrics(HttpGet(controller_->http_addr(), "/metrics").body, &bad);
  EXPECT_GT(served["dsec_image_chunks_total{event=\"served\"}"], 0) << bad;
  auto fetched = ParseMetrics(HttpGet(nodes_[0]->http_addr(), "/metrics").body, &bad);
  EXPECT_EQ(fetched["dsec_image_chunks_total{event=\"fetched\"}"], static_cast<double>(Stat(0, "chunks_fetched")));
  EXPECT_GT(fetched["dsec_image_bytes_total{what=\"fetched\"}"], 0);
  HeadlessChromium chromium;
  if (auto why = chromium.Open(); !why.empty()) GTEST_SKIP() << why;
  auto dom = chromium.Dom("http://" + controller_->http_addr() + "/");
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  for (const auto& id : ids_) EXPECT_THAT(dom.out, HasSubstr("data-lazy-node=\"" + id + "\""));
}

// Acceptance 1: 64 containers of one image on one node, reading at once,
// fetch each chunk once.
TEST_F(LazyImages, SixtyFourContainersOfAnImageOnANodeFetchEachChunkOnce) {
  constexpr int kContainers = 64;
  std::vector<Sandbox> boxes;
  Steer(1, true);
  for (int k = 0; k < kContainers; ++k) {
    auto sb = client_->Create(ContainerSpec(solo_.name));
    ASSERT_TRUE(sb.ok()) << k << ": " << sb.status().ToString();
    boxes.push_back(*sb);
  }
  Steer(1, false);
  for (const auto& sb : boxes) ASSERT_EQ(sb.Get()->node_id(), ids_[1]);
  uint64_t before = Stat(1, "chunks_fetched"), again = Stat(1, "chunks_fetched_again");
  std::vector<std::string> sums(kContainers);
  std::vector<std::thread> readers;
  for (int k = 0; k < kContainers; ++k)
    readers.emplace_back([&, k] { sums[k] = SumIn(boxes[k], "data/solo"); });
  for (auto& t : readers) t.join();
  for (int k = 0; k < kContainers; ++k) EXPECT_EQ(sums[k], solo_.sums.at("data/solo")) << "container " << k;
  uint64_t fetched = Stat(1, "chunks_fetched") - before;
  EXPECT_GT(fetched, 0u);
  EXPECT_EQ(Stat(1, "chunks_fetched_again"), again) << "a chunk was fetched twice: " << Lazy(1).dump();
  EXPECT_LE(fetched, Chunks(solo_).size()) << "more fetches than the image has chunks";
  for (const auto& sb : boxes) EXPECT_TRUE(sb.Destroy().ok());
}

// Acceptance 1: the second image of a family fetches only the chunks the
// first did not have (counted against the two chunk maps).
TEST_F(LazyImages, ASecondImageOfAFamilyFetchesOnlyTheChunksItDoesNotShare) {
  auto first = CreateOn(2, fam1_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(DigestOfLazyFile(2, fam1_), fam1_.digest);  // every chunk of fam1 is on node 2 now
  uint64_t before = Stat(2, "chunks_fetched");
  auto second = CreateOn(2, fam2_);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(SumIn(*second, "data/two"), fam2_.sums.at("data/two"));
  EXPECT_EQ(SumIn(*second, "data/shared"), fam2_.sums.at("data/shared"));
  ASSERT_EQ(DigestOfLazyFile(2, fam2_), fam2_.digest);
  std::set<std::string> one = Chunks(fam1_), two = Chunks(fam2_), own;
  for (const auto& c : two)
    if (!one.count(c)) own.insert(c);
  uint64_t fetched = Stat(2, "chunks_fetched") - before;
  EXPECT_EQ(fetched, own.size()) << "fam2 has " << two.size() << " chunks, " << own.size() << " not in fam1";
  EXPECT_LT(own.size() * 3, two.size()) << "the family shares less than two thirds of its chunks";
  std::printf("fam2: %zu chunks, %zu of them its own (fetched: %llu)\n", two.size(), own.size(),
              static_cast<unsigned long long>(fetched));
  EXPECT_TRUE(first->Destroy().ok());
  EXPECT_TRUE(second->Destroy().ok());
}

// The first node's first reads of an image become its prefetch order (the
// nodes record for 2 s here); the second node to take it prefetches them
// in the background, so its first task reads without waiting for a chunk.
TEST_F(LazyImages, ASecondColdNodePrefetchesWhatTheFirstNodeRead) {
  auto first = CreateOn(0, pre_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(SumIn(*first, "data/pre"), pre_.sums.at("data/pre"));
  std::string saved = controller_->data_dir() + "/images/" + pre_.digest.substr(7) + ".prefetch";
  cluster::v1::ChunkMap order;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto text = ReadFileToString(saved);
        return text.ok() && order.ParseFromString(*text) && order.prefetch_size() > 0;
      },
      std::chrono::seconds(15)))
      << "the image service has no prefetch order for pre";
  cluster::v1::ChunkMap map = MapOf(pre_);
  uint64_t order_bytes = 0;
  std::set<std::string> distinct;
  for (uint32_t i : order.prefetch())
    if (distinct.insert(map.chunks(i).digest()).second) order_bytes += map.chunks(i).length();

  auto second = CreateOn(1, pre_);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  auto cached = [&] {
    auto ls = RunProcess({BinDir() + "/dsec-image", "--data-dir", nodes_[1]->data_dir(), "ls", "--json"});
    std::istringstream lines(ls.out);
    for (std::string line; std::getline(lines, line);) {
      auto m = nlohmann::json::parse(line, nullptr, false);
      if (m.is_object() && m.value("name", "") == "pre") return m.value("cached_bytes", uint64_t{0});
    }
    return uint64_t{0};
  };
  EXPECT_TRUE(WaitUntil([&] { return cached() >= order_bytes; }, std::chrono::seconds(15)))
      << "node 1 holds " << cached() << " bytes of the " << order_bytes << " its order names: " << Lazy(1).dump();
  EXPECT_GT(Stat(1, "prefetched_chunks"), 0u);
  uint64_t misses = Stat(1, "cache_misses");
  EXPECT_EQ(SumIn(*second, "data/pre"), pre_.sums.at("data/pre"));
  EXPECT_EQ(Stat(1, "cache_misses"), misses) << "the second node's task waited for chunks the first had read";
  EXPECT_TRUE(first->Destroy().ok());
  EXPECT_TRUE(second->Destroy().ok());
}

// Acceptance 2: a chunk corrupted on the wire is refused and fetched
// again; one corrupted in the node's cache is found when read and fetched
// again. Nothing wrong is ever read.
TEST_F(LazyImages, ACorruptChunkOnTheWireOrInTheCacheIsRefusedAndFetchedAgain) {
  uint64_t failures = Stat(0, "digest_failures");
  ASSERT_TRUE(controller_->Admin("fault chunk-corrupt 3").value("ok", false));
  auto sb = CreateOn(0, solo_);  // node 0 has not read solo yet: every chunk comes over the wire
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_EQ(SumIn(*sb, "data/solo"), solo_.sums.at("data/solo"));
  EXPECT_EQ(Stat(0, "digest_failures"), failures + 3) << Lazy(0).dump();
  ASSERT_EQ(DigestOfLazyFile(0, solo_), solo_.digest);

  // One chunk on the node's disk gets a flipped byte; the kernel's copy of
  // the lazy file is dropped, so the next read asks dsecd for it again.
  cluster::v1::ChunkMap map = MapOf(solo_);
  const std::string& victim = map.chunks(map.chunks_size() / 2).digest();
  std::string path = nodes_[0]->data_dir() + "/image-cache/chunks/" + victim.substr(0, 2) + "/" + victim;
  auto bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok()) << path;
  (*bytes)[100] = static_cast<char>((*bytes)[100] ^ 1);
  ASSERT_TRUE(WriteFileAtomic(path, *bytes).ok());
  ASSERT_TRUE(DropPageCache(0, solo_));
  uint64_t again = Stat(0, "chunks_fetched_again");
  EXPECT_EQ(DigestOfLazyFile(0, solo_), solo_.digest);
  EXPECT_EQ(Stat(0, "digest_failures"), failures + 4);
  EXPECT_EQ(Stat(0, "chunks_fetched_again"), again + 1) << Lazy(0).dump();
  EXPECT_TRUE(sb->Destroy().ok());
}

// Acceptance 2: dsec-lazyfs killed: the sandboxes of its images are failed
// (not left hanging), it is started again, and new sandboxes of the image
// read it.
TEST_F(LazyImages, ADeadLazyfsFailsItsImagesSandboxesAndComesBack) {
  auto sb = CreateOn(0, fam1_);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(SumIn(*sb, "data/one"), fam1_.sums.at("data/one"));
  int pid = static_cast<int>(Stat(0, "lazyfs_pid"));
  ASSERT_GT(pid, 0);
  uint64_t restarts = Stat(0, "lazyfs_restarts");
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  std::string error;
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto rec = sb->Get();
        error = rec.ok() ? rec->error() : rec.status().ToString();
        return rec.ok() && rec->phase() == v1::SANDBOX_PHASE_FAILED;
      },
      std::chrono::seconds(10)))
      << "the sandbox on the dead lazy file is not failed: " << error;
  EXPECT_THAT(error, HasSubstr("dsec-lazyfs"));
  EXPECT_TRUE(WaitUntil([&] { return Stat(0, "lazyfs_pid") != 0 && Stat(0, "lazyfs_pid") != uint64_t(pid); },
                        std::chrono::seconds(10)))
      << Lazy(0).dump();
  EXPECT_EQ(Stat(0, "lazyfs_restarts"), restarts + 1);
  auto next = CreateOn(0, fam1_);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(SumIn(*next, "data/shared"), fam1_.sums.at("data/shared"));
  EXPECT_TRUE(next->Destroy().ok());
  (void)sb->Destroy();
}

// Acceptance 3: chunks go to nodes only. A peer that holds the cluster
// secret but is not a node that joined, and a trainer on the SDK port,
// are refused, naming why; the controller goes on serving its nodes.
TEST_F(LazyImages, AChunkRequestFromAPeerThatIsNotANodeIsRefused) {
  cluster::v1::ChunkMap map = MapOf(fam1_);
  ASSERT_GT(map.chunks_size(), 0);
  caf::actor_system_config cfg;
  ConfigureCaf(cfg, CafOptions{});
  caf::actor_system sys{cfg};
  auto secret = ReadFileToString(controller_->data_dir() + "/cluster.secret");
  ASSERT_TRUE(secret.ok());
  while (!secret->empty() && secret->back() == '\n') secret->pop_back();
  std::string addr = controller_->cluster_addr();
  std::string host = addr.substr(0, addr.rfind(':'));
  auto port = static_cast<uint16_t>(std::stoi(addr.substr(host.size() + 1)));
  auto peer = sdk::ConnectEntry(sys, host, port, *secret, std::chrono::seconds(5), 2 /* door::kCluster */);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  caf::scoped_actor self{sys};
  std::string refusal;
  self->request(*peer, std::chrono::seconds(10), chunks_atom::value, std::vector<std::string>{map.chunks(0).digest()})
      .receive([&](std::vector<std::string>&) { refusal = "(served)"; },
               [&](caf::error& e) { refusal = sys.render(e); });
  EXPECT_THAT(refusal, HasSubstr("nodes only"));
  // The nodes are still served: a cold read on a node works.
  auto sb = CreateOn(2, solo_);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_EQ(SumIn(*sb, "data/solo"), solo_.sums.at("data/solo"));
  EXPECT_TRUE(sb->Destroy().ok());
}

// Garbage on a node's lazy socket (<data>/run/lazy.sock, where dsec-lazyfs
// asks dsecd for an image's bytes): each request is answered with an errno
// or its connection closed, a closed connection leaves no thread or stack
// behind (2 000 of them would be 16 GiB of stacks), and the socket serves
// on.
TEST_F(LazyImages, GarbageOnTheLazySocketIsRefusedAndCostsNothing) {
  namespace lw = images::lazywire;
  const std::string sock = nodes_[1]->data_dir() + "/run/lazy.sock";
  const std::string status = "/proc/" + std::to_string(nodes_[1]->pid()) + "/status";
  auto field_of = [&](const char* key) {
    auto text = ReadFileToString(status);
    size_t at = text.ok() ? text->find(key) : std::string::npos;
    return at == std::string::npos ? -1L : std::atol(text->c_str() + at + std::strlen(key));
  };
  auto dial = [&] {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, sock.c_str(), sizeof(a.sun_path) - 1);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) fd.Reset();
    return fd;
  };
  // One request; its reply's errno, or -1 when the connection closed.
  auto ask = [&](int fd, char op, const std::string& name, uint64_t offset, uint32_t length, uint32_t name_len) {
    lw::Request rq;
    rq.op = static_cast<uint8_t>(op);
    rq.name_len = name_len;
    rq.offset = offset;
    rq.length = length;
    lw::Reply rp;
    if (!lw::WriteFull(fd, &rq, sizeof rq) || !lw::WriteFull(fd, name.data(), name.size()) ||
        !lw::ReadFull(fd, &rp, sizeof rp))
      return -1;
    std::string data(rp.data_len, '\0');
    return lw::ReadFull(fd, data.data(), data.size()) ? rp.err : -1;
  };
  const long vm_before = field_of("VmSize:"), threads_before = field_of("Threads:");
  ASSERT_GT(vm_before, 0) << status;
  const std::string unknown = std::string(64, 'a') + ".erofs";
  std::string noise(64, '\0');
  for (int i = 0; i < 2000; ++i) {
    UniqueFd fd = dial();
    ASSERT_TRUE(fd) << sock << ": " << std::strerror(errno);
    switch (i % 5) {
      case 0:  // noise, and gone without reading
        for (auto& c : noise) c = static_cast<char>(std::rand());
        (void)lw::WriteFull(fd.get(), noise.data(), noise.size());
        break;
      case 1:  // a name longer than any: closed unread
        EXPECT_EQ(ask(fd.get(), lw::kRead, "", 0, 1, 1u << 30), -1);
        break;
      case 2:  // an operation that is none
        EXPECT_EQ(ask(fd.get(), 'Z', unknown, 0, 0, static_cast<uint32_t>(unknown.size())), EINVAL);
        break;
      case 3:  // 4 GiB of an image this node does not have
        EXPECT_EQ(ask(fd.get(), lw::kRead, unknown, ~0ull - 5, ~0u, static_cast<uint32_t>(unknown.size())), ENOENT);
        break;
      default:  // half a header
        (void)lw::WriteFull(fd.get(), "R\x05", 2);
    }
  }
  UniqueFd fd = dial();
  ASSERT_TRUE(fd);
  EXPECT_EQ(ask(fd.get(), lw::kList, "", 0, 0, 0), 0) << "the socket serves on";
  fd.Reset();
  // The connections' threads have ended (each ends when its peer closes);
  // the next accept joins what is left of them.
  ASSERT_TRUE(WaitUntil([&] { return field_of("Threads:") <= threads_before + 8; }, std::chrono::seconds(10)))
      << field_of("Threads:") << " threads, " << threads_before << " before";
  fd = dial();
  ASSERT_TRUE(fd);
  EXPECT_EQ(ask(fd.get(), lw::kList, "", 0, 0, 0), 0);
  // Kept stacks would be 8 MiB each (16 GiB); malloc's arenas for new
  // threads reserve up to 64 MiB each (at most 8 per core), once.
  const long grown_kib = field_of("VmSize:") - vm_before;
  EXPECT_LT(grown_kib, 2L << 20) << "dsecd's address space grew by " << grown_kib << " KiB over 2 000 connections";
}

// Acceptance 2: a full cache evicts and keeps serving; the image service
// killed with -9 while reads wait for it: a read on a node with a short
// --image-fetch-timeout fails with EIO within it, a read on a node with the
// default one waits and completes once the service is back, with the
// source's bytes, and so does the failed one read again. (Last: it
// restarts the controller and a node.)
TEST_F(LazyImages, AFullCacheEvictsAndADeadImageServiceIsWaitedForOrFailsWithinItsBound) {
  constexpr double kCacheGib = 0.004;
  auto restarted = nodes_[2]->Restart({"--image-fetch-timeout", "3", "--image-cache-gib", std::to_string(kCacheGib)});
  ASSERT_TRUE(restarted.ok()) << restarted.ToString();
  ASSERT_TRUE(WaitUntil([] { return UpNodes() == kNodes; }, std::chrono::seconds(20)));
  ASSERT_TRUE(DropPageCache(2, fam1_));
  uint64_t fetched = Stat(2, "chunks_fetched");
  EXPECT_EQ(DigestOfLazyFile(2, fam1_), fam1_.digest) << "a cache smaller than the image serves it whole";
  EXPECT_GT(Stat(2, "chunks_fetched"), fetched) << "what was evicted is fetched again";
  EXPECT_GT(Stat(2, "evictions"), 0u);
  EXPECT_LE(Stat(2, "cached_bytes"), static_cast<uint64_t>(kCacheGib * double(1ull << 30)));

  auto waits = CreateOn(1, late_), fails = CreateOn(2, late_);
  ASSERT_TRUE(waits.ok() && fails.ok()) << waits.status().ToString() << fails.status().ToString();
  controller_->Kill9();
  std::string waited;
  std::thread reader([&] { waited = SumIn(*waits, "data/late"); });
  auto started = std::chrono::steady_clock::now();
  auto r = fails->Exec(Command({"/bin/sha256sum", "/data/late"}));
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->exit_code(), 0) << "read without the image service: " << r->stdout();
  EXPECT_THAT(r->stderr(), HasSubstr("error"));
  EXPECT_LT(took, 15.0) << "the read did not fail within its 3 s bound (and dsec-lazyfs's 8 s)";
  EXPECT_GT(Stat(2, "fetch_failures"), 0u);
  ASSERT_TRUE(controller_->Restart().ok());
  reader.join();
  EXPECT_EQ(waited, late_.sums.at("data/late")) << "the waiting read did not complete with the source's bytes";
  EXPECT_TRUE(WaitUntil([&] { return SumIn(*fails, "data/late") == late_.sums.at("data/late"); },
                        std::chrono::seconds(20)))
      << "the failed read, read again once the service is back";
  (void)waits->Destroy();
  (void)fails->Destroy();
}

}  // namespace
}  // namespace dsec::testing
