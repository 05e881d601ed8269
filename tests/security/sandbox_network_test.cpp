// Network from inside a sandbox, once per registered kind: no route out,
// and none of the host's listeners (TCP on 127.0.0.1 and on the host's own
// addresses, abstract unix sockets) within reach, whatever root inside
// tries. A kind with a loopback of its own (traits.own_loopback: the
// container) has it up and working; the others (fncall) have only a
// loopback that is down and cannot be brought up. A new kind is tested by
// being registered. What is particular to one kind's mechanism (the
// container's recycled net namespaces) stays in that kind's tests.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/unique_fd.hpp"
#include "tests/support/kind_sandbox_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

// The host's own IPv4 addresses other than loopback (eth0 and the like).
std::vector<std::string> HostAddresses() {
  std::vector<std::string> out;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) < 0) return out;
  for (ifaddrs* i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (ntohl(sin->sin_addr.s_addr) >> 24 == 127) continue;
    if (::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf)) out.push_back(buf);
  }
  ::freeifaddrs(all);
  return out;
}

// Each test only probes from its sandbox (connections that must fail): on
// a kind whose creation is a boot the tests share one guest.
class SandboxNetwork : public KindSandboxTest {
 protected:
  bool SharesItsSandbox() const override { return IsVm(GetParam().traits); }
};

TEST_P(SandboxNetwork, CannotConnectToAHostTcpListener) {
  // Listening on every address of the host, so its loopback and its own
  // addresses are tried alike.
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  UniqueFd listener = NonBlockingListener(AF_INET, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ASSERT_TRUE(listener) << std::strerror(errno);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string port = std::to_string(ntohs(addr.sin_port));

  std::vector<std::string> argv = {"python3", "-c", kConnectProbe, "4", "127.0.0.1", port, "4", "localhost", port};
  std::vector<std::string> host = HostAddresses();
  for (const auto& a : host) argv.insert(argv.end(), {"4", a, port});
  auto r = Run(argv);
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 2 + host.size()) << r.stdout();
  // 127.0.0.1 (localhost in the sandbox's /etc/hosts) is the sandbox's own
  // loopback, where nothing listens, or one that is down; either way it
  // fails at once, not by a timeout. The host's addresses have no route.
  const char* loopback = GetParam().traits.own_loopback ? "ECONNREFUSED" : "ENETUNREACH";
  EXPECT_EQ(res["127.0.0.1"], loopback) << port;
  EXPECT_EQ(res["localhost"], loopback) << port;
  for (const auto& a : host) EXPECT_EQ(res[a], "ENETUNREACH") << a << ":" << port;
  ExpectNothingAccepted(listener);
}

TEST_P(SandboxNetwork, CannotConnectToAHostAbstractUnixSocket) {
  // Abstract unix sockets belong to the net namespace, not the file system.
  std::string name = "dsec-security-" + std::to_string(std::random_device{}());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  UniqueFd listener = NonBlockingListener(AF_UNIX, reinterpret_cast<sockaddr*>(&addr), len);
  ASSERT_TRUE(listener) << std::strerror(errno);

  auto r = Run({"python3", "-c", kAbstractConnectProbe, name});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "ECONNREFUSED\n");
  ExpectNothingAccepted(listener);
}

TEST_P(SandboxNetwork, CannotReachTheOutside) {
  auto r = Run({"python3", "-c", kConnectProbe, "4", "1.1.1.1", "53", "4", "8.8.8.8", "443", "6",
                "2606:4700:4700::1111", "53"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 3u) << r.stdout();
  // No route: the attempt fails at once instead of timing out. IPv6 with
  // the loopback down has not even ::1 as a source address.
  EXPECT_EQ(res["1.1.1.1"], "ENETUNREACH");
  EXPECT_EQ(res["8.8.8.8"], "ENETUNREACH");
  EXPECT_EQ(res["2606:4700:4700::1111"], GetParam().traits.own_loopback ? "ENETUNREACH" : "EADDRNOTAVAIL");
  // Neither UDP nor name resolution gets out.
  auto udp = Run({"python3", "-c",
                  "import errno, socket\n"
                  "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                  "try:\n"
                  "    s.sendto(b'x', ('1.1.1.1', 53))\n"
                  "    print('sent')\n"
                  "except OSError as e:\n"
                  "    print(errno.errorcode.get(e.errno, e.errno))\n"
                  "try:\n"
                  "    socket.getaddrinfo('example.com', 80)\n"
                  "    print('resolved')\n"
                  "except OSError as e:\n"
                  "    print('unresolved')\n"});
  ASSERT_EQ(udp.verdict(), v1::VERDICT_OK) << udp.error() << "\n" << udp.stderr();
  EXPECT_EQ(udp.stdout(), "ENETUNREACH\nunresolved\n");
}

// The only interface is the loopback, up or down as the kind says, with no
// route in the main table; root inside cannot add a route or an address,
// nor turn the loopback up or down.
// On the host's kernel, nobody in the sandbox holds CAP_NET_ADMIN over its
// network namespace. (A VM's root owns its guest's network stack, which has
// no device but the loopback: vm_isolation_test.cpp.)
class SandboxHostNetwork : public SandboxNetwork {};

TEST_P(SandboxHostNetwork, OnlyTheLoopbackExistsAndNobodyInsideCanChangeIt) {
  auto r = Run({"python3", "-c",
                std::string(kAttempt) +
                    "import fcntl, socket, struct\n"
                    "names = [l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]]\n"
                    "print(' '.join(sorted(names)))\n"
                    "print(' '.join(n for _, n in socket.if_nameindex()))\n"
                    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    "req = struct.pack('16sH14x', b'lo', 0)\n"
                    "flags = struct.unpack('16sH14x', fcntl.ioctl(s, 0x8913, req))[1]\n"  // SIOCGIFFLAGS
                    "print('up' if flags & 1 else 'down')\n"
                    "print(len(open('/proc/net/route').readlines()[1:]))\n"  // routes below the header
                    "def sin(a):\n"
                    "    return struct.pack('HH4s8x', socket.AF_INET, 0, socket.inet_aton(a))\n"
                    // struct rtentry: pad, dst, gateway, genmask, flags (RTF_UP|RTF_GATEWAY), ...
                    "rt = bytearray(120)\n"
                    "rt[8:24] = sin('0.0.0.0')\n"
                    "rt[24:40] = sin('127.0.0.1')\n"
                    "rt[40:56] = sin('0.0.0.0')\n"
                    "rt[56:58] = struct.pack('H', 3)\n"
                    "attempt('add_default_route', lambda: fcntl.ioctl(s, 0x890B, bytes(rt)))\n"  // SIOCADDRT
                    "attempt('set_address', lambda: fcntl.ioctl(s, 0x8916, "                     // SIOCSIFADDR
                    "struct.pack('16s16s8x', b'lo', sin('10.0.0.1'))))\n"
                    "attempt('toggle_lo', lambda: fcntl.ioctl(s, 0x8914, "                       // SIOCSIFFLAGS
                    "struct.pack('16sH22x', b'lo', flags ^ 1)))\n"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  // /proc/net/dev and the kernel's interface list agree: lo alone; the IPv4
  // main table holds no route (loopback routes live in the local table; with
  // the loopback down the file has not even its header).
  std::string lo = GetParam().traits.own_loopback ? "up" : "down";
  EXPECT_EQ(r.stdout(), "lo\nlo\n" + lo + "\n0\nadd_default_route EPERM\nset_address EPERM\ntoggle_lo EPERM\n");
}

INSTANTIATE_TEST_SUITE_P(Kinds, SandboxNetwork, ::testing::ValuesIn(RegisteredKinds()), KindParamName);
INSTANTIATE_TEST_SUITE_P(Kinds, SandboxHostNetwork, ::testing::ValuesIn(RegisteredKinds(OnTheHostKernel)),
                         KindParamName);

// Kinds whose sandboxes have a loopback of their own: it carries traffic
// between programs of one sandbox.
using SandboxLoopback = KindSandboxTest;

TEST_P(SandboxLoopback, CarriesTrafficInsideTheSandbox) {
  auto r = Run({"python3", "-c",
                "import socket, threading\n"
                "def echo(srv):\n"
                "    c, _ = srv.accept()\n"
                "    c.sendall(c.recv(64).upper())\n"
                "    c.close()\n"
                "srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
                "srv.bind(('127.0.0.1', 0))\n"
                "srv.listen(1)\n"
                "t = threading.Thread(target=echo, args=(srv,))\n"
                "t.start()\n"
                "c = socket.create_connection(srv.getsockname(), timeout=5)\n"
                "c.sendall(b'ping')\n"
                "print(c.recv(64).decode())\n"
                "t.join()\n"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "PING\n");
}

INSTANTIATE_TEST_SUITE_P(Kinds, SandboxLoopback,
                         ::testing::ValuesIn(RegisteredKinds([](const drivers::KindTraits& t) { return t.own_loopback; })),
                         KindParamName);

}  // namespace
}  // namespace dsec::testing
