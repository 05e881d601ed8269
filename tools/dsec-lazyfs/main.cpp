// dsec-lazyfs: the FUSE filesystem of a node's lazy image files
// (docs/images.md). One read-only file per image, <hex digest>.erofs,
// whose bytes it asks dsecd for over a Unix socket (drivers/images/
// lazy_wire.hpp); dsecd fetches the chunks they lie in. dsecd starts it;
// it is not meant to be run by hand. It outlives a dsecd restart and
// reconnects to the next one; a read waits up to --wait seconds for dsecd,
// then fails with EIO.
#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "drivers/images/lazy_wire.hpp"

namespace {

namespace lw = dsec::images::lazywire;
using Clock = std::chrono::steady_clock;

std::string g_socket;
int g_wait_s = 35;
// This FUSE thread's connection to dsecd, closed when the thread ends
// (libfuse ends idle worker threads; their connections must go with them).
struct ThreadConn {
  int fd = -1;
  ~ThreadConn() {
    if (fd >= 0) ::close(fd);
  }
};
thread_local ThreadConn t_conn;

using lw::ReadFull;
using lw::WriteFull;

int Connect() {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, g_socket.c_str(), sizeof(a.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) < 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One request to dsecd: its errno (0 when it answered), the size and the
// bytes. Requests are idempotent: a broken connection is made again and
// the request sent again, until --wait seconds have passed (then EIO).
int Call(lw::Op op, const std::string& name, uint64_t offset, uint32_t length, uint64_t* size, std::string* data) {
  auto deadline = Clock::now() + std::chrono::seconds(g_wait_s);
  for (;;) {
    if (t_conn.fd < 0) t_conn.fd = Connect();
    if (t_conn.fd >= 0) {
      lw::Request rq;
      rq.op = op;
      rq.name_len = static_cast<uint32_t>(name.size());
      rq.offset = offset;
      rq.length = length;
      lw::Reply rp;
      if (WriteFull(t_conn.fd, &rq, sizeof rq) && WriteFull(t_conn.fd, name.data(), name.size()) &&
          ReadFull(t_conn.fd, &rp, sizeof rp) && rp.data_len <= lw::kMaxRead + lw::kMaxList) {
        data->resize(rp.data_len);
        if (ReadFull(t_conn.fd, data->data(), data->size())) {
          *size = rp.size;
          return rp.err;
        }
      }
      ::close(t_conn.fd);
      t_conn.fd = -1;
    }
    if (Clock::now() >= deadline) {
      std::fprintf(stderr, "dsec-lazyfs: dsecd (%s) did not answer within %d s; EIO\n", g_socket.c_str(), g_wait_s);
      return EIO;
    }
    // dsecd is restarting: a reconnect's pause.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

bool Valid(const char* path) {
  return path[0] == '/' && std::strchr(path + 1, '/') == nullptr && std::strlen(path + 1) <= lw::kMaxName;
}

void* Init(fuse_conn_info*, fuse_config* cfg) {
  cfg->kernel_cache = 1;  // images never change: keep their pages across opens
  cfg->entry_timeout = 3600;
  cfg->attr_timeout = 3600;
  cfg->negative_timeout = 0;
  return nullptr;
}

int GetAttr(const char* path, struct stat* st, fuse_file_info*) {
  std::memset(st, 0, sizeof *st);
  if (std::strcmp(path, "/") == 0) {
    st->st_mode = S_IFDIR | 0555;
    st->st_nlink = 2;
    return 0;
  }
  if (!Valid(path)) return -ENOENT;
  uint64_t size = 0;
  std::string data;
  int e = Call(lw::kStat, path + 1, 0, 0, &size, &data);
  if (e) return -e;
  st->st_mode = S_IFREG | 0444;
  st->st_nlink = 1;
  st->st_size = static_cast<off_t>(size);
  st->st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  return 0;
}

int ReadDir(const char* path, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info*, fuse_readdir_flags) {
  if (std::strcmp(path, "/") != 0) return -ENOTDIR;
  uint64_t size = 0;
  std::string names;
  int e = Call(lw::kList, "", 0, 0, &size, &names);
  if (e) return -e;
  fill(buf, ".", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  fill(buf, "..", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  for (size_t at = 0; at < names.size();) {
    size_t nl = names.find('\n', at);
    if (nl == std::string::npos) nl = names.size();
    std::string n = names.substr(at, nl - at);
    if (!n.empty()) fill(buf, n.c_str(), nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
    at = nl + 1;
  }
  return 0;
}

int Open(const char* path, fuse_file_info* fi) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
  struct stat st;
  if (int e = GetAttr(path, &st, fi)) return e;
  fi->keep_cache = 1;
  return 0;
}

int Read(const char* path, char* buf, size_t size, off_t off, fuse_file_info*) {
  if (!Valid(path) || off < 0) return -EINVAL;
  uint64_t ignored = 0;
  std::string data;
  int e = Call(lw::kRead, path + 1, static_cast<uint64_t>(off),
               static_cast<uint32_t>(std::min<size_t>(size, lw::kMaxRead)), &ignored, &data);
  if (e) return -e;
  std::memcpy(buf, data.data(), data.size());
  return static_cast<int>(data.size());
}

void Usage(FILE* to) {
  std::fprintf(to,
               "usage: dsec-lazyfs --mount DIR --socket PATH [--wait SECONDS] [--ready-fd FD]\n"
               "Serves a node's lazy image files (one read-only <digest>.erofs per image) at DIR,\n"
               "asking dsecd at the Unix socket PATH for their bytes. dsecd starts it (docs/images.md).\n"
               "  --wait SECONDS  how long a read waits for dsecd before it fails with EIO (35)\n"
               "  --ready-fd FD   writes \"ok\" there once mounted\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string mount;
  int ready_fd = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dsec-lazyfs: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      Usage(stdout);
      return 0;
    } else if (a == "--mount") {
      mount = next();
    } else if (a == "--socket") {
      g_socket = next();
    } else if (a == "--wait") {
      g_wait_s = std::atoi(next());
    } else if (a == "--ready-fd") {
      ready_fd = std::atoi(next());
    } else {
      std::fprintf(stderr, "dsec-lazyfs: unknown argument %s\n", a.c_str());
      Usage(stderr);
      return 2;
    }
  }
  if (mount.empty() || g_socket.empty() || g_wait_s <= 0) {
    Usage(stderr);
    return 2;
  }
  fuse_operations ops{};
  ops.init = Init;
  ops.getattr = GetAttr;
  ops.readdir = ReadDir;
  ops.open = Open;
  ops.read = Read;
  char arg0[] = "dsec-lazyfs", o[] = "-o", opts[] = "ro,allow_other,fsname=dsec-lazy,subtype=dsec-lazy";
  char* fargv[] = {arg0, o, opts, nullptr};
  fuse_args args = FUSE_ARGS_INIT(3, fargv);
  fuse* f = fuse_new(&args, &ops, sizeof ops, nullptr);
  if (!f) {
    std::fprintf(stderr, "dsec-lazyfs: fuse_new failed\n");
    return 1;
  }
  if (fuse_mount(f, mount.c_str()) != 0) {
    std::fprintf(stderr, "dsec-lazyfs: cannot mount %s (is /dev/fuse there?)\n", mount.c_str());
    fuse_destroy(f);
    return 1;
  }
  fuse_set_signal_handlers(fuse_get_session(f));
  if (ready_fd >= 0) {
    (void)!::write(ready_fd, "ok", 2);
    ::close(ready_fd);
  }
  std::fprintf(stderr, "dsec-lazyfs: serving %s for %s\n", mount.c_str(), g_socket.c_str());
  int rc = fuse_loop_mt(f, 0);
  fuse_remove_signal_handlers(fuse_get_session(f));
  fuse_unmount(f);
  fuse_destroy(f);
  return rc == 0 ? 0 : 1;
}
