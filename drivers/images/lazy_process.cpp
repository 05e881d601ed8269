// dsec-lazyfs, the process behind the lazy image files: started in a
// session of its own and not as dsecd's child (double fork), so that a
// dsecd killed or restarted leaves it serving the images of running
// sandboxes; the next dsecd adopts it by its pid file. Watched through a
// pidfd: when it dies, its images' sandboxes are reported, its dead mount
// is detached and it is started again.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "drivers/images/lazy_images_impl.hpp"
#include "runtime/files.hpp"

namespace dsec::images {

namespace {

int PidfdOpen(int pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Whether a FUSE filesystem is mounted at `point`, and whether some EROFS
// mount reads from a file under it.
void MountsAt(const std::string& point, bool* fuse, bool* erofs_on_it) {
  *fuse = *erofs_on_it = false;
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string id, parent, dev, root, at, opts, word;
    f >> id >> parent >> dev >> root >> at >> opts;
    while (f >> word && word != "-") {
    }
    std::string type, source;
    f >> type >> source;
    if (at == point && type.rfind("fuse", 0) == 0) *fuse = true;
    if (type == "erofs" && source.rfind(point + "/", 0) == 0) *erofs_on_it = true;
  }
}

std::string ProcCmd(int pid) {
  auto cmd = ReadFileToString("/proc/" + std::to_string(pid) + "/cmdline");
  if (!cmd.ok()) return "";
  for (auto& c : *cmd)
    if (c == '\0') c = ' ';
  return *cmd;
}

}  // namespace

Status LazyImages::Impl::StartOrAdopt() {
  auto text = ReadFileToString(pid_path);
  int pid = text.ok() ? std::atoi(text->c_str()) : 0;
  bool fuse = false, erofs = false;
  MountsAt(mnt, &fuse, &erofs);
  if (pid > 0 && fuse && ProcCmd(pid).find("dsec-lazyfs --mount " + mnt + " ") != std::string::npos) {
    int fd = PidfdOpen(pid);
    if (fd >= 0) {
      lazyfs_pid = pid;
      pidfd = fd;
      up = true;
      Log(0, "image cache: adopted dsec-lazyfs (pid " + std::to_string(pid) + ") serving " + mnt);
      keeper = std::thread([this] { KeeperLoop(); });
      return Status::Ok();
    }
  }
  Status started = StartLazyfs();
  keeper = std::thread([this] { KeeperLoop(); });
  return started;
}

Status LazyImages::Impl::StartLazyfs() {
  // A mount whose process is gone answers ENOTCONN: detached first.
  ::umount2(mnt.c_str(), MNT_DETACH);
  DSEC_RETURN_IF_ERROR(MakeDirs(mnt, 0755));
  std::string log_path = run_dir + "/lazyfs.log";
  std::string wait = std::to_string(o.fetch_timeout_s + 5);
  std::vector<std::string> args = {o.lazyfs, "--mount", mnt, "--socket", sock_path, "--wait", wait, "--ready-fd", "3"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int ready[2], pidpipe[2];
  if (::pipe2(ready, O_CLOEXEC) < 0 || ::pipe2(pidpipe, O_CLOEXEC) < 0) return Status::FromErrno(errno, "pipe");
  pid_t mid = ::fork();
  if (mid < 0) return Status::FromErrno(errno, "fork");
  if (mid == 0) {
    // Only async-signal-safe calls from here to exec.
    ::setsid();
    pid_t grand = ::fork();
    if (grand != 0) {
      (void)!::write(pidpipe[1], &grand, sizeof grand);
      ::_exit(grand < 0 ? 1 : 0);
    }
    int logfd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, 0);
    if (logfd >= 0) {
      ::dup2(logfd, 1);
      ::dup2(logfd, 2);
    }
    ::dup2(ready[1], 3);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(ready[1]);
  ::close(pidpipe[1]);
  pid_t grand = -1;
  bool got_pid = ::read(pidpipe[0], &grand, sizeof grand) == sizeof grand;
  ::close(pidpipe[0]);
  ::waitpid(mid, nullptr, 0);
  pollfd p{ready[0], POLLIN, 0};
  char ok[2] = {0, 0};
  bool ready_ok = ::poll(&p, 1, 20000) == 1 && ::read(ready[0], ok, 2) == 2 && ok[0] == 'o' && ok[1] == 'k';
  ::close(ready[0]);
  if (!got_pid || grand <= 0 || !ready_ok) {
    if (got_pid && grand > 0) ::kill(grand, SIGKILL);
    auto log = ReadFileToString(log_path);
    std::string tail = log.ok() ? log->substr(log->size() > 400 ? log->size() - 400 : 0) : "";
    return Status::Unavailable("dsec-lazyfs (" + o.lazyfs + ") did not mount " + mnt + " (its log " + log_path +
                               " ends: " + tail + "); lazy images cannot be served on this node");
  }
  lazyfs_pid = grand;
  if (pidfd >= 0) ::close(pidfd);
  pidfd = PidfdOpen(grand);
  (void)WriteFileAtomic(pid_path, std::to_string(grand) + "\n");
  up = true;
  Log(0, "image cache: dsec-lazyfs (pid " + std::to_string(grand) + ") serves lazy images at " + mnt);
  return Status::Ok();
}

void LazyImages::Impl::KeeperLoop() {
  auto backoff = std::chrono::milliseconds(500);
  while (!stopping) {
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      if (::poll(&p, 1, 500) == 1 && !stopping) {
        LazyfsDied();
        backoff = std::chrono::milliseconds(500);
      }
    } else if (!stopping) {
      // Not running (it could not be started): tried again, backing off.
      std::this_thread::sleep_for(backoff);  // a retry's pause
      if (!stopping && StartLazyfs().ok()) backoff = std::chrono::milliseconds(500);
      else backoff = std::min(backoff * 2, std::chrono::milliseconds(10000));
    }
    FlushRecords(false);
  }
}

void LazyImages::Impl::LazyfsDied() {
  up = false;
  int pid = lazyfs_pid;
  ::waitpid(pid, nullptr, WNOHANG);  // ours only before a restart; harmless otherwise
  ::close(pidfd);
  pidfd = -1;
  std::vector<std::string> digests;
  {
    std::lock_guard<std::mutex> lk(mu);
    st.lazyfs_restarts++;
    for (const auto& [hex, im] : images) {
      (void)hex;
      digests.push_back(im->map.image_digest());
    }
  }
  std::string why = "the lazy image file server (dsec-lazyfs, pid " + std::to_string(pid) +
                    ") died; the sandboxes reading its images cannot go on";
  Log(2, "image cache: " + why + "; starting it again");
  if (o.lost) o.lost(digests, why);
  Status s = StartLazyfs();
  if (!s.ok()) Log(2, "image cache: " + s.message() + " (trying again)");
}

void LazyImages::Impl::StopLazyfsIfUnused() {
  if (lazyfs_pid <= 0 || !up) return;
  bool fuse = false, erofs = false;
  MountsAt(mnt, &fuse, &erofs);
  if (erofs) {
    Log(0, "image cache: dsec-lazyfs (pid " + std::to_string(lazyfs_pid) +
               ") stays: running sandboxes' images read through it");
    return;
  }
  // Unmounted first: its threads wait in reads of /dev/fuse, which the
  // unmount ends (a signal alone is seen only at the next request).
  ::umount2(mnt.c_str(), MNT_DETACH);
  ::kill(lazyfs_pid, SIGTERM);
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) ::kill(lazyfs_pid, SIGKILL);
    ::close(pidfd);
    pidfd = -1;
  }
  ::unlink(pid_path.c_str());
  up = false;
}

}  // namespace dsec::images
