// dsec-agent: PID 1 of a container (later the init of a VM); see agent.hpp.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "drivers/agent/agent.hpp"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: dsec-agent (--listen PATH | --listen-fd N | --fd N [--vport]) [--cgroup DIR] [--oom-events F] [--ready-fd N] [--guarded] [--layers-fd U,I[,M]]\n"
               "       dsec-agent --reclaim\n"
               "       dsec-agent --identity < LINES\n"
               "       dsec-agent --relay PORT\n"
               "\n"
               "The in-sandbox agent of dsec: PID 1 of a container, serving the agent\n"
               "protocol (drivers/agent/agent.proto) to dsecd. It runs commands, streams\n"
               "their output, reads and writes files, and reaps every process in the sandbox.\n"
               "\n"
               "  --listen PATH   create a unix socket at PATH (mode 0600) and serve every\n"
               "                  client that connects\n"
               "  --listen-fd N   accept on an already-listening unix socket\n"
               "  --fd N          serve one already-connected stream fd (socketpair end,\n"
               "                  virtio-serial port)\n"
               "  --vport         the --fd is a virtio-serial port: the host may go away and\n"
               "                  come back; each host starts with a sync (channel_sync.hpp)\n"
               "  --oom-events F  memory.events of our cgroup (in a VM): an exec killed while\n"
               "                  its oom_kill count grew is reported OOM-killed\n"
               "  --cgroup DIR    a cgroup v2 group every program joins before it runs (the\n"
               "                  agent stays out of it); its memory.events as --oom-events\n"
               "  --ready-fd N    write \"ready\\n\" to fd N and close it once serving\n"
               "  --guarded       (a guarded task's VM guest) programs run with only the\n"
               "                  capabilities a container's keep (no remount, no raw disk)\n"
               "  --layers-fd U,I[,M]  (a VM guest) descriptors of its overlay's upper dir,\n"
               "                  image and mask layer: what the Changes request reads\n"
               "  --reclaim       (in a VM's guest, run by dsecd when the sandbox is idle)\n"
               "                  drop the guest kernel's clean caches and compact its free\n"
               "                  memory, so that free-page reporting hands it back to the\n"
               "                  host; prints what was freed, in KiB\n"
               "  --identity      (in a VM guest made from a snapshot, run by dsecd before any\n"
               "                  other program) take the lines of stdin as the hostname, the\n"
               "                  machine-id, a random seed (hex) and the time (ns since the\n"
               "                  epoch): set them, and reseed the kernel's RNG with the seed\n"
               "  --relay PORT    (run by dsecd to reach a service in the sandbox) connect to\n"
               "                  127.0.0.1:PORT (else [::1]:PORT), copy stdin to it (its write\n"
               "                  side shut at stdin's end) and what it sends to stdout, until\n"
               "                  it closes; exit 3 when nothing listens there\n"
               "\n"
               "As PID 1 it ignores SIGTERM and SIGINT (the host kills the sandbox to stop\n"
               "it). Otherwise it makes itself a child subreaper and, on SIGTERM or SIGINT,\n"
               "kills what it started, removes its socket and exits 0.\n");
}

bool ParseFd(const char* s, int* out) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  if (errno || !end || *end || end == s || v < 0 || v > 1 << 30) return false;
  *out = static_cast<int>(v);
  return true;
}

// MemFree of /proc/meminfo, KiB (0 when unreadable).
long MemFreeKiB() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemFree: %ld kB", &kib) == 1) break;
  std::fclose(f);
  return kib;
}

bool WriteProc(const char* path, const char* value) {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, value, std::strlen(value)) == static_cast<ssize_t>(std::strlen(value));
  ::close(fd);
  return ok;
}

// The guest's side of dsecd's idle reclaim (drivers/vm/guest_driver.cpp):
// clean page cache and slab go, free memory is compacted into the large
// blocks free-page reporting hands back to the host (virtio-balloon).
int Reclaim() {
  long before = MemFreeKiB();
  ::sync();
  bool dropped = WriteProc("/proc/sys/vm/drop_caches", "3");
  bool compacted = WriteProc("/proc/sys/vm/compact_memory", "1");
  if (!dropped) {
    std::fprintf(stderr, "dsec-agent --reclaim: cannot write /proc/sys/vm/drop_caches: %s\n", std::strerror(errno));
    return 1;
  }
  std::printf("freed %ld KiB%s\n", MemFreeKiB() - before, compacted ? ", compacted" : "");
  return 0;
}

// A guest made from a snapshot starts as its source stood: the same
// hostname, machine-id, RNG state and clock. dsecd gives it its own before
// anything else runs in it (drivers/vm/guest_snapshot.cpp).
int Identity() {
  std::string in;
  char buf[1024];
  for (ssize_t n; (n = ::read(0, buf, sizeof buf)) > 0;) in.append(buf, static_cast<size_t>(n));
  std::string line[4];
  size_t at = 0;
  for (auto& l : line) {
    size_t nl = in.find('\n', at);
    if (nl == std::string::npos) {
      std::fprintf(stderr, "dsec-agent --identity: want 4 lines on stdin (hostname, machine-id, seed, time)\n");
      return 2;
    }
    l = in.substr(at, nl - at);
    at = nl + 1;
  }
  auto fail = [](const char* what) {
    std::fprintf(stderr, "dsec-agent --identity: %s: %s\n", what, std::strerror(errno));
    return 1;
  };
  // Empty lines keep what is (a resumed guest keeps its name and id).
  if (!line[0].empty() && ::sethostname(line[0].data(), line[0].size()) < 0) return fail("sethostname");
  // Files of the guest's root (its tmpfs layer): as its init wrote them.
  for (auto [path, value] : {std::pair<const char*, std::string>{"/etc/hostname", line[0]}, {"/etc/machine-id", line[1]}}) {
    if (value.empty()) continue;
    int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
    if (fd < 0) continue;  // an image without /etc
    value += "\n";
    if (::write(fd, value.data(), value.size()) != static_cast<ssize_t>(value.size())) return fail(path);
    ::close(fd);
  }
  // The seed into the input pool (credited), then a reseed of the CRNG
  // every reader draws from.
  std::string seed;
  for (size_t i = 0; i + 1 < line[2].size(); i += 2) seed += static_cast<char>(std::stoi(line[2].substr(i, 2), nullptr, 16));
  alignas(rand_pool_info) unsigned char raw[sizeof(rand_pool_info) + 256] = {};
  auto* add = reinterpret_cast<rand_pool_info*>(raw);
  if (seed.size() > 256) seed.resize(256);
  add->entropy_count = static_cast<int>(seed.size() * 8);
  add->buf_size = static_cast<int>(seed.size());
  std::memcpy(raw + sizeof(rand_pool_info), seed.data(), seed.size());
  int rnd = ::open("/dev/urandom", O_RDWR | O_CLOEXEC);
  if (rnd < 0) return fail("open /dev/urandom");
  if (::ioctl(rnd, RNDADDENTROPY, add) < 0) return fail("RNDADDENTROPY");
  if (::ioctl(rnd, RNDRESEEDCRNG) < 0) return fail("RNDRESEEDCRNG");
  ::close(rnd);
  long long ns = std::atoll(line[3].c_str());
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  if (ns > 0 && ::clock_settime(CLOCK_REALTIME, &ts) < 0) return fail("clock_settime");
  std::printf("identity %s\n", line[0].c_str());
  return 0;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// --relay PORT: stdin and stdout joined to a TCP connection to a service
// listening in the sandbox (dsecd's E2B door reaches ports this way: it
// needs no network link, so a sandbox without one has its services too).
int Relay(const char* port_text) {
  char* end = nullptr;
  long port = std::strtol(port_text, &end, 10);
  if (!*port_text || *end || port < 1 || port > 65535) {
    std::fprintf(stderr, "dsec-agent --relay: '%s' is not a port (1 to 65535)\n", port_text);
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  int sock = -1, err = 0;
  for (int family : {AF_INET, AF_INET6}) {
    sock = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) continue;
    int rc;
    if (family == AF_INET) {
      sockaddr_in a = {};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      rc = ::connect(sock, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in6 a = {};
      a.sin6_family = AF_INET6;
      a.sin6_port = htons(static_cast<uint16_t>(port));
      a.sin6_addr = in6addr_loopback;
      rc = ::connect(sock, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc == 0) break;
    err = errno;
    ::close(sock);
    sock = -1;
  }
  if (sock < 0) {
    std::fprintf(stderr, "nothing listens on port %ld in the sandbox (%s)\n", port, std::strerror(err));
    return 3;
  }
  char buf[65536];
  bool in_open = true;
  for (;;) {
    pollfd fds[2] = {{in_open ? 0 : -1, POLLIN, 0}, {sock, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (in_open && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = ::read(0, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        in_open = false;
        ::shutdown(sock, SHUT_WR);
      } else if (!WriteAll(sock, buf, static_cast<size_t>(n))) {
        return 1;
      }
    }
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::read(sock, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return 0;
      if (n < 0 || !WriteAll(1, buf, static_cast<size_t>(n))) return n < 0 ? 1 : 0;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Not dumpable: root in the container (the same uid as we are, without
  // CAP_SYS_PTRACE) must not open /proc/1/mem and rewrite what we report
  // about its programs (their exit codes are rewards). Programs we start
  // are dumpable again from their execve on.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  if (argc == 2 && std::string(argv[1]) == "--reclaim") return Reclaim();
  if (argc == 2 && std::string(argv[1]) == "--identity") return Identity();
  if (argc == 3 && std::string(argv[1]) == "--relay") return Relay(argv[2]);
  dsec::agent::AgentOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      Usage(stdout);
      return 0;
    }
    bool has_value = i + 1 < argc;
    if (a == "--listen" && has_value) {
      o.listen_path = argv[++i];
    } else if (a == "--listen-fd" && has_value) {
      if (!ParseFd(argv[++i], &o.listen_fd)) {
        std::fprintf(stderr, "dsec-agent: --listen-fd needs a descriptor number\n");
        return 2;
      }
    } else if (a == "--fd" && has_value) {
      if (!ParseFd(argv[++i], &o.fd)) {
        std::fprintf(stderr, "dsec-agent: --fd needs a descriptor number\n");
        return 2;
      }
    } else if (a == "--cgroup" && has_value) {
      o.cgroup = argv[++i];
    } else if (a == "--oom-events" && has_value) {
      o.oom_events = argv[++i];
    } else if (a == "--vport") {
      o.vport = true;
    } else if (a == "--guarded") {
      o.guarded = true;
    } else if (a == "--layers-fd" && has_value) {
      // UPPER,IMAGE[,MASK]: descriptors we keep (our programs do not get them).
      std::vector<int> fds;
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        size_t comma = list.find(',', at);
        int fd = -1;
        if (!ParseFd(list.substr(at, comma == std::string::npos ? std::string::npos : comma - at).c_str(), &fd) ||
            ::fcntl(fd, F_GETFD) < 0) {
          std::fprintf(stderr, "dsec-agent: --layers-fd needs open descriptors UPPER,IMAGE[,MASK]: '%s'\n",
                       list.c_str());
          return 2;
        }
        ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        fds.push_back(fd);
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
      if (fds.size() < 2 || fds.size() > 3) {
        std::fprintf(stderr, "dsec-agent: --layers-fd takes UPPER,IMAGE[,MASK]\n");
        return 2;
      }
      auto path = [](int fd) { return "/proc/self/fd/" + std::to_string(fd); };
      o.layer_upper = path(fds[0]);
      if (fds.size() == 3) o.layer_lowers.push_back(path(fds[2]));
      o.layer_lowers.push_back(path(fds[1]));
    } else if (a == "--ready-fd" && has_value) {
      if (!ParseFd(argv[++i], &o.ready_fd)) {
        std::fprintf(stderr, "dsec-agent: --ready-fd needs a descriptor number\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "dsec-agent: unknown or incomplete argument '%s'\n", a.c_str());
      Usage(stderr);
      return 2;
    }
  }
  if (o.vport && o.fd < 0) {
    std::fprintf(stderr, "dsec-agent: --vport needs --fd\n");
    return 2;
  }
  if (o.listen_path.empty() && o.listen_fd < 0 && o.fd < 0) {
    Usage(stderr);
    return 2;
  }
  for (int fd : {o.fd, o.listen_fd, o.ready_fd})
    if (fd >= 0 && ::fcntl(fd, F_GETFD) < 0) {
      std::fprintf(stderr, "dsec-agent: fd %d is not open\n", fd);
      return 2;
    }
  // Keep 0-2 occupied so no socket or pipe of ours lands there (a container
  // may start us with them closed). Without /dev/null, nothing to be done.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0) {
      int n = ::open("/dev/null", O_RDWR);
      if (n >= 0 && n != fd) ::close(n);
    }
  return dsec::agent::RunAgent(o);
}
