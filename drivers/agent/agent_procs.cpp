// An exec's stdin (written as the epoll loop lets it; an interactive one's
// kept open for more), terminals, Signal (an exec or a watch of the
// connection by its request id), attaching to a running exec's output, and
// Proc: the agent's running execs by pid, whichever connection started
// them, listed, signalled, their stdin written or closed, their terminal
// resized.
#include "drivers/agent/agent_internal.hpp"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <signal.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace dsec::agent::internal {

namespace {
// Input waiting for a process that does not read: beyond this, Proc input is refused.
constexpr size_t kMaxPendingInput = 16 << 20;
}  // namespace

int OpenPty(uint32_t cols, uint32_t rows, UniqueFd* master, UniqueFd* slave) {
  UniqueFd m(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK));
  if (!m || ::grantpt(m.get()) < 0 || ::unlockpt(m.get()) < 0) return errno;
  char name[64];
  if (int e = ::ptsname_r(m.get(), name, sizeof name)) return e;
  UniqueFd s(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!s) return errno;
  winsize ws{};
  ws.ws_col = static_cast<unsigned short>(cols ? cols : 80);
  ws.ws_row = static_cast<unsigned short>(rows ? rows : 24);
  if (::ioctl(m.get(), TIOCSWINSZ, &ws) < 0) return errno;
  *master = std::move(m);
  *slave = std::move(s);
  return 0;
}

void Agent::WriteStdin(ExecRun& x) {
  while (x.in && x.stdin_off < x.stdin_data.size()) {
    ssize_t w = ::write(x.in.get(), x.stdin_data.data() + x.stdin_off, x.stdin_data.size() - x.stdin_off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      if (!x.in_watched) WatchFd(x.in.get(), x.key, kExecIn, EPOLLOUT);
      x.in_watched = true;
      return;
    }
    if (w < 0) {  // EPIPE: it closed stdin early; its business
      x.stdin_close = true;
      break;
    }
    x.stdin_off += static_cast<size_t>(w);
  }
  std::string().swap(x.stdin_data);
  x.stdin_off = 0;
  if (x.interactive && !x.stdin_close && x.in) {  // all written: wait for more
    if (x.in_watched) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, x.in.get(), nullptr);
    x.in_watched = false;
    return;
  }
  x.in.Reset();  // closing it leaves epoll too
  x.in_watched = false;
}

void Agent::OnSignalRequest(Conn& c, uint64_t id, const Signal& req) {
  if (auto w = c.watches.find(req.exec_id()); w != c.watches.end()) {  // a watch: it ends
    EndWatch(w->second, 0, {});  // its end (ok) to the watch, then this one's
    Event ev;
    ev.set_id(id);
    ev.mutable_ok();
    return Send(c, ev);
  }
  auto it = c.execs.find(req.exec_id());
  auto x = it == c.execs.end() ? execs_.end() : execs_.find(it->second);
  if (x == execs_.end()) {
    SendError(c, id, ESRCH,
              "signal: no running exec with id " + std::to_string(req.exec_id()) + " on this connection");
    return;
  }
  ExecRun& r = *x->second;
  auto& a = r.attached;
  if (auto mine = std::find(a.begin(), a.end(), std::make_pair(c.key, req.exec_id())); mine != a.end()) {
    // An attachment: it ends (the process runs on; its own client signals it).
    a.erase(mine);
    c.execs.erase(it);
    SendError(c, req.exec_id(), ECANCELED, "attach: detached; process " + std::to_string(r.pid) + " runs on");
    Resume(r);
    Event ev;
    ev.set_id(id);
    ev.mutable_ok();
    return Send(c, ev);
  }
  if (req.signal() < 0 || req.signal() >= NSIG) {
    SendError(c, id, EINVAL, "signal: " + std::to_string(req.signal()) + " is not a signal number");
    return;
  }
  // Once its process was reaped its pid may name someone else's group.
  bool group_ours = !r.reaped || !by_pid_.count(r.pid);
  if (group_ours && ::kill(-r.pid, req.signal()) < 0 && errno != ESRCH) {
    SendError(c, id, errno,
              "signal: send signal " + std::to_string(req.signal()) + " to exec " +
                  std::to_string(req.exec_id()) + " (process group " + std::to_string(r.pid) +
                  "): " + std::strerror(errno));
    return;
  }
  Event ev;
  ev.set_id(id);
  ev.mutable_ok();
  Send(c, ev);
}

void Agent::Attach(Conn& c, uint64_t id, const Exec& req) {
  int32_t pid = req.attach_pid();
  auto found = by_pid_.find(pid);
  auto it = found == by_pid_.end() ? execs_.end() : execs_.find(found->second);
  if (it == execs_.end() || it->second->reaped || it->second->privileged)
    return SendError(c, id, ESRCH, "attach: no running process " + std::to_string(pid) +
                                       " started by dsec in this sandbox (list them to see which run)");
  ExecRun& x = *it->second;
  if (!x.stream)
    return SendError(c, id, EINVAL, "attach: process " + std::to_string(pid) +
                                        " does not stream its output (its exec gets it whole when it ends)");
  x.attached.emplace_back(c.key, id);
  c.execs[id] = x.key;
  if (uint64_t ms = req.limits().timeout_ms())
    attach_timers_.emplace(NowNs() + static_cast<int64_t>(std::min<uint64_t>(ms, 1ull << 40)) * 1000000,
                           std::make_pair(c.key, id));
  Event ev;  // the pid first, as an interactive exec's start says it
  ev.set_id(id);
  ev.mutable_output()->set_pid(pid);
  Send(c, ev);
}

void Agent::OnAttachTimer(uint64_t conn, uint64_t id) {
  Conn* c = FindConn(conn);
  if (!c) return;
  auto it = c->execs.find(id);
  auto x = it == c->execs.end() ? execs_.end() : execs_.find(it->second);
  if (x == execs_.end()) return;  // ended (answered) already
  auto& a = x->second->attached;
  auto mine = std::find(a.begin(), a.end(), std::make_pair(conn, id));
  if (mine == a.end()) return;  // the request id is the process's own start, or reused
  a.erase(mine);
  c->execs.erase(it);
  SendError(*c, id, ETIMEDOUT, "attach: its time is up; process " + std::to_string(x->second->pid) + " runs on");
  Resume(*x->second);
}

void Agent::Detach(ExecRun& x, uint64_t conn) {
  auto& a = x.attached;
  a.erase(std::remove_if(a.begin(), a.end(), [conn](const auto& p) { return p.first == conn; }), a.end());
  Resume(x);  // it may have waited for that client alone; the next read pauses again if another is slow
}

void Agent::OnProc(Conn& c, uint64_t id, const Proc& req) {
  auto ok = [&] {
    Event ev;
    ev.set_id(id);
    ev.mutable_ok();
    Send(c, ev);
  };
  if (req.op() == 1) {  // list: the execs still running, oldest first
    Event ev;
    ev.set_id(id);
    auto* list = ev.mutable_procs();
    std::vector<const ExecRun*> running;
    for (const auto& [key, x] : execs_)
      if (!x->reaped && !x->privileged) running.push_back(x.get());
    std::sort(running.begin(), running.end(), [](auto* a, auto* b) { return a->start_ns < b->start_ns; });
    int64_t now = NowNs();
    for (const ExecRun* x : running) {
      ProcInfo* p = list->add_procs();
      p->set_pid(x->pid);
      for (const auto& a : x->argv) p->add_argv(a);
      p->set_cwd(x->cwd);
      p->set_uid(x->uid);
      p->set_running_ms((now - x->start_ns) / 1000000);
      p->set_stdin_open(x->interactive && !x->stdin_close && static_cast<bool>(x->in));
    }
    return Send(c, ev);
  }
  const std::string what = req.op() == 2   ? "signal"
                           : req.op() == 3 ? "input"
                           : req.op() == 4 ? "close_stdin"
                           : req.op() == 5 ? "resize"
                                           : "proc";
  auto found = by_pid_.find(req.pid());
  auto it = found == by_pid_.end() ? execs_.end() : execs_.find(found->second);
  // dsecd's own upkeep is not the user's to signal or feed (it runs with the agent's capabilities).
  if (it == execs_.end() || it->second->reaped || it->second->privileged)
    return SendError(c, id, ESRCH, what + ": no running process " + std::to_string(req.pid()) +
                                       " started by dsec in this sandbox (list them to see which run)");
  ExecRun& x = *it->second;
  switch (req.op()) {
    case 2:
      if (req.signal() <= 0 || req.signal() >= NSIG)
        return SendError(c, id, EINVAL, "signal: " + std::to_string(req.signal()) + " is not a signal number");
      if (::kill(-x.pid, req.signal()) < 0 && errno != ESRCH)
        return SendError(c, id, errno, "signal: process group " + std::to_string(x.pid) + ": " + std::strerror(errno));
      return ok();
    case 3:
    case 4:
      if (!x.interactive || x.stdin_close || !x.in)
        return SendError(c, id, EPIPE, what + ": process " + std::to_string(x.pid) +
                                           (x.interactive ? "'s stdin is closed"
                                                          : " was not started interactive (its stdin was closed "
                                                            "after the exec's own)"));
      if (req.op() == 4) {
        x.stdin_close = true;
      } else {
        if (x.stdin_data.size() - x.stdin_off + req.input().size() > kMaxPendingInput)
          return SendError(c, id, EAGAIN, "input: process " + std::to_string(x.pid) + " has " +
                                              std::to_string(x.stdin_data.size() - x.stdin_off) +
                                              " bytes of input it has not read yet; send more once it reads");
        x.stdin_data.append(req.input());
      }
      WriteStdin(x);
      return ok();
    case 5: {
      int master = x.out.fd ? x.out.fd.get() : x.in ? x.in.get() : -1;  // both are the master's
      if (!x.pty || master < 0)
        return SendError(c, id, ENOTTY, "resize: process " + std::to_string(x.pid) + " has no terminal");
      winsize ws{};
      ws.ws_col = static_cast<unsigned short>(std::clamp<uint32_t>(req.size().cols(), 1, 10000));
      ws.ws_row = static_cast<unsigned short>(std::clamp<uint32_t>(req.size().rows(), 1, 10000));
      if (::ioctl(master, TIOCSWINSZ, &ws) < 0)
        return SendError(c, id, errno, "resize: " + std::string(std::strerror(errno)));
      return ok();
    }
    default:
      return SendError(c, id, EINVAL, "proc: unknown operation " + std::to_string(req.op()) +
                                          " (1 list, 2 signal, 3 input, 4 close_stdin, 5 resize)");
  }
}

}  // namespace dsec::agent::internal
