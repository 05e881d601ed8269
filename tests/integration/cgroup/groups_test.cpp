// cgroup::Groups, the one interface a container's group is driven through,
// run against each hierarchy this host mounts: the v1 controllers and a
// cgroup2 mount (on a hybrid host: /sys/fs/cgroup/unified, which holds few
// controllers, so its limits are refused, saying which). Real groups, real
// processes; each test removes what it made.
#include "drivers/cgroup/groups.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <cstdio>
#include <memory>
#include <string>


namespace dsec::cgroup {
namespace {

// "v1" or "v2": the backend under test, or why this host has none.
std::unique_ptr<Groups> Open(const std::string& version, std::string* skip) {
  if (::geteuid() != 0) {
    *skip = "cgroups need root";
    return nullptr;
  }
  if (version == "v1") {
    // Whether the host has v1 is read off /proc/mounts, apart from the
    // product: a v1 memory hierarchy mounted and not discovered fails.
    std::ifstream mounts("/proc/mounts");
    bool v1_memory = false;
    for (std::string dev, dir, type, opts, rest; mounts >> dev >> dir >> type >> opts && std::getline(mounts, rest);)
      v1_memory = v1_memory || (type == "cgroup" && ("," + opts + ",").find(",memory,") != std::string::npos);
    auto m = DiscoverCgroupMounts();
    if (!v1_memory) {
      *skip = "no cgroup v1 memory hierarchy mounted here (/proc/mounts)";
      return nullptr;
    }
    EXPECT_TRUE(m.ok()) << "/proc/mounts has a v1 memory hierarchy the product did not find: " << m.status().ToString();
    return m.ok() ? Groups::V1(*m) : nullptr;
  }
  std::string mnt = Groups::V2Mount();
  if (mnt.empty()) *skip = "no cgroup2 filesystem mounted on this host";
  return mnt.empty() ? nullptr : Groups::V2(mnt);
}

// A child process that waits: for `go` (then burns `burn_ms` of CPU, says
// so on `done`, and waits again), or forever.
struct Child {
  pid_t pid = -1;
  int go = -1, done = -1;
  static Child Start(int burn_ms = 0, bool fork_one_more = false) {
    int a[2], b[2];
    if (::pipe(a) < 0 || ::pipe(b) < 0) return {};
    pid_t pid = ::fork();
    if (pid == 0) {
      char c;
      if (::read(a[0], &c, 1) != 1) ::_exit(1);
      if (fork_one_more && ::fork() == 0)
        for (;;) ::pause();
      // Counted from here, not from the fork: under TCG the child's side of
      // the fork (its copy-on-write faults) costs milliseconds of CPU that
      // were spent before it joined any group.
      auto cpu_ms = [] {
        timespec t{};
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
        return t.tv_sec * 1000 + t.tv_nsec / 1000000;
      };
      for (long start = cpu_ms(); burn_ms && cpu_ms() - start < burn_ms;) {
      }
      (void)!::write(b[1], "x", 1);
      for (;;) ::pause();
    }
    ::close(a[0]);
    ::close(b[1]);
    return Child{pid, a[1], b[0]};
  }
  // Lets it run, and waits until it has done what it was started for.
  bool Go() {
    char c = 'g';
    return ::write(go, &c, 1) == 1 && ::read(done, &c, 1) == 1;
  }
  // Reaps it: true when it was killed by SIGKILL.
  bool Killed() {
    int st = 0;
    bool killed = ::waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    ::close(go);
    ::close(done);
    pid = -1;
    return killed;
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      ::close(go);
      ::close(done);
    }
  }
};

class GroupsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string skip;
    groups_ = Open(GetParam(), &skip);
    if (!groups_) GTEST_SKIP() << skip;
    EXPECT_EQ(groups_->version(), GetParam());
    rel_ = parent_ + "/g" + std::to_string(::getpid());
    ASSERT_TRUE(groups_->Make(rel_).ok());
  }
  void TearDown() override {
    if (!groups_) return;
    groups_->KillAndRemove(rel_);
    groups_->KillAndRemove(rel_ + "-renamed");
    groups_->RemoveDirs(parent_);
    EXPECT_FALSE(groups_->Exists(rel_)) << "the test leaves no group behind";
  }
  // Puts `pid` in the group the way a container's init joins: its cgroup.procs files.
  void Join(pid_t pid, const std::string& rel) {
    for (const auto& p : groups_->ProcsPaths(rel))
      ASSERT_TRUE(WriteProcs(p, pid)) << p;
  }
  static bool WriteProcs(const std::string& path, pid_t pid) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    bool ok = std::fprintf(f, "%d", pid) > 0;
    return std::fclose(f) == 0 && ok;
  }

  const std::string parent_ = "dsec-test";
  std::unique_ptr<Groups> groups_;
  std::string rel_;
};

TEST_P(GroupsTest, AProcessThatJoinsIsListedFrozenThawedAndKilledWithTheGroup) {
  Child c = Child::Start();
  ASSERT_GT(c.pid, 0);
  Join(c.pid, rel_);
  EXPECT_EQ(groups_->Pids(rel_), std::vector<pid_t>{c.pid});
  if (groups_->CanFreeze()) {
    ASSERT_TRUE(groups_->Freeze(rel_, true).ok());
    EXPECT_TRUE(groups_->Frozen(rel_));
    ASSERT_TRUE(groups_->Freeze(rel_, false).ok());
    EXPECT_FALSE(groups_->Frozen(rel_));
  }
  EXPECT_TRUE(groups_->Empty(rel_));
  EXPECT_TRUE(c.Killed());
  EXPECT_TRUE(groups_->Pids(rel_).empty());
  EXPECT_TRUE(groups_->Exists(rel_)) << "emptied, not removed";
}

TEST_P(GroupsTest, AFrozenGroupIsEmptiedAndLeftThawed) {
  if (!groups_->CanFreeze()) GTEST_SKIP() << "no freezer in this hierarchy";
  Child c = Child::Start();
  Join(c.pid, rel_);
  ASSERT_TRUE(groups_->Freeze(rel_, true).ok());
  EXPECT_TRUE(groups_->Empty(rel_));
  EXPECT_TRUE(c.Killed());
  EXPECT_FALSE(groups_->Frozen(rel_));
}

TEST_P(GroupsTest, ARenamedGroupKeepsItsProcessesWhereTheHierarchyRenames) {
  Child c = Child::Start();
  Join(c.pid, rel_);
  std::string to = rel_ + "-renamed";
  Status renamed = groups_->Rename(rel_, to);
  if (!groups_->CanRename()) {
    // cgroup v2: refused, saying so, and nothing changed.
    EXPECT_EQ(renamed.code(), Status::Code::kUnimplemented) << renamed.ToString();
    EXPECT_TRUE(groups_->Exists(rel_));
    EXPECT_FALSE(groups_->Exists(to));
    EXPECT_EQ(groups_->Pids(rel_), std::vector<pid_t>{c.pid});
    groups_->KillAndRemove(rel_);
    EXPECT_TRUE(c.Killed());
    return;
  }
  ASSERT_TRUE(renamed.ok()) << renamed.ToString();
  EXPECT_FALSE(groups_->Exists(rel_));
  EXPECT_EQ(groups_->Pids(to), std::vector<pid_t>{c.pid});
  auto names = groups_->List(parent_);
  EXPECT_NE(std::find(names.begin(), names.end(), "g" + std::to_string(::getpid()) + "-renamed"), names.end());
  EXPECT_FALSE(groups_->Rename(rel_, to).ok()) << "renaming a group that is not there fails";
  groups_->KillAndRemove(to);
  EXPECT_TRUE(c.Killed());
  EXPECT_FALSE(groups_->Exists(to));
}

TEST_P(GroupsTest, StoppingAContainerKillsItsInitAndWhatIsLeft) {
  for (bool frozen : {false, true}) {
    if (frozen && !groups_->CanFreeze()) continue;
    Child c = Child::Start(0, /*fork_one_more=*/true);
    Join(c.pid, rel_);
    ASSERT_TRUE(c.Go());  // it has forked its own child, in the group too
    EXPECT_EQ(groups_->Pids(rel_).size(), 2u);
    if (frozen) {
      ASSERT_TRUE(groups_->Freeze(rel_, true).ok());
    }
    EXPECT_TRUE(groups_->StopContainer(rel_, c.pid, frozen)) << (frozen ? "frozen" : "running");
    EXPECT_TRUE(c.Killed());
    EXPECT_TRUE(groups_->Pids(rel_).empty());
  }
}

TEST_P(GroupsTest, CpuUsageCountsWhatItsProcessesRan) {
  Child c = Child::Start(/*burn_ms=*/50);
  Join(c.pid, rel_);
  uint64_t before = groups_->CpuUsageNs(rel_);
  ASSERT_TRUE(c.Go());
  EXPECT_GE(groups_->CpuUsageNs(rel_) - before, 40'000'000u) << "50 ms of CPU burnt inside";
  EXPECT_EQ(groups_->OomKills(rel_), 0u);
}

// A limit is written, or refused naming the controller that is missing;
// never dropped. No limit at all needs no controller.
TEST_P(GroupsTest, LimitsAreWrittenOrRefusedSayingWhichControllerIsMissing) {
  GroupLimits have = GroupLimits::Fresh();
  EXPECT_TRUE(groups_->ApplyLimits(rel_, GroupLimits::Fresh(), &have).ok());
  GroupLimits want{64ll << 20, 10, 50'000};
  Status st = groups_->ApplyLimits(rel_, want, &have);
  if (st.ok()) {
    EXPECT_EQ(have.memory, want.memory);
    EXPECT_EQ(have.pids, want.pids);
    EXPECT_EQ(have.cpu_quota, want.cpu_quota);
    return;
  }
  ASSERT_EQ(GetParam(), "v2") << "v1 has every controller dsec needs: " << st.ToString();
  EXPECT_EQ(st.code(), Status::Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("controller is not available"), std::string::npos) << st.message();
  EXPECT_EQ(have.memory, GroupLimits::kUnknown) << "a limit not written is not recorded as written";
}

// The spawner's pooled run group: a process joins through the open
// cgroup.procs, limits are written through open files, and the counters
// count from ResetCounters. On a hierarchy without the controllers a run
// needs, making one is refused naming the controller.
TEST_P(GroupsTest, ARunSlotCountsARunFromItsResetAndIsRemovedWhole) {
  std::string rel = rel_ + "/r0";
  auto made = groups_->MakeRunSlot(rel);
  // Whether the hierarchy has a run's controllers, read off the host: v1
  // has them; v2 lists them in its cgroup.controllers.
  bool has_all = GetParam() == "v1";
  if (!has_all) {
    std::ifstream in(Groups::V2Mount() + "/cgroup.controllers");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(all.begin(), all.end(), '\n', ' ');
    all = " " + all + " ";
    has_all = true;
    for (const char* c : {" memory", " pids", " cpu"}) has_all = has_all && all.find(std::string(c) + " ") != std::string::npos;
  }
  if (has_all) ASSERT_TRUE(made.ok()) << "the hierarchy has every controller a run needs: " << made.status().ToString();
  if (!made.ok()) {
    EXPECT_EQ(made.status().code(), Status::Code::kFailedPrecondition) << made.status().ToString();
    EXPECT_NE(made.status().message().find("controller is not available"), std::string::npos) << made.status().message();
    EXPECT_FALSE(groups_->Exists(rel)) << "a slot that could not be made leaves no group";
    GTEST_SKIP() << "the cgroup v2 hierarchy on this host lacks a run's controllers (" << made.status().message()
                 << "); the v2 run group needs a host that mounts cgroup v2 alone";
  }
  std::unique_ptr<RunSlot> slot = std::move(*made);
  ASSERT_FALSE(slot->JoinFds().empty());
  ASSERT_TRUE(slot->SetMemoryLimit(256ull << 20).ok());
  ASSERT_TRUE(slot->SetPidsMax(8).ok());
  ASSERT_TRUE(slot->SetCpuQuota(900).ok());
  ASSERT_TRUE(slot->SetCpuQuota(0).ok()) << "back to no quota";

  Child first = Child::Start(/*burn_ms=*/30);
  std::string pid = std::to_string(first.pid);
  for (int fd : slot->JoinFds()) ASSERT_EQ(::pwrite(fd, pid.data(), pid.size(), 0), static_cast<ssize_t>(pid.size()));
  for (int fd : slot->CpuJoinFds()) ASSERT_EQ(::pwrite(fd, pid.data(), pid.size(), 0), static_cast<ssize_t>(pid.size()));
  slot->ResetCounters(true);
  ASSERT_TRUE(first.Go());
  EXPECT_GE(slot->CpuUsageNs(), 20'000'000u) << "30 ms of CPU burnt inside";
  EXPECT_GT(slot->PeakBytes(), 0u);
  uint64_t oom0 = slot->OomKills();
  EXPECT_EQ(oom0, 0u);
  ::kill(first.pid, SIGKILL);
  EXPECT_TRUE(first.Killed());

  // The next run counts from its own start.
  slot->ResetCounters(true);
  EXPECT_LT(slot->CpuUsageNs(), 20'000'000u) << "the last run's CPU is not counted again";
  if (slot->Reusable()) {
    EXPECT_TRUE(groups_->Exists(rel));
  }
  slot->Remove();
  EXPECT_FALSE(groups_->Exists(rel));
}

// A spawner that died leaves its groups (sp<pid>); the next one removes
// them, and only them.
TEST_P(GroupsTest, StaleSpawnerGroupsAreSweptAndLiveOnesKept) {
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  std::string stale = rel_ + "/sp" + std::to_string(dead), live = rel_ + "/sp" + std::to_string(::getpid());
  ASSERT_TRUE(groups_->Make(stale + "/r0").ok());
  ASSERT_TRUE(groups_->Make(live + "/r0").ok());
  Child c = Child::Start();
  Join(c.pid, stale + "/r0");
  EXPECT_EQ(groups_->SweepStaleSpawners(rel_) > 0, true);
  EXPECT_TRUE(c.Killed()) << "what the dead spawner left running is killed";
  EXPECT_FALSE(groups_->Exists(stale));
  EXPECT_TRUE(groups_->Exists(live + "/r0"));
  groups_->KillAndRemove(live);
}

INSTANTIATE_TEST_SUITE_P(Hierarchies, GroupsTest, ::testing::Values("v1", "v2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace dsec::cgroup
