#include "drivers/guard/carry.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "drivers/guard/task_paths.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::guard {

namespace {

constexpr const char* kOpaque = "trusted.overlay.opaque";

bool IsWhiteout(const struct stat& st) { return S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0); }

bool Opaque(int fd) {
  char v[4];
  for (const char* name : {kOpaque, "user.overlay.opaque"})
    if (::fgetxattr(fd, name, v, sizeof v) == 1 && v[0] == 'y') return true;
  return false;
}

// What of a file's attributes a lower layer may carry: everything but the
// overlay's own bookkeeping (origin, impure, redirect, ...), the opaque
// mark excepted.
bool Carried(const char* name) {
  for (const char* ns : {"trusted.overlay.", "user.overlay."})
    if (std::strncmp(name, ns, std::strlen(ns)) == 0) return std::strcmp(name + std::strlen(ns), "opaque") == 0;
  return true;
}

void CopyXattrs(int from, int to) {
  char names[8192];
  ssize_t n = ::flistxattr(from, names, sizeof names);
  for (ssize_t at = 0; n > 0 && at < n; at += static_cast<ssize_t>(std::strlen(names + at)) + 1) {
    if (!Carried(names + at)) continue;
    char value[4096];
    ssize_t v = ::fgetxattr(from, names + at, value, sizeof value);
    if (v >= 0) ::fsetxattr(to, names + at, value, static_cast<size_t>(v), 0);  // best effort, as cp -a
  }
}

void CopyMeta(int fd, const struct stat& st) {
  (void)::fchown(fd, st.st_uid, st.st_gid);
  (void)::fchmod(fd, st.st_mode & 07777);  // after the chown, which drops set-id bits
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  (void)::futimens(fd, times);
}

struct Copier {
  size_t max_entries;
  CarryStats stats;
  // Carrying (not a plain copy): the task's root and globs, and what of
  // the image they match (relative to the root, sorted).
  const CarryOptions* carry = nullptr;
  std::string image_root;
  std::vector<std::string> image_kept;

  Status Count(const std::string& at) {
    if (++stats.entries <= max_entries) return Status::Ok();
    return Status::ResourceExhausted("more than " + std::to_string(max_entries) + " entries to copy (at " + at +
                                     "); the layer is too big to carry");
  }

  // Whether the image has kept paths strictly under `trel` (relative to the root).
  bool KeptUnder(const std::string& trel) const {
    if (trel.empty()) return !image_kept.empty();
    auto it = std::lower_bound(image_kept.begin(), image_kept.end(), trel + "/");
    return it != image_kept.end() && it->compare(0, trel.size() + 1, trel + "/") == 0;
  }

  Status CopyFile(int sdir, const char* name, const struct stat& st, const std::string& to) {
    UniqueFd in(::openat(sdir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!in) return errno == ENOENT ? Status::Ok() : Status::FromErrno(errno, "open " + to + "'s source");
    struct stat now;
    if (::fstat(in.get(), &now) != 0 || !S_ISREG(now.st_mode)) return Status::Ok();  // swapped meanwhile
    UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out) return Status::FromErrno(errno, "create " + to);
    if (::ioctl(out.get(), FICLONE, in.get()) == 0) {
      ++stats.reflinked;
    } else {
      for (;;) {
        ssize_t n = ::copy_file_range(in.get(), nullptr, out.get(), nullptr, 1 << 30, 0);
        if (n == 0) break;
        if (n > 0) continue;
        if (errno != EXDEV && errno != EINVAL && errno != EOPNOTSUPP) return Status::FromErrno(errno, "copy " + to);
        char buf[65536];  // a filesystem copy_file_range cannot do
        ssize_t r;
        while ((r = ::read(in.get(), buf, sizeof buf)) > 0)
          if (::write(out.get(), buf, static_cast<size_t>(r)) != r) return Status::FromErrno(errno, "write " + to);
        if (r < 0) return Status::FromErrno(errno, "read " + to + "'s source");
        break;
      }
    }
    stats.bytes += static_cast<uint64_t>(now.st_size);
    CopyXattrs(in.get(), out.get());
    CopyMeta(out.get(), st);
    return Status::Ok();
  }

  // Copies entry `name` of directory `sdir` (stat `st`) to `to`. `trel`:
  // its path relative to the task's root when carrying (else unused).
  Status CopyEntry(int sdir, const char* name, const struct stat& st, const std::string& to, const std::string& trel,
                   bool filtered) {
    DSEC_RETURN_IF_ERROR(Count(to));
    bool replaces_kept = filtered && !S_ISDIR(st.st_mode) && KeptUnder(trel);
    if (S_ISDIR(st.st_mode) || replaces_kept) {
      // A whiteout or a file where the image has kept paths below: a
      // directory (opaque: nothing else of the image's) with those paths.
      UniqueFd src(S_ISDIR(st.st_mode) ? ::openat(sdir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1);
      if (S_ISDIR(st.st_mode) && !src) return errno == ENOENT || errno == ENOTDIR ? Status::Ok()
                                                                              : Status::FromErrno(errno, "open " + to + "'s source");
      if (::mkdir(to.c_str(), 0700) != 0) return Status::FromErrno(errno, "mkdir " + to);
      UniqueFd dst(::open(to.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!dst) return Status::FromErrno(errno, "open " + to);
      bool opaque = replaces_kept;
      if (src) {
        CopyXattrs(src.get(), dst.get());
        opaque = opaque || Opaque(src.get());
        DSEC_RETURN_IF_ERROR(CopyDir(src.get(), to, trel, filtered));
        CopyMeta(dst.get(), st);
      } else {
        struct stat img;
        if (::lstat((image_root + "/" + trel).c_str(), &img) == 0 && S_ISDIR(img.st_mode)) CopyMeta(dst.get(), img);
        else ::fchmod(dst.get(), 0755);
      }
      if (opaque && replaces_kept && ::fsetxattr(dst.get(), kOpaque, "y", 1, 0) != 0)
        return Status::FromErrno(errno, "mark " + to + " opaque");
      if (filtered && opaque) DSEC_RETURN_IF_ERROR(Restore(trel, to));
      return Status::Ok();
    }
    if (S_ISREG(st.st_mode)) return CopyFile(sdir, name, st, to);
    if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t n = ::readlinkat(sdir, name, target, sizeof target - 1);
      if (n < 0) return errno == ENOENT || errno == EINVAL ? Status::Ok() : Status::FromErrno(errno, "readlink " + to);
      target[n] = 0;
      if (::symlink(target, to.c_str()) != 0) return Status::FromErrno(errno, "symlink " + to);
      (void)::lchown(to.c_str(), st.st_uid, st.st_gid);
      struct timespec times[2] = {st.st_atim, st.st_mtim};
      (void)::utimensat(AT_FDCWD, to.c_str(), times, AT_SYMLINK_NOFOLLOW);
      return Status::Ok();
    }
    if (IsWhiteout(st) || S_ISFIFO(st.st_mode)) {
      if (::mknod(to.c_str(), st.st_mode & (S_IFMT | 07777), st.st_rdev) != 0)
        return Status::FromErrno(errno, "mknod " + to);
      return Status::Ok();
    }
    --stats.entries;  // sockets and devices: nothing a grade reads
    return Status::Ok();
  }

  Status CopyDir(int sdir, const std::string& to, const std::string& trel, bool filtered) {
    UniqueFd listing(::dup(sdir));
    DIR* d = listing ? ::fdopendir(listing.get()) : nullptr;
    if (!d) return Status::FromErrno(errno, "list " + to + "'s source");
    (void)listing.Release();
    ::rewinddir(d);
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    ::closedir(d);
    for (const auto& name : names) {
      struct stat st;
      if (::fstatat(sdir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone while read
      std::string child = trel.empty() ? name : trel + "/" + name;
      if (filtered && FirstMatch(carry->image_wins, child)) {
        ++stats.skipped;  // the image's version shows from below
        continue;
      }
      DSEC_RETURN_IF_ERROR(CopyEntry(sdir, name.c_str(), st, to + "/" + name, child, filtered));
    }
    return Status::Ok();
  }

  // Puts the image's kept paths under `trel` into `to` (its copy), where
  // the agent's directory hides them; parents made as the image has them.
  Status Restore(const std::string& trel, const std::string& to) {
    std::string prefix = trel.empty() ? "" : trel + "/";
    for (auto it = std::lower_bound(image_kept.begin(), image_kept.end(), prefix);
         it != image_kept.end() && it->compare(0, prefix.size(), prefix) == 0; ++it) {
      std::string rest = it->substr(prefix.size()), at = to;
      struct stat st;
      for (size_t slash = rest.find('/'); slash != std::string::npos; slash = rest.find('/', slash + 1)) {
        at = to + "/" + rest.substr(0, slash);
        if (::lstat(at.c_str(), &st) == 0) continue;
        if (::mkdir(at.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + at);
        if (::lstat((image_root + "/" + prefix + rest.substr(0, slash)).c_str(), &st) == 0)
          if (UniqueFd fd(::open(at.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); fd) CopyMeta(fd.get(), st);
      }
      std::string target = to + "/" + rest;
      if (::lstat(target.c_str(), &st) == 0) continue;  // put back already (a deeper copy did)
      std::string from = image_root + "/" + *it;
      std::string dir = from.substr(0, from.rfind('/')), base = from.substr(from.rfind('/') + 1);
      UniqueFd sdir(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!sdir || ::fstatat(sdir.get(), base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        return Status::FromErrno(errno, "read the image's " + *it);
      DSEC_RETURN_IF_ERROR(CopyEntry(sdir.get(), base.c_str(), st, target, *it, false));
      ++stats.restored;
    }
    return Status::Ok();
  }
};

Status MakeTop(const std::string& dest) {
  if (::mkdir(dest.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + dest);
  return Status::Ok();
}

}  // namespace

Result<CarryStats> CarryChanges(const std::string& upper, const std::string& image, const std::string& dest,
                                const CarryOptions& opts) {
  Copier c;
  c.max_entries = opts.max_entries;
  c.carry = &opts;
  c.image_root = opts.root.empty() ? image : image + "/" + opts.root;
  if (!opts.image_wins.empty()) {
    struct stat st;
    if (::stat(c.image_root.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      auto kept = FindTaskPaths(c.image_root, opts.image_wins, opts.max_entries);
      if (!kept.ok()) return kept.status().Annotate("the image's protected and hidden paths");
      c.image_kept = std::move(kept->paths);
      std::sort(c.image_kept.begin(), c.image_kept.end());
    }
  }
  DSEC_RETURN_IF_ERROR(MakeTop(dest));
  // Down to the root through the upper dir's directories (each opened
  // relative to the one above, never through a link); the dirs on the way
  // are plain (not opaque): only the root's tree is the agent's.
  UniqueFd dir(::open(upper.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return Status::FromErrno(errno, "open the upper dir " + upper);
  std::string at = dest;
  size_t from = 0;
  while (from < opts.root.size()) {
    size_t slash = opts.root.find('/', from);
    std::string part = opts.root.substr(from, slash == std::string::npos ? std::string::npos : slash - from);
    from = slash == std::string::npos ? opts.root.size() : slash + 1;
    UniqueFd next(::openat(dir.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) {
      if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return c.stats;  // nothing changed under the root
      return Status::FromErrno(errno, "open " + upper + "/" + opts.root.substr(0, from));
    }
    at += "/" + part;
    if (::mkdir(at.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + at);
    struct stat st;
    if (::fstat(next.get(), &st) == 0)
      if (UniqueFd fd(::open(at.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); fd) CopyMeta(fd.get(), st);
    dir = std::move(next);
  }
  DSEC_RETURN_IF_ERROR(c.CopyDir(dir.get(), at, "", true));
  if (!opts.root.empty() && Opaque(dir.get())) {
    // The root itself made anew: opaque here too, and the kept paths back.
    if (::setxattr(at.c_str(), kOpaque, "y", 1, 0) != 0) return Status::FromErrno(errno, "mark " + at + " opaque");
    DSEC_RETURN_IF_ERROR(c.Restore("", at));
  }
  return c.stats;
}

Result<CarryStats> CopyLayer(const std::string& src, const std::string& dest, size_t max_entries) {
  Copier c;
  c.max_entries = max_entries;
  UniqueFd dir(::open(src.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return Status::FromErrno(errno, "open " + src);
  DSEC_RETURN_IF_ERROR(MakeTop(dest));
  DSEC_RETURN_IF_ERROR(c.CopyDir(dir.get(), dest, "", false));
  return c.stats;
}

}  // namespace dsec::guard
