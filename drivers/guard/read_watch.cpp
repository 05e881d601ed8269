#include "drivers/guard/read_watch.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/fanotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::guard {

namespace {

struct Watched {
  int init_pid = 0;                                  // its agent: dsecd's file calls, not the sandbox's
  std::set<uint64_t> mounts;                         // the container's mount ids
  std::unordered_map<uint64_t, std::string> inodes;  // marked inode -> path
  std::map<std::string, uint64_t> reads;
};

bool MountAndInode(int fd, uint64_t* mnt, uint64_t* ino) {
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID | STATX_INO | STATX_TYPE, &sx) != 0) return false;
  if (!(sx.stx_mask & STATX_MNT_ID)) return false;
  *mnt = sx.stx_mnt_id, *ino = sx.stx_ino;
  return S_ISREG(sx.stx_mode);
}

}  // namespace

struct ReadWatch::State {
  UniqueFd group, wake;
  std::function<void(int, const std::string&)> log;
  mutable std::mutex mu;
  std::map<std::string, Watched> by_id;
  std::unordered_map<uint64_t, std::string> by_mount;  // mount id -> container
  std::atomic<uint64_t> overflows{0};
  std::thread thread;

  // Takes what the kernel has queued (the loop on readiness; Reads first,
  // so a step's reads are counted at that step). False on an error other
  // than an empty queue.
  std::mutex drain_mu;
  bool Drain() {
    std::lock_guard<std::mutex> dl(drain_mu);
    alignas(struct fanotify_event_metadata) char buf[8192];
    for (;;) {
      ssize_t n = ::read(group.get(), buf, sizeof buf);
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      if (n == 0) return true;
      auto* m = reinterpret_cast<struct fanotify_event_metadata*>(buf);
      for (; FAN_EVENT_OK(m, n); m = FAN_EVENT_NEXT(m, n)) {
        if (m->mask & FAN_Q_OVERFLOW) {
          if (overflows++ == 0 && log) log(2, "read watch: the kernel's event queue overflowed; reads were lost");
        }
        if (m->fd < 0) continue;
        uint64_t mnt = 0, ino = 0;
        bool ok = MountAndInode(m->fd, &mnt, &ino);
        ::close(m->fd);
        if (!ok) continue;
        std::lock_guard<std::mutex> lk(mu);
        auto c = by_mount.find(mnt);
        if (c == by_mount.end()) continue;  // a container forgotten meanwhile
        auto& w = by_id[c->second];
        if (m->pid == w.init_pid) continue;
        auto path = w.inodes.find(ino);
        ++w.reads[path == w.inodes.end() ? "inode " + std::to_string(ino) : path->second];
      }
    }
  }

  void Loop() {
    for (;;) {
      pollfd p[2] = {{group.get(), POLLIN, 0}, {wake.get(), POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents) return;
      if (!Drain()) {
        // No descriptor for an event (EMFILE, ENFILE): it stays queued; wait
        // a moment rather than spin on it.
        if (log) log(2, std::string("read watch: reading events: ") + std::strerror(errno));
        pollfd w{wake.get(), POLLIN, 0};
        if (::poll(&w, 1, 100) > 0) return;
      }
    }
  }
};

ReadWatch::ReadWatch(std::unique_ptr<State> s) : s_(std::move(s)) {}

Result<std::unique_ptr<ReadWatch>> ReadWatch::Start(std::function<void(int, const std::string&)> log) {
  auto s = std::make_unique<State>();
  s->log = std::move(log);
  s->group = UniqueFd(::fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_MARKS,
                                      O_RDONLY | O_CLOEXEC | O_LARGEFILE | O_NOATIME));
  if (!s->group) return Status::FromErrno(errno, "fanotify_init (the read detector needs fanotify and root)");
  s->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->wake) return Status::FromErrno(errno, "eventfd");
  auto* st = s.get();
  s->thread = std::thread([st] { st->Loop(); });
  return std::unique_ptr<ReadWatch>(new ReadWatch(std::move(s)));
}

ReadWatch::~ReadWatch() {
  uint64_t one = 1;
  (void)!::write(s_->wake.get(), &one, sizeof one);
  if (s_->thread.joinable()) s_->thread.join();
}

Result<size_t> ReadWatch::Watch(const std::string& id, int init_pid, const std::vector<std::string>& paths) {
  std::string root_path = "/proc/" + std::to_string(init_pid) + "/root";
  UniqueFd root(::open(root_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return Status::FromErrno(errno, "container " + id + ": open its root for the read watch");
  auto mounts = MountIds(init_pid);
  if (mounts.empty()) return Status::Unavailable("container " + id + ": no mount of its init " + std::to_string(init_pid));
  {
    // The container first, so that a read right after a mark is counted.
    std::lock_guard<std::mutex> lk(s_->mu);
    auto& w = s_->by_id[id];
    w.init_pid = init_pid;
    for (uint64_t m : mounts) {
      w.mounts.insert(m);
      s_->by_mount[m] = id;
    }
  }
  size_t marked = 0;
  for (const auto& p : paths) {
    // Resolved inside the container's root: a symlink of the image cannot
    // lead the mark out of it.
    struct open_how how {};
    how.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    UniqueFd f(static_cast<int>(::syscall(SYS_openat2, root.get(), p.c_str(), &how, sizeof how)));
    uint64_t mnt = 0, ino = 0;
    if (!f || !MountAndInode(f.get(), &mnt, &ino)) continue;
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->by_id[id].inodes[ino] = p;
    }
    // fanotify_mark takes no O_PATH descriptor: the object by its magic link.
    std::string self = "/proc/self/fd/" + std::to_string(f.get());
    if (::fanotify_mark(s_->group.get(), FAN_MARK_ADD, FAN_OPEN, AT_FDCWD, self.c_str()) != 0)
      return Status::FromErrno(errno, "container " + id + ": fanotify_mark " + p + " (" + std::to_string(marked) +
                                          " marked before it)");
    ++marked;
  }
  return marked;
}

void ReadWatch::Forget(const std::string& id) {
  std::lock_guard<std::mutex> lk(s_->mu);
  auto it = s_->by_id.find(id);
  if (it == s_->by_id.end()) return;
  for (uint64_t m : it->second.mounts) {
    auto b = s_->by_mount.find(m);
    if (b != s_->by_mount.end() && b->second == id) s_->by_mount.erase(b);
  }
  s_->by_id.erase(it);
}

std::map<std::string, uint64_t> ReadWatch::Reads(const std::string& id) const {
  (void)s_->Drain();
  std::lock_guard<std::mutex> lk(s_->mu);
  auto it = s_->by_id.find(id);
  return it == s_->by_id.end() ? std::map<std::string, uint64_t>{} : it->second.reads;
}

uint64_t ReadWatch::Overflows() const { return s_->overflows.load(); }

}  // namespace dsec::guard
