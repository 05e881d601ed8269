// Internal to dsec-spawner (spawner.cpp, spawner_pool.cpp): the Spawner
// class and the per-runner record. spawner.cpp holds the event loop, the
// protocol with dsecd and the life of a run; spawner_pool.cpp keeps the warm
// pool: creating runners and the cgroups, namespaces and stacks they use.
#pragma once

#include "drivers/spawner/spawner.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <unordered_map>
#include <vector>

#include "drivers/spawner/container_init.hpp"
#include "drivers/cgroup/groups.hpp"
#include "drivers/spawner/ns_pool.hpp"
#include "drivers/spawner/runner.hpp"
#include "drivers/spawner/sandbox_root.hpp"
#include "drivers/spawner/seccomp_filter.hpp"
#include "drivers/spawner/spawner.pb.h"
#include "runtime/frame.hpp"


namespace dsec::fncall {
// The spawner's cgroups (drivers/cgroup/).
using cgroup::RunSlot;
}  // namespace dsec::fncall

namespace dsec::fncall::internal {

inline int64_t NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// epoll tags: (key << 2) | stream. Keys 0 and 1 are the dsecd socket and the
// signalfd; runners count up from 2.
enum Stream : uint64_t { kCtl = 0, kOut = 1, kErr = 2, kIn = 3 };
constexpr uint64_t kControlKey = 0, kSignalKey = 1, kNotifyKey = 2;

enum class State { kStarting, kReady, kRunning };

constexpr int64_t kCpuCheckNs = 50'000'000;  // how often CPU-time limits are checked

struct Runner {
  Runner() = default;
  Runner(const Runner&) = delete;
  ~Runner() = default;
  uint64_t key = 0;
  pid_t pid = -1;
  State state = State::kStarting;
  UniqueFd ctl, out, err, in;
  // Shared with the runner process (CLONE_VM); see runner.hpp.
  RunnerShared shared;
  RunnerStart start{};
  void* stack = nullptr;
  std::vector<std::string> storage;  // argv, env and exec candidates of the run
  std::vector<char*> argv, envp;
  std::vector<const char*> candidates;
  int slot = -1, netns = -1, ipcns = -1;
  bool exited = false, ctl_eof = false, out_eof = false, err_eof = false;
  std::string setup_error;
  // The run, once assigned.
  uint64_t run_id = 0;
  std::string stdin_data;
  size_t stdin_off = 0;
  uint64_t output_cap = 0, cpu_time_ms = 0;
  std::string out_buf, err_buf;
  bool out_trunc = false, err_trunc = false;
  bool timed_out = false, output_exceeded = false, killed = false, kill_sent = false, cpu_exceeded = false;
  std::string kill_reason;
  std::string platform_error;  // the spawner failed this run
  int64_t start_ns = 0, deadline_ns = 0;
  uint64_t oom0 = 0;
  uint64_t cpu_us = 0;  // from wait4: the runner and everything it reaped
};

class Spawner {
 public:
  explicit Spawner(const SpawnerOptions& o) : opts_(o) {
    // Released namespaces refill the pool up to its size and no further, so
    // the spawner holds no more of them after a burst than before it.
    container_netns_.set_max_free(o.container_netns);
  }
  int Main();

 private:
  // Setup; returns "" or why fncall cannot work on this host.
  std::string Init();
  void Loop();
  void Shutdown();

  void Send(spawner::Event& ev);
  void Log(int level, const std::string& text);
  void FlushControl();
  void OnControlReadable();
  void OnRequest(spawner::Request& req);
  void OnSignal();
  void OnRunnerEvent(uint64_t key, uint64_t stream, uint32_t events);
  void OnRunnerCtl(Runner& r);
  void ReadOutput(Runner& r, bool is_err);
  void WriteStdin(Runner& r);
  void CheckDone(Runner& r);
  void Finish(Runner& r);
  void Discard(Runner& r);
  void Kill(Runner& r, const char* why);
  void Dispatch();
  void Go(Runner& r, spawner::Run& run);
  void PrepareRun(Runner& r, const spawner::Run& run);
  void Refill();
  void CreateContainer(const spawner::CreateContainer& req);
  // A container init's status pipe reported EOF: it executed the agent or
  // failed; answers dsecd and frees what the init used.
  void OnInitDone(uint64_t key);
  void ContainerGone(pid_t pid);
  // Containers' seccomp listeners (denials.cpp): each init sends its own on
  // notify_rx_ before it executes the agent; each notification is answered
  // EPERM and counted, and the counts go to dsecd once per loop.
  Status OpenNotify();
  void OnNotifyReadable();
  // poll_first: not called for its readiness (a Flush), so a receive
  // is tried only when poll says one is pending.
  void OnListener(uint64_t key, uint32_t events, bool poll_first = false);
  void FlushDenied();
  UniqueFd notify_rx_, notify_tx_;
  struct Listener {
    UniqueFd fd;
    std::string sandbox_id;
    pid_t agent_pid = 0;        // its PID 1 on the host: its own file calls (dsecd's) are not counted
    std::set<uint64_t> mounts;  // its container's mount ids, read at the first watched write
  };
  void AddListener(UniqueFd listener, const std::string& sandbox_id, pid_t agent_pid);
  // Watched writes (write_watch.cpp): counted when refused by a read-only
  // mount, always let go on.
  void AnswerWrite(Listener& l, const WatchedWrite& w, const seccomp_notif& req);
  bool OnReadOnlyMount(Listener& l, int proc, pid_t pid, int dirfd, const std::string& path, bool follow);
  void AdoptListener(const spawner::AdoptListener& req);
  // Request.flush: the sandbox's pending notifications, then every count, then Flushed.
  void FlushFor(const spawner::Flush& req);
  std::unordered_map<int, const WatchedWrite*> watched_writes_;  // by syscall number (with opts_.watch_writes)
  std::unordered_map<uint64_t, Listener> listeners_;  // epoll key -> listener
  std::map<std::string, std::map<std::string, uint64_t>> denied_;  // not sent yet
  std::map<std::string, std::map<std::string, uint64_t>> writes_;  // "<call> <path>" refused, not sent yet
  SeccompProgram container_seccomp_;
  sock_fprog container_seccomp_prog_{};
  // The same with WatchedWrites notified too, for containers that ask
  // (CreateContainer.watch_writes) when opts_.watch_writes.
  SeccompProgram watching_seccomp_;
  sock_fprog watching_seccomp_prog_{};
  // Net namespaces of live containers we keep a descriptor for (to recycle
  // them); past this, a container's namespace is simply not recycled.
  static constexpr size_t kMaxTrackedContainerNetns = 4096;
  void RunnerFailed(const std::string& why);
  void CheckCpuTime(int64_t now);
  bool SpawnRunner();
  int AcquireSlot();
  void ReleaseSlot(int slot);
  void* AcquireStack();
  void ReleaseStack(Runner& r);
  void ReleaseNamespaces(Runner& r);
  void FailRun(uint64_t id, const std::string& why);
  void SendStats();

  SpawnerOptions opts_;
  UniqueFd epoll_, sigfd_;
  int control_ = -1;
  FrameDecoder control_dec_;
  std::string control_out_;
  bool control_eof_ = false, shutting_down_ = false;
  std::unique_ptr<cgroup::Groups> groups_;  // v1 or v2, whichever the host mounts
  std::string group_base_;
  UniqueFd root_ns_;   // always kSlotRoot
  UniqueFd container_base_ns_;  // containers only: BuildContainerBaseNamespace
  UniqueFd devnull_;   // fills unused runner slots
  SeccompProgram seccomp_;
  std::string work_opts_, tmp_opts_;
  sock_fprog seccomp_prog_{};
  // Run groups by index (<group_base_>/r<index>); null when a single-use
  // one (RunSlot::Reusable) could not be made again: that index is retired.
  std::vector<std::unique_ptr<RunSlot>> slots_;
  std::vector<int> free_slots_;
  NamespacePool netns_{CLONE_NEWNET, "net"};
  NamespacePool ipcns_{CLONE_NEWIPC, "ipc"};
  // Net namespaces for containers, made ahead. One comes back when its
  // container's init (our child) is reaped and no socket outlived the
  // container (NetEmpty), unless --fresh-namespaces; else it is closed.
  NamespacePool container_netns_{CLONE_NEWNET, "net"};
  std::unordered_map<pid_t, int> container_netns_by_pid_;  // init pid -> namespace index
  // New ones are made once the pool is below half its size, up to full:
  // under churn, released namespaces keep it from going that low.
  bool container_netns_topping_ = false;
  // A container init still setting up. It shares our memory: its setup, the
  // strings the setup points to and its stack stay here, unmoved, until its
  // status pipe reports EOF.
  struct PendingInit {
    uint64_t id = 0;  // dsecd's request id
    std::string sandbox_id, lower, upper, work, run_dir, agent_path, hostname;
    std::vector<std::string> read_only;  // a task's protected paths
    std::vector<const char*> read_only_ptrs;
    std::string argv0 = "dsec-agent", listen_flag = "--listen-fd", listen_fd = "3",
                env_path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    char* argv[4] = {};
    char* envp[2] = {};
    container::ContainerSetup setup;
    void* stack = nullptr;
    UniqueFd status;  // read end
    pid_t pid = -1;
    int netns = -1;
    bool reaped = false;  // its SIGCHLD came first
  };
  static constexpr size_t kInitStackBytes = 256 << 10;  // plus a guard page below
  void* AcquireInitStack();
  std::unordered_map<uint64_t, std::unique_ptr<PendingInit>> inits_;  // epoll key -> init
  std::unordered_map<pid_t, uint64_t> init_by_pid_;
  // Inits answered as failed that may still run on their stack (no fd table
  // of their own, or killed): kept until reaped.
  std::unordered_map<pid_t, std::unique_ptr<PendingInit>> dying_inits_;
  std::vector<void*> free_init_stacks_;
  std::vector<void*> free_stacks_;
  std::unordered_map<uint64_t, std::unique_ptr<Runner>> runners_;
  std::unordered_map<pid_t, uint64_t> by_pid_;
  std::unordered_map<uint64_t, uint64_t> by_run_;  // run id -> runner key
  std::deque<uint64_t> ready_;
  std::deque<spawner::Run> pending_;
  std::multimap<int64_t, uint64_t> deadlines_;  // deadline -> runner key
  uint64_t next_key_ = 3;
  size_t starting_ = 0, running_ = 0;
  uint64_t runs_ = 0, runner_failures_ = 0, consecutive_failures_ = 0, ipcns_dropped_ = 0;
  // Runner starts failing in a row: back off (doubling up to 5 s), and while
  // no runner can start, fail runs at once with the reason instead of queueing.
  int64_t refill_resume_ns_ = 0;
  int64_t refill_backoff_ns_ = 100'000'000;
  std::string last_runner_error_;
  bool refill_progress_ = false;
  // CPU-time limits are enforced on the whole run's cgroup (RLIMIT_CPU alone
  // is per process, so forking would escape it): checked on these ticks.
  std::multimap<int64_t, uint64_t> cpu_checks_;  // check time -> runner key
};

}  // namespace dsec::fncall::internal
