// Limits hit only the offender: a memory hog in container A is killed with
// a memory-limit verdict while A's agent and container B live on; a
// recycled cgroup holds its new container's limits; the agent stays out of
// reach of what its programs do (stopping everything, the OOM killer). Fork
// bombs against the pids limit are tried in every kind
// (sandbox_fork_bomb_test.cpp).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"


namespace dsec::testing {
namespace {

// A file of a container's group, whichever hierarchy dsecd drives (its
// stats say): by its v1 controller and name, or its name in the one v2
// directory. Run on a cgroup v1 host, and inside a guest that mounts cgroup
// v2 alone (tests/integration/cgroup/cgroup_v2_guest_test.cpp).
struct Group {
  bool v2;
  std::string id;
  std::string File(const std::string& v1_ctrl, const std::string& v1_file, const std::string& v2_file) const {
    std::ifstream in(v2 ? "/sys/fs/cgroup/dsec-test/c/" + id + "/" + v2_file
                        : "/sys/fs/cgroup/" + v1_ctrl + "/dsec-test/c/" + id + "/" + v1_file);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  std::string MemoryLimit() const { return File("memory", "memory.limit_in_bytes", "memory.max"); }
  // What may be swapped on top of the memory limit: none. v1 counts memory
  // and swap together (memsw, where the kernel accounts swap), v2 apart.
  std::string SwapLimitAsWritten() const {
    return File("memory", "memory.memsw.limit_in_bytes", "memory.swap.max");
  }
  std::string Pids(const std::string& file) const { return File("pids", file, file); }
  // "<quota> <period>" in microseconds.
  std::string CpuMax() const {
    if (v2) return File("", "", "cpu.max");
    return File("cpu", "cpu.cfs_quota_us", "") + " " + File("cpu", "cpu.cfs_period_us", "");
  }
  uint64_t OomKills() const {
    std::string s = File("memory", "memory.oom_control", "memory.events");
    auto pos = s.find("oom_kill ");
    return pos == std::string::npos ? 0 : std::stoull(s.substr(pos + 9));
  }
};

class ContainerLimits : public ContainerTest {
 protected:
  // The group of `sb`, in the hierarchy dsecd says it drives.
  static Group GroupOf(const Sandbox& sb) {
    std::string version = daemon_->Admin("stats")["container"].value("cgroup", "");
    EXPECT_TRUE(version == "v1" || version == "v2") << "dsecd's stats name no cgroup version: " << version;
    return Group{version == "v2", sb.id()};
  }
  // Why the agent's oom_score_adj cannot be lowered here, "" when it can:
  // the container spawner, which sets it to -900, needs CAP_SYS_RESOURCE in
  // its effective set (root has it unless the host withholds it from dsecd,
  // as a container may). Asked of the kernel up front, not read off the score.
  static std::string NoCapSysResource() {
    constexpr int kCapSysResource = 24;
    int spawner = daemon_->Admin("stats")["container"].value("spawner_pid", 0);
    EXPECT_GT(spawner, 0) << "no container spawner pid in dsecd's stats";
    if (spawner <= 0 || HasCapability(spawner, kCapSysResource)) return "";
    return "the container spawner (pid " + std::to_string(spawner) + ", dsecd's " + std::to_string(daemon_->pid()) +
           ") runs without CAP_SYS_RESOURCE on this host (CapEff in /proc/<pid>/status): the agent's "
           "oom_score_adj cannot be lowered";
  }
};

TEST_F(ContainerLimits, MemoryHogIsKilledAndNothingElse) {
  v1::Limits small;
  small.set_memory_bytes(64 << 20);
  auto a = Make(small);
  auto b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  ASSERT_EQ(ShIn(*b, "sleep 1000 > /dev/null 2>&1 & echo $! > /tmp/bg").verdict(), v1::VERDICT_OK);
  ASSERT_EQ(ShIn(*a, "echo kept > /work/state").verdict(), v1::VERDICT_OK);
  Group ga = GroupOf(*a), gb = GroupOf(*b);
  EXPECT_EQ(ga.MemoryLimit(), std::to_string(64 << 20));

  // 256 MiB of touched memory in a 64 MiB container.
  auto hog = Exec(*a, Command({"python3", "-c", "x = b'\\x01' * (256 << 20); print(len(x))"}));
  EXPECT_EQ(hog.verdict(), v1::VERDICT_MEMORY_LIMIT) << v1::Verdict_Name(hog.verdict()) << ": " << hog.error();
  EXPECT_EQ(hog.signal(), SIGKILL);
  EXPECT_GE(ga.OomKills(), 1u);

  // A's agent was not the victim: A answers, with its state.
  auto after = ShIn(*a, "cat /work/state; cat /proc/1/comm");
  EXPECT_EQ(after.verdict(), v1::VERDICT_OK) << after.error();
  EXPECT_EQ(after.stdout(), "kept\nagent\n");
  // B saw nothing of it: no OOM kill there, its sleep alive, it answers.
  EXPECT_EQ(gb.OomKills(), 0u);
  auto bg = ShIn(*b, "kill -0 $(cat /tmp/bg) && echo alive");
  EXPECT_EQ(bg.stdout(), "alive\n") << bg.stderr();
  Destroy(*a);
  Destroy(*b);
}

TEST_F(ContainerLimits, ARecycledGroupHoldsTheLimitsOfItsNewContainer) {
  // A removed container's group is kept for the next one with the limits it
  // had (cgroup v1); the next container's own must be in force, whatever
  // they are. cgroup v2 renames no group, so each container has a new one:
  // its limits must be in force all the same.
  auto free_groups = [] { return daemon_->Admin("stats")["container"].value("free_cgroups", -1); };
  v1::Limits first;
  first.set_memory_bytes(300 << 20);
  first.set_pids(40);
  first.set_cpu_millis(500);
  auto a = Make(first);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  bool v2 = GroupOf(*a).v2;
  Destroy(*a);
  int free_after = free_groups();
  if (v2) {
    EXPECT_EQ(free_after, 0) << "cgroup v2 cannot rename a group: none is kept";
  } else {
    ASSERT_GE(free_after, 1) << "the removed container's group was not kept";
  }
  v1::Limits next;
  next.set_memory_bytes(200 << 20);
  next.set_pids(20);
  next.set_cpu_millis(250);
  // Different limits, then the same ones again (nothing to write).
  for (int round = 0; round < 2; ++round) {
    auto sb = Make(next);
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    if (!v2) {
      EXPECT_EQ(free_groups(), free_after - 1) << "round " << round << ": the container did not take a kept group";
    }
    auto rec = sb->Get();
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    const v1::Limits& l = rec->spec().limits();
    EXPECT_EQ(l.memory_bytes(), 200u << 20);
    Group g = GroupOf(*sb);
    EXPECT_EQ(g.MemoryLimit(), std::to_string(200 << 20)) << round;
    std::string swap = g.SwapLimitAsWritten();
    if (v2) {
      EXPECT_EQ(swap, "0") << round << ": no swap on top of the memory limit";
    } else if (!swap.empty()) {
      EXPECT_EQ(swap, std::to_string(200 << 20)) << round;
    }
    EXPECT_EQ(g.Pids("pids.max"), "21") << round << ": 20 and the agent";
    EXPECT_EQ(g.CpuMax(), "25000 100000") << round;
    // The limit holds: of 22 sleeps, those beyond pids.max do not start.
    // (The shell exits at the first fork that fails.)
    (void)ShIn(*sb, "for i in $(seq 22); do sleep 30 > /dev/null 2>&1 & done");
    int now = std::stoi(g.Pids("pids.current"));
    EXPECT_LE(now, 21) << round << ": more processes than pids.max allows";
    EXPECT_GE(now, 15) << round << ": the sleeps did not start";
    Destroy(*sb);
  }
}

// A program that keeps stopping every process of its container (as root it
// may, except PID 1) catches execs between the agent's clone and execve.
// The agent must not wait on such a child forever: every exec gets an
// answer, and once the program is done the container works as before.
TEST_F(ContainerLimits, AProgramStoppingEverythingDoesNotWedgeTheAgent) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto stopper_req = Command({"python3", "-c",
                              "import os, signal, time\n"
                              "open('/tmp/stopping', 'w').close()\n"  // the execs below start once it runs
                              "end = time.time() + 4\n"
                              "n = 0\n"
                              "while time.time() < end:\n"
                              "    try:\n"
                              "        os.kill(-1, signal.SIGSTOP)\n"  // everything but PID 1 and itself
                              "        n += 1\n"
                              "    except ProcessLookupError:\n"
                              "        pass\n"  // nothing else running right now
                              "print(n)\n"});
  stopper_req.mutable_limits()->set_timeout_ms(10000);
  auto stopper = sb->ExecAsync(stopper_req);
  // Python takes a while to start (seconds in an emulated guest under
  // load): the execs go once the stopper is running, not before.
  auto wait_start = std::chrono::steady_clock::now();
  while (!sb->ReadFile("/tmp/stopping").ok()) {
    ASSERT_LT(std::chrono::steady_clock::now() - wait_start, std::chrono::seconds(30)) << "the stopper never started";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls the sandbox's state
  }
  auto t0 = std::chrono::steady_clock::now();
  int answered = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
    auto req = Command({"/bin/true"});
    req.mutable_limits()->set_timeout_ms(1000);
    auto r = sb->Exec(req);  // any verdict; the point is that it comes back
    ASSERT_TRUE(r.ok()) << "exec " << answered << " got no answer: " << r.status().ToString();
    ++answered;
  }
  EXPECT_GT(answered, 0);
  ASSERT_EQ(stopper.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "the stopper never ended";
  // It did stop processes while the execs ran (n: its kills that found one).
  auto stopped = stopper.get();
  ASSERT_TRUE(stopped.ok()) << stopped.status().ToString();
  EXPECT_GT(std::atoi(stopped->stdout().c_str()), 0) << "the stopper never found a process to stop: "
                                                      << stopped->stdout() << stopped->stderr();
  auto again = ShIn(*sb, "echo still here");
  EXPECT_EQ(again.verdict(), v1::VERDICT_OK) << again.error() << again.stderr();
  EXPECT_EQ(again.stdout(), "still here\n");
  Destroy(*sb);
}

// The agent (PID 1) runs at oom_score_adj -900, so a container's OOM kills
// the program that ran out rather than the agent; programs run at 0. Running
// them must not take the agent's protection away: a child that shares the
// agent's memory until its exec (CLONE_VM) and writes its own score there
// sets the agent's too (and walks every process on the host).
TEST_F(ContainerLimits, AProgramCannotTakeTheAgentsPlaceBeforeTheOomKiller) {
  // A program at -1000 would never be the OOM victim: the agent (-900)
  // would be killed for it, or a host-wide OOM would spare it. Its floor is
  // the one the spawner set for the agent, which it cannot go below.
  if (auto why = NoCapSysResource(); !why.empty()) GTEST_SKIP() << why;
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  int agent = 1;
  std::ifstream(std::string("/proc/") + std::to_string(InitPid(*sb)) + "/oom_score_adj") >> agent;
  ASSERT_EQ(agent, -900) << "the agent is not protected from the OOM killer";
  auto r = Exec(*sb, Command({"python3", "-c",
                              "import errno, os\n"
                              "for v in (b'-1000', b'-901'):\n"
                              "    fd = os.open('/proc/self/oom_score_adj', os.O_WRONLY)\n"
                              "    try:\n"
                              "        os.write(fd, v)\n"
                              "        print('lowered')\n"
                              "    except OSError as e:\n"
                              "        print(errno.errorcode[e.errno])\n"
                              "    os.close(fd)\n"
                              "print(open('/proc/self/oom_score_adj').read().strip())\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << r.stderr();
  EXPECT_EQ(r.stdout(), "EACCES\nEACCES\n0\n");
  Destroy(*sb);
}

TEST_F(ContainerLimits, ProgramsRunAtOomScoreZeroAndTheAgentKeepsItsProtection) {
  if (auto why = NoCapSysResource(); !why.empty()) GTEST_SKIP() << why;
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  int pid = InitPid(*sb);
  ASSERT_GT(pid, 0);
  auto agent_score = [pid] {
    std::ifstream in("/proc/" + std::to_string(pid) + "/oom_score_adj");
    int v = 1;
    in >> v;
    return v;
  };
  // Before any exec: the protection the execs must not take away.
  ASSERT_EQ(agent_score(), -900) << "the agent is not protected from the OOM killer";
  // The agent's stdin write comes after it set the program's score: `read`
  // returning orders the check after it.
  auto req = Sh("read go; cat /proc/self/oom_score_adj");
  req.set_stdin("go\n");
  auto r = Exec(*sb, req);
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << r.stderr();
  EXPECT_EQ(r.stdout(), "0\n");
  for (int i = 0; i < 3; ++i) ASSERT_EQ(ShIn(*sb, "true").verdict(), v1::VERDICT_OK);
  EXPECT_EQ(agent_score(), -900) << "running programs reset the agent's oom_score_adj";
  Destroy(*sb);
}

}  // namespace
}  // namespace dsec::testing
