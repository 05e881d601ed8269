// dsec-spawner: started by dsecd with its socket on fd 3. Not meant to be run
// by hand; `--help` says so and lists the flags dsecd passes.
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "drivers/spawner/spawner.hpp"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: dsec-spawner [--fd N] [--uid N] [--gid N] [--pool N] [--max-runners N]\n"
               "                    [--fresh-namespaces] [--containers] [--no-write-watch] [--container-netns N] [--cgroup-parent NAME] [--tmpfs-bytes N]\n"
               "\n"
               "Internal helper of dsecd: keeps a warm pool of fncall sandboxes and runs\n"
               "programs in them for dsecd, which talks to it over the socket on --fd\n"
               "(default 3). dsecd starts and stops it; there is no reason to run it by hand.\n");
}

bool ParseU64(const char* s, unsigned long long* out) {
  char* end = nullptr;
  errno = 0;
  *out = std::strtoull(s, &end, 10);
  return errno == 0 && end && *end == 0 && end != s;
}

}  // namespace

int main(int argc, char** argv) {
  dsec::fncall::SpawnerOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next_u64 = [&](unsigned long long* v) {
      if (i + 1 >= argc || !ParseU64(argv[i + 1], v)) {
        std::fprintf(stderr, "dsec-spawner: %s needs a number\n", a.c_str());
        std::exit(2);
      }
      ++i;
    };
    unsigned long long v = 0;
    if (a == "--help" || a == "-h") {
      Usage(stdout);
      return 0;
    } else if (a == "--fd") {
      next_u64(&v);
      o.control_fd = static_cast<int>(v);
    } else if (a == "--uid") {
      next_u64(&v);
      o.uid = static_cast<uid_t>(v);
    } else if (a == "--gid") {
      next_u64(&v);
      o.gid = static_cast<gid_t>(v);
    } else if (a == "--pool") {
      next_u64(&v);
      o.pool_size = v;
    } else if (a == "--max-runners") {
      next_u64(&v);
      o.max_runners = v;
    } else if (a == "--tmpfs-bytes") {
      next_u64(&v);
      o.tmpfs_bytes = v;
    } else if (a == "--container-netns") {
      next_u64(&v);
      o.container_netns = v;
    } else if (a == "--containers") {
      o.containers = true;
    } else if (a == "--no-write-watch") {
      o.watch_writes = false;
    } else if (a == "--fresh-namespaces") {
      o.fresh_namespaces = true;
    } else if (a == "--cgroup-parent" && i + 1 < argc) {
      o.cgroup_parent = argv[++i];
    } else {
      std::fprintf(stderr, "dsec-spawner: unknown argument '%s'\n", a.c_str());
      Usage(stderr);
      return 2;
    }
  }
  // Keep only stdio and our socket: whatever else dsecd had open (listening
  // ports, its database) must not live on in us or in the sandboxes.
  if (o.control_fd != 3) {
    if (::dup2(o.control_fd, 3) < 0) return 1;
    o.control_fd = 3;
  }
  ::syscall(SYS_close_range, 4u, ~0u, 0u);
  return dsec::fncall::RunSpawner(o);
}
