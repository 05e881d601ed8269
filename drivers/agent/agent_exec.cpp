// The life of an exec in dsec-agent: a vfork-style clone (CLONE_VM, waited
// for in AwaitExec) and execve into a new process group with stdio pipes,
// rlimits and an optional uid/gid drop (ChildExec, the only code that runs
// between the clone and execve); stdin fed without blocking; output kept
// up to its cap or streamed with backpressure; the wall-clock limit; Signal;
// reaping (every zombie, as PID 1 or subreaper); and the report of how each exec ended (run::Outcome).
//
// An exec is done when its own process has been reaped and both output pipes
// are at EOF. Processes it leaves behind with the pipes still open (`cmd &`)
// get kPipeGraceNs to finish writing; then the exec is reported and our pipe
// ends closed (they keep running; a later write of theirs gets EPIPE).
#include "drivers/agent/agent_internal.hpp"
#include "drivers/spawner/sandbox_caps.hpp"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace dsec::agent::internal {

namespace {

// Where the child failed, reported on its status pipe as {stage, errno}.
enum Stage : int {
  kStageNone = 0, kStageStdio, kStageRlimit, kStageCredentials, kStageChdir, kStageExec, kStageCgroup
};

constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

struct ChildPlan {
  int in = -1, out = -1, err = -1, status = -1;  // child ends of the pipes
  std::vector<char*> argv, envp;
  std::vector<char*> sh_argv;  // {"sh", <the file>, argv[1..]}: a file without #! runs with /bin/sh
  std::vector<std::string> candidates;  // execve paths, PATH order
  const char* cwd = "/";
  rlimit cpu{RLIM_INFINITY, RLIM_INFINITY}, fsize{RLIM_INFINITY, RLIM_INFINITY}, nofile{0, 0};
  bool set_cpu = false, set_fsize = false, set_nofile = false;
  bool set_gid = false, set_uid = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups (Exec.user's); none without
  bool pty = false;           // in, out and err are a terminal's: a session of its own
  const char* cgroup_procs = nullptr;  // joined first (AgentOptions::cgroup)
  bool drop_caps = false;              // AgentOptions::guarded: only kContainerCaps stay
};

// Runs in the child, which shares our memory (CLONE_VM) while we wait
// (AwaitExec) until it has executed the program or exited: no page tables
// to copy, no copy-on-write faults, which fork paid on every exec. So only
// system calls here: no allocation, nothing that changes our state; the
// plan is read, and sh_argv[1] written, nothing else.
[[noreturn]] void ChildFail(int status_fd, int stage, int err) {
  int rec[2] = {stage, err};
  (void)!::write(status_fd, rec, sizeof rec);
  _exit(stage == kStageExec && err == ENOENT ? 127 : 126);
}

[[noreturn]] void ChildExec(const ChildPlan& p) {
  int status = p.status;
  auto fail = [&status](int stage, int err) { ChildFail(status, stage, err); };
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &dfl, nullptr);
  if (p.pty) ::setsid();  // a session (and group) of its own, the terminal its controlling one
  else ::setpgid(0, 0);
  // No oom_score_adj here: while the child shares our memory, the kernel
  // applies a write to every process sharing it (the agent too, losing its
  // -900) after a walk over every process on the host. The agent sets it
  // once the program runs (ExecDefaultOomScore).
  // Lift every pipe end above 2 first so the dup2s below cannot clobber one
  // another, whatever numbers they had.
  int in = ::fcntl(p.in, F_DUPFD, 3), out = ::fcntl(p.out, F_DUPFD, 3), err = ::fcntl(p.err, F_DUPFD, 3);
  int st = ::fcntl(p.status, F_DUPFD, 3);
  if (st >= 0) status = st;
  if (in < 0 || out < 0 || err < 0 || st < 0) fail(kStageStdio, errno);
  if (::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0 || ::dup2(st, 3) < 0) fail(kStageStdio, errno);
  status = 3;
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  if (p.pty && ::ioctl(0, TIOCSCTTY, 0) < 0) fail(kStageStdio, errno);
  ::syscall(SYS_close_range, 4u, ~0u, 0u);  // our fds are CLOEXEC anyway; inherited ones may not be
  if (p.cgroup_procs) {
    int g = ::open(p.cgroup_procs, O_WRONLY | O_CLOEXEC);
    if (g < 0 || ::write(g, "0", 1) != 1) fail(kStageCgroup, errno);
    ::close(g);
  }
  if ((p.set_cpu && ::setrlimit(RLIMIT_CPU, &p.cpu) < 0) ||
      (p.set_fsize && ::setrlimit(RLIMIT_FSIZE, &p.fsize) < 0) ||
      (p.set_nofile && ::setrlimit(RLIMIT_NOFILE, &p.nofile) < 0))
    fail(kStageRlimit, errno);
  if (p.drop_caps) {
    // From the bounding set: no exec, setuid or file capability gets them back.
    for (int cap = 0; cap < 64; ++cap) {
      if (container::kContainerCaps & (1ull << cap)) continue;
      if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
        if (errno == EINVAL) break;  // past the last capability this kernel knows
        fail(kStageCredentials, errno);
      }
    }
    if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) fail(kStageCredentials, errno);
  }
  if (p.set_gid || p.set_uid) {
    // Raw calls: libc's versions would signal "our" threads, which are the
    // agent's.
    if (::geteuid() == 0 && ::syscall(SYS_setgroups, p.groups.size(), p.groups.data()) < 0)
      fail(kStageCredentials, errno);
    if (p.set_gid && ::syscall(SYS_setresgid, p.gid, p.gid, p.gid) < 0) fail(kStageCredentials, errno);
    if (p.set_uid && ::syscall(SYS_setresuid, p.uid, p.uid, p.uid) < 0) fail(kStageCredentials, errno);
  }
  // As the target user: it may only enter what that user may.
  if (::chdir(p.cwd) < 0) fail(kStageChdir, errno);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);  // a Signal sent before now is delivered here
  // Like execvp: remember EACCES, keep looking after ENOENT/ENOTDIR, run a
  // file without a #! line with /bin/sh.
  int e = ENOENT;
  bool eacces = false;
  for (const auto& path : p.candidates) {
    ::execve(path.c_str(), p.argv.data(), p.envp.data());
    e = errno;
    if (e == ENOEXEC) {
      char** sh = const_cast<char**>(p.sh_argv.data());
      sh[1] = const_cast<char*>(path.c_str());
      ::execve("/bin/sh", sh, p.envp.data());
      fail(kStageExec, ENOEXEC);
    }
    if (e == EACCES) eacces = true;
    else if (e != ENOENT && e != ENOTDIR && e != ESTALE && e != ENODEV && e != ETIMEDOUT) break;
  }
  ChildFail(status, kStageExec, eacces && (e == ENOENT || e == ENOTDIR) ? EACCES : e);
}

int ChildEntry(void* plan) { ChildExec(*static_cast<const ChildPlan*>(plan)); }

// The child shares our memory (and child_stack) until it has executed the
// program or exited; its end of the status pipe closes then (close-on-exec,
// or exit). Nothing here may change before that, so we wait, as vfork would,
// but not blindly: a child stopped on the way (SIGSTOP from a process in
// the container: PID 1 is immune, its children are not) would hold PID 1
// forever. Such a child is killed; its exec then reports the signal.
void AwaitExec(pid_t pid, int status_fd) {
  pollfd p{status_fd, POLLIN, 0};
  for (;;) {
    int r = ::poll(&p, 1, 50);
    if (r > 0 && (p.revents & (POLLHUP | POLLERR))) return;
    if (r > 0 && (p.revents & POLLIN)) p.events = 0;  // a failure record: its exit follows
    siginfo_t si{};
    if (r == 0 && ::waitid(P_PID, static_cast<id_t>(pid), &si, WSTOPPED | WNOHANG | WNOWAIT) == 0 &&
        si.si_pid == pid)
      ::kill(pid, SIGKILL);
  }
}

// The agent keeps itself out of the OOM killer's way (its init set -900);
// what it runs is an ordinary victim, set to 0 here, right after its exec
// (it has its own memory now: the write touches it alone). Until then, a
// few microseconds, it runs at the agent's -900. Raising needs no privilege.
void ExecDefaultOomScore(pid_t pid) {
  char path[48];
  std::snprintf(path, sizeof path, "/proc/%d/oom_score_adj", static_cast<int>(pid));
  if (int adj = ::open(path, O_WRONLY | O_CLOEXEC); adj >= 0) {
    (void)!::write(adj, "0", 1);
    ::close(adj);
  }
}

// The child's stack while it sets up (we wait in AwaitExec meanwhile, so one
// is enough).
alignas(64) char child_stack[256 << 10];

std::vector<std::string> Candidates(const std::string& argv0, const Exec& req) {
  if (argv0.find('/') != std::string::npos) return {argv0};
  std::string path = kDefaultPath;
  for (const auto& kv : req.env())
    if (kv.compare(0, 5, "PATH=") == 0) {
      path = kv.substr(5);
      break;
    }
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    out.push_back(dir.empty() ? argv0 : dir + "/" + argv0);  // empty: the working directory
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return out;
}

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

void CloseBoth(int p[2]) {
  if (p[0] >= 0) ::close(p[0]);
  if (p[1] >= 0) ::close(p[1]);
}

}  // namespace

void Agent::WatchFd(int fd, uint64_t key, Kind kind, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = (key << 3) | kind;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
}

// What a keyed exec runs: the same key must name the same command.
size_t Fingerprint(const Exec& req) {
  std::string all;
  for (const auto& a : req.argv()) all += a + '\0';
  all += '\1';
  for (const auto& e : req.env()) all += e + '\0';
  all += '\1' + req.cwd() + '\1' + req.stdin();
  return std::hash<std::string>()(all);
}

bool Agent::JoinKeyed(Conn& c, uint64_t id, const Exec& req, size_t fingerprint) {
  auto refuse = [&] {
    SendError(c, id, EEXIST, "exec: key '" + req.key() + "' was used for another command");
    return true;
  };
  if (auto it = keyed_running_.find(req.key()); it != keyed_running_.end()) {
    ExecRun& x = *execs_.at(it->second);
    if (x.fingerprint != fingerprint) return refuse();
    x.waiters.emplace_back(c.key, id);
    c.execs[id] = x.key;
    return true;
  }
  for (const auto& k : kept_) {
    if (k.key != req.key()) continue;
    if (k.fingerprint != fingerprint) return refuse();
    Event ev;
    ev.set_id(id);
    *ev.mutable_exec_done() = k.done;
    Send(c, ev);
    return true;
  }
  return false;
}

void Agent::StartExec(Conn& c, uint64_t id, Exec& req) {
  if (c.execs.count(id)) {
    SendError(c, id, EEXIST, "exec: request id " + std::to_string(id) + " is already running on this connection");
    return;
  }
  if (req.attach_pid()) return Attach(c, id, req);
  if (!req.key().empty() && req.stream()) {
    SendError(c, id, EINVAL, "exec: a keyed exec cannot stream its output");
    return;
  }
  size_t fingerprint = req.key().empty() ? 0 : Fingerprint(req);
  if (!req.key().empty() && JoinKeyed(c, id, req, fingerprint)) return;
  if (req.argv_size() == 0) {
    SendError(c, id, EINVAL, "exec: empty argv");
    return;
  }
  for (const auto& a : req.argv())
    if (HasNul(a)) {
      SendError(c, id, EINVAL, "exec: an argv element contains a NUL byte");
      return;
    }
  for (const auto& e : req.env())
    if (HasNul(e)) {
      SendError(c, id, EINVAL, "exec: an env entry contains a NUL byte");
      return;
    }
  // A named user: its ids and groups, HOME, USER, LOGNAME, its home as cwd.
  std::vector<gid_t> groups;
  if (std::string why; !AsUser(&req, &groups, &why)) {
    SendError(c, id, ENOENT, "exec: " + why);
    return;
  }
  std::string cwd = req.cwd().empty() ? "/" : req.cwd();
  if (HasNul(cwd)) {
    SendError(c, id, EINVAL, "exec: cwd contains a NUL byte");
    return;
  }
  const Limits& lim = req.limits();
  ChildPlan plan;
  for (auto& a : *req.mutable_argv()) plan.argv.push_back(a.data());
  plan.argv.push_back(nullptr);
  for (auto& e : *req.mutable_env()) plan.envp.push_back(e.data());
  plan.envp.push_back(nullptr);
  plan.sh_argv.push_back(const_cast<char*>("sh"));
  plan.sh_argv.push_back(nullptr);  // the file, filled in by the child
  for (size_t i = 1; i + 1 < plan.argv.size(); ++i) plan.sh_argv.push_back(plan.argv[i]);
  plan.sh_argv.push_back(nullptr);
  plan.candidates = Candidates(req.argv(0), req);
  plan.cwd = cwd.c_str();
  if (!cgroup_procs_.empty()) plan.cgroup_procs = cgroup_procs_.c_str();
  plan.drop_caps = opts_.guarded && !req.privileged();
  if (lim.cpu_time_ms()) {
    rlim_t s = static_cast<rlim_t>((lim.cpu_time_ms() + 999) / 1000);
    plan.cpu = {s, s + 1};  // SIGXCPU at the limit, SIGKILL a second later
    plan.set_cpu = true;
  }
  if (lim.file_size_bytes()) {
    plan.fsize = {lim.file_size_bytes(), lim.file_size_bytes()};
    plan.set_fsize = true;
  }
  if (lim.open_files()) {
    plan.nofile = {lim.open_files(), lim.open_files()};
    plan.set_nofile = true;
  } else if (nofile_.rlim_max) {
    plan.nofile = nofile_;  // what we raised for ourselves is not theirs
    plan.set_nofile = true;
  }
  plan.set_uid = req.uid() != 0;
  plan.set_gid = req.gid() != 0;
  plan.uid = req.uid();
  plan.gid = req.gid();
  plan.groups = std::move(groups);

  auto fail_setup = [&](const std::string& what) {
    Event ev;
    ev.set_id(id);
    ev.mutable_exec_done()->set_user_error("exec: " + what + ": " + std::strerror(errno));
    Send(c, ev);
  };
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, st[2] = {-1, -1};
  if (::pipe2(in, O_CLOEXEC) < 0 || ::pipe2(out, O_CLOEXEC) < 0 || ::pipe2(err, O_CLOEXEC) < 0 ||
      ::pipe2(st, O_CLOEXEC) < 0) {
    fail_setup("create pipes");
    for (int* p : {in, out, err, st}) CloseBoth(p);
    return;
  }
  plan.in = in[0];
  plan.out = out[1];
  plan.err = err[1];
  plan.status = st[1];
  // A terminal: the child's stdin, stdout and stderr are its slave end; we
  // read and write the master (the pipes' other ends go unused).
  UniqueFd master, slave;
  if (req.has_pty()) {
    if (int e = OpenPty(req.pty().cols(), req.pty().rows(), &master, &slave)) {
      errno = e;
      fail_setup("open a pseudo-terminal (/dev/ptmx)");
      for (int* p : {in, out, err, st}) CloseBoth(p);
      return;
    }
    plan.in = plan.out = plan.err = slave.get();
    plan.pty = true;
  }
  // Clone with every signal blocked (until the child has executed): the
  // child resets dispositions before it unblocks, so a Signal that arrives
  // in between is held, not lost to an ignored disposition it inherited
  // from us.
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &old);
  int64_t start = NowNs();
  pid_t pid = ::clone(ChildEntry, child_stack + sizeof child_stack, CLONE_VM | SIGCHLD, &plan);
  int fork_errno = errno;
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  ::close(st[1]);
  if (pid > 0) {
    AwaitExec(pid, st[0]);
    ExecDefaultOomScore(pid);
  }
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    errno = fork_errno;
    fail_setup("clone");
    for (int fd : {in[1], out[0], err[0], st[0]}) ::close(fd);
    return;
  }
  ::setpgid(pid, pid);  // also in the child; whichever runs first (a terminal's child has its session)
  if (master) {
    slave.Reset();
    ::close(in[1]);
    in[1] = ::fcntl(master.get(), F_DUPFD_CLOEXEC, 3);
    ::close(out[0]);
    out[0] = master.Release();
  }

  auto x = std::make_unique<ExecRun>();
  x->key = next_key_++;
  x->conn = c.key;
  x->req_id = id;
  x->pid = pid;
  x->stream = req.stream();
  x->cap = lim.output_bytes() ? lim.output_bytes() : kDefaultOutputCap;
  if (!x->stream && x->cap > kMaxBufferedOutput) x->cap = kMaxBufferedOutput;
  x->in.Reset(in[1]);
  x->out.fd.Reset(out[0]);
  x->err.fd.Reset(err[0]);
  x->status.Reset(st[0]);
  x->start_ns = start;
  x->oom_kills_at_start = OomKills();
  x->cwd = cwd;
  x->idem_key = req.key();
  x->fingerprint = fingerprint;
  if (!x->idem_key.empty()) keyed_running_[x->idem_key] = x->key;
  x->uid = req.uid();
  x->gid = req.gid();
  for (int fd : {in[1], out[0], err[0], st[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  WatchFd(out[0], x->key, kExecOut, EPOLLIN);
  WatchFd(err[0], x->key, kExecErr, EPOLLIN);
  if (lim.timeout_ms()) {
    x->deadline_ns = start + static_cast<int64_t>(lim.timeout_ms()) * 1000000;
    timers_.emplace(x->deadline_ns, x->key);
  }
  ExecRun& r = *x;
  by_pid_[pid] = r.key;
  c.execs[id] = r.key;
  execs_[r.key] = std::move(x);
  r.interactive = req.interactive() || req.has_pty();
  r.pty = req.has_pty();
  r.privileged = req.privileged();
  r.argv.assign(req.argv().begin(), req.argv().end());
  if (r.interactive && r.stream) {  // the pid first: the client's handle for Proc (a terminal's too)
    Event ev;
    ev.set_id(id);
    ev.mutable_output()->set_pid(pid);
    Send(c, ev);
  }
  r.stdin_data.swap(*req.mutable_stdin());
  WriteStdin(r);
}

void Agent::KillGroup(ExecRun& x) {
  if (x.reaped && by_pid_.count(x.pid)) return;  // pid reused by a newer exec
  ::kill(-x.pid, SIGKILL);
}

void Agent::Reap() {
  for (;;) {
    int status = 0;
    rusage ru{};
    pid_t pid = ::wait4(-1, &status, WNOHANG, &ru);
    if (pid <= 0) return;  // 0: none ready; ECHILD: no children
    auto it = by_pid_.find(pid);
    if (it == by_pid_.end()) continue;  // an orphan; reaping it is all we owe it
    uint64_t key = it->second;
    by_pid_.erase(it);
    auto x = execs_.find(key);
    if (x == execs_.end()) continue;
    ExecRun& r = *x->second;
    r.reaped = true;
    r.wait_status = status;
    r.ru = ru;
    int rec[2] = {0, 0};
    if (r.status && ::read(r.status.get(), rec, sizeof rec) == sizeof rec) {
      r.setup_stage = rec[0];
      r.setup_errno = rec[1];
    }
    r.status.Reset();
    r.in.Reset();
    // What it wrote before it ended is in the pipes now.
    ReadPipe(r, false, 64);
    ReadPipe(r, true, 64);
    if (r.out.eof && r.err.eof) {
      Finish(r, {});
    } else {
      r.grace_ns = NowNs() + kPipeGraceNs;
      timers_.emplace(r.grace_ns, r.key);
    }
  }
}

void Agent::OnExecEvent(uint64_t key, Kind kind, uint32_t events) {
  auto it = execs_.find(key);
  if (it == execs_.end()) return;
  ExecRun& x = *it->second;
  switch (kind) {
    case kExecOut: ReadPipe(x, false, 4); break;
    case kExecErr: ReadPipe(x, true, 4); break;
    case kExecIn: WriteStdin(x); break;
    default: break;
  }
  MaybeFinish(x);
}

void Agent::ReadPipe(ExecRun& x, bool is_err, int max_reads) {
  Pipe& p = is_err ? x.err : x.out;
  char buf[kReadChunk];
  for (int i = 0; i < max_reads && p.fd && !x.paused; ++i) {
    Conn* c = x.stream && x.conn ? FindConn(x.conn) : nullptr;
    if (c && c->pending() >= kHighWater) {
      Pause(x, *c);  // its program blocks on a full pipe until the client reads
      return;
    }
    for (auto [conn, req_id] : x.attached)
      if (Conn* a = FindConn(conn); a && a->pending() >= kHighWater) return Pause(x, *a);
    ssize_t n = ::read(p.fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      p.eof = true;
      p.fd.Reset();  // also leaves the epoll set
      return;
    }
    uint64_t room = p.count < x.cap ? x.cap - p.count : 0;
    size_t take = static_cast<uint64_t>(n) < room ? static_cast<size_t>(n) : static_cast<size_t>(room);
    if (take > 0) {
      p.count += take;
      if (!x.stream) {
        p.buf.append(buf, take);
      } else if (c || !x.attached.empty()) {
        Event ev;
        ev.set_id(x.req_id);
        ev.mutable_output()->set_stream(is_err ? 2 : x.pty ? 3 : 1);
        ev.mutable_output()->set_data(buf, take);
        if (c) Send(*c, ev);
        for (auto [conn, req_id] : x.attached) {
          ev.set_id(req_id);
          if (Conn* a = FindConn(conn)) Send(*a, ev);
        }
      }
    }
    if (take < static_cast<size_t>(n) && !p.truncated) {
      p.truncated = true;
      x.output_exceeded = true;
      KillGroup(x);  // then drain to EOF, dropping the rest
    }
  }
}

void Agent::Pause(ExecRun& x, Conn& c) {
  if (x.paused) return;
  for (Pipe* p : {&x.out, &x.err})
    if (p->fd) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, p->fd.get(), nullptr);
  x.paused = true;
  c.paused.insert(x.key);
}

void Agent::Resume(ExecRun& x) {
  if (!x.paused) return;
  x.paused = false;
  if (x.out.fd) WatchFd(x.out.fd.get(), x.key, kExecOut, EPOLLIN);
  if (x.err.fd) WatchFd(x.err.fd.get(), x.key, kExecErr, EPOLLIN);
}

void Agent::ResumePaused(Conn& c) {
  std::set<uint64_t> keys;
  keys.swap(c.paused);
  for (uint64_t key : keys) {
    auto it = execs_.find(key);
    if (it != execs_.end()) Resume(*it->second);
  }
}

void Agent::MaybeFinish(ExecRun& x) {
  if (x.reaped && x.out.eof && x.err.eof) Finish(x, {});
}

void Agent::OnExecTimer(uint64_t key, int64_t when) {
  auto it = execs_.find(key);
  if (it == execs_.end()) return;
  ExecRun& x = *it->second;
  if (when == x.deadline_ns && !x.reaped) {
    x.timed_out = true;
    KillGroup(x);
  }
  if (when != x.grace_ns || !x.reaped) return;
  if (x.paused) {  // the client is slow, not the program: wait for it
    x.grace_ns = NowNs() + kPipeGraceNs;
    timers_.emplace(x.grace_ns, x.key);
    return;
  }
  ReadPipe(x, false, 16);
  ReadPipe(x, true, 16);
  if (x.paused) {
    x.grace_ns = NowNs() + kPipeGraceNs;
    timers_.emplace(x.grace_ns, x.key);
    return;
  }
  // Left-behind processes hold the pipes: report without waiting for them.
  for (Pipe* p : {&x.out, &x.err}) {
    p->fd.Reset();
    p->eof = true;
  }
  Finish(x, {});
}

uint64_t Agent::OomKills() const {
  if (opts_.oom_events.empty()) return 0;
  int fd = ::open(opts_.oom_events.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = std::strstr(buf, "oom_kill ");
  return p ? std::strtoull(p + 9, nullptr, 10) : 0;
}

void Agent::Finish(ExecRun& x, const std::string& forced_error) {
  Event ev;
  ev.set_id(x.req_id);
  auto* d = ev.mutable_exec_done();
  int st = x.wait_status;
  if (WIFEXITED(st)) {
    d->set_exited(true);
    d->set_exit_code(WEXITSTATUS(st));
  } else if (WIFSIGNALED(st)) {
    d->set_signal(WTERMSIG(st));
    if (WTERMSIG(st) == SIGKILL && !opts_.oom_events.empty() && OomKills() > x.oom_kills_at_start)
      d->set_oom_killed(true);
  }
  std::string why = x.setup_errno ? std::strerror(x.setup_errno) : "";
  switch (x.setup_stage) {
    case kStageNone: break;
    case kStageExec: d->set_exec_errno(x.setup_errno); break;
    case kStageStdio: d->set_user_error("exec: set up stdin/stdout/stderr: " + why); break;
    case kStageRlimit: d->set_user_error("exec: set resource limits: " + why); break;
    case kStageCredentials:
      d->set_user_error("exec: switch to uid " + std::to_string(x.uid) + " gid " + std::to_string(x.gid) + ": " + why);
      break;
    case kStageChdir: d->set_user_error("exec: cannot enter the working directory '" + x.cwd + "': " + why); break;
    case kStageCgroup: d->set_user_error("exec: join the sandbox's cgroup: " + why); break;
    default: d->set_user_error("exec: setup failed: " + why); break;
  }
  if (!forced_error.empty()) d->set_user_error(forced_error);
  d->set_timed_out(x.timed_out);
  d->set_output_exceeded(x.output_exceeded);
  if (!x.stream) {
    *d->mutable_stdout() = std::move(x.out.buf);
    *d->mutable_stderr() = std::move(x.err.buf);
  }
  d->set_stdout_truncated(x.out.truncated);
  d->set_stderr_truncated(x.err.truncated);
  const rusage& ru = x.ru;
  d->set_cpu_us(static_cast<uint64_t>(ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec +
                                      ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec));
  d->set_wall_us(static_cast<uint64_t>((NowNs() - x.start_ns) / 1000));
  d->set_peak_memory_bytes(static_cast<uint64_t>(ru.ru_maxrss) * 1024);  // KiB on Linux
  if (Conn* c = x.conn ? FindConn(x.conn) : nullptr) {
    Send(*c, ev);
    auto it = c->execs.find(x.req_id);
    if (it != c->execs.end() && it->second == x.key) c->execs.erase(it);
    c->paused.erase(x.key);
  }
  for (auto [conn, req_id] : x.attached) {
    Conn* a = FindConn(conn);
    if (!a) continue;
    ev.set_id(req_id);
    Send(*a, ev);
    a->execs.erase(req_id);
    a->paused.erase(x.key);
  }
  if (!x.idem_key.empty()) {
    // Everyone who asked for this key hears; the result is kept for those
    // who ask later (a client that lost its connection meanwhile).
    for (auto [conn, req_id] : x.waiters) {
      Conn* w = FindConn(conn);
      if (!w) continue;
      ev.set_id(req_id);
      Send(*w, ev);
      auto it = w->execs.find(req_id);
      if (it != w->execs.end() && it->second == x.key) w->execs.erase(it);
    }
    keyed_running_.erase(x.idem_key);
    kept_.push_back({x.idem_key, x.fingerprint, std::move(*ev.mutable_exec_done())});
    // Bounded in count and bytes (they live in the container's memory); the
    // newest is always kept: it is the one a reconnecting client asks for.
    size_t bytes = 0;
    for (const auto& k : kept_) bytes += k.done.stdout().size() + k.done.stderr().size();
    while (kept_.size() > 1 && (kept_.size() > kKeptResults || bytes > kKeptBytes)) {
      bytes -= kept_.front().done.stdout().size() + kept_.front().done.stderr().size();
      kept_.erase(kept_.begin());
    }
  }
  if (!x.reaped) by_pid_.erase(x.pid);
  for (int64_t when : {x.deadline_ns, x.grace_ns}) {
    for (auto it = timers_.lower_bound(when); it != timers_.end() && it->first == when;) {
      if (it->second == x.key) it = timers_.erase(it);
      else ++it;
    }
  }
  execs_.erase(x.key);  // x is gone
}

}  // namespace dsec::agent::internal
