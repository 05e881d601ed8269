// File requests of dsec-agent: ReadFile, WriteFile, Stat, ListDir, PathOp. They run
// on the event loop and block on the local filesystem, which is the
// sandbox's own (the agent runs inside it), so paths are taken as given and
// symlinks followed like any program there would, except the "magic" links
// of /proc (/proc/<pid>/root, /proc/<pid>/fd/N), which are refused: they are
// not paths in the sandbox but handles to wherever a process points. What could block for good
// (FIFOs, devices) is refused, and sizes are capped so every answer fits in
// one frame. Errors name the request, the path and the errno.
#include "drivers/agent/agent_internal.hpp"
#include "drivers/guard/upper_diff.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <cstring>

namespace dsec::agent::internal {

namespace {

const char* TypeName(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symlink";
  return "not a regular file";
}

// errno for "this is not a regular file": EISDIR for directories, else EINVAL.
int NotRegularErrno(mode_t m) { return S_ISDIR(m) ? EISDIR : EINVAL; }

// User extended attributes (WriteFile.xattrs, FileInfo.xattrs): how many,
// how long a name and a value may be.
constexpr int kMaxXattrs = 64;
constexpr size_t kMaxXattrName = 200, kMaxXattrValue = 4096;

// What is wrong with a write's xattrs, or "".
std::string BadXattrs(const WriteFile& req) {
  if (req.xattrs_size() > kMaxXattrs) return "more than " + std::to_string(kMaxXattrs) + " extended attributes";
  for (const auto& [k, v] : req.xattrs()) {
    if (k.empty() || k.size() > kMaxXattrName || k.find('\0') != std::string::npos)
      return "extended attribute name '" + k.substr(0, 64) + "': 1 to " + std::to_string(kMaxXattrName) +
             " bytes, no NUL";
    if (v.size() > kMaxXattrValue)
      return "extended attribute '" + k.substr(0, 64) + "': its value is over " + std::to_string(kMaxXattrValue) +
             " bytes";
  }
  return "";
}

// The NUL-separated names `list` gives (flistxattr, llistxattr), however
// many there are: asked their size again when they outgrow the buffer.
std::string XattrNames(const std::function<ssize_t(char*, size_t)>& list) {
  std::string names(16384, '\0');
  for (int tries = 0; tries < 3; ++tries) {
    ssize_t n = list(names.data(), names.size());
    if (n >= 0) return names.substr(0, static_cast<size_t>(n));
    if (errno != ERANGE) break;
    ssize_t need = list(nullptr, 0);
    if (need <= 0) break;
    names.assign(static_cast<size_t>(need) + 1024, '\0');
  }
  return "";
}

// Sets a file's xattrs as user.<name>, then removes its user.<replace>*
// ones the write does not name (a set that fails removes none). An errno,
// or 0.
int SetXattrs(int fd, const WriteFile& req, std::string* why) {
  for (const auto& [k, v] : req.xattrs()) {
    if (::fsetxattr(fd, ("user." + k).c_str(), v.data(), v.size(), 0) == 0) continue;
    int err = errno;
    *why = "set extended attribute user." + k.substr(0, 64) + ": " +
           (err == EOPNOTSUPP ? std::string("this filesystem keeps no user extended attributes") : std::strerror(err));
    return err;
  }
  if (!req.xattrs_replace().empty()) {
    std::string names = XattrNames([fd](char* b, size_t n) { return ::flistxattr(fd, b, n); });
    const std::string prefix = "user." + req.xattrs_replace();
    for (size_t i = 0; i < names.size(); i += std::strlen(names.c_str() + i) + 1) {
      const char* k = names.c_str() + i;
      if (std::strncmp(k, prefix.c_str(), prefix.size()) == 0 && !req.xattrs().count(k + 5)) (void)::fremovexattr(fd, k);
    }
  }
  return 0;
}

// An entry's user.* extended attributes (names without "user."), by its
// directory and name, a last symlink not followed; at most kMaxXattrs.
void ReadXattrs(int dirfd, const char* name, FileInfo* fi) {
  std::string at = "/proc/self/fd/" + std::to_string(dirfd) + "/" + name;
  std::string names = XattrNames([&at](char* b, size_t n) { return ::llistxattr(at.c_str(), b, n); });
  int shown = 0;
  for (size_t i = 0; i < names.size() && shown < kMaxXattrs; i += std::strlen(names.c_str() + i) + 1) {
    const char* k = names.c_str() + i;
    if (std::strncmp(k, "user.", 5) != 0) continue;
    char value[kMaxXattrValue];
    ssize_t m = ::lgetxattr(at.c_str(), k, value, sizeof value);
    if (m < 0) continue;  // gone meanwhile, or longer than we show
    (*fi->mutable_xattrs())[k + 5] = std::string(value, static_cast<size_t>(m));
    ++shown;
  }
}

void FillInfo(FileInfo* fi, const std::string& name, const struct stat& st, const std::string& link,
              const IdNames& names) {
  fi->set_name(name);
  fi->set_uid(st.st_uid);
  fi->set_gid(st.st_gid);
  fi->set_owner(names.User(st.st_uid));
  fi->set_group(names.Group(st.st_gid));
  fi->set_mode(st.st_mode);
  fi->set_size(static_cast<uint64_t>(st.st_size));
  fi->set_mtime_ms(static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000);
  if (!link.empty()) fi->set_link_target(link);
}

std::string ReadLinkAt(int dirfd, const char* path) {
  char buf[4096];
  ssize_t n = ::readlinkat(dirfd, path, buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string Basename(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// open(2) that refuses to pass through /proc's magic links (ELOOP).
int OpenNoMagic(const std::string& path, int flags, mode_t mode = 0) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_NO_MAGICLINKS;
  long fd = ::syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof how);
  if (fd < 0 && errno == ENOSYS) return ::open(path.c_str(), flags, mode);  // kernels before 5.6
  return static_cast<int>(fd);
}

// Makes the missing directories on the way to `path` (not `path` itself),
// owned by `owner` when it is not root. 0, or the errno with `why`.
int MakeParents(const std::string& path, const UserEntry& owner, std::string* why) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    std::string dir = path.substr(0, slash);
    if (::mkdir(dir.c_str(), 0755) < 0) {
      if (errno == EEXIST) continue;
      *why = "create directory " + dir + ": " + std::strerror(errno);
      return errno;
    }
    if ((owner.uid | owner.gid) && ::chown(dir.c_str(), owner.uid, owner.gid) < 0) {
      *why = "chown directory " + dir + ": " + std::strerror(errno);
      return errno;
    }
  }
  return 0;
}

// Removes what `name` (in `dirfd`) is, directories with all they hold,
// without following symlinks. 0 or the errno; `why` names the path.
int RemoveAt(int dirfd, const std::string& name, const std::string& shown, std::string* why, int depth = 0) {
  if (::unlinkat(dirfd, name.c_str(), 0) == 0) return 0;
  if (errno != EISDIR && errno != EPERM) {
    *why = "remove " + shown + ": " + std::strerror(errno);
    return errno;
  }
  if (depth > 256) {
    *why = "remove " + shown + ": deeper than 256 directories";
    return ELOOP;
  }
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    *why = "remove " + shown + ": " + std::strerror(errno);
    return errno;
  }
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    *why = "remove " + shown + ": " + std::strerror(errno);
    return errno;
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  int err = 0;
  for (const auto& n : names)
    if ((err = RemoveAt(fd, n, shown + "/" + n, why, depth + 1))) break;
  ::closedir(d);
  if (err) return err;
  if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) < 0) {
    *why = "remove " + shown + ": " + std::strerror(errno);
    return errno;
  }
  return 0;
}

std::string MagicLinkWhy(int err) {
  return err == ELOOP ? std::string(std::strerror(err)) + " (or a /proc magic link in the path, which is refused)"
                      : std::string(std::strerror(err));
}

}  // namespace

void Agent::OnReadFile(Conn& c, uint64_t id, const ReadFile& req) {
  const std::string& path = req.path();
  auto fail = [&](int err, const std::string& why) { SendError(c, id, err, "read_file " + path + ": " + why); };
  if (path.empty() || path.find('\0') != std::string::npos) return fail(EINVAL, "empty path or NUL byte in it");
  uint64_t max = req.max_bytes() ? req.max_bytes() : kDefaultReadMax;
  if (max > kMaxReadBytes) max = kMaxReadBytes;
  // O_NONBLOCK: opening a FIFO must not wait for a writer; we refuse it below.
  UniqueFd fd(OpenNoMagic(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) return fail(errno, MagicLinkWhy(errno));
  struct stat st;
  if (::fstat(fd.get(), &st) < 0) return fail(errno, std::string("fstat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return fail(NotRegularErrno(st.st_mode), std::string("is ") + TypeName(st.st_mode) + ", not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max)
    return fail(EFBIG, "the file is " + std::to_string(st.st_size) + " bytes, above the limit of " +
                           std::to_string(max));
  std::string data;
  data.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  // Up to one byte past the limit: files in /proc say size 0 and still have data.
  for (;;) {
    if (got == data.size()) {
      if (got > max) break;
      data.resize(std::min<uint64_t>(max + 1, std::max<uint64_t>(got * 2, 4096)));
    }
    ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(errno, std::string("read: ") + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max) return fail(EFBIG, "the file grew above the limit of " + std::to_string(max) + " bytes");
  data.resize(got);
  Event ev;
  ev.set_id(id);
  ev.set_file_data(std::move(data));
  Send(c, ev);
}

void Agent::OnWriteFile(Conn& c, uint64_t id, const WriteFile& req) {
  const std::string& path = req.path();
  auto fail = [&](int err, const std::string& why) { SendError(c, id, err, "write_file " + path + ": " + why); };
  if (path.empty() || path.find('\0') != std::string::npos) return fail(EINVAL, "empty path or NUL byte in it");
  if (std::string bad = BadXattrs(req); !bad.empty()) return fail(EINVAL, bad);
  UserEntry owner;
  std::string why;
  if (!req.user().empty() && !LookupUser(req.user(), &owner, &why)) return fail(ENOENT, why);
  if (req.mkdirs()) {
    if (int err = MakeParents(path, owner, &why)) return fail(err, why);
  }
  mode_t mode = req.mode() ? static_cast<mode_t>(req.mode() & 07777) : 0644;
  // Exclusive create first, to know whether the mode is ours to set.
  int flags = O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  bool created = true;
  UniqueFd fd(OpenNoMagic(path, flags | O_CREAT | O_EXCL, mode));
  if (!fd && errno == EEXIST) {
    created = false;
    fd.Reset(OpenNoMagic(path, flags));
  }
  if (!fd) return fail(errno, MagicLinkWhy(errno));
  struct stat st;
  if (::fstat(fd.get(), &st) < 0) return fail(errno, std::string("fstat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return fail(NotRegularErrno(st.st_mode), std::string("is ") + TypeName(st.st_mode) + ", not a regular file");
  // A new file gets exactly `mode` (not masked by the umask); an existing one
  // keeps its mode unless the request names one.
  if ((created || req.mode()) && ::fchmod(fd.get(), mode) < 0)
    return fail(errno, std::string("chmod: ") + std::strerror(errno));
  if (created && owner.uid | owner.gid && ::fchown(fd.get(), owner.uid, owner.gid) < 0)
    return fail(errno, std::string("chown: ") + std::strerror(errno));
  // Its attributes before its data: a filesystem that keeps none refuses
  // the write with the file as it was (one made for it removed).
  if (int err = SetXattrs(fd.get(), req, &why)) {
    if (created) (void)::unlink(path.c_str());
    return fail(err, why);
  }
  if (!created && ::ftruncate(fd.get(), 0) < 0)
    return fail(errno, std::string("truncate: ") + std::strerror(errno));
  if (int err = WriteFull(fd.get(), req.data().data(), req.data().size()))
    return fail(err, std::string("write: ") + std::strerror(err));
  if (::close(fd.Release()) < 0) return fail(errno, std::string("close: ") + std::strerror(errno));
  Event ev;
  ev.set_id(id);
  ev.mutable_ok();
  Send(c, ev);
}

void Agent::OnStat(Conn& c, uint64_t id, const Stat& req) { SendStat(c, id, "stat", req.path()); }

void Agent::SendStat(Conn& c, uint64_t id, const std::string& what, const std::string& path) {
  if (path.empty() || path.find('\0') != std::string::npos)
    return SendError(c, id, EINVAL, what + " " + path + ": empty path or NUL byte in it");
  // lstat: a symlink is reported as one, with its target. The parent is
  // resolved without magic links, the last component not followed.
  std::string base = Basename(path);
  size_t slash = path.find_last_not_of('/');
  slash = slash == std::string::npos ? std::string::npos : path.rfind('/', slash);
  std::string parent = slash == std::string::npos || slash == 0 ? (path[0] == '/' ? "/" : ".") : path.substr(0, slash);
  if (base == "/" || base.empty()) base = ".";
  UniqueFd dir(OpenNoMagic(parent, O_PATH | O_DIRECTORY | O_CLOEXEC));
  struct stat st;
  if (!dir || ::fstatat(dir.get(), base.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0)
    return SendError(c, id, errno, what + " " + path + ": " + MagicLinkWhy(errno));
  Event ev;
  ev.set_id(id);
  if (!S_ISLNK(st.st_mode)) ReadXattrs(dir.get(), base.c_str(), ev.mutable_stat());
  FillInfo(ev.mutable_stat(), Basename(path), st, S_ISLNK(st.st_mode) ? ReadLinkAt(dir.get(), base.c_str()) : "",
           IdNames());
  Send(c, ev);
}

void Agent::OnPathOp(Conn& c, uint64_t id, const PathOp& req) {
  const std::string& path = req.path();
  const char* what = req.op() == 1 ? "make_dir" : req.op() == 2 ? "move" : req.op() == 3 ? "remove" : "path_op";
  auto fail = [&](int err, const std::string& why) { SendError(c, id, err, std::string(what) + " " + path + ": " + why); };
  if (path.empty() || path.find('\0') != std::string::npos || req.destination().find('\0') != std::string::npos)
    return fail(EINVAL, "empty path or NUL byte in it");
  if (path == "/") return fail(EBUSY, "the root itself cannot be made, moved or removed");
  std::string why;
  switch (req.op()) {
    case 1: {  // make_dir: the parents too; EEXIST when the path exists
      UserEntry owner;
      if (!req.user().empty() && !LookupUser(req.user(), &owner, &why)) return fail(ENOENT, why);
      if (int err = MakeParents(path, owner, &why)) return fail(err, why);
      if (::mkdir(path.c_str(), 0755) < 0) return fail(errno, std::strerror(errno));
      if ((owner.uid | owner.gid) && ::chown(path.c_str(), owner.uid, owner.gid) < 0)
        return fail(errno, std::string("chown: ") + std::strerror(errno));
      return SendStat(c, id, what, path);
    }
    case 2:  // move
      if (req.destination().empty()) return fail(EINVAL, "no destination");
      if (::rename(path.c_str(), req.destination().c_str()) < 0)
        return fail(errno, "to " + req.destination() + ": " + std::strerror(errno));
      return SendStat(c, id, what, req.destination());
    case 3: {  // remove, recursively
      std::string p = path;
      while (p.size() > 1 && p.back() == '/') p.pop_back();
      std::string parent = p.substr(0, p.find_last_of('/') + 1);
      UniqueFd dir(OpenNoMagic(parent.empty() ? "." : parent, O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!dir) return fail(errno, MagicLinkWhy(errno));
      if (int err = RemoveAt(dir.get(), Basename(p), p, &why)) return SendError(c, id, err, why);
      Event ev;
      ev.set_id(id);
      ev.mutable_ok();
      return Send(c, ev);
    }
    default:
      return fail(EINVAL, "unknown operation " + std::to_string(req.op()) + " (1 make_dir, 2 move, 3 remove)");
  }
}

void Agent::OnListDir(Conn& c, uint64_t id, const ListDir& req) {
  const std::string& path = req.path();
  auto fail = [&](int err, const std::string& why) { SendError(c, id, err, "list_dir " + path + ": " + why); };
  if (path.empty() || path.find('\0') != std::string::npos) return fail(EINVAL, "empty path or NUL byte in it");
  int fd = OpenNoMagic(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail(errno, MagicLinkWhy(errno));
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int err = errno;
    ::close(fd);
    return fail(err, std::strerror(err));
  }
  Event ev;
  ev.set_id(id);
  auto* list = ev.mutable_dir_list();
  size_t bytes = 0;
  IdNames names;
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    struct stat st;
    if (::fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;  // gone meanwhile
    FileInfo* fi = list->add_entries();
    FillInfo(fi, e->d_name, st, S_ISLNK(st.st_mode) ? ReadLinkAt(fd, e->d_name) : "", names);
    if (!S_ISLNK(st.st_mode)) ReadXattrs(fd, e->d_name, fi);
    bytes += fi->ByteSizeLong() + 8;
    if (bytes > kMaxReadBytes) {
      ::closedir(d);
      return fail(EFBIG, "more entries than fit in one answer (" + std::to_string(list->entries_size()) +
                             " so far); list its subdirectories or use an exec");
    }
  }
  ::closedir(d);
  std::sort(list->mutable_entries()->begin(), list->mutable_entries()->end(),
            [](const FileInfo& a, const FileInfo& b) { return a.name() < b.name(); });
  Send(c, ev);
}

void Agent::OnChanges(Conn& c, uint64_t id, const Changes& req) {
  if (opts_.layer_upper.empty())
    return SendError(c, id, ENOENT,
                     "changes: this agent was given no layers (a VM guest's init gives them, --layers-fd; a "
                     "container's changes are read on its host)");
  const std::string& upper = opts_.layer_upper;
  const std::vector<std::string>& lowers = opts_.layer_lowers;
  size_t limit = req.limit() ? req.limit() : 100000;
  auto diff = guard::ReadUpperDiff(upper, lowers, limit);
  if (!diff.ok()) return SendError(c, id, EIO, "changes: " + diff.status().message());
  Event ev;
  ev.set_id(id);
  auto* list = ev.mutable_changes();
  size_t bytes = 0;
  for (const auto& ch : diff->changes) {
    bytes += ch.path.size() + 16;
    if (bytes > kMaxReadBytes) {
      list->set_truncated(true);
      break;
    }
    auto* out = list->add_changes();
    out->set_path(ch.path);
    out->set_kind(static_cast<uint32_t>(ch.kind));
    out->set_dir(ch.dir);
  }
  if (diff->truncated) list->set_truncated(true);
  Send(c, ev);
}

}  // namespace dsec::agent::internal
