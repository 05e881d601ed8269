// The agent tests' fixture: the real static dsec-agent, started per test as
// an ordinary process (so a child subreaper, not PID 1) on a socket in a
// fresh /tmp/dsec-test-agent-* dir, driven through AgentClient, stopped by
// PID. Nothing here waits by sleeping for a while: the agent reaps before it
// serves each request, so a Ping answered after a process has exited is a
// barrier for its reaping; what has no event to wait on is polled for, with
// a deadline; commands hold until a file the test makes exists.
#pragma once

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
#include <thread>
#include <vector>

#include "drivers/agent/agent_client.hpp"
#include "runtime/frame.hpp"
#include "harness/daemon.hpp"

extern char** environ;

namespace dsec::testing {

using drivers::AgentClient;
using Millis = std::chrono::milliseconds;
inline constexpr Millis kWait{30000};

inline agent::Exec Cmd(std::vector<std::string> argv) {
  agent::Exec e;
  for (auto& a : argv) e.add_argv(a);
  e.add_env("PATH=/usr/local/bin:/usr/bin:/bin");
  return e;
}

inline agent::Exec Sh(const std::string& script) { return Cmd({"/bin/sh", "-c", script}); }

// True once `pid` has exited (or is gone already); waits on a pidfd.
inline bool WaitExited(pid_t pid, int timeout_ms = 20000) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int rc = ::poll(&p, 1, timeout_ms);
  ::close(fd);
  return rc == 1;
}

inline bool Alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// Starts `args` with fd 3 open: a pipe the agent says "ready" on (when
// `wait_ready`, this returns once it did), or `fd3`. -1 on failure.
inline pid_t SpawnAgent(std::vector<std::string> args, bool wait_ready, int fd3 = -1) {
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
inline std::string ProcState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return "";
  size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ? "" : line.substr(paren + 2, 1);
}

inline std::string ProcField(pid_t pid, const std::string& key) {
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

  Result<run::Outcome> Run(const agent::Exec& e) { return client_->ExecSync(e, kWait); }

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


}  // namespace dsec::testing
