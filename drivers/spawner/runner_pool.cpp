// The warm pool of dsec-spawner's fncall runners: creating runners (clone,
// fd-table hand-off) and recycling what they use: cgroup slots, net/ipc
// namespaces, stacks. (Container inits: container_pool.cpp.)
#include "drivers/spawner/spawner_internal.hpp"

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
  size_t index = slots_.size();
  auto slot = groups_->MakeRunSlot(group_base_ + "/r" + std::to_string(index));
  if (!slot.ok()) {
    last_runner_error_ = slot.status().message();
    return -1;
  }
  slots_.push_back(std::move(*slot));
  return static_cast<int>(index);
}

// A group that can serve one run only (RunSlot::Reusable) is removed and its
// index made anew when taken again.
void Spawner::ReleaseSlot(int s) {
  auto& slot = slots_[static_cast<size_t>(s)];
  if (slot && !slot->Reusable()) {
    slot->Remove();
    auto fresh = groups_->MakeRunSlot(group_base_ + "/r" + std::to_string(s));
    if (!fresh.ok()) {
      // Given back as a null slot: the index stays out of the free list.
      Log(2, "remake run group r" + std::to_string(s) + ": " + fresh.status().message());
      slot.reset();
      return;
    }
    slot = std::move(*fresh);
  }
  free_slots_.push_back(s);
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
      ReleaseSlot(slot);
      return false;
    }
  }
  auto give_back = [&] {
    ReleaseSlot(slot);
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
  auto pool_procs = slots_[slot]->JoinFds(), cpu_procs = slots_[slot]->CpuJoinFds();
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
