// Containers in dsec-spawner: cloning a container's init (container_init.hpp)
// with its namespaces, waiting for its set-up, and taking back what it used
// (net namespaces, stacks) once it is gone.
#include "drivers/spawner/spawner_internal.hpp"

namespace dsec::fncall::internal {

// A container's init (the agent, PID 1 of its pid namespace) was reaped: every
// process of the container is dead, so its net namespace can go back to the
// pool if nothing outlived them there.
void Spawner::ContainerGone(pid_t pid) {
  if (auto init = init_by_pid_.find(pid); init != init_by_pid_.end()) {
    inits_[init->second]->reaped = true;  // OnInitDone decides
    init_by_pid_.erase(init);             // the pid may be reused from now on
    return;
  }
  if (auto dying = dying_inits_.find(pid); dying != dying_inits_.end()) {
    free_init_stacks_.push_back(dying->second->stack);
    container_netns_.Drop(dying->second->netns);
    dying_inits_.erase(dying);
    return;
  }
  auto it = container_netns_by_pid_.find(pid);
  if (it == container_netns_by_pid_.end()) return;
  int netns = it->second;
  container_netns_by_pid_.erase(it);
  if (container_netns_.NetEmpty(netns)) container_netns_.Release(netns);
  else container_netns_.Drop(netns);
}

void* Spawner::AcquireInitStack() {
  if (!free_init_stacks_.empty()) {
    void* s = free_init_stacks_.back();
    free_init_stacks_.pop_back();
    return s;
  }
  void* s = ::mmap(nullptr, kInitStackBytes + 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (s == MAP_FAILED) return nullptr;
  ::mprotect(s, 4096, PROT_NONE);  // an overflow faults instead of writing over our memory
  return s;
}

// Starts a container's init (container_init.hpp). We wait only until it has
// its own fd table; it sets up while we serve other requests, and its
// status pipe tells us when it has executed the agent or failed
// (OnInitDone), so several inits run at once.
void Spawner::CreateContainer(const spawner::CreateContainer& req) {
  spawner::Event ev;
  auto* out = ev.mutable_container_created();
  out->set_id(req.id());
  auto fail = [&](const std::string& why) {
    out->set_error("container " + req.sandbox_id() + ": " + why);
    Send(ev);
  };
  if (!opts_.containers) return fail("this spawner was not started with --containers");
  if (req.cgroup_procs_size() > 6) return fail("too many cgroup hierarchies");
  if (req.read_only_size() > 4096) return fail("more than 4096 read-only paths");
  for (const auto& ro : req.read_only())
    if (ro.empty() || ro[0] != '/' || ro.size() >= 3000 || ro.find("/../") != std::string::npos ||
        ro.find("/..", ro.size() >= 3 ? ro.size() - 3 : 0) != std::string::npos)
      return fail("read-only path '" + ro.substr(0, 64) + "' is not an absolute path inside the root");
  std::string err;
  int netns = container_netns_.Acquire(&err);
  if (netns < 0) return fail(err);
  std::vector<UniqueFd> procs;
  for (const auto& p : req.cgroup_procs()) {
    procs.emplace_back(::open(p.c_str(), O_WRONLY | O_CLOEXEC));
    if (!procs.back()) {
      container_netns_.Drop(netns);
      return fail("open " + p + ": " + std::strerror(errno));
    }
  }
  auto in = std::make_unique<PendingInit>();
  in->id = req.id();
  in->sandbox_id = req.sandbox_id();
  in->lower = req.lower();
  in->upper = req.upper();
  in->work = req.work();
  in->run_dir = req.run_dir();
  in->agent_path = req.agent_path();
  in->hostname = req.hostname();
  in->read_only.assign(req.read_only().begin(), req.read_only().end());
  for (const auto& ro : in->read_only) in->read_only_ptrs.push_back(ro.c_str());
  in->argv[0] = in->argv0.data();
  in->argv[1] = in->listen_flag.data();
  in->argv[2] = in->listen_fd.data();
  in->envp[0] = in->env_path.data();
  container::ContainerSetup& setup = in->setup;
  setup.lower = in->lower.c_str();
  setup.upper = in->upper.c_str();
  setup.work = in->work.c_str();
  setup.run_dir = in->run_dir.c_str();
  setup.agent_path = in->agent_path.c_str();
  setup.hostname = in->hostname.empty() ? nullptr : in->hostname.c_str();
  setup.has_net_ns = true;
  setup.loopback_up = false;  // up since the pool made it
  setup.cgroups = static_cast<int>(procs.size());
  setup.read_only = in->read_only_ptrs.data();
  setup.read_only_count = static_cast<int>(in->read_only_ptrs.size());
  setup.seccomp = req.watch_writes() && opts_.watch_writes ? &watching_seccomp_prog_ : &container_seccomp_prog_;
  setup.sandbox_id = in->sandbox_id.c_str();
  setup.agent_argv = in->argv;
  setup.agent_envp = in->envp;
  in->stack = AcquireInitStack();
  int status[2] = {-1, -1};
  if (!in->stack || ::pipe2(status, O_CLOEXEC) < 0) {
    std::string why = in->stack ? std::string("status pipe: ") + std::strerror(errno) : "out of memory for an init stack";
    if (in->stack) free_init_stacks_.push_back(in->stack);
    container_netns_.Drop(netns);
    return fail(why);
  }
  ::dup2(container_netns_.fd(netns), container::kInitSlotNet);
  ::dup2(container_base_ns_.get(), container::kInitSlotMntBase);
  for (size_t i = 0; i < procs.size(); ++i) ::dup2(procs[i].get(), container::kInitSlotCgroup + static_cast<int>(i));
  ::dup2(status[1], container::kInitSlotStatus);
  ::dup2(notify_tx_.get(), container::kInitSlotNotify);
  ::close(status[1]);
  // No CLONE_NEWNS: the init makes its mount namespace from the base.
  int flags = CLONE_VM | CLONE_FILES | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
  pid_t pid = ::clone(container::ContainerInitEntry, static_cast<char*>(in->stack) + kInitStackBytes + 4096, flags,
                      &setup);
  int clone_errno = errno;
  std::string lost;  // why the init is given up before it reports
  if (pid > 0) {
    // Until the init has its own table, ours must not change under it.
    int64_t give_up = NowNs() + 10'000'000'000;
    while (__atomic_load_n(&setup.handed_off, __ATOMIC_ACQUIRE) == 0) {
      timespec wait{1, 0};
      long rc = ::syscall(SYS_futex, &setup.handed_off, FUTEX_WAIT, 0, &wait, nullptr, 0);
      if (rc < 0 && errno == ETIMEDOUT && NowNs() > give_up) {
        lost = "the init did not start within 10 s";
        ::kill(pid, SIGKILL);
        break;  // it shares our table no more once it is dead
      }
    }
    if (__atomic_load_n(&setup.handed_off, __ATOMIC_ACQUIRE) == 2)
      lost = std::string(setup.failed_what) + ": " + std::strerror(setup.failed_errno);
  }
  // Back to placeholders: the status pipe's write end is the init's alone.
  for (int slot = container::kInitSlotNet; slot < container::kInitFirstFree; ++slot) ::dup2(devnull_.get(), slot);
  if (pid < 0) {
    ::close(status[0]);
    free_init_stacks_.push_back(in->stack);
    container_netns_.Drop(netns);
    return fail(std::string("clone the init: ") + std::strerror(clone_errno));
  }
  in->pid = pid;
  in->netns = netns;
  in->status.Reset(status[0]);
  SetNonBlocking(status[0]);
  uint64_t key = next_key_++;
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.u64 = (key << 2) | kCtl;
  if (lost.empty() && ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, status[0], &e) < 0) {
    lost = std::string("watch the init's status pipe: ") + std::strerror(errno);
    ::kill(pid, SIGKILL);
  }
  if (!lost.empty()) {
    // It may still run on its stack: kept until reaped (ContainerGone).
    in->status.Reset();
    dying_inits_[pid] = std::move(in);
    return fail(lost);
  }
  init_by_pid_[pid] = key;
  inits_[key] = std::move(in);
}

void Spawner::OnInitDone(uint64_t key) {
  auto it = inits_.find(key);
  PendingInit& in = *it->second;
  char buf[64];
  ssize_t n;
  while ((n = ::read(in.status.get(), buf, sizeof buf)) > 0) {
  }
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;  // not done yet (nothing is written, only closed)
  spawner::Event ev;
  auto* out = ev.mutable_container_created();
  out->set_id(in.id);
  if (in.setup.failed_what || !__atomic_load_n(&in.setup.reached_exec, __ATOMIC_ACQUIRE)) {
    // It exited (or was killed); the SIGCHLD handler reaps it.
    std::string why = in.setup.failed_what
                          ? std::string(in.setup.failed_what) + ": " + std::strerror(in.setup.failed_errno)
                          : "the init died during its setup (killed, or a crash: see the kernel log)";
    out->set_error("container " + in.sandbox_id + ": " + why);
    container_netns_.Drop(in.netns);
  } else {
    out->set_pid(in.pid);
    // We are -1000 (never an OOM victim); the agent stays nearly as safe,
    // -900: a memory limit hit kills the program that hit it, not the
    // container. Written by us, with CAP_SYS_RESOURCE, it is also the floor
    // of what the agent's programs may set for themselves (they go to 0,
    // agent_exec.cpp). Before dsecd hears of the agent, so before any
    // program exists. (The init could not: it shares our memory, and the
    // kernel applies such a write to every process sharing it.)
    if (!in.reaped) {
      std::string adj = "/proc/" + std::to_string(in.pid) + "/oom_score_adj";
      if (int fd = ::open(adj.c_str(), O_WRONLY | O_CLOEXEC); fd >= 0) {
        (void)!::write(fd, "-900", 4);
        ::close(fd);
      }
    }
    // The namespace is the container's now; we keep its descriptor (one per
    // container, bounded) to take it back when the container is gone.
    if (in.reaped) {
      if (container_netns_.NetEmpty(in.netns)) container_netns_.Release(in.netns);
      else container_netns_.Drop(in.netns);
    } else if (!opts_.fresh_namespaces && container_netns_by_pid_.size() < kMaxTrackedContainerNetns) {
      container_netns_by_pid_[in.pid] = in.netns;
    } else {
      container_netns_.Drop(in.netns);
    }
  }
  Send(ev);
  if (auto p = init_by_pid_.find(in.pid); p != init_by_pid_.end() && p->second == key) init_by_pid_.erase(p);
  free_init_stacks_.push_back(in.stack);
  inits_.erase(it);  // closing the pipe takes it out of the epoll set
}

}  // namespace dsec::fncall::internal
