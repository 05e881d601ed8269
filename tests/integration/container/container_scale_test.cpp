// Containers at scale and over time, each with a daemon of its own:
//   - kill -9 of dsecd with 200 running containers: all re-adopted, all
//     answer an exec with the state they had;
//   - 10 000 creations and removals leave nothing: no mount, cgroup,
//     namespace, process, descriptor or file of the daemon's is left over
//     (counted before and after; DSEC_CLEANUP_COUNT overrides the count),
//     beyond the bounded pool of emptied cgroups kept for reuse;
//   - a container idle past the (shortened) idle period is frozen and still
//     answers, with its state; one doing background work is not frozen.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/container_fixture.hpp"
#include "tests/support/parallel.hpp"

namespace dsec::testing {
namespace {

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

// Every process below `root` (by parent links), root included.
std::vector<pid_t> Descendants(pid_t root) {
  std::vector<pid_t> all = {root};
  for (size_t i = 0; i < all.size(); ++i)
    for (pid_t c : ChildrenOf(all[i])) all.push_back(c);
  return all;
}

class ContainerScale : public ContainerTest {
 protected:
  static void SetUpTestSuite() {}
  void SetUp() override {}
  void Start(std::vector<std::string> args = {}, std::string cgroup_parent = "dsec-test") {
    TestDaemonOptions o;
    o.extra_args = std::move(args);
    o.cgroup_parent = cgroup_parent_ = std::move(cgroup_parent);
    auto skip = StartContainerDaemon(o, &daemon_, &client_);
    if (!client_) GTEST_SKIP() << skip;
  }
  void TearDown() override {
    ContainerTest::TearDown();
    client_.reset();
    daemon_.reset();
  }

  // What the daemon holds on the host, as counts.
  struct Footprint {
    size_t mounts = 0, cgroups = 0, processes = 0, namespaces = 0, fds = 0, sandbox_dirs = 0;
    std::string ToString() const {
      return "mounts " + std::to_string(mounts) + ", cgroups " + std::to_string(cgroups) + ", processes " +
             std::to_string(processes) + ", namespaces " + std::to_string(namespaces) + ", descriptors " +
             std::to_string(fds) + ", sandbox dirs " + std::to_string(sandbox_dirs);
    }
    bool operator==(const Footprint& o) const {
      return mounts == o.mounts && cgroups == o.cgroups && processes == o.processes && namespaces == o.namespaces &&
             fds == o.fds && sandbox_dirs == o.sandbox_dirs;
    }
  };
  static Footprint Measure() {
    Footprint f;
    std::ifstream mi("/proc/self/mountinfo");
    // Mounts of containers and images; the filesystem the sandbox dirs
    // live on (one for the data dir, sandbox_disk.hpp) is not one of them.
    std::string disk = " " + daemon_->data_dir() + "/sandboxes ";
    for (std::string line; std::getline(mi, line);)
      if (line.find(daemon_->data_dir()) != std::string::npos && line.find(disk) == std::string::npos) ++f.mounts;
    for (const auto& root : CgroupRoots())  // v1's hierarchies and v2's
      for (const auto& e : Entries(root + "/" + cgroup_parent_ + "/c"))
        if (e.rfind("sb-", 0) == 0) ++f.cgroups;
    std::set<std::string> ns;
    auto procs = Descendants(daemon_->pid());
    f.processes = procs.size();
    for (pid_t p : procs) {
      std::string base = "/proc/" + std::to_string(p);
      for (const char* kind : {"mnt", "pid", "net", "ipc", "uts"}) {
        char buf[64];
        ssize_t n = ::readlink((base + "/ns/" + kind).c_str(), buf, sizeof buf);
        if (n > 0) ns.insert(std::string(buf, static_cast<size_t>(n)));
      }
      f.fds += Entries(base + "/fd").size();
    }
    f.namespaces = ns.size();
    for (const auto& e : Entries(daemon_->data_dir() + "/sandboxes"))
      if (e.rfind("free.", 0) != 0) ++f.sandbox_dirs;  // kept empty dirs are checked apart
    return f;
  }
  static inline std::string cgroup_parent_ = "dsec-test";
};

TEST_F(ContainerScale, Kill9With200RunningContainersReadoptsThemAll) {
  Start();
  constexpr int kCount = 200;
  std::vector<Result<Sandbox>> boxes(kCount, Status::Internal("not created"));
  Parallel(kCount, 8, [&](int i) {
    auto sb = NewContainer();
    if (sb.ok() && ShIn(*sb, "echo " + sb->id() + " > /work/id; sleep 3600 > /dev/null 2>&1 &").verdict() != v1::VERDICT_OK)
      sb = Status::Internal("first exec failed");
    boxes[i] = std::move(sb);
  });
  for (auto& b : boxes) {
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    made_.push_back(*b);
  }
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart().ok());
  std::atomic<int> answered{0};
  std::mutex mu;
  std::vector<std::string> wrong;
  Parallel(kCount, 8, [&](int i) {
    const Sandbox& sb = *boxes[i];
    auto r = sb.Exec(Sh("cat /work/id; ps -e -o args | grep -c '^sleep 3600'"));
    if (r.ok() && r->stdout() == sb.id() + "\n1\n") {
      ++answered;
    } else {
      std::lock_guard<std::mutex> lk(mu);
      wrong.push_back(sb.id() + ": " + (r.ok() ? r->stdout() + r->stderr() + r->error() : r.status().ToString()));
    }
  });
  EXPECT_EQ(answered.load(), kCount) << (wrong.empty() ? "" : wrong.front());
  auto status = daemon_->Admin("stats");
  EXPECT_EQ(status["container"].value("containers", 0), kCount) << status.dump();
  Parallel(kCount, 8, [&](int i) { EXPECT_TRUE(boxes[i]->Destroy().ok()); });
  made_.clear();
  for (auto& b : boxes) EXPECT_EQ(Remains(b->id()), "");
}

TEST_F(ContainerScale, TenThousandCreatedAndRemovedLeaveNothing) {
  // A cgroup parent of its own: other tests' daemons share dsec-test.
  Start({}, "dsec-test-cleanup-" + std::to_string(::getpid()));
  int count = 10000;
  if (const char* c = std::getenv("DSEC_CLEANUP_COUNT")) count = std::atoi(c);
  // One container first, so the image mount and the spawner's own state
  // exist in both counts; it is removed before the second.
  auto first = NewContainer();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Footprint before = Measure();
  std::atomic<int> failed{0};
  std::mutex mu;
  std::string first_error;
  Parallel(count, 16, [&](int i) {
    auto sb = NewContainer();
    Status st = sb.ok() ? Status::Ok() : sb.status();
    if (st.ok() && i % 100 == 0) {
      // Some of them are used, with files and a process left running.
      auto r = ShIn(*sb, "echo x > /work/f; sleep 3600 > /dev/null 2>&1 &");
      if (r.verdict() != v1::VERDICT_OK) st = Status::Internal("exec: " + r.error());
    }
    if (sb.ok()) {
      Status d = sb->Destroy();
      if (st.ok()) st = d;
    }
    if (!st.ok()) {
      std::lock_guard<std::mutex> lk(mu);
      if (failed++ == 0) first_error = st.ToString();
    }
  });
  EXPECT_EQ(failed.load(), 0) << first_error;
  Footprint after = Measure();
  // The container spawner keeps up to --container-netns-pool (16) net
  // namespaces of removed containers for reuse, a descriptor each, and is
  // itself in the last one it checked: by that much, and no more, the two
  // counts may differ.
  constexpr size_t kNetnsPool = 16;
  Footprint expected = before;
  expected.namespaces = std::clamp(after.namespaces, before.namespaces, before.namespaces + 1);
  expected.fds = std::clamp(after.fds, before.fds, before.fds + kNetnsPool);
  EXPECT_TRUE(expected == after) << "before: " << before.ToString() << "\nafter:  " << after.ToString();
  // Emptied groups kept for reuse (renamed, not counted above): a bounded pool.
  size_t pool = 0;
  std::string groups = "/sys/fs/cgroup/memory/" + cgroup_parent_ + "/c/";
  for (const auto& e : Entries(groups)) {
    struct stat st;
    if (e.rfind("sb-", 0) != 0 && ::stat((groups + e).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) ++pool;
  }
  EXPECT_LE(pool, 256u);
  EXPECT_EQ(daemon_->Admin("stats")["container"].value("free_cgroups", -1), static_cast<int>(pool));
  // Emptied sandbox dirs kept for reuse: a bounded pool, each holding only
  // what a new container's dir holds.
  size_t dirs = 0;
  std::string sandboxes = daemon_->data_dir() + "/sandboxes/";
  for (const auto& e : Entries(sandboxes)) {
    if (e.rfind("free.", 0) != 0) continue;
    ++dirs;
    std::string d = sandboxes + e;
    EXPECT_EQ(Entries(d + "/upper").size() + Entries(d + "/work").size(), 0u) << d;
    EXPECT_EQ(Entries(d + "/run"), std::vector<std::string>{"agent"}) << d;
  }
  EXPECT_LE(dirs, 256u);
  EXPECT_EQ(daemon_->Admin("stats")["container"].value("free_dirs", -1), static_cast<int>(dirs));
  Status gone = first->Destroy();
  EXPECT_TRUE(gone.ok()) << gone.ToString();
  Footprint end = Measure();
  EXPECT_EQ(end.cgroups + end.sandbox_dirs + end.mounts, 0u) << end.ToString();
  auto stats = daemon_->Admin("stats");
  EXPECT_EQ(stats["container"].value("containers", -1), 0) << stats.dump();
}

TEST_F(ContainerScale, IdleContainerIsFrozenAndStillAnswersWithItsState) {
  Start({"--container-idle-freeze", "0.3"});
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "echo kept > /work/state").verdict(), v1::VERDICT_OK);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (FreezerState(sb->id()) != "FROZEN" && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the kernel's freezer state
  ASSERT_EQ(FreezerState(sb->id()), "FROZEN") << "an idle container was not frozen";
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING) << "idle freezing is not a pause the user sees";
  // The next call thaws it; the caller notices nothing.
  auto r = ShIn(*sb, "cat /work/state");
  EXPECT_EQ(r.verdict(), v1::VERDICT_OK) << r.error();
  EXPECT_EQ(r.stdout(), "kept\n");
  auto file = sb->ReadFile("/work/state");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(*file, "kept\n");
  EXPECT_GE(daemon_->Admin("stats")["container"].value("idle_freezes", 0), 1);

  // A container busy in the background is not idle.
  auto busy = Make();
  ASSERT_TRUE(busy.ok()) << busy.status().ToString();
  ASSERT_EQ(ShIn(*busy, "(while :; do :; done) > /dev/null 2>&1 &").verdict(), v1::VERDICT_OK);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // five idle periods, in which it must stay awake
  EXPECT_EQ(FreezerState(busy->id()), "THAWED") << "a container doing background work was frozen";
  Destroy(*busy);
  Destroy(*sb);
}

}  // namespace
}  // namespace dsec::testing
