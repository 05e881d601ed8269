// What the tests share: a python probe that connects to addresses and
// reports each outcome, the parser for "name result" lines such probes
// print, a host listener the test owns and checks nothing reached, probes
// that signal a pid or make device nodes, tokens no one else has, and
// syscall probes run in a sandbox. What this host offers: host_probes.hpp;
// the seccomp filter replayed as root: seccomp_probes.hpp (both included).
#pragma once

#include <spawn.h>
#include <unistd.h>

#include <random>
#include <string>

#include "tests/support/host_probes.hpp"
#include "tests/support/seccomp_probes.hpp"

extern char** environ;

namespace dsec::testing {

// Tries each "family host port" target from argv (TCP, 3 s timeout) and prints
// "host connected" or "host ERRNO".
inline constexpr const char* kConnectProbe =
    "import errno, socket, sys\n"
    "args = sys.argv[1:]\n"
    "for i in range(0, len(args), 3):\n"
    "    fam = {'4': socket.AF_INET, '6': socket.AF_INET6}[args[i]]\n"
    "    host, port = args[i + 1], int(args[i + 2])\n"
    "    s = socket.socket(fam, socket.SOCK_STREAM)\n"
    "    s.settimeout(3)\n"
    "    try:\n"
    "        s.connect((host, port))\n"
    "        print(host, 'connected')\n"
    "    except socket.timeout:\n"
    "        print(host, 'timeout')\n"
    "    except OSError as e:\n"
    "        print(host, errno.errorcode.get(e.errno, e.errno))\n"
    "    s.close()\n";

// A name or argument no other test, process or file has:
// "<prefix>-<this test's pid>-<random>".
inline std::string UniqueToken(const std::string& prefix) {
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
}

// "name result" lines -> {name: result}; the result is the rest of the line.
inline std::map<std::string, std::string> ParseResults(const std::string& out) {
  std::map<std::string, std::string> m;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    size_t sp = line.find(' ');
    if (sp != std::string::npos) m[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return m;
}

// A listener the test owns; the UniqueFd closes it whatever happens.
inline UniqueFd NonBlockingListener(int family, const sockaddr* addr, socklen_t len) {
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  if (::bind(fd.get(), addr, len) < 0 || ::listen(fd.get(), 16) < 0) fd.Reset();
  return fd;
}

// Nothing reached the listener: a non-blocking accept finds no connection.
inline void ExpectNothingAccepted(const UniqueFd& listener) {
  int c = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  int err = errno;
  if (c >= 0) ::close(c);
  EXPECT_LT(c, 0) << "the host listener accepted a connection from the sandbox";
  EXPECT_TRUE(err == EAGAIN || err == EWOULDBLOCK) << std::strerror(err);
}

// Syscall probes: name -> a python call of sc() or sc_fork() (both return
// (result, errno)), run after kPrelude; report() prints "name result errno".
using Probes = std::vector<std::pair<std::string, std::string>>;

// Python: connects to the abstract unix socket named argv[1] (3 s
// timeout); prints "connected" or the errno's name.
inline constexpr const char* kAbstractConnectProbe =
    "import errno, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "s.settimeout(3)\n"
    "try:\n"
    "    s.connect('\\0' + sys.argv[1])\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print(errno.errorcode.get(e.errno, e.errno))\n";

// Python: sends signal 0, SIGTERM and SIGKILL to pid argv[1]; prints
// "<signal> delivered" or "<signal> ERRNO" for each.
inline constexpr const char* kSignalProbe =
    "import errno, os, signal, sys\n"
    "pid = int(sys.argv[1])\n"
    "for sig in (0, signal.SIGTERM, signal.SIGKILL):\n"
    "    try:\n"
    "        os.kill(pid, sig)\n"
    "        print(int(sig), 'delivered')\n"
    "    except OSError as e:\n"
    "        print(int(sig), errno.errorcode[e.errno])\n";

// The host is unharmed by what a sandbox did: this process can still fork
// and spawn.
inline void ExpectHostCanFork() {
  pid_t child = ::fork();
  ASSERT_GE(child, 0) << "the test process cannot fork: " << std::strerror(errno);
  if (child == 0) ::_exit(7);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 7) << "wait status " << st;
  pid_t spawned = -1;
  char* argv[] = {const_cast<char*>("true"), nullptr};
  ASSERT_EQ(::posix_spawnp(&spawned, "true", nullptr, nullptr, argv, environ), 0);
  ASSERT_EQ(::waitpid(spawned, &st, 0), spawned);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;
}

// Python: attempt(name, f) prints "name done", or "name ERRNO" when f raises
// OSError (ENOENT, EPERM, ...).
inline constexpr const char* kAttempt =
    "import errno\n"
    "def attempt(name, f):\n"
    "    try:\n"
    "        f()\n"
    "        print(name, 'done')\n"
    "    except OSError as e:\n"
    "        print(name, errno.errorcode.get(e.errno, e.errno))\n";

// Python: tries each "path kind major minor" of argv (kind b: block device,
// c: character device, p: FIFO) with mknod, mode 0666; prints "path made"
// or "path ERRNO" for each. Leaves `args` (argv[1:]) defined for code after it.
inline constexpr const char* kMknodProbe =
    "import errno, os, stat, sys\n"
    "kinds = {'b': stat.S_IFBLK, 'c': stat.S_IFCHR, 'p': stat.S_IFIFO}\n"
    "args = sys.argv[1:]\n"
    "for i in range(0, len(args), 4):\n"
    "    path, kind, major, minor = args[i], args[i + 1], int(args[i + 2]), int(args[i + 3])\n"
    "    try:\n"
    "        os.mknod(path, kinds[kind] | 0o666, os.makedev(major, minor))\n"
    "        print(path, 'made')\n"
    "    except OSError as e:\n"
    "        print(path, errno.errorcode.get(e.errno, e.errno))\n";

inline constexpr const char* kPrelude =
    "import ctypes, errno, os, subprocess\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "def arg(a):\n"
    "    return ctypes.c_long(a) if isinstance(a, int) else a\n"
    "def sc(nr, *args):\n"
    "    ctypes.set_errno(0)\n"
    "    r = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])\n"
    "    return r, ctypes.get_errno()\n"
    "def sc_fork(nr, *args):\n"  // a clone that succeeds must not run on here
    "    r, e = sc(nr, *args)\n"
    "    if r == 0:\n"
    "        os._exit(0)\n"
    "    if r > 0:\n"
    "        os.waitpid(r, 0)\n"
    "    return r, e\n"
    "def zeros(n):\n"
    "    return ctypes.create_string_buffer(n)\n"
    "def report(name, res):\n"
    "    r, e = res\n"
    "    print(name, r, errno.errorcode.get(e, e) if r == -1 else '-', flush=True)\n";

inline std::string N(long nr) { return std::to_string(nr); }

// Each probe printed "<name> -1 <expected errno>".
inline void ExpectAllFail(const v1::ExecResult& r, const Probes& probes, const std::string& expected) {
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto got = ParseResults(r.stdout());
  for (const auto& [name, call] : probes) {
    ASSERT_EQ(got.count(name), 1u) << name << " printed nothing:\n" << r.stdout() << r.stderr();
    EXPECT_EQ(got[name], "-1 " + expected) << name << " = " << call << " was not denied";
  }
}

}  // namespace dsec::testing
