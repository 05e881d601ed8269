#include "harness/daemon.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "drivers/vm/guest.hpp"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

extern char** environ;

namespace dsec::testing {

namespace {

using Clock = std::chrono::steady_clock;

// Orphans (a killed dsecd's spawner) are re-parented to us so we can reap them.
const bool kSubreaper = [] {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}();

bool Alive(pid_t pid) {
  int status;
  if (::waitpid(pid, &status, WNOHANG) == pid) return false;
  if (::kill(pid, 0) != 0) return false;
  std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(st, s);
  auto rp = s.rfind(')');
  return rp == std::string::npos || s.size() < rp + 3 || s[rp + 2] != 'Z';
}

bool WaitGone(pid_t pid, int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    if (!Alive(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling a foreign process's exit
  }
  return !Alive(pid);
}

}  // namespace

std::string BinDir() {
  if (const char* d = std::getenv("DSEC_BIN_DIR"); d && *d) return d;
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string self(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return self.substr(0, self.rfind('/'));
}

std::string TestGuestDir() {
  if (const char* d = std::getenv("DSEC_GUEST_DIR"); d && *d) return d;
  std::string bin = BinDir();
  return bin.substr(0, bin.rfind('/')) + "/guest";
}

std::vector<std::string> CgroupRoots() {
  std::vector<std::string> roots;
  std::ifstream mounts("/proc/mounts");
  for (std::string dev, dir, type, rest; mounts >> dev >> dir >> type && std::getline(mounts, rest);)
    if ((type == "cgroup" || type == "cgroup2") && std::find(roots.begin(), roots.end(), dir) == roots.end())
      roots.push_back(dir);
  return roots;
}

namespace {

// Whether this host can get the guest's kernel at all, asked of apt alone:
// the package linux-image-cloud-amd64 depends on, downloaded into a
// scratch dir. "" when it can; else why not.
std::string KernelPackageGap() {
  auto deps = RunProcess({"/bin/sh", "-c",
                          "apt-cache depends linux-image-cloud-amd64 2>/dev/null | "
                          "awk '/Depends: linux-image-/{print $2; exit}'"});
  std::string pkg = deps.out;
  while (!pkg.empty() && (pkg.back() == '\n' || pkg.back() == ' ')) pkg.pop_back();
  if (pkg.empty()) return "apt knows no linux-image-cloud-amd64 (run apt-get update, or no Debian mirror is configured)";
  char tmpl[] = "/tmp/dsec-kernel-probe-XXXXXX";
  if (!::mkdtemp(tmpl)) return "mkdtemp";
  auto got = RunProcess({"/bin/sh", "-c", std::string("cd ") + tmpl + " && apt-get download -q " + pkg}, "", 600);
  RunProcess({"/bin/rm", "-rf", tmpl});
  if (got.exit_code != 0) return "the Debian mirror does not give " + pkg + ": " + got.err;
  return "";
}

}  // namespace

GuestPrep EnsureTestGuest() {
  std::string dir = TestGuestDir();
  // Prepared, in the format this build's dsecd boots (else prepared again).
  auto ready = [&] {
    auto txt = ReadFileToString(dir + "/guest.txt");
    return ::access((dir + "/vmlinux").c_str(), R_OK) == 0 && ::access((dir + "/base.cpio").c_str(), R_OK) == 0 &&
           txt.ok() && txt->find("format " + std::to_string(drivers::vm::kGuestFormat) + "\n") != std::string::npos;
  };
  if (ready()) return {};
  if (Status st = MakeDirs(dir, 0755); !st.ok()) return {"", st.message()};
  UniqueFd lock(::open((dir + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock || ::flock(lock.get(), LOCK_EX) < 0) return {"", "cannot lock " + dir + ".lock"};
  if (ready()) return {};
  std::string log = dir + ".log";
  int rc = RunToFile({BinDir() + "/dsec-image", "guest", "--dir", dir}, log);
  if (rc == 0 && ready()) return {};
  auto text = ReadFileToString(log);
  std::string why = "the VM guest could not be prepared in " + dir + " (dsec-image guest, exit " +
                    std::to_string(rc) + "): " + (text.ok() ? *text : std::string("no output"));
  // A host that cannot get the kernel skips; one that can and still has
  // no guest found a fault of dsec-image's.
  if (std::string gap = KernelPackageGap(); !gap.empty()) return {"no VM guest on this host: " + gap, ""};
  return {"", why};
}

Result<std::unique_ptr<Child>> Child::Start(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC)) return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  std::unique_ptr<Child> c(new Child);
  int rc = posix_spawn(&c->pid_, argv[0].c_str(), &fa, nullptr, av.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return Status::Internal("spawn " + argv[0] + ": " + std::strerror(rc));
  }
  c->out_ = out[0];
  return c;
}

Child::~Child() {
  if (pid_ > 0) {
    Kill9();
    Wait();
  }
  if (out_ >= 0) ::close(out_);
}

bool Child::ReadLine(std::string* line, int timeout_s) {
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      *line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return true;
    }
    if (out_ < 0 || Clock::now() >= deadline) return false;
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;
    char chunk[65536];
    ssize_t n = ::read(out_, chunk, sizeof chunk);
    if (n <= 0) {
      ::close(out_);
      out_ = -1;
      continue;
    }
    buf_.append(chunk, static_cast<size_t>(n));
  }
}

void Child::Kill9() {
  if (pid_ > 0) ::kill(pid_, SIGKILL);
}

int Child::Wait() {
  if (pid_ <= 0) return -1;
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

ProcResult RunProcess(const std::vector<std::string>& argv, const std::string& stdin_data, int timeout_s) {
  ProcResult r;
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC)) return r;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, av.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    r.err = std::string("spawn failed: ") + std::strerror(rc);
    return r;
  }
  std::thread writer([fd = in[1], data = stdin_data] {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(fd, data.data() + off, data.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::close(fd);
  });
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int open = 2;
  while (open > 0 && Clock::now() < deadline) {
    if (::poll(fds, 2, 1000) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[65536];
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  if (open > 0) ::kill(pid, SIGKILL);
  writer.join();
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

Result<std::unique_ptr<TestDaemon>> TestDaemon::Start(Options options) {
  std::unique_ptr<TestDaemon> d(new TestDaemon());
  d->options_ = std::move(options);
  std::string tmpl = "/tmp/" + d->options_.data_dir_name + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) return Status::FromErrno(errno, "mkdtemp");
  d->data_dir_ = tmpl;
  d->log_path_ = d->data_dir_ + ".log";
  std::string any = d->options_.host + ":0";
  DSEC_RETURN_IF_ERROR(d->Launch(any, any));
  return d;
}

Status TestDaemon::Launch(const std::string& listen, const std::string& admin,
                          const std::vector<std::string>& more_args) {
  ::unlink((data_dir_ + "/dsecd.json").c_str());
  std::vector<std::string> args = {BinDir() + "/dsecd", "--data-dir", data_dir_, "--listen", listen, "--admin",
                                   admin, "--cgroup-parent", options_.cgroup_parent, "--fncall-pool", "8", "--log-file",
                                   log_path_, "--http", http_addr_.empty() ? options_.host + ":0" : http_addr_,
                                   "--e2b", e2b_addr_.empty() ? options_.host + ":0" : e2b_addr_};
  if (options_.test_hooks) args.push_back("--test-hooks");
  if (!options_.network) args.push_back("--no-sandbox-network");
  if (options_.role == "controller") {
    for (const char* a : {"--role", "controller", "--cluster-listen"}) args.push_back(a);
    args.push_back(cluster_addr_.empty() ? options_.cluster_listen : cluster_addr_);
  }
  args.push_back("--guest-dir");
  args.push_back(TestGuestDir());
  for (const auto& a : options_.extra_args) args.push_back(a);
  for (const auto& a : more_args) args.push_back(a);
  args.insert(args.begin(), options_.wrapper.begin(), options_.wrapper.end());
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (options_.own_process_group) {
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
  }
  int rc = posix_spawn(&pid_, av[0], &fa, &attr, av.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status::FromErrno(rc, "start " + args[0]);
  // Ready once it has written its endpoints.
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    auto ep = ReadFileToString(data_dir_ + "/dsecd.json");
    if (ep.ok()) {
      auto j = nlohmann::json::parse(*ep, nullptr, false);
      if (!j.is_discarded() && j.value("pid", 0) == pid_) {
        sdk_addr_ = j.value("sdk", "");
        admin_addr_ = j.value("admin", "");
        http_addr_ = j.value("http", "");
        e2b_addr_ = j.value("e2b", "");
        cluster_addr_ = j.value("cluster", "");
        return Status::Ok();
      }
    }
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      auto log = ReadFileToString(log_path_);
      return Status::Unavailable("dsecd exited during start (status " + std::to_string(status) + "): " +
                                 (log.ok() ? *log : std::string("no log")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // waiting for another process's file
  }
  return Status::DeadlineExceeded("dsecd did not become ready within 60 s");
}

namespace {
std::string ReadToken(const std::string& path) {
  auto t = ReadFileToString(path);
  std::string s = t.ok() ? *t : "";
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}
}  // namespace

std::string TestDaemon::Token() const { return ReadToken(data_dir_ + "/admin.token"); }
std::string TestDaemon::SdkToken() const { return ReadToken(data_dir_ + "/sdk.token"); }

void TestDaemon::Kill9() {
  if (pid_ <= 0) return;
  auto children = ChildrenOf(pid_);
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  // Its spawner sees the socket close, kills its runners, removes its
  // cgroups and exits; it is re-parented to us (subreaper).
  for (pid_t c : children) {
    if (!WaitGone(c, 20000)) ::kill(c, SIGKILL);
    ::waitpid(c, nullptr, WNOHANG);
  }
}

int TestDaemon::Stop() { return StopWith(SIGTERM, pid_); }

int TestDaemon::Interrupt() { return StopWith(SIGINT, options_.own_process_group ? -pid_ : pid_); }

int TestDaemon::StopWith(int sig, pid_t target) {
  if (pid_ <= 0) return -1;
  ::kill(target, sig);
  int status = 0;
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      Kill9();
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // waiting for another process to exit
  }
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Status TestDaemon::Restart(const std::vector<std::string>& more_args) {
  if (pid_ > 0) Stop();
  return Launch(sdk_addr_, admin_addr_, more_args);
}

TestDaemon::~TestDaemon() {
  if (pid_ > 0) Stop();
  // Containers outlive their spawner, and with it gone they are re-parented
  // to us (subreaper); reap those a later daemon destroyed.
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  if (!data_dir_.empty() && std::getenv("DSEC_KEEP_TEST_DATA") == nullptr) {
    // VMs outlive dsecd too: a test that left some (it failed midway) has
    // their QEMU killed here, and their groups removed, saying so.
    // (A vm sandbox's QEMU is libvirtd's child; its command line names its
    // initramfs in <data>/domains, and libvirtd drops the domain once it is
    // killed.)
    auto vms = ProcessesMatching(data_dir_ + "/vms/");
    for (pid_t p : ProcessesMatching(data_dir_ + "/domains/")) vms.push_back(p);
    for (pid_t p : vms) {
      std::fprintf(stderr, "TestDaemon: killed QEMU %d, left running after dsecd stopped\n", p);
      ::kill(p, SIGKILL);
    }
    for (int i = 0; i < 500 && !(ProcessesMatching(data_dir_ + "/vms/").empty() &&
                                 ProcessesMatching(data_dir_ + "/domains/").empty());
         ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // killed processes take a moment to exit
    if (!vms.empty())
      for (const std::string root : {"/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu,cpuacct",
                                     "/sys/fs/cgroup/pids", "/sys/fs/cgroup/freezer", "/sys/fs/cgroup/cpu",
                                     "/sys/fs/cgroup/cpuacct"}) {
        std::string base = root + "/" + options_.cgroup_parent + "/vm";
        for (const auto& g : ListSubdirs(base)) ::rmdir((base + "/" + g).c_str());
        ::rmdir(base.c_str());
        ::rmdir((root + "/" + options_.cgroup_parent).c_str());
      }
    // The sandboxes' filesystem and the images of running containers stay
    // mounted while sandboxes outlive a dsecd (a test that killed it and
    // did not restart it): those mounts, and with them the loop device, go
    // before the dir, the deepest first. Said on stderr, so that a test
    // whose containers outlived it shows in its output.
    for (const auto& point : UnmountAllUnder(data_dir_))
      if (point != data_dir_ + "/sandboxes" && point != data_dir_ + "/run/lazy")
        std::fprintf(stderr, "TestDaemon: unmounted %s, left mounted after dsecd stopped\n", point.c_str());
    // A node's dsec-lazyfs stays while sandboxes read images through it
    // (it outlives dsecd on purpose): ended here with its mount.
    for (pid_t p : ProcessesMatching("dsec-lazyfs --mount " + data_dir_ + "/run/lazy ")) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    RunProcess({"/bin/rm", "-rf", "--one-file-system", data_dir_});
    ::unlink(log_path_.c_str());
  }
}

ProcResult TestDaemon::Ctl(std::vector<std::string> args, const std::string& stdin_data) const {
  std::vector<std::string> argv = options_.ctl_wrapper;
  for (auto a : {BinDir() + "/dsecctl", std::string("--addr"), sdk_addr_, std::string("--admin"), admin_addr_,
                 std::string("--data-dir"), data_dir_})
    argv.push_back(std::move(a));
  for (auto& a : args) argv.push_back(std::move(a));
  return RunProcess(argv, stdin_data);
}

nlohmann::json TestDaemon::Admin(const std::string& line) const {
  ConsoleConn c(admin_addr_);
  if (!c.ok()) return nlohmann::json{{"ok", false}, {"error", "cannot connect"}};
  c.Send("AUTH " + Token() + "\n");
  c.ReadLine();
  c.Send(line + "\n");
  return nlohmann::json::parse(c.ReadLine(), nullptr, false);
}

std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = ::opendir(task_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(task_dir + "/" + e->d_name + "/children");
      pid_t c;
      while (in >> c) out.push_back(c);
    }
    ::closedir(d);
  }
  return out;
}

std::string ProcCmdline(const std::string& pid) {
  auto cmd = ReadFileToString("/proc/" + pid + "/cmdline");
  return cmd.ok() ? *cmd : std::string();
}

std::vector<std::string> UnmountAllUnder(const std::string& dir) {
  std::vector<std::string> mounts, done;
  std::ifstream mi("/proc/self/mountinfo");
  for (std::string line; std::getline(mi, line);) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    fields >> id >> parent >> dev >> root >> point;
    if (point.rfind(dir + "/", 0) == 0) mounts.push_back(point);
  }
  for (auto it = mounts.rbegin(); it != mounts.rend(); ++it)
    if (::umount2(it->c_str(), MNT_DETACH) == 0) done.push_back(*it);
  return done;
}

std::vector<pid_t> ProcessesMatching(const std::string& needle) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0 || pid == ::getpid()) continue;
    std::string cmd = ProcCmdline(e->d_name);
    for (auto& c : cmd)
      if (c == '\0') c = ' ';
    if (cmd.find(needle) != std::string::npos) out.push_back(pid);
  }
  ::closedir(d);
  return out;
}

}  // namespace dsec::testing
