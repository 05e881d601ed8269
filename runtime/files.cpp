#include "runtime/files.hpp"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dsec {

Status WriteFileAtomic(const std::string& path, const std::string& content, mode_t mode) {
  // Unique per writer: two threads writing the same path must not share a temp file.
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + RandomHex(8);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return Status::FromErrno(errno, "write " + tmp);
  ::fchmod(fd, mode);  // the umask must not widen or narrow a secret's mode
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::FromErrno(e, "write " + tmp);
    }
    off += static_cast<size_t>(n);
  }
  int sync_rc = ::fsync(fd);
  int sync_errno = errno;
  int close_rc = ::close(fd);
  int close_errno = errno;
  if (sync_rc < 0 || close_rc < 0) {
    ::unlink(tmp.c_str());
    return Status::FromErrno(sync_rc < 0 ? sync_errno : close_errno, "fsync " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) < 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno(e, "rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

Status MakeDirs(const std::string& path, mode_t mode) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), mode) == 0) continue;
    if (errno != EEXIST) return Status::FromErrno(errno, "mkdir " + cur);
    // EEXIST is fine only for a directory: mkdir -p refuses a file in the way.
    struct stat st;
    if (::stat(cur.c_str(), &st) != 0) return Status::FromErrno(errno, "mkdir " + cur);
    if (!S_ISDIR(st.st_mode))
      return Status::FromErrno(ENOTDIR, "mkdir " + cur + " (it exists and is not a directory)");
  }
  return Status::Ok();
}

std::string RandomHex(size_t chars) {
  std::string bytes((chars + 1) / 2, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      // No entropy source at all: ids and tokens would be guessable; stop.
      std::fprintf(stderr, "dsec: getrandom failed: %s\n", std::strerror(errno));
      std::abort();
    }
  }
  std::string out = HexOf(bytes.data(), bytes.size());
  out.resize(chars);
  return out;
}

std::string HexOf(const void* data, size_t n) {
  static const char* kHex = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

Result<std::string> LoadOrCreateToken(const std::string& path) {
  auto existing = ReadFileToString(path);
  if (existing.ok()) {
    std::string t = *existing;
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
    if (t.empty()) return Status::FailedPrecondition("admin token file " + path + " is empty; delete it and restart dsecd to make a new one");
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077))
      ::chmod(path.c_str(), 0600);  // never leave a token readable by others
    return t;
  }
  if (existing.status().code() != Status::Code::kNotFound) return existing.status();
  std::string token = RandomHex(32);
  DSEC_RETURN_IF_ERROR(WriteFileAtomic(path, token + "\n", 0600));
  return token;
}

std::string AbsolutePath(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (!::getcwd(cwd, sizeof cwd)) return path;
  std::string p = path;
  while (p.rfind("./", 0) == 0) p = p.substr(2);
  return std::string(cwd) + "/" + p;
}

}  // namespace dsec

namespace dsec {

int RunToFile(const std::vector<std::string>& argv, const std::string& output) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> av;
    for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    ::execv(av[0], av.data());
    ::_exit(127);
  }
  if (pid < 0) return -1;
  int status = 0;
  for (;;) {
    if (::waitpid(pid, &status, 0) == pid) break;
    if (errno != EINTR) return -1;  // not ours to wait for (SIGCHLD ignored?): unknown, so not success
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

namespace {
int RemoveOne(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path) < 0 && errno != ENOENT ? -1 : 0; }
}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) < 0) return errno == ENOENT ? Status::Ok() : Status::FromErrno(errno, "stat " + path);
  errno = 0;
  if (::nftw(path.c_str(), RemoveOne, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
    return Status::FromErrno(errno ? errno : EIO, "remove " + path);
  return Status::Ok();
}

}  // namespace dsec
