// The warm pool of dsec-spawner: creating runners (clone, fd-table hand-off)
// and recycling what they use: cgroup slots, net/ipc namespaces, stacks.
#include "drivers/fncall/spawner_internal.hpp"

namespace dsec::fncall::internal {

// Stacks are reused: unmapping memory shared with running runners costs
// TLB shootdowns on every CPU they run on.
void* Spawner::AcquireStack() {
  if (!free_stacks_.empty()) {
    void* s = free_stacks_.back();
    free_stacks_.pop_back();
    return s;
  }
  void* s = ::mmap(nullptr, kRunnerStackBytes + kChildStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  return s == MAP_FAILED ? nullptr : s;
}

void Spawner::ReleaseStack(Runner& r) {
  if (r.stack) free_stacks_.push_back(r.stack);
  r.stack = nullptr;
}

// Lays out argv, envp and the execve candidates (PATH search, as execvp) in
// memory the runner reads once it gets "go".
void Spawner::PrepareRun(Runner& r, const spawner::Run& run) {
  auto& st = r.storage;
  st.clear();
  st.reserve(static_cast<size_t>(run.argv_size() + run.env_size()) + 16);
  std::string path = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
  for (const auto& a : run.argv()) st.push_back(a);
  for (const auto& e : run.env()) {
    st.push_back(e);
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  }
  const std::string& prog = run.argv(0);
  size_t first_candidate = st.size();
  if (prog.find('/') != std::string::npos) {
    st.push_back(prog);
  } else {
    size_t start = 0;
    while (start <= path.size()) {
      size_t end = path.find(':', start);
      if (end == std::string::npos) end = path.size();
      std::string dir = path.substr(start, end - start);
      st.push_back((dir.empty() ? std::string(".") : dir) + "/" + prog);
      start = end + 1;
    }
  }
  st.push_back(run.cwd().empty() ? std::string("/work") : run.cwd());
  size_t nargv = static_cast<size_t>(run.argv_size());
  r.argv.clear();
  r.envp.clear();
  r.candidates.clear();
  for (size_t i = 0; i < nargv; ++i) r.argv.push_back(st[i].data());
  r.argv.push_back(nullptr);
  for (size_t i = nargv; i < first_candidate; ++i) r.envp.push_back(st[i].data());
  r.envp.push_back(nullptr);
  for (size_t i = first_candidate; i + 1 < st.size(); ++i) r.candidates.push_back(st[i].c_str());
  r.candidates.push_back(nullptr);
  RunnerShared& sh = r.shared;
  sh.argv = r.argv.data();
  sh.envp = r.envp.data();
  sh.candidates = r.candidates.data();
  sh.cwd = st.back().c_str();
  if (run.cpu_time_ms()) {
    rlim_t secs = (run.cpu_time_ms() + 999) / 1000;
    sh.cpu = {secs, secs + 1};
  }
  if (run.file_size_bytes()) sh.fsize = {run.file_size_bytes(), run.file_size_bytes()};
  if (run.open_files()) sh.nofile = {run.open_files(), run.open_files()};
}

int Spawner::AcquireSlot() {
  if (!free_slots_.empty()) {
    int s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  auto slot = CgroupSlot::Create(cgroups_, group_base_ + "/r" + std::to_string(slots_.size()));
  if (!slot.ok()) {
    last_runner_error_ = slot.status().message();
    return -1;
  }
  slots_.push_back(std::move(*slot));
  return static_cast<int>(slots_.size() - 1);
}

// Back to the pools once the runner is gone: every process that was in them
// is dead, so sockets are closed; an ipc namespace is reused only when no
// System V object survived in it.
void Spawner::ReleaseNamespaces(Runner& r) {
  if (r.netns >= 0) netns_.Release(r.netns);
  if (r.ipcns >= 0) {
    if (ipcns_.IpcEmpty(r.ipcns)) {
      ipcns_.Release(r.ipcns);
    } else {
      ipcns_.Drop(r.ipcns);
      ++ipcns_dropped_;
    }
  }
  r.netns = r.ipcns = -1;
}

bool Spawner::SpawnRunner() {
  int slot = AcquireSlot();
  if (slot < 0) return false;
  int netns = -1, ipcns = -1;
  if (!opts_.fresh_namespaces) {
    std::string err;
    netns = netns_.Acquire(&err);
    if (netns >= 0) ipcns = ipcns_.Acquire(&err);
    if (ipcns < 0) {
      last_runner_error_ = err;
      if (netns >= 0) netns_.Release(netns);
      free_slots_.push_back(slot);
      return false;
    }
  }
  auto give_back = [&] {
    free_slots_.push_back(slot);
    if (netns >= 0) netns_.Release(netns);
    if (ipcns >= 0) ipcns_.Release(ipcns);
  };
  int ctl[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) < 0 || ::pipe2(out, O_CLOEXEC) < 0 ||
      ::pipe2(err, O_CLOEXEC) < 0 || ::pipe2(in, O_CLOEXEC) < 0) {
    last_runner_error_ = std::string("pipes: ") + std::strerror(errno);
    for (int fd : {ctl[0], ctl[1], out[0], out[1], err[0], err[1], in[0], in[1]})
      if (fd >= 0) ::close(fd);
    give_back();
    return false;
  }
  auto r = std::make_unique<Runner>();
  r->stack = AcquireStack();
  if (!r->stack) {
    last_runner_error_ = "out of memory for a runner stack";
    for (int fd : {ctl[0], ctl[1], out[0], out[1], err[0], err[1], in[0], in[1]}) ::close(fd);
    give_back();
    return false;
  }
  RunnerShared& sh = r->shared;
  ::dup2(ctl[1], kSlotCtl);
  ::dup2(out[1], kSlotOut);
  ::dup2(err[1], kSlotErr);
  ::dup2(in[0], kSlotIn);
  sh.has_net_ns = netns >= 0;
  sh.has_ipc_ns = ipcns >= 0;
  if (sh.has_net_ns) ::dup2(netns_.fd(netns), kSlotNet);
  if (sh.has_ipc_ns) ::dup2(ipcns_.fd(ipcns), kSlotIpc);
  ::close(ctl[1]);
  ::close(out[1]);
  ::close(err[1]);
  ::close(in[0]);
  auto pool_procs = slots_[slot].PoolProcsFds(), cpu_procs = slots_[slot].CpuProcsFds();
  sh.cgroup_hierarchies = static_cast<int>(std::min<size_t>(pool_procs.size(), 2));
  sh.cpu_hierarchies = static_cast<int>(std::min<size_t>(cpu_procs.size(), 2));
  for (int i = 0; i < sh.cgroup_hierarchies; ++i) ::dup2(pool_procs[static_cast<size_t>(i)], kSlotCgroup + i);
  for (int i = 0; i < sh.cpu_hierarchies; ++i) ::dup2(cpu_procs[static_cast<size_t>(i)], kSlotCpuCgroup + i);
  sh.work_opts = work_opts_.c_str();
  sh.tmp_opts = tmp_opts_.c_str();
  sh.seccomp = &seccomp_prog_;
  sh.uid = opts_.uid;
  sh.gid = opts_.gid;
  char* base = static_cast<char*>(r->stack);
  r->start.shared = &sh;
  r->start.child_stack_top = base + kRunnerStackBytes + kChildStackBytes;
  int flags = CLONE_VM | CLONE_FILES | CLONE_NEWPID |
              (opts_.fresh_namespaces ? CLONE_NEWNET | CLONE_NEWIPC : 0) | SIGCHLD;
  pid_t pid = ::clone(RunnerEntry, base + kRunnerStackBytes, flags, &r->start);
  int clone_errno = errno;
  if (pid > 0) {
    // Until the runner has its own table, ours must not change under it.
    timespec wait{10, 0};
    while (__atomic_load_n(&sh.handed_off, __ATOMIC_ACQUIRE) == 0) {
      long rc = ::syscall(SYS_futex, &sh.handed_off, FUTEX_WAIT, 0, &wait, nullptr, 0);
      if (rc < 0 && errno == ETIMEDOUT) {
        Log(3, "runner pid " + std::to_string(pid) + " did not start within 10 s; killing it");
        ::kill(pid, SIGKILL);
        break;  // it shares our table no more once it is dead
      }
    }
  }
  // Drop our references to the runner's ends: EOF on its pipes must depend
  // on the runner and its program only.
  for (int slot = kSlotCtl; slot < kFirstSpawnerFd; ++slot) ::dup2(devnull_.get(), slot);
  r->ctl.Reset(ctl[0]);
  r->out.Reset(out[0]);
  r->err.Reset(err[0]);
  r->in.Reset(in[1]);
  if (pid < 0) {
    last_runner_error_ = std::string("clone a runner: ") + std::strerror(clone_errno);
    ReleaseStack(*r);
    give_back();
    return false;
  }
  r->key = next_key_++;
  r->pid = pid;
  r->slot = slot;
  r->netns = netns;
  r->ipcns = ipcns;
  for (int fd : {r->ctl.get(), r->out.get(), r->err.get(), r->in.get()}) SetNonBlocking(fd);
  epoll_event ev{};
  // Edge-triggered: EOF is reported once, so no EPOLL_CTL_DEL is needed; the
  // fd leaves the epoll set when it is closed (we hold its only reference).
  ev.events = EPOLLIN | EPOLLET;
  ev.data.u64 = (r->key << 2) | kCtl;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, r->ctl.get(), &ev);
  ev.data.u64 = (r->key << 2) | kOut;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, r->out.get(), &ev);
  ev.data.u64 = (r->key << 2) | kErr;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, r->err.get(), &ev);
  by_pid_[pid] = r->key;
  ++starting_;
  runners_[r->key] = std::move(r);
  return true;
}

void Spawner::Refill() {
  refill_progress_ = false;
  if (shutting_down_ || NowNs() < refill_resume_ns_) return;
  // Warm pool first; then whatever the queue needs, bounded by max_runners.
  size_t want = opts_.pool_size + pending_.size();
  size_t spawned = 0;
  while (starting_ + ready_.size() < want && runners_.size() < opts_.max_runners && spawned < 8) {
    if (!SpawnRunner()) {
      RunnerFailed("cannot start a runner: " + last_runner_error_);
      break;
    }
    ++spawned;
  }
  // Net namespaces for containers, made ahead of need (~1.2 ms each).
  std::string err;
  if (container_netns_.free() < (opts_.container_netns + 1) / 2) container_netns_topping_ = true;
  while (container_netns_topping_ && container_netns_.free() < opts_.container_netns && spawned < 8) {
    int n = container_netns_.Make(&err);
    if (n < 0) {
      Log(3, "container net namespace: " + err);
      break;
    }
    container_netns_.Release(n);
    ++spawned;
  }
  if (container_netns_.free() >= opts_.container_netns) container_netns_topping_ = false;
  refill_progress_ = spawned > 0;
}

// A runner failed to start (SpawnRunner failed, or it died in setup). After
// 20 in a row, pause starting new ones with a doubling backoff and fail the
// queued runs with the reason; the first runner that gets ready resets this.
void Spawner::RunnerFailed(const std::string& why) {
  ++runner_failures_;
  ++consecutive_failures_;
  last_runner_error_ = why;
  // Log the first failure of a streak and then every doubling, not each one.
  if ((consecutive_failures_ & (consecutive_failures_ - 1)) == 0)
    Log(3, "fncall runner failed (" + std::to_string(consecutive_failures_) + " in a row): " + why);
  if (consecutive_failures_ < 20) return;
  refill_resume_ns_ = NowNs() + refill_backoff_ns_;
  refill_backoff_ns_ = std::min<int64_t>(refill_backoff_ns_ * 2, 5'000'000'000);
  while (!pending_.empty()) {
    FailRun(pending_.front().id(), "fncall runners cannot start: " + why);
    pending_.pop_front();
  }
}

}  // namespace dsec::fncall::internal

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
  setup.seccomp = &seccomp_prog_;
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
