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
#include <map>
#include <memory>
#include <utility>

#include "drivers/guard/task_paths.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::guard {

namespace {

constexpr const char* kOpaque = "trusted.overlay.opaque";

bool IsWhiteout(const struct stat& st) { return S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0); }

// The overlay's own mark (a user.overlay.* attribute is the agent's to set
// on an overlay without userxattr, and means nothing to it).
bool Opaque(int fd) {
  char v[4];
  return ::fgetxattr(fd, kOpaque, v, sizeof v) == 1 && v[0] == 'y';
}

// What of a file's attributes a lower layer may carry: everything but the
// overlay's own bookkeeping (origin, impure, redirect, ...; the opaque mark
// is set apart).
bool Carried(const char* name) {
  return std::strncmp(name, "trusted.overlay.", 16) != 0 && std::strncmp(name, "user.overlay.", 13) != 0;
}

void CopyXattrs(int from, int to) {
  ssize_t size = ::flistxattr(from, nullptr, 0);
  if (size <= 0 || size > (1 << 20)) return;
  std::string names(static_cast<size_t>(size), '\0');
  size = ::flistxattr(from, names.data(), names.size());
  std::string value;
  for (ssize_t at = 0; size > 0 && at < size; at += static_cast<ssize_t>(std::strlen(names.data() + at)) + 1) {
    const char* name = names.data() + at;
    if (!Carried(name)) continue;
    ssize_t v = ::fgetxattr(from, name, nullptr, 0);
    if (v < 0 || v > (1 << 16)) continue;
    value.resize(static_cast<size_t>(v));
    v = ::fgetxattr(from, name, value.data(), value.size());
    if (v >= 0) ::fsetxattr(to, name, value.data(), static_cast<size_t>(v), 0);  // best effort, as cp -a
  }
}

void CopyMeta(int fd, const struct stat& st) {
  (void)::fchown(fd, st.st_uid, st.st_gid);
  (void)::fchmod(fd, st.st_mode & 07777);  // after the chown, which drops set-id bits
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  (void)::futimens(fd, times);
}

void CopyMetaAt(const std::string& path, const struct stat& st) {
  if (UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); fd) CopyMeta(fd.get(), st);
}

struct Copier {
  size_t max_entries = 0;
  uint64_t max_bytes = 0;
  int max_depth = 0;
  CarryStats stats;
  // Carrying (not a plain copy): the task's globs, and what of the image
  // they match (relative to the root, sorted), under image_root.
  const CarryOptions* carry = nullptr;
  std::string image_root;
  std::vector<std::string> image_kept;
  // Hard links of the source: each inode copied once, then linked.
  std::map<std::pair<dev_t, ino_t>, std::string> linked;
  // Directories made, with the stat whose times they get once filled.
  std::vector<std::pair<std::string, struct stat>> dirs_made;
  std::vector<char> buf = std::vector<char>(1 << 16);
  // Merging an older overlay layer under what `to` holds (MergeUnder): an
  // entry there already wins, and nothing goes under a file, a whiteout or
  // an opaque directory there.
  bool merge_under = false;

  // A directory still to copy, found in `parent` as `name` (stat `st`);
  // no parent: the top (`top`), or none (a whiteout or file that becomes a
  // directory). Where it goes, its path relative to the task's root,
  // whether the globs apply, whether it is opaque whatever its source, its
  // depth. Sources are opened when their turn comes, relative to their
  // parent: the open descriptors are the parents of what waits, not every
  // directory found.
  struct Pending {
    std::shared_ptr<UniqueFd> parent;
    std::string name;
    struct stat st;
    std::string to, trel;
    bool filtered = false, opaque = false;
    int depth = 0;
    std::shared_ptr<UniqueFd> top;
  };
  std::vector<Pending> pending;

  Status Count(const std::string& at) {
    if (++stats.entries <= max_entries) return Status::Ok();
    return Status::ResourceExhausted("more than " + std::to_string(max_entries) + " entries to carry (at " + at +
                                     "): the grade takes the changes under the task root; remove build outputs "
                                     "and caches there, or set the task root to the repository");
  }

  // Whether the image has kept paths strictly under `trel`.
  bool KeptUnder(const std::string& trel) const {
    if (trel.empty()) return !image_kept.empty();
    auto it = std::lower_bound(image_kept.begin(), image_kept.end(), trel + "/");
    return it != image_kept.end() && it->compare(0, trel.size() + 1, trel + "/") == 0;
  }

  Status CopyFile(int sdir, const char* name, const struct stat& st, const std::string& to, const std::string& what) {
    UniqueFd in(::openat(sdir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!in) return errno == ENOENT || errno == ELOOP ? Status::Ok() : Status::FromErrno(errno, "open " + what);
    struct stat now;
    if (::fstat(in.get(), &now) != 0 || !S_ISREG(now.st_mode)) return Status::Ok();  // swapped meanwhile
    if (now.st_nlink > 1) {
      auto it = linked.find({now.st_dev, now.st_ino});
      if (it != linked.end() && ::link(it->second.c_str(), to.c_str()) == 0) return Status::Ok();
      linked[{now.st_dev, now.st_ino}] = to;
    }
    uint64_t size = static_cast<uint64_t>(now.st_size);
    if (stats.bytes + size > max_bytes)
      return Status::ResourceExhausted("the changes to carry pass " + std::to_string(max_bytes >> 20) + " MiB (at " +
                                       what + ", " + std::to_string(size >> 20) +
                                       " MiB): the grade takes the changes under the task root; remove large "
                                       "outputs there");
    stats.bytes += size;
    UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out) return Status::FromErrno(errno, "create " + to);
    if (::ioctl(out.get(), FICLONE, in.get()) == 0) {
      ++stats.reflinked;
    } else {
      // At most the size seen: a file that grows meanwhile is cut there.
      uint64_t left = size;
      while (left > 0) {
        ssize_t n = ::copy_file_range(in.get(), nullptr, out.get(), nullptr, left, 0);
        if (n == 0) break;
        if (n > 0) {
          left -= static_cast<uint64_t>(n);
          continue;
        }
        if (errno != EXDEV && errno != EINVAL && errno != EOPNOTSUPP) return Status::FromErrno(errno, "copy " + what);
        ssize_t r;  // a filesystem copy_file_range cannot do
        while (left > 0 && (r = ::read(in.get(), buf.data(), std::min<uint64_t>(left, buf.size()))) > 0) {
          if (::write(out.get(), buf.data(), static_cast<size_t>(r)) != r) return Status::FromErrno(errno, "write " + to);
          left -= static_cast<uint64_t>(r);
        }
        break;
      }
    }
    CopyXattrs(in.get(), out.get());
    CopyMeta(out.get(), st);
    return Status::Ok();
  }

  // Copies entry `name` of directory `sdir` (stat `st`) to `to`; a
  // directory waits its turn.
  Status CopyEntry(const std::shared_ptr<UniqueFd>& sdir, const char* name, const struct stat& st,
                   const std::string& to, const std::string& trel, bool filtered, int depth, const std::string& what) {
    DSEC_RETURN_IF_ERROR(Count(what));
    if (S_ISDIR(st.st_mode)) {
      pending.push_back({sdir, name, st, to, trel, filtered, false, depth, nullptr});
      return Status::Ok();
    }
    if (filtered && KeptUnder(trel)) {
      // A whiteout or a file where the image has kept paths below: a
      // directory (opaque: nothing else of the image's) with those paths.
      pending.push_back({nullptr, "", st, to, trel, filtered, true, depth, nullptr});
      return Status::Ok();
    }
    int fd = sdir->get();
    if (S_ISREG(st.st_mode)) return CopyFile(fd, name, st, to, what);
    if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t n = ::readlinkat(fd, name, target, sizeof target - 1);
      if (n < 0) return errno == ENOENT || errno == EINVAL ? Status::Ok() : Status::FromErrno(errno, "readlink " + what);
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

  // Makes the directory of `dir`, and copies what its source holds.
  Status CopyDir(Pending dir, const std::string& from) {
    if (dir.depth > max_depth)
      return Status::ResourceExhausted("directories deeper than " + std::to_string(max_depth) + " levels to carry (at " +
                                       from + "/" + dir.trel + ")");
    std::shared_ptr<UniqueFd> src = dir.top;
    if (!src && dir.parent) {
      src = std::make_shared<UniqueFd>(
          ::openat(dir.parent->get(), dir.name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      struct stat now;
      // Gone or swapped since it was listed: skipped.
      if (!*src || ::fstat(src->get(), &now) != 0 || now.st_ino != dir.st.st_ino || now.st_dev != dir.st.st_dev)
        return Status::Ok();
    }
    bool newer = false;  // merge_under: a newer layer's directory is there
    if (merge_under) {
      struct stat have;
      if (::lstat(dir.to.c_str(), &have) == 0) {
        if (!S_ISDIR(have.st_mode)) return Status::Ok();  // hidden by a newer file or whiteout
        UniqueFd there(::open(dir.to.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!there || Opaque(there.get())) return Status::Ok();  // a newer opaque directory hides it
        newer = true;
      }
    }
    if (::mkdir(dir.to.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir " + dir.to);
    UniqueFd dst(::open(dir.to.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dst) return Status::FromErrno(errno, "open " + dir.to);
    bool opaque = dir.opaque;
    if (src && newer) {
      // The newer directory's owner, mode and attributes stand; an older
      // opaque one still hides the image below both.
      opaque = Opaque(src->get());
    } else if (src) {
      CopyXattrs(src->get(), dst.get());
      opaque = opaque || Opaque(src->get());
      dirs_made.emplace_back(dir.to, dir.st);
    } else {
      struct stat img;
      bool from_image = ::lstat((image_root + "/" + dir.trel).c_str(), &img) == 0 && S_ISDIR(img.st_mode);
      dirs_made.emplace_back(dir.to, from_image ? img : dir.st);
    }
    if (opaque && ::fsetxattr(dst.get(), kOpaque, "y", 1, 0) != 0)
      return Status::FromErrno(errno, "mark " + dir.to + " opaque");
    // Under an opaque directory nothing of the image shows: its kept paths
    // are put back (the agent's entries there are skipped).
    if (dir.filtered && opaque) DSEC_RETURN_IF_ERROR(Restore(dir.trel, dir.to, dir.depth));
    if (!src) return Status::Ok();
    UniqueFd listing(::dup(src->get()));
    DIR* d = listing ? ::fdopendir(listing.get()) : nullptr;
    if (!d) return Status::FromErrno(errno, "list " + from + "/" + dir.trel);
    (void)listing.Release();
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      if (names.size() > max_entries) break;  // Count says so below
      names.emplace_back(e->d_name);
    }
    ::closedir(d);
    for (const auto& name : names) {
      struct stat st;
      if (::fstatat(src->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone while read
      std::string child = dir.trel.empty() ? name : dir.trel + "/" + name;
      if (dir.filtered && FirstMatch(carry->image_wins, child)) {
        ++stats.skipped;  // the image's version shows from below
        continue;
      }
      std::string to = dir.to + "/" + name;
      struct stat there;
      if (::lstat(to.c_str(), &there) == 0 && !S_ISDIR(st.st_mode)) {
        // Merging: an older whiteout or file under a newer directory hid
        // the image's below it; the merged directory goes on hiding it.
        if (merge_under && S_ISDIR(there.st_mode) && ::setxattr(to.c_str(), kOpaque, "y", 1, 0) != 0)
          return Status::FromErrno(errno, "mark " + to + " opaque");
        continue;  // the newer entry, or put back from the image already
      }
      DSEC_RETURN_IF_ERROR(
          CopyEntry(src, name.c_str(), st, to, child, dir.filtered, dir.depth + 1, from + "/" + child));
    }
    return Status::Ok();
  }

  // Copies what waits, one directory at a time (no recursion: the tree's
  // depth is the agent's to choose).
  Status Drain(const std::string& from) {
    while (!pending.empty()) {
      Pending dir = std::move(pending.back());
      pending.pop_back();
      DSEC_RETURN_IF_ERROR(CopyDir(std::move(dir), from));
    }
    return Status::Ok();
  }

  // Puts the image's kept paths under `trel` into `to` (its copy), where
  // the agent's directory hides them; parents made as the image has them.
  Status Restore(const std::string& trel, const std::string& to, int depth) {
    std::string prefix = trel.empty() ? "" : trel + "/";
    for (auto it = std::lower_bound(image_kept.begin(), image_kept.end(), prefix);
         it != image_kept.end() && it->compare(0, prefix.size(), prefix) == 0; ++it) {
      std::string rest = it->substr(prefix.size());
      struct stat st;
      for (size_t slash = rest.find('/'); slash != std::string::npos; slash = rest.find('/', slash + 1)) {
        std::string at = to + "/" + rest.substr(0, slash);
        if (::lstat(at.c_str(), &st) == 0) continue;
        if (::mkdir(at.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + at);
        if (::lstat((image_root + "/" + prefix + rest.substr(0, slash)).c_str(), &st) == 0) dirs_made.emplace_back(at, st);
      }
      std::string target = to + "/" + rest;
      if (::lstat(target.c_str(), &st) == 0) continue;  // put back already
      std::string from = image_root + "/" + *it;
      std::string dir = from.substr(0, from.rfind('/')), base = from.substr(from.rfind('/') + 1);
      auto sdir = std::make_shared<UniqueFd>(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!*sdir || ::fstatat(sdir->get(), base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        return Status::FromErrno(errno, "read the image's " + *it);
      DSEC_RETURN_IF_ERROR(CopyEntry(sdir, base.c_str(), st, target, *it, false, depth + 1, from));
      ++stats.restored;
    }
    return Status::Ok();
  }

  // Directory times last: filling a directory moves its mtime.
  void Finish() {
    for (auto it = dirs_made.rbegin(); it != dirs_made.rend(); ++it) CopyMetaAt(it->first, it->second);
  }
};

}  // namespace

Result<CarryStats> CarryChanges(const std::string& upper, const std::string& image, const std::string& dest,
                                const CarryOptions& opts) {
  Copier c;
  c.max_entries = opts.max_entries;
  c.max_bytes = opts.max_bytes;
  c.max_depth = opts.max_depth;
  c.carry = &opts;
  c.image_root = opts.root.empty() ? image : image + "/" + opts.root;
  struct stat st;
  if (opts.image_kept) {
    c.image_kept = *opts.image_kept;
    std::sort(c.image_kept.begin(), c.image_kept.end());
    c.image_kept.erase(std::unique(c.image_kept.begin(), c.image_kept.end()), c.image_kept.end());
  } else if (!opts.image_wins.empty() && ::stat(c.image_root.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    auto kept = FindTaskPaths(c.image_root, opts.image_wins, opts.max_entries);
    if (!kept.ok()) return kept.status().Annotate("the image's protected and hidden paths");
    c.image_kept = std::move(kept->paths);
    std::sort(c.image_kept.begin(), c.image_kept.end());
  }
  if (::mkdir(dest.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + dest);
  // Down to the root through the upper dir's directories, each opened
  // relative to the one above (never through a link). The dirs on the way
  // are plain: only the root's tree is the agent's. One that the agent
  // made anew (opaque), removed (a whiteout) or replaced with a file takes
  // the image's root with it: the root is then opaque (empty when it is
  // gone), with its kept paths put back.
  UniqueFd dir(::open(upper.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return Status::FromErrno(errno, "open the upper dir " + upper);
  std::string at = dest;
  bool replaced = false, gone = false;
  for (size_t from = 0; from < opts.root.size();) {
    size_t slash = opts.root.find('/', from);
    std::string part = opts.root.substr(from, slash == std::string::npos ? std::string::npos : slash - from);
    from = slash == std::string::npos ? opts.root.size() : slash + 1;
    if (::fstatat(dir.get(), part.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) return Status::FromErrno(errno, "read " + upper + "/" + opts.root.substr(0, from));
      if (!replaced) return c.stats;  // nothing changed under the root
      dir.Reset();
      break;
    }
    at += "/" + part;
    if (!S_ISDIR(st.st_mode)) {  // a whiteout or a file: the root is gone
      gone = true;
      dir.Reset();
      break;
    }
    UniqueFd next(::openat(dir.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) return Status::FromErrno(errno, "open " + upper + "/" + opts.root.substr(0, from));
    if (Opaque(next.get())) replaced = true;
    if (::mkdir(at.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + at);
    c.dirs_made.emplace_back(at, st);
    dir = std::move(next);
  }
  if (gone || (replaced && !dir)) {
    // The agent took the root away: so does the grade, but for its kept paths.
    at = dest + (opts.root.empty() ? "" : "/" + opts.root);
    for (size_t slash = at.find('/', dest.size() + 1); slash != std::string::npos; slash = at.find('/', slash + 1))
      if (::mkdir(at.substr(0, slash).c_str(), 0755) != 0 && errno != EEXIST)
        return Status::FromErrno(errno, "mkdir " + at.substr(0, slash));
    if (::stat(c.image_root.c_str(), &st) == 0) c.pending.push_back({nullptr, "", st, at, "", true, true, 0, nullptr});
  } else {
    if (::fstat(dir.get(), &st) != 0) return Status::FromErrno(errno, "read " + upper + "/" + opts.root);
    c.pending.push_back({nullptr, "", st, at, "", true, replaced, 0, std::make_shared<UniqueFd>(std::move(dir))});
  }
  DSEC_RETURN_IF_ERROR(c.Drain(upper + (opts.root.empty() ? "" : "/" + opts.root)));
  c.Finish();
  return c.stats;
}

Result<CarryStats> CopyLayer(const std::string& src, const std::string& dest, size_t max_entries, uint64_t max_bytes) {
  return MergeUnder(src, dest, max_entries, max_bytes, /*merge=*/false);
}

Result<CarryStats> MergeUnder(const std::string& src, const std::string& dest, size_t max_entries, uint64_t max_bytes,
                              bool merge) {
  Copier c;
  c.merge_under = merge;
  c.max_entries = max_entries;
  c.max_bytes = max_bytes;
  c.max_depth = 1024;
  auto dir = std::make_shared<UniqueFd>(::open(src.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (!*dir || ::fstat(dir->get(), &st) != 0) return Status::FromErrno(errno, "open " + src);
  c.pending.push_back({nullptr, "", st, dest, "", false, false, 0, dir});
  DSEC_RETURN_IF_ERROR(c.Drain(src));
  c.Finish();
  return c.stats;
}

}  // namespace dsec::guard
