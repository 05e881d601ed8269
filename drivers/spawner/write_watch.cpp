// Refused writes in containers (issue 29's detector of attempted writes to
// protected paths): a container's filter sends the calls that write to or
// remove an existing path (WatchedWrites, seccomp_filter.hpp) to its
// listener here. Each is let go on (SECCOMP_USER_NOTIF_FLAG_CONTINUE: the
// kernel decides, as without us); first its path is resolved in the
// caller's view, and when that path exists on a read-only mount of the
// container (a protected path's bind mount, /run/dsec, /proc/sys) the call is
// about to fail with EROFS: it is counted per sandbox as "<call> <path>",
// and the counts go to dsecd with the denied calls (Denied.writes).
//
// What it costs: one round trip through this loop per watched call (an
// open for writing, an unlink, a rename...), not per read; see
// docs/performance.md. Also here: a listener taken back from a container's
// agent after a restart (AdoptListener).
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/uio.h>

#include "drivers/spawner/spawner_internal.hpp"
#include "runtime/files.hpp"

namespace dsec::fncall::internal {

namespace {

constexpr size_t kMaxWritesPerSandbox = 64;  // distinct "<call> <path>" kept between flushes
constexpr size_t kMaxShownPath = 160;

// A NUL-terminated string of the caller's memory (at most PATH_MAX).
bool ReadString(pid_t pid, uint64_t addr, std::string* out) {
  if (!addr) return false;
  char buf[4096];
  size_t got = 0;
  // Page by page: a string near the end of its mapping stops there.
  while (got < sizeof buf) {
    size_t page_left = 4096 - ((addr + got) & 4095);
    size_t want = std::min(page_left, sizeof buf - got);
    iovec local{buf + got, want}, remote{reinterpret_cast<void*>(addr + got), want};
    ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) return false;
    if (void* nul = std::memchr(buf + got, '\0', static_cast<size_t>(n))) {
      out->assign(buf, static_cast<size_t>(static_cast<char*>(nul) - buf));
      return true;
    }
    got += static_cast<size_t>(n);
  }
  return false;
}

}  // namespace

// Whether `path` (relative to the caller's dirfd, cwd or root; `proc` is
// its /proc/<pid>) names an existing file on a read-only mount of its
// container. An absolute path resolves inside the container's root; a
// relative one from where the caller stands without following any symlink
// (one would resolve from our root, not the container's: such a path is
// not counted), and ".." stops at the container's root (its mount
// namespace's).
bool Spawner::OnReadOnlyMount(Listener& l, int proc, pid_t pid, int dirfd, const std::string& path, bool follow) {
  if (path.empty()) return false;
  bool absolute = path[0] == '/';
  std::string base = absolute ? "root" : dirfd == AT_FDCWD || dirfd < 0 ? "cwd" : "fd/" + std::to_string(dirfd);
  UniqueFd at(::openat(proc, base.c_str(), O_PATH | O_CLOEXEC));
  if (!at) return false;
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW);
  how.resolve = RESOLVE_NO_MAGICLINKS | (absolute ? RESOLVE_IN_ROOT : RESOLVE_NO_SYMLINKS);
  UniqueFd f(static_cast<int>(::syscall(SYS_openat2, at.get(), path.c_str(), &how, sizeof how)));
  if (!f) return false;  // not there: a creation, which this does not flag
  struct statfs fs {};
  if (::fstatfs(f.get(), &fs) != 0 || !(fs.f_flags & ST_RDONLY)) return false;
  struct statx sx {};
  if (::statx(f.get(), "", AT_EMPTY_PATH, STATX_MNT_ID, &sx) != 0 || !(sx.stx_mask & STATX_MNT_ID)) return false;
  if (l.mounts.empty()) l.mounts = dsec::MountIds(pid);  // a container cannot mount: read once
  return l.mounts.count(sx.stx_mnt_id) > 0;
}

void Spawner::AnswerWrite(Listener& l, const WatchedWrite& w, const seccomp_notif& req) {
  const auto& a = req.data.args;
  bool watched = static_cast<pid_t>(req.pid) != l.agent_pid;  // the agent's own file calls are dsecd's
  bool follow = w.follow;
  if (w.flags >= 0) follow = follow && !(a[w.flags] & O_NOFOLLOW);
  if (watched && w.flags == -2) {
    // openat2 (notified whatever its flags): they are in the struct it points to.
    open_how how{};
    iovec local{&how, sizeof how}, remote{reinterpret_cast<void*>(a[2]), sizeof how};
    watched = a[3] >= sizeof how && ::process_vm_readv(req.pid, &local, 1, &remote, 1, 0) == sizeof how &&
              (how.flags & O_ACCMODE) != O_RDONLY && !(how.flags & O_EXCL);
    follow = !(how.flags & O_NOFOLLOW);
  }
  std::string hit;
  // Its /proc entry first, then what it points to, then the check that the
  // notification (so that pid) is still the caller's: a pid reused since
  // cannot be read in its place.
  UniqueFd proc(watched ? ::open(("/proc/" + std::to_string(req.pid)).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC) : -1);
  std::string path, path2;
  if (proc && ReadString(req.pid, a[w.path], &path)) {
    if (w.path2 >= 0) (void)ReadString(req.pid, a[w.path2], &path2);
    uint64_t id = req.id;
    if (::ioctl(l.fd.get(), SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0) {
      auto dirfd = [&](int arg) { return arg < 0 ? AT_FDCWD : static_cast<int>(a[arg]); };
      auto pid = static_cast<pid_t>(req.pid);
      if (OnReadOnlyMount(l, proc.get(), pid, dirfd(w.dirfd), path, follow)) hit = path;
      else if (!path2.empty() && OnReadOnlyMount(l, proc.get(), pid, dirfd(w.dirfd2), path2, follow)) hit = path2;
    }
  }
  seccomp_notif_resp resp;
  std::memset(&resp, 0, sizeof resp);
  resp.id = req.id;
  resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
  // Counted once answered (ENOENT: the caller went meanwhile, or was
  // interrupted, and an interrupted call comes again).
  if (::ioctl(l.fd.get(), SECCOMP_IOCTL_NOTIF_SEND, &resp) != 0 || hit.empty()) return;
  if (hit.size() > kMaxShownPath) hit = hit.substr(0, kMaxShownPath) + "...";
  auto& counts = writes_[l.sandbox_id];
  std::string key = std::string(w.name) + " " + hit;
  if (!counts.count(key) && counts.size() >= kMaxWritesPerSandbox) key = "(more paths)";
  ++counts[key];
}

void Spawner::FlushFor(const spawner::Flush& req) {
  // Notifications pending on the sandbox's listener are taken first (their
  // callers are stopped in them), then everything counted goes.
  for (auto& [key, l] : listeners_)
    if (l.sandbox_id == req.sandbox_id()) {
      OnListener(key, EPOLLIN, /*poll_first=*/true);
      break;
    }
  FlushDenied();
  spawner::Event ev;
  ev.mutable_flushed()->set_id(req.id());
  Send(ev);
}

void Spawner::AddListener(UniqueFd listener, const std::string& sandbox_id, pid_t agent_pid) {
  for (const auto& [key, l] : listeners_)
    if (l.sandbox_id == sandbox_id) return;  // one per container: it has it
  uint64_t key = next_key_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = key << 2;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener.get(), &ev) < 0) {
    // Its calls would wait for a spawner that does not listen.
    Log(3, "container " + sandbox_id + ": its seccomp listener cannot be watched (" + std::strerror(errno) +
               "): its notified calls wait until dsecd restarts; destroy it");
    return;
  }
  listeners_[key] = Listener{std::move(listener), sandbox_id, agent_pid, {}};
}

// A container's agent keeps its filter's listener (container_init.cpp
// leaves it at kInitSlotNotify across the execve; the agent is not
// dumpable, so nothing in the container can take it): a spawner started
// after a dsecd restart takes it back, and the container's notified calls,
// which waited meanwhile, are answered again.
void Spawner::AdoptListener(const spawner::AdoptListener& req) {
  auto say = [&](int level, const std::string& what) {
    Log(level, "container " + req.sandbox_id() + ": its seccomp listener " + what);
  };
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, req.pid(), 0));
  if (pidfd < 0) return say(2, std::string("is not back (pidfd_open: ") + std::strerror(errno) + ")");
  UniqueFd pf(pidfd);
  // The pid is the container's agent still (in its group), not a reused one.
  std::string groups;
  if (auto text = ReadFileToString("/proc/" + std::to_string(req.pid()) + "/cgroup"); text.ok()) groups = *text;
  if (req.cgroup().empty() || groups.find("/" + req.cgroup() + "\n") == std::string::npos)
    return say(2, "is not back: pid " + std::to_string(req.pid()) + " is not in its group " + req.cgroup());
  int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, container::kInitSlotNotify, 0));
  if (fd < 0)
    return say(1, std::string("is not back (") + std::strerror(errno) +
                      "; made by a dsec before 2026-12-05?): its denied calls fail with ENOSYS, uncounted");
  UniqueFd got(::fcntl(fd, F_DUPFD_CLOEXEC, kFirstSpawnerFd));
  ::close(fd);
  char link[64] = {};
  if (!got || ::readlink(("/proc/self/fd/" + std::to_string(got.get())).c_str(), link, sizeof link - 1) < 0 ||
      std::string(link) != "anon_inode:seccomp notify")
    return say(2, std::string("is not back: its agent's slot holds ") + (link[0] ? link : "nothing readable"));
  AddListener(std::move(got), req.sandbox_id(), static_cast<pid_t>(req.pid()));
  say(0, "is back");
}

}  // namespace dsec::fncall::internal
