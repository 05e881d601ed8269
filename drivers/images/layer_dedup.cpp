#include "drivers/images/layer_dedup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::images {

namespace {

constexpr const char* kTmp = "tmp";

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) { EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr); }
  void Add(const void* p, size_t n) { EVP_DigestUpdate(ctx_.get(), p, n); }
  template <typename T>
  void AddValue(T v) {
    Add(&v, sizeof v);
  }
  void AddString(const std::string& s) {
    AddValue<uint64_t>(s.size());
    Add(s.data(), s.size());
  }
  std::string Hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_.get(), md, &len);
    return HexOf(md, len);
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

// The attributes a layer's file carries, sorted by name (the copy set
// them; the overlay's own are not among them).
std::vector<std::pair<std::string, std::string>> Xattrs(int fd) {
  std::vector<std::pair<std::string, std::string>> out;
  ssize_t size = ::flistxattr(fd, nullptr, 0);
  if (size <= 0 || size > (1 << 20)) return out;
  std::string names(static_cast<size_t>(size), '\0');
  size = ::flistxattr(fd, names.data(), names.size());
  for (ssize_t at = 0; size > 0 && at < size; at += static_cast<ssize_t>(std::strlen(names.data() + at)) + 1) {
    const char* name = names.data() + at;
    ssize_t v = ::fgetxattr(fd, name, nullptr, 0);
    if (v < 0 || v > (1 << 16)) continue;
    std::string value(static_cast<size_t>(v), '\0');
    v = ::fgetxattr(fd, name, value.data(), value.size());
    if (v >= 0) out.emplace_back(name, value.substr(0, static_cast<size_t>(v)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool SameMeta(const struct stat& a, const struct stat& b) {
  return a.st_size == b.st_size && a.st_mode == b.st_mode && a.st_uid == b.st_uid && a.st_gid == b.st_gid &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

struct Sharer {
  UniqueFd objects;
  std::set<std::string> used;  // keys this layer already has
  std::vector<char> buf = std::vector<char>(1 << 20);
  DedupStats stats;

  // The key of an open file: its contents, then its metadata.
  Result<std::string> Key(int fd, const struct stat& st, const std::string& what) {
    Sha256 contents;
    for (;;) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "read " + what);
      }
      contents.Add(buf.data(), static_cast<size_t>(n));
    }
    Sha256 key;
    key.AddString("dsec-layer-file-v1");
    key.AddString(contents.Hex());
    key.AddValue<uint64_t>(static_cast<uint64_t>(st.st_size));
    key.AddValue<uint32_t>(st.st_mode);
    key.AddValue<uint32_t>(st.st_uid);
    key.AddValue<uint32_t>(st.st_gid);
    key.AddValue<int64_t>(st.st_mtim.tv_sec);
    key.AddValue<int64_t>(st.st_mtim.tv_nsec);
    for (const auto& [name, value] : Xattrs(fd)) {
      key.AddString(name);
      key.AddString(value);
    }
    return key.Hex();
  }

  Status File(int dir, const char* name, const std::string& what) {
    UniqueFd in(::openat(dir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!in) return errno == ENOENT || errno == ELOOP ? Status::Ok() : Status::FromErrno(errno, "open " + what);
    struct stat st;
    if (::fstat(in.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) return Status::Ok();
    ++stats.files;
    auto key = Key(in.get(), st, what);
    if (!key.ok()) return key.status();
    if (!used.insert(*key).second) return Status::Ok();  // two of one layer stay apart
    std::string sub = key->substr(0, 2), obj = sub + "/" + *key;
    struct stat have;
    if (::fstatat(objects.get(), obj.c_str(), &have, AT_SYMLINK_NOFOLLOW) == 0) {
      if (!S_ISREG(have.st_mode) || !SameMeta(have, st)) return Status::Ok();  // not what its name says: left be
      static std::atomic<uint64_t> n{0};
      std::string tmp = std::string(kTmp) + "/" + std::to_string(::getpid()) + "." + std::to_string(++n);
      if (::linkat(objects.get(), obj.c_str(), objects.get(), tmp.c_str(), 0) != 0) {
        if (errno == EMLINK || errno == ENOENT) return Status::Ok();  // full, or collected meanwhile
        return Status::FromErrno(errno, "link object " + obj);
      }
      if (::renameat(objects.get(), tmp.c_str(), dir, name) != 0) {
        int e = errno;
        (void)::unlinkat(objects.get(), tmp.c_str(), 0);
        return e == ENOENT ? Status::Ok() : Status::FromErrno(e, "share " + what);
      }
      ++stats.shared_files;
      stats.shared_bytes += static_cast<uint64_t>(st.st_size);
      return Status::Ok();
    }
    if (::mkdirat(objects.get(), sub.c_str(), 0700) != 0 && errno != EEXIST)
      return Status::FromErrno(errno, "make objects dir " + sub);
    if (::linkat(dir, name, objects.get(), obj.c_str(), 0) != 0 && errno != EEXIST && errno != EMLINK)
      return Status::FromErrno(errno, "keep " + what + " as object " + obj);
    return Status::Ok();
  }
};

// Names in a directory (no . and ..), with their types as readdir says.
std::vector<std::pair<std::string, unsigned char>> Entries(int dir) {
  std::vector<std::pair<std::string, unsigned char>> out;
  int copy = ::fcntl(dir, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return out;
  DIR* d = ::fdopendir(copy);
  if (!d) {
    ::close(copy);
    return out;
  }
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    out.emplace_back(e->d_name, e->d_type);
  }
  ::closedir(d);
  return out;
}

}  // namespace

Result<DedupStats> ShareFiles(const std::string& layer, const std::string& objects) {
  DSEC_RETURN_IF_ERROR(MakeDirs(objects + "/" + kTmp, 0700));
  Sharer s;
  s.objects = UniqueFd(::open(objects.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!s.objects) return Status::FromErrno(errno, "open " + objects);
  // Depth first: a directory waits with its parent's descriptor, opened
  // when its turn comes.
  struct Pending {
    std::shared_ptr<UniqueFd> parent;
    std::string name, path;
  };
  auto top = std::make_shared<UniqueFd>(::open(layer.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!*top) return Status::FromErrno(errno, "open " + layer);
  std::vector<Pending> pending;
  std::shared_ptr<UniqueFd> dir = top;
  std::string path = layer;
  for (;;) {
    for (const auto& [name, type] : Entries(dir->get())) {
      std::string what = path + "/" + name;
      if (type == DT_DIR) {
        pending.push_back({dir, name, what});
      } else if (type == DT_REG || type == DT_UNKNOWN) {
        Status st = s.File(dir->get(), name.c_str(), what);
        if (!st.ok()) return st;
      }
    }
    if (pending.empty()) break;
    Pending next = std::move(pending.back());
    pending.pop_back();
    auto fd = std::make_shared<UniqueFd>(
        ::openat(next.parent->get(), next.name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (!*fd) return Status::FromErrno(errno, "open " + next.path);
    dir = std::move(fd);
    path = std::move(next.path);
  }
  return s.stats;
}

size_t CollectObjects(const std::string& objects) {
  UniqueFd top(::open(objects.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!top) return 0;
  size_t removed = 0;
  for (const auto& [sub, type] : Entries(top.get())) {
    UniqueFd dir(::openat(top.get(), sub.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (!dir) continue;
    bool tmp = sub == kTmp;  // links a share left half made (a crash)
    for (const auto& [name, t] : Entries(dir.get())) {
      struct stat st;
      if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if ((tmp || st.st_nlink <= 1) && ::unlinkat(dir.get(), name.c_str(), 0) == 0) ++removed;
    }
  }
  return removed;
}

}  // namespace dsec::images
