// `dsecctl exec`, `ps`, `signal`, `attach` and `watch` (dsec/processes.hpp,
// dsec/watch.hpp): a command in a sandbox with its output streamed as it
// comes, its stdin streamed too (a pipe, or the terminal with -i) and
// Ctrl-C passed to it (SIGINT; a second Ctrl-C: SIGKILL); the sandbox's
// running execs listed, signalled and attached to by pid; a directory's
// changes as they happen.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "dsec/processes.hpp"
#include "dsec/watch.hpp"
#include "tools/dsecctl/cli.hpp"

namespace dsec::ctl {

void AddExecCommands(CLI::App* app, ExecFlags* f) {
  f->exec = app->add_subcommand("exec", "run a command in an existing sandbox (Ctrl-C stops it there)");
  f->exec->add_option("id", f->id, "sandbox id")->required();
  AddLimitFlags(f->exec, &f->limits, true);
  f->exec->add_flag("--json", f->json, "print the whole result as JSON (stdin read whole first)");
  f->exec->add_flag("-i,--interactive", f->interactive,
                    "pass the terminal's input on (without it a terminal's stdin is closed at once; a pipe's is "
                    "always passed on, as it comes)");
  f->exec->add_flag("-t,--tty", f->tty,
                    "give the command a terminal (its size the local one's, kept in step); with -i the local "
                    "terminal is put in raw mode, so keys such as Ctrl-C go to the command's terminal");
  f->exec->add_option("--user,-u", f->user,
                      "run as this user of the sandbox's /etc/passwd (name or uid): its ids, groups, HOME; its "
                      "home as the working directory unless --cwd");
  f->exec->add_option("command", f->cmd, "the command (after --)")->required();
  f->ps = app->add_subcommand("ps", "a sandbox's running execs: pid, age, stdin, command");
  f->ps->add_option("id", f->id, "sandbox id")->required();
  f->usage = app->add_subcommand("usage", "what a sandbox uses now: CPUs and their use, memory, disk");
  f->usage->add_option("id", f->id, "sandbox id")->required();
  f->usage->add_flag("--json", f->json, "print it as JSON");
  f->signal = app->add_subcommand("signal", "send a signal to a running exec's process group, by pid (see ps)");
  f->signal->add_option("id", f->id, "sandbox id")->required();
  f->signal->add_option("pid", f->pid, "the exec's pid")->required();
  f->signal->add_option("-s,--signal", f->sig, "signal number (default 15, TERM)");
  f->attach = app->add_subcommand(
      "attach", "a running exec's output from now on, by pid (see ps), and its exit status; Ctrl-C leaves it running");
  f->attach->add_option("id", f->id, "sandbox id")->required();
  f->attach->add_option("pid", f->pid, "the exec's pid")->required();
  f->attach->add_option("--timeout", f->timeout_s, "stop following after this many seconds (exit 124)");
  f->watch = app->add_subcommand("watch", "print a directory's changes as they happen: TYPE NAME a line each");
  f->watch->add_option("id", f->id, "sandbox id")->required();
  f->watch->add_option("path", f->path, "the directory (absolute)")->required();
  f->watch->add_flag("-r,--recursive", f->recursive, "every directory under it too, new ones included");
  f->watch->add_option("--timeout", f->timeout_s, "stop after this many seconds (0: until Ctrl-C)");
}

namespace {
int PrintUsage(const Sandbox& sb, bool as_json) {
  auto u = MeasureUsage(sb);
  if (!u.ok()) return Fail(u.status());
  if (as_json) {
    std::fputs(ToJson(*u).c_str(), stdout);
    return 0;
  }
  auto mib = [](uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
  std::printf("cpu     %.1f%% of %u (%.1f s in all)\n", u->cpu_used_pct(), u->cpu_count(), u->cpu_ns() / 1e9);
  std::printf("memory  %s used, %s cache, of %s\n", mib(u->mem_used_bytes()).c_str(), mib(u->mem_cache_bytes()).c_str(),
              mib(u->mem_total_bytes()).c_str());
  std::printf("disk    %s%s\n", mib(u->disk_used_bytes()).c_str(),
              u->disk_total_bytes() ? (" of " + mib(u->disk_total_bytes())).c_str() : " (no limit)");
  return 0;
}

int Watch(const Sandbox& sb, const ExecFlags& f) {
  static const char* kTypes[] = {"?", "create", "write", "remove", "rename", "chmod"};
  WatchOptions o;
  o.recursive = f.recursive;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  auto w = WatchDir(
      sb, f.path,
      [](const v1::FsEvent& e) {
        std::printf("%s %s\n", kTypes[e.type() >= 0 && e.type() <= 5 ? e.type() : 0], e.name().c_str());
        std::fflush(stdout);
      },
      o);
  if (!w.ok()) return Fail(w.status());
  auto end = (*w)->Wait();  // Ctrl-C ends dsecctl, and with it the watch
  return end.ok() ? 0 : Fail(end.status());
}
}  // namespace

namespace {

// Ctrl-C and terminal size changes while an exec runs: counted here,
// passed on by a thread.
std::atomic<int> interrupts{0}, resizes{0};
int wake_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  (sig == SIGWINCH ? resizes : interrupts).fetch_add(1);
  char b = 1;
  (void)!::write(wake_pipe[1], &b, 1);
}

// The local terminal's size (80x24 when stdout is none).
v1::PtySize LocalSize() {
  v1::PtySize s;
  winsize ws{};
  bool ok = ::ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row;
  s.set_cols(ok ? ws.ws_col : 80);
  s.set_rows(ok ? ws.ws_row : 24);
  return s;
}

// The local terminal in raw mode while it lives (-it), restored after.
class RawMode {
 public:
  RawMode() {
    if (::tcgetattr(0, &saved_) < 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    on_ = ::tcsetattr(0, TCSANOW, &raw) == 0;
  }
  ~RawMode() {
    if (on_) ::tcsetattr(0, TCSANOW, &saved_);
  }

 private:
  termios saved_{};
  bool on_ = false;
};

void Write(FILE* to, const std::string& s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), to);
  std::fflush(to);
}

}  // namespace

int RunExecCommand(const Common& c, const ExecFlags& f) {
  int rc = 0;
  if (*f.ps || *f.usage || *f.signal) {
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    auto sb = client->Attach(f.id);
    if (!sb.ok()) return Fail(sb.status());
    if (*f.signal) {
      Status s = SignalProcess(*sb, f.pid, f.sig);
      return s.ok() ? 0 : Fail(s);
    }
    if (*f.usage) return PrintUsage(*sb, f.json);
    auto list = ListProcesses(*sb);
    if (!list.ok()) return Fail(list.status());
    std::printf("%-8s %-8s %-6s %s\n", "PID", "AGE", "STDIN", "COMMAND");
    for (const auto& p : *list) {
      std::string cmd;
      for (const auto& a : p.argv()) cmd += (cmd.empty() ? "" : " ") + a;
      std::printf("%-8u %-8s %-6s %s\n", p.pid(), (std::to_string(p.running_ms() / 1000) + "s").c_str(),
                  p.stdin_open() ? "open" : "-", cmd.c_str());
    }
    return 0;
  }
  if (*f.attach || *f.watch) {
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    auto sb = client->Attach(f.id);
    if (!sb.ok()) return Fail(sb.status());
    if (*f.watch) return Watch(*sb, f);
    v1::ExecRequest req;
    req.set_attach_pid(f.pid);
    req.mutable_limits()->set_timeout_ms(static_cast<uint64_t>(f.timeout_s * 1000));
    auto r = sb->ExecStream(req, [](const v1::ExecOutput& o) {
      Write(stdout, o.stdout());
      Write(stderr, o.stderr());
      Write(stdout, o.pty());
    });
    if (!r.ok() && r.status().code() == Status::Code::kDeadlineExceeded && f.timeout_s > 0) return 124;
    if (!r.ok()) return Fail(r.status());
    return Report(*r, false);
  }
  v1::ExecRequest req;
  if (auto e = ApplyLimits(f.limits, req.mutable_limits()); !e.empty()) return Fail(e, kUsage);
  if (auto e = BuildExec(f.limits, f.cmd, &req); !e.empty()) return Fail(e, kUsage);
  req.set_user(f.user);
  if (f.tty) *req.mutable_pty() = LocalSize();
  bool tty = ::isatty(0);
  bool pass_stdin = !tty || f.interactive;
  auto client = ConnectOrDie(c, &rc);
  if (!client) return rc;
  auto sb = client->Attach(f.id);
  if (!sb.ok()) return Fail(sb.status());
  if (f.json) {
    if (pass_stdin) req.set_stdin(ReadAllStdin(64u << 20));
    auto r = sb->Exec(req);
    if (!r.ok()) return Fail(r.status());
    return Report(*r, true);
  }
  // Streamed and interactive: the first piece names the pid; stdin goes
  // after it as it comes; Ctrl-C is passed on by pid.
  req.set_interactive(true);
  std::mutex mu;
  std::condition_variable cv;
  uint32_t pid = 0;
  bool ended = false;
  if (::pipe2(wake_pipe, O_CLOEXEC) < 0) return Fail("pipe: " + std::string(std::strerror(errno)), kLocal);
  struct sigaction sa {}, old_int {}, old_winch {};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGINT, &sa, &old_int);
  if (f.tty) ::sigaction(SIGWINCH, &sa, &old_winch);
  std::unique_ptr<RawMode> raw;
  if (f.tty && f.interactive && tty) raw = std::make_unique<RawMode>();
  std::thread relay([&] {
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return pid != 0 || ended; });
      if (ended) return;
    }
    bool stdin_open = pass_stdin;
    if (!stdin_open) (void)CloseStdin(*sb, pid);
    int sent = 0;
    char buf[64 << 10];
    for (;;) {
      pollfd fds[2] = {{wake_pipe[0], POLLIN, 0}, {0, static_cast<short>(stdin_open ? POLLIN : 0), 0}};
      if (::poll(fds, stdin_open ? 2 : 1, -1) < 0 && errno != EINTR) return;
      if (fds[0].revents) {
        char b[16];
        (void)!::read(wake_pipe[0], b, sizeof b);
        {
          std::lock_guard<std::mutex> lk(mu);
          if (ended) return;
        }
        for (int n = interrupts.load(); sent < n; ++sent) (void)SignalProcess(*sb, pid, sent == 0 ? SIGINT : SIGKILL);
        if (resizes.exchange(0)) {
          v1::ProcessRequest resize;
          resize.set_op(v1::PROCESS_OP_RESIZE);
          resize.set_pid(pid);
          *resize.mutable_size() = LocalSize();
          ProcessAsync(*sb, std::move(resize), [](Result<v1::ProcessReply>) {});
        }
      }
      if (stdin_open && fds[1].revents) {
        ssize_t n = ::read(0, buf, sizeof buf);
        if (n > 0 && SendInput(*sb, pid, std::string(buf, static_cast<size_t>(n))).ok()) continue;
        stdin_open = false;  // end of input (or the command closed its stdin, or ended)
        (void)CloseStdin(*sb, pid);
      }
    }
  });
  auto r = sb->ExecStream(req, [&](const v1::ExecOutput& o) {
    if (o.pid()) {
      std::lock_guard<std::mutex> lk(mu);
      pid = o.pid();
      cv.notify_all();
    }
    Write(stdout, o.stdout());
    Write(stderr, o.stderr());
    Write(stdout, o.pty());
  });
  raw.reset();
  {
    std::lock_guard<std::mutex> lk(mu);
    ended = true;
    cv.notify_all();
  }
  char b = 0;
  (void)!::write(wake_pipe[1], &b, 1);
  relay.join();
  ::sigaction(SIGINT, &old_int, nullptr);
  if (f.tty) ::sigaction(SIGWINCH, &old_winch, nullptr);
  ::close(wake_pipe[0]);
  ::close(wake_pipe[1]);
  // A kind without processes (fncall) refuses before running anything: run
  // it whole instead, stdin read first.
  if (!r.ok() && r.status().code() == Status::Code::kUnimplemented) {
    req.set_interactive(false);
    if (pass_stdin) req.set_stdin(ReadAllStdin(64u << 20));
    r = sb->Exec(req);
  }
  if (!r.ok()) return Fail(r.status());
  return Report(*r, false);
}

}  // namespace dsec::ctl
