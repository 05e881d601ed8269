#include "drivers/guard/upper_diff.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/unique_fd.hpp"

namespace dsec::guard {

const char* ChangeKindName(ChangeKind k) {
  switch (k) {
    case ChangeKind::kCreated:
      return "created";
    case ChangeKind::kModified:
      return "modified";
    case ChangeKind::kDeleted:
      return "deleted";
    case ChangeKind::kReplaced:
      return "replaced";
  }
  return "?";
}

namespace {

bool Opaque(const std::string& path) {
  char v[4];
  for (const char* name : {"trusted.overlay.opaque", "user.overlay.opaque"}) {
    ssize_t n = ::lgetxattr(path.c_str(), name, v, sizeof v);
    if (n == 1 && v[0] == 'y') return true;
  }
  return false;
}

// Same bytes (both regular files of one size).
bool SameContent(const std::string& a, const std::string& b) {
  // Non-blocking, no symlink, regular files only: the upper dir is the
  // agent's, and what was a file at the lstat may be a FIFO by now.
  constexpr int kFlags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  UniqueFd fa(::open(a.c_str(), kFlags)), fb(::open(b.c_str(), kFlags));
  if (!fa || !fb) return false;
  struct stat sa, sb;
  if (::fstat(fa.get(), &sa) != 0 || ::fstat(fb.get(), &sb) != 0 || !S_ISREG(sa.st_mode) || !S_ISREG(sb.st_mode))
    return false;
  char x[65536], y[65536];
  for (;;) {
    ssize_t n = ::read(fa.get(), x, sizeof x);
    if (n < 0) return false;
    if (n == 0) return ::read(fb.get(), y, 1) == 0;
    ssize_t got = 0;
    while (got < n) {
      ssize_t m = ::read(fb.get(), y + got, static_cast<size_t>(n - got));
      if (m <= 0) return false;
      got += m;
    }
    if (std::memcmp(x, y, static_cast<size_t>(n)) != 0) return false;
  }
}

std::string Link(const std::string& p) {
  char buf[4096];
  ssize_t n = ::readlink(p.c_str(), buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

// Whether upper entry `u` (stat `us`) differs from lower entry `l` (`ls`).
bool Differs(const std::string& u, const struct stat& us, const std::string& l, const struct stat& ls) {
  if ((us.st_mode & S_IFMT) != (ls.st_mode & S_IFMT)) return true;
  if (us.st_mode != ls.st_mode || us.st_uid != ls.st_uid || us.st_gid != ls.st_gid) return true;
  if (S_ISDIR(us.st_mode)) return false;  // its entries are changes of their own
  if (S_ISLNK(us.st_mode)) return Link(u) != Link(l);
  if (!S_ISREG(us.st_mode)) return us.st_rdev != ls.st_rdev;
  if (us.st_size != ls.st_size) return true;
  // Equal metadata (a copy-up without a write, or a write with its mtime
  // put back): the bytes decide.
  return !SameContent(u, l);
}

}  // namespace

Result<UpperDiff> ReadUpperDiff(const std::string& upper, const std::vector<std::string>& lowers, size_t limit) {
  UpperDiff out;
  struct stat top;
  // stat: the top is the caller's, maybe a /proc/self/fd/N link to it.
  if (::stat(upper.c_str(), &top) != 0 || !S_ISDIR(top.st_mode))
    return Status::NotFound("overlay upper directory " + upper + " is not there");
  auto lower_of = [&](const std::string& rel, struct stat* st, std::string* path) {
    for (const auto& l : lowers) {
      *path = l + "/" + rel;
      if (::lstat(path->c_str(), st) != 0) continue;
      // A whiteout in a lower layer (a task's hidden path) hides what is
      // below it: the path is not there.
      return !(S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0));
    }
    return false;
  };
  auto add = [&](Change c) {
    if (out.changes.size() >= limit) {
      out.truncated = true;
      return false;
    }
    out.changes.push_back(std::move(c));
    return true;
  };
  // Relative paths still to read; whether the lower layers are hidden
  // there (under an opaque directory, everything is new).
  std::vector<std::pair<std::string, bool>> dirs = {{"", false}};
  while (!dirs.empty() && !out.truncated) {
    auto [rel_dir, hidden] = dirs.back();
    dirs.pop_back();
    std::string abs_dir = rel_dir.empty() ? upper : upper + "/" + rel_dir;
    // Never through a symlink (the agent may swap a directory for one
    // mid-walk); one gone or swapped since it was listed is skipped. The
    // top is the caller's (a guest's agent names it by /proc/self/fd/N).
    int dfd = ::open(abs_dir.c_str(), O_RDONLY | O_DIRECTORY | (rel_dir.empty() ? 0 : O_NOFOLLOW) | O_CLOEXEC);
    DIR* d = dfd >= 0 ? ::fdopendir(dfd) : nullptr;
    if (!d) {
      int err = errno;
      if (dfd >= 0) ::close(dfd);
      if (err == ENOENT || err == ENOTDIR || err == ELOOP) continue;
      return Status::FromErrno(err, "read " + abs_dir);
    }
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    ::closedir(d);
    for (const auto& name : names) {
      std::string rel = rel_dir.empty() ? name : rel_dir + "/" + name;
      std::string abs = upper + "/" + rel;
      struct stat us, ls;
      if (::lstat(abs.c_str(), &us) != 0) continue;  // gone while read: the next read sees it
      std::string lower_path;
      bool in_lower = !hidden && lower_of(rel, &ls, &lower_path);
      bool dir = S_ISDIR(us.st_mode);
      if (S_ISCHR(us.st_mode) && us.st_rdev == makedev(0, 0)) {
        if (in_lower && !add({rel, ChangeKind::kDeleted, S_ISDIR(ls.st_mode)})) break;
        continue;
      }
      if (!in_lower) {
        if (!add({rel, ChangeKind::kCreated, dir})) break;
      } else if (dir && Opaque(abs)) {
        if (!add({rel, ChangeKind::kReplaced, true})) break;
        dirs.push_back({rel, true});
        continue;
      } else if (Differs(abs, us, lower_path, ls)) {
        if (!add({rel, ChangeKind::kModified, dir})) break;
      }
      if (dir) dirs.push_back({rel, !in_lower});
    }
  }
  std::sort(out.changes.begin(), out.changes.end(), [](const Change& a, const Change& b) { return a.path < b.path; });
  return out;
}

}  // namespace dsec::guard
