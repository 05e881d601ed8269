// dsec-agent end to end: the real static binary, started per test as an
// ordinary process (so a child subreaper, not PID 1) on a socket in a fresh
// /tmp/dsec-test-agent-* dir, driven through AgentClient, stopped by PID.
// Nothing here waits by sleeping: the agent reaps before it serves each
// request, so a Ping answered after a process has exited is a barrier for its
// reaping; commands run by the agent may sleep.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include "drivers/agent/agent_client.hpp"
#include "runtime/frame.hpp"
#include "tests/support/daemon.hpp"

extern char** environ;

namespace dsec::testing {
namespace {

using drivers::AgentClient;
using Millis = std::chrono::milliseconds;
constexpr Millis kWait{30000};

agent::Exec Cmd(std::vector<std::string> argv) {
  agent::Exec e;
  for (auto& a : argv) e.add_argv(a);
  e.add_env("PATH=/usr/local/bin:/usr/bin:/bin");
  return e;
}

agent::Exec Sh(const std::string& script) { return Cmd({"/bin/sh", "-c", script}); }

// True once `pid` has exited (or is gone already); waits on a pidfd.
bool WaitExited(pid_t pid, int timeout_ms = 20000) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int rc = ::poll(&p, 1, timeout_ms);
  ::close(fd);
  return rc == 1;
}

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// Starts `args` with fd 3 open: a pipe the agent says "ready" on (when
// `wait_ready`, this returns once it did), or `fd3`. -1 on failure.
pid_t SpawnAgent(std::vector<std::string> args, bool wait_ready, int fd3 = -1) {
  int ready[2] = {-1, -1};
  if (wait_ready) {
    EXPECT_EQ(::pipe2(ready, O_CLOEXEC), 0);
    fd3 = ready[1];
  }
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd3, 3);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, av[0], &fa, nullptr, av.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (!wait_ready) {
    EXPECT_EQ(rc, 0) << "spawn " << args[0] << ": " << std::strerror(rc);
    return rc == 0 ? pid : -1;
  }
  ::close(ready[1]);
  UniqueFd r(ready[0]);
  EXPECT_EQ(rc, 0) << "spawn " << args[0] << ": " << std::strerror(rc);
  if (rc != 0) return -1;
  pollfd p{r.get(), POLLIN, 0};
  char buf[16] = {};
  if (::poll(&p, 1, 20000) != 1 || ::read(r.get(), buf, sizeof buf) != 6 || std::string(buf) != "ready\n") {
    ADD_FAILURE() << args[0] << " did not get ready";
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

// "R", "S", "Z"... of /proc/<pid>/stat; "" if gone.
std::string ProcState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return "";
  size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ? "" : line.substr(paren + 2, 1);
}

std::string ProcField(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, key.size() + 1, key + ":") == 0) {
      std::istringstream s(line.substr(key.size() + 1));
      std::string v;
      s >> v;
      return v;
    }
  return "";
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::signal(SIGPIPE, SIG_IGN);
    char tmpl[] = "/tmp/dsec-test-agent-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    sock_ = dir_ + "/agent.sock";
    StartAgent();
    ASSERT_GT(pid_, 0);
    client_ = Connect();
    ASSERT_NE(client_, nullptr);
  }

  void TearDown() override {
    client_.reset();
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      if (!WaitExited(pid_)) ::kill(pid_, SIGKILL);
      int status = 0;
      ASSERT_EQ(::waitpid(pid_, &status, 0), pid_);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "agent wait status " << status;
      struct stat st;
      EXPECT_NE(::lstat(sock_.c_str(), &st), 0) << "the agent left its socket behind";
    }
    if (!dir_.empty()) RunProcess({"/bin/rm", "-rf", dir_});
  }

  void StartAgent() {
    pid_ = SpawnAgent({BinDir() + "/dsec-agent", "--listen", sock_, "--ready-fd", "3"}, true);
  }

  std::unique_ptr<AgentClient> Connect() {
    auto c = AgentClient::Connect(sock_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // A raw connection for feeding the agent bad frames.
  UniqueFd RawConnect() {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, sock_.c_str(), sizeof addr.sun_path - 1);
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    return fd;
  }

  // The next event on a raw connection; nullopt on EOF (*eof) or timeout.
  static std::optional<agent::Event> ReadEvent(int fd, bool* eof, int timeout_ms = 20000) {
    *eof = false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return std::nullopt;
    std::string frame;
    if (ReadFrame(fd, &frame) != 0) {
      *eof = true;
      return std::nullopt;
    }
    agent::Event ev;
    EXPECT_TRUE(ev.ParseFromString(frame));
    return ev;
  }

  Result<agent::ExecDone> Run(const agent::Exec& e) { return client_->ExecSync(e, kWait); }

  agent::WriteFile Write(const std::string& path, const std::string& data, uint32_t mode = 0, bool mkdirs = false) {
    agent::WriteFile w;
    w.set_path(path);
    w.set_data(data);
    w.set_mode(mode);
    w.set_mkdirs(mkdirs);
    return w;
  }

  std::string dir_, sock_;
  pid_t pid_ = -1;
  std::unique_ptr<AgentClient> client_;
};

TEST_F(AgentTest, HelpSaysWhatItIs) {
  auto r = RunProcess({BinDir() + "/dsec-agent", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("usage: dsec-agent"), std::string::npos) << r.out;
  EXPECT_NE(RunProcess({BinDir() + "/dsec-agent", "--bogus"}).exit_code, 0);
}

TEST_F(AgentTest, Ping) {
  auto p = client_->PingSync(kWait);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(static_cast<pid_t>(p->pid()), pid_);
  EXPECT_FALSE(p->version().empty());
  EXPECT_EQ(p->execs_running(), 0u);
}

TEST_F(AgentTest, ExecReportsOutputAndExitCode) {
  auto r = Run(Sh("echo hello; echo oops >&2; exit 3"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->exited());
  EXPECT_EQ(r->exit_code(), 3);
  EXPECT_EQ(r->stdout(), "hello\n");
  EXPECT_EQ(r->stderr(), "oops\n");
  EXPECT_FALSE(r->timed_out());
  EXPECT_EQ(r->exec_errno(), 0);
  EXPECT_TRUE(r->error().empty()) << r->error();
  EXPECT_GT(r->wall_us(), 0u);
  EXPECT_GT(r->peak_rss_bytes(), 0u);
}

TEST_F(AgentTest, StdinIsFedThenClosed) {
  auto e = Cmd({"tr", "a-z", "A-Z"});
  e.set_stdin("hello agent\n");
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "HELLO AGENT\n");
  // More than any pipe holds: written as the program reads.
  auto big = Cmd({"wc", "-c"});
  big.set_stdin(std::string(3 << 20, 'x'));
  r = Run(big);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), std::to_string(3 << 20) + "\n");
}

TEST_F(AgentTest, EnvCwdAndPathFromTheRequest) {
  auto e = Sh("echo $FOO; pwd");
  e.add_env("FOO=bar");
  e.set_cwd(dir_);
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "bar\n" + dir_ + "\n");
  // The whole environment is the request's.
  r = Run(Cmd({"env"}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), "PATH=/usr/local/bin:/usr/bin:/bin\n");
  // argv[0] is looked up in the request's PATH; a script without #! runs with sh.
  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/bin/mytool", "#!/bin/sh\necho mytool \"$1\"\n", 0755, true), kWait).ok());
  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/bin/noshebang", "echo plain \"$1\"\n", 0755), kWait).ok());
  agent::Exec t;
  t.add_argv("mytool");
  t.add_argv("x");
  t.add_env("PATH=/nonexistent:" + dir_ + "/bin");
  r = Run(t);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "mytool x\n");
  t.set_argv(0, "noshebang");
  r = Run(t);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "plain x\n");
}

TEST_F(AgentTest, CommandNotFoundAndNotExecutable) {
  auto r = Run(Cmd({"dsec-no-such-command"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exec_errno(), ENOENT);
  EXPECT_EQ(r->exit_code(), 127);
  EXPECT_TRUE(r->error().empty()) << r->error();

  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/plain.txt", "not a program\n", 0644), kWait).ok());
  r = Run(Cmd({dir_ + "/plain.txt"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exec_errno(), EACCES);
  EXPECT_EQ(r->exit_code(), 126);

  auto e = Cmd({"true"});
  e.set_cwd(dir_ + "/no-such-dir");
  r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->error().find(dir_ + "/no-such-dir"), std::string::npos) << r->error();
  EXPECT_NE(r->error().find("No such file"), std::string::npos) << r->error();

  agent::Exec empty;
  auto bad = client_->ExecSync(empty, kWait);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument) << bad.status().ToString();
}

TEST_F(AgentTest, StreamedOutputArrivesWhileItRuns) {
  auto e = Sh("for i in 1 2 3 4 5; do echo line$i; sleep 0.2; done; echo bye >&2");
  e.set_stream(true);
  std::mutex mu;
  std::vector<agent::Output> outs;
  std::atomic<bool> done_seen{false};
  bool output_after_done = false;
  auto r = client_->ExecSync(e, kWait, [&](const agent::Output& o) {
    std::lock_guard<std::mutex> lk(mu);
    if (done_seen) output_after_done = true;
    outs.push_back(o);
  });
  done_seen = true;
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_code(), 0);
  EXPECT_TRUE(r->stdout().empty());
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_FALSE(output_after_done);
  std::string out, err;
  int stdout_events = 0;
  for (const auto& o : outs) {
    if (o.stream() == 1) {
      out += o.data();
      ++stdout_events;
    } else {
      EXPECT_EQ(o.stream(), 2);
      err += o.data();
    }
  }
  EXPECT_GE(stdout_events, 3) << "output came in one piece at the end";
  EXPECT_EQ(out, "line1\nline2\nline3\nline4\nline5\n");
  EXPECT_EQ(err, "bye\n");
}

TEST_F(AgentTest, TimeoutKillsTheWholeProcessGroup) {
  auto e = Sh("sleep 1000 & echo $!; wait");
  e.mutable_limits()->set_timeout_ms(300);
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->timed_out());
  EXPECT_FALSE(r->exited());
  EXPECT_EQ(r->signal(), SIGKILL);
  EXPECT_GE(r->wall_us(), 300'000u);
  EXPECT_LT(r->wall_us(), 10'000'000u);
  pid_t bg = static_cast<pid_t>(std::atoi(r->stdout().c_str()));
  ASSERT_GT(bg, 0) << r->stdout();
  EXPECT_TRUE(WaitExited(bg)) << "the background sleep survived the timeout";
  ASSERT_TRUE(client_->PingSync(kWait).ok());  // barrier: reaped by now
  EXPECT_FALSE(Alive(bg));
}

TEST_F(AgentTest, OutputCapTruncatesAndKills) {
  auto e = Cmd({"yes"});
  e.mutable_limits()->set_output_bytes(1000);
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout().size(), 1000u);
  EXPECT_TRUE(r->stdout_truncated());
  EXPECT_FALSE(r->stderr_truncated());
  EXPECT_TRUE(r->output_exceeded());
  EXPECT_EQ(r->signal(), SIGKILL);

  // Streamed: the cap counts what was sent.
  e.set_stream(true);
  std::atomic<size_t> sent{0};
  r = client_->ExecSync(e, kWait, [&](const agent::Output& o) { sent += o.data().size(); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(sent.load(), 1000u);
  EXPECT_TRUE(r->stdout_truncated());
  EXPECT_TRUE(r->output_exceeded());
}

TEST_F(AgentTest, SignalReachesARunningExec) {
  auto e = Sh("echo ready; exec sleep 1000");
  e.set_stream(true);
  std::promise<void> ready;
  std::atomic<bool> once{false};
  std::promise<Result<agent::ExecDone>> done;
  uint64_t id = client_->Exec(
      e,
      [&](const agent::Output&) {
        if (!once.exchange(true)) ready.set_value();
      },
      [&](Result<agent::ExecDone> r) { done.set_value(std::move(r)); });
  ASSERT_NE(id, 0u);
  ASSERT_EQ(ready.get_future().wait_for(kWait), std::future_status::ready);
  EXPECT_TRUE(client_->SignalSync(id, SIGTERM, kWait).ok());
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
  auto r = f.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->signal(), SIGTERM);
  EXPECT_FALSE(r->timed_out());

  Status st = client_->SignalSync(id, SIGTERM, kWait);  // finished: unknown now
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.ToString();
  st = client_->SignalSync(987654, SIGTERM, kWait);
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find("987654"), std::string::npos) << st.message();
}

TEST_F(AgentTest, TwentyConcurrentExecs) {
  constexpr int kN = 20;
  std::vector<std::promise<Result<agent::ExecDone>>> done(kN);
  for (int i = 0; i < kN; ++i)
    client_->Exec(Cmd({"/bin/sh", "-c", "sleep 0.3; echo $0", "n" + std::to_string(i)}), {},
                  [&done, i](Result<agent::ExecDone> r) { done[i].set_value(std::move(r)); });
  auto ping = client_->PingSync(kWait);
  ASSERT_TRUE(ping.ok());
  EXPECT_GT(ping->execs_running(), 0u);
  for (int i = 0; i < kN; ++i) {
    auto f = done[i].get_future();
    ASSERT_EQ(f.wait_for(kWait), std::future_status::ready) << i;
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->exit_code(), 0);
    EXPECT_EQ(r->stdout(), "n" + std::to_string(i) + "\n");
  }
  EXPECT_EQ(client_->PingSync(kWait)->execs_running(), 0u);
}

TEST_F(AgentTest, FilesWriteReadStatList) {
  std::string f = dir_ + "/a/b/c.txt";
  ASSERT_TRUE(client_->WriteFileSync(Write(f, "data", 0, true), kWait).ok());
  auto data = client_->ReadFileSync(f, kWait);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(*data, "data");
  auto st = client_->StatSync(f, kWait);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->name(), "c.txt");
  EXPECT_TRUE(S_ISREG(st->mode()));
  EXPECT_EQ(st->mode() & 07777, 0644u);
  EXPECT_EQ(st->size(), 4u);
  EXPECT_GT(st->mtime_ms(), 0);
  // Overwrite: shorter content, an explicit mode.
  ASSERT_TRUE(client_->WriteFileSync(Write(f, "xy", 0600), kWait).ok());
  EXPECT_EQ(*client_->ReadFileSync(f, kWait), "xy");
  EXPECT_EQ(client_->StatSync(f, kWait)->mode() & 07777, 0600u);
  ASSERT_EQ(::symlink("c.txt", (dir_ + "/a/b/link").c_str()), 0);
  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/a/b/empty", ""), kWait).ok());
  auto ls = client_->ListDirSync(dir_ + "/a/b", kWait);
  ASSERT_TRUE(ls.ok()) << ls.status().ToString();
  ASSERT_EQ(ls->size(), 3u);
  EXPECT_EQ((*ls)[0].name(), "c.txt");
  EXPECT_EQ((*ls)[1].name(), "empty");
  EXPECT_EQ((*ls)[1].size(), 0u);
  EXPECT_EQ((*ls)[2].name(), "link");
  EXPECT_TRUE(S_ISLNK((*ls)[2].mode()));
  EXPECT_EQ((*ls)[2].link_target(), "c.txt");
  auto link = client_->StatSync(dir_ + "/a/b/link", kWait);
  ASSERT_TRUE(link.ok());
  EXPECT_TRUE(S_ISLNK(link->mode()));
  EXPECT_EQ(link->link_target(), "c.txt");
  EXPECT_EQ(*client_->ReadFileSync(dir_ + "/a/b/link", kWait), "xy");  // followed: it is the sandbox's own
  // Binary content survives.
  std::string bin("\0\x01\xff\n\0", 5);
  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/bin.dat", bin), kWait).ok());
  EXPECT_EQ(*client_->ReadFileSync(dir_ + "/bin.dat", kWait), bin);
  // A file written by the agent is visible to its commands.
  auto r = Run(Cmd({"cat", f}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), "xy");
}

TEST_F(AgentTest, FileErrorsNameThePath) {
  std::string missing = dir_ + "/missing.txt";
  auto rd = client_->ReadFileSync(missing, kWait);
  ASSERT_FALSE(rd.ok());
  EXPECT_EQ(rd.status().code(), Status::Code::kNotFound);
  EXPECT_NE(rd.status().message().find(missing), std::string::npos) << rd.status().message();
  EXPECT_NE(rd.status().message().find("No such file"), std::string::npos) << rd.status().message();

  rd = client_->ReadFileSync(dir_, kWait);
  ASSERT_FALSE(rd.ok());
  EXPECT_EQ(rd.status().code(), Status::Code::kFailedPrecondition) << rd.status().ToString();
  EXPECT_NE(rd.status().message().find(dir_), std::string::npos) << rd.status().message();
  EXPECT_NE(rd.status().message().find("directory"), std::string::npos) << rd.status().message();

  // A FIFO is refused at once rather than blocking the agent.
  std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  rd = client_->ReadFileSync(fifo, kWait);
  ASSERT_FALSE(rd.ok());
  EXPECT_NE(rd.status().message().find("FIFO"), std::string::npos) << rd.status().message();

  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/ten", "0123456789"), kWait).ok());
  rd = client_->ReadFileSync(dir_ + "/ten", kWait, 5);
  ASSERT_FALSE(rd.ok());
  EXPECT_EQ(rd.status().code(), Status::Code::kResourceExhausted) << rd.status().ToString();
  EXPECT_EQ(*client_->ReadFileSync(dir_ + "/ten", kWait, 10), "0123456789");

  std::string deep = dir_ + "/no/such/dir/f.txt";
  Status st = client_->WriteFileSync(Write(deep, "x"), kWait);
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find(deep), std::string::npos) << st.message();
  st = client_->WriteFileSync(Write(dir_, "x"), kWait);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir_), std::string::npos) << st.message();

  auto s = client_->StatSync(missing, kWait);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kNotFound);
  EXPECT_NE(s.status().message().find(missing), std::string::npos);
  auto ls = client_->ListDirSync(missing, kWait);
  ASSERT_FALSE(ls.ok());
  EXPECT_EQ(ls.status().code(), Status::Code::kNotFound);
  EXPECT_NE(ls.status().message().find(missing), std::string::npos);
  ls = client_->ListDirSync(dir_ + "/ten", kWait);
  ASSERT_FALSE(ls.ok());
  EXPECT_NE(ls.status().message().find(dir_ + "/ten"), std::string::npos);
}

TEST_F(AgentTest, OrphansAreReaped) {
  auto r = Run(Sh("sleep 0.5 >/dev/null 2>&1 & echo $!"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_code(), 0);
  pid_t orphan = static_cast<pid_t>(std::atoi(r->stdout().c_str()));
  ASSERT_GT(orphan, 0);
  // Its shell is gone, so it is the agent's child now (if it still runs).
  std::string ppid = ProcField(orphan, "PPid");
  if (!ppid.empty()) {
    EXPECT_EQ(ppid, std::to_string(pid_));
  }
  ASSERT_TRUE(WaitExited(orphan));
  ASSERT_TRUE(client_->PingSync(kWait).ok());  // barrier: the agent reaps before serving
  EXPECT_FALSE(Alive(orphan)) << "orphan " << orphan << " is a zombie: state " << ProcState(orphan);
  for (pid_t child : ChildrenOf(pid_)) EXPECT_NE(ProcState(child), "Z") << "zombie child " << child;
}

TEST_F(AgentTest, MalformedFramesGetAnErrorAndTheAgentServesOthers) {
  UniqueFd raw = RawConnect();
  bool eof = false;
  // Not a Request at all (an over-long varint).
  ASSERT_EQ(WriteFrame(raw.get(), std::string(16, '\xff')), 0);
  auto ev = ReadEvent(raw.get(), &eof);
  ASSERT_TRUE(ev) << "eof=" << eof;
  EXPECT_EQ(ev->id(), 0u);
  ASSERT_TRUE(ev->has_error());
  EXPECT_EQ(ev->error().errno_value(), EBADMSG);
  // An empty frame: no id, no body.
  ASSERT_EQ(WriteFrame(raw.get(), ""), 0);
  ev = ReadEvent(raw.get(), &eof);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->id(), 0u);
  EXPECT_TRUE(ev->has_error());
  // A valid frame with an id and no body.
  agent::Request req;
  req.set_id(7);
  ASSERT_EQ(WriteFrame(raw.get(), req.SerializeAsString()), 0);
  ev = ReadEvent(raw.get(), &eof);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->id(), 7u);
  EXPECT_TRUE(ev->has_error());
  // The connection still works after all that.
  req.mutable_ping();
  ASSERT_EQ(WriteFrame(raw.get(), req.SerializeAsString()), 0);
  ev = ReadEvent(raw.get(), &eof);
  ASSERT_TRUE(ev);
  EXPECT_TRUE(ev->has_pong());

  // An oversized length prefix: the stream is unusable, the agent hangs up.
  const char huge[4] = {'\xf0', '\xff', '\xff', '\xff'};
  ASSERT_EQ(WriteFull(raw.get(), huge, 4), 0);
  for (int i = 0; i < 3 && !eof; ++i) {
    ev = ReadEvent(raw.get(), &eof);
    if (ev) EXPECT_TRUE(ev->has_error());
    else EXPECT_TRUE(eof) << "no EOF after an oversized frame";
  }
  EXPECT_TRUE(eof);
  // Plain garbage (an HTTP request reads as a 542 MB length).
  UniqueFd raw2 = RawConnect();
  std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(WriteFull(raw2.get(), http.data(), http.size()), 0);
  eof = false;
  for (int i = 0; i < 3 && !eof; ++i)
    if (!ReadEvent(raw2.get(), &eof)) break;
  EXPECT_TRUE(eof);

  auto p = client_->PingSync(kWait);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto r = Run(Cmd({"echo", "still here"}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), "still here\n");
}

TEST_F(AgentTest, ClientDisconnectMidExecLeavesItRunning) {
  auto other = Connect();
  ASSERT_NE(other, nullptr);
  auto e = Sh("echo $$; exec sleep 1000");
  e.set_stream(true);
  std::promise<std::string> first;
  std::atomic<bool> once{false};
  std::promise<Status> done;
  other->Exec(
      e,
      [&](const agent::Output& o) {
        if (!once.exchange(true)) first.set_value(o.data());
      },
      [&](Result<agent::ExecDone> r) { done.set_value(r.status()); });
  auto ff = first.get_future();
  ASSERT_EQ(ff.wait_for(kWait), std::future_status::ready);
  pid_t pid = static_cast<pid_t>(std::atoi(ff.get().c_str()));
  ASSERT_GT(pid, 0);
  other.reset();  // hang up mid-exec
  auto df = done.get_future();
  ASSERT_EQ(df.wait_for(kWait), std::future_status::ready);
  EXPECT_EQ(df.get().code(), Status::Code::kUnavailable);

  auto p = client_->PingSync(kWait);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->execs_running(), 1u);
  EXPECT_TRUE(Alive(pid));
  ::kill(pid, SIGKILL);
  ASSERT_TRUE(WaitExited(pid));
  p = client_->PingSync(kWait);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->execs_running(), 0u);  // finished, its events dropped
}

TEST_F(AgentTest, ASlowReaderHoldsBackOutputNotAgentMemory) {
  UniqueFd raw = RawConnect();
  agent::Request req;
  req.set_id(1);
  auto* e = req.mutable_exec();
  *e = Cmd({"head", "-c", "64000000", "/dev/zero"});
  e->set_stream(true);
  e->mutable_limits()->set_output_bytes(1ull << 30);
  ASSERT_EQ(WriteFrame(raw.get(), req.SerializeAsString()), 0);
  // Nobody reads `raw` for a second; the agent must not buffer 64 MB meanwhile.
  auto r = Run(Cmd({"sleep", "1"}));
  ASSERT_TRUE(r.ok());
  std::string hwm = ProcField(pid_, "VmHWM");  // kB
  ASSERT_FALSE(hwm.empty());
  EXPECT_LT(std::stoull(hwm), 24u * 1024) << "agent peak RSS " << hwm << " kB";
  uint64_t got = 0;
  bool eof = false, done = false;
  while (!done) {
    auto ev = ReadEvent(raw.get(), &eof);
    ASSERT_TRUE(ev) << "eof=" << eof << " after " << got << " bytes";
    if (ev->has_output()) got += ev->output().data().size();
    else if (ev->has_exec_done()) {
      done = true;
      EXPECT_EQ(ev->exec_done().exit_code(), 0);
    }
  }
  EXPECT_EQ(got, 64000000u);
  EXPECT_LT(std::stoull(ProcField(pid_, "VmHWM")), 24u * 1024);
}

TEST_F(AgentTest, LimitsAndUserDrop) {
  auto e = Sh("ulimit -n; ulimit -t");
  e.mutable_limits()->set_open_files(17);
  e.mutable_limits()->set_cpu_time_ms(2500);
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "17\n3\n");
  // Without a limit, commands get the agent's original soft limit back (it
  // raised its own); it inherited ours.
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  r = Run(Sh("ulimit -n"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), std::to_string(nofile.rlim_cur) + "\n");
  if (::geteuid() != 0) GTEST_SKIP() << "dropping to another uid needs root";
  e = Sh("id -u; id -g; id -G");
  e.set_uid(65534);
  e.set_gid(65534);
  r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "65534\n65534\n65534\n") << r->error();
}

TEST_F(AgentTest, CpuTimeIsReported) {
  auto r = Run(Sh("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_code(), 0);
  EXPECT_GT(r->cpu_us(), 0u);
}


// --fd: one already-connected stream (how a VM's virtio-serial port is
// served); without a listening socket, and not PID 1, the agent leaves when
// that stream closes.
TEST(AgentFdTest, ServesOneConnectedFdAndLeavesWhenItCloses) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = SpawnAgent({BinDir() + "/dsec-agent", "--fd", "3"}, false, sv[1]);
  ::close(sv[1]);
  ASSERT_GT(pid, 0);
  auto c = AgentClient::FromFd(UniqueFd(sv[0]));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto p = (*c)->PingSync(kWait);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(static_cast<pid_t>(p->pid()), pid);
  auto r = (*c)->ExecSync(Cmd({"echo", "over fd"}), kWait);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "over fd\n");
  c->reset();
  ASSERT_TRUE(WaitExited(pid));
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// As PID 1 of a pid namespace (as in a container): SIGTERM and SIGINT are
// ignored, orphans are reaped, only SIGKILL from outside stops it.
TEST(AgentPid1Test, IgnoresTermAndReapsAsInit) {
  if (::geteuid() != 0) GTEST_SKIP() << "a new pid namespace needs root";
  char tmpl[] = "/tmp/dsec-test-agent-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, sock = dir + "/agent.sock";
  pid_t unshare = SpawnAgent({"/usr/bin/unshare", "--pid", "--fork", "--kill-child", BinDir() + "/dsec-agent",
                              "--listen", sock, "--ready-fd", "3"},
                             true);
  ASSERT_GT(unshare, 0);
  std::vector<pid_t> kids = ChildrenOf(unshare);
  ASSERT_EQ(kids.size(), 1u);
  pid_t agent = kids[0];  // its pid out here
  {
    auto c = AgentClient::Connect(sock);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto p = (*c)->PingSync(kWait);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->pid(), 1u);
    auto r = (*c)->ExecSync(Sh("sleep 0.3 >/dev/null 2>&1 & echo started"), kWait);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->stdout(), "started\n");
    for (pid_t orphan : ChildrenOf(agent)) EXPECT_TRUE(WaitExited(orphan));
    ::kill(agent, SIGTERM);
    ::kill(agent, SIGINT);
    p = (*c)->PingSync(kWait);  // still there; and a barrier for the reaping
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    for (pid_t child : ChildrenOf(agent)) EXPECT_NE(ProcState(child), "Z") << "zombie " << child;
  }
  ::kill(unshare, SIGKILL);  // --kill-child: the agent gets SIGKILL too
  ::waitpid(unshare, nullptr, 0);
  EXPECT_TRUE(WaitExited(agent));
  RunProcess({"/bin/rm", "-rf", dir});
}

}  // namespace
}  // namespace dsec::testing

