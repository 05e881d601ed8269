// Network from inside a container: no route out. A container has its own
// loopback, up and working, and nothing else: the host's listeners (TCP on
// 127.0.0.1 and on its own addresses, abstract unix sockets) and the
// outside world are out of reach, and root cannot change that.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/unique_fd.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

class ContainerNetwork : public ContainerTest {};

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

TEST_F(ContainerNetwork, CannotConnectToAHostTcpListener) {
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

  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  std::vector<std::string> argv = {"python3", "-c", kConnectProbe, "4", "127.0.0.1", port};
  std::vector<std::string> host = HostAddresses();
  for (const auto& a : host) argv.insert(argv.end(), {"4", a, port});
  auto r = Exec(*sb, Command(argv));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 1 + host.size()) << r.stdout();
  // 127.0.0.1 is the container's own loopback, where nothing listens; the
  // host's addresses have no route.
  EXPECT_EQ(res["127.0.0.1"], "ECONNREFUSED");
  for (const auto& a : host) EXPECT_EQ(res[a], "ENETUNREACH") << a << ":" << port;
  ExpectNothingAccepted(listener);
  Destroy(*sb);
}

TEST_F(ContainerNetwork, CannotReachTheOutside) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = Exec(*sb, Command({"python3", "-c", kConnectProbe, "4", "1.1.1.1", "53", "4", "8.8.8.8", "443", "6",
                              "2606:4700:4700::1111", "53"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 3u) << r.stdout();
  // No route: the attempt fails at once instead of timing out.
  for (const auto& [host, result] : res) EXPECT_EQ(result, "ENETUNREACH") << host;
  auto udp = Exec(*sb, Command({"python3", "-c",
                                "import errno, socket\n"
                                "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                                "try:\n"
                                "    s.sendto(b'x', ('1.1.1.1', 53))\n"
                                "    print('sent')\n"
                                "except OSError as e:\n"
                                "    print(errno.errorcode.get(e.errno, e.errno))\n"}));
  EXPECT_EQ(udp.stdout(), "ENETUNREACH\n") << udp.stderr();
  Destroy(*sb);
}

TEST_F(ContainerNetwork, CannotConnectToAHostAbstractUnixSocket) {
  // Abstract unix sockets belong to the net namespace, not the file system.
  std::string name = "dsec-security-" + std::to_string(std::random_device{}());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  UniqueFd listener = NonBlockingListener(AF_UNIX, reinterpret_cast<sockaddr*>(&addr), len);
  ASSERT_TRUE(listener) << std::strerror(errno);

  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = Exec(*sb, Command({"python3", "-c",
                              "import errno, socket, sys\n"
                              "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                              "s.settimeout(3)\n"
                              "try:\n"
                              "    s.connect('\\0' + sys.argv[1])\n"
                              "    print('connected')\n"
                              "except OSError as e:\n"
                              "    print(errno.errorcode.get(e.errno, e.errno))\n",
                              name}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "ECONNREFUSED\n");
  ExpectNothingAccepted(listener);
  Destroy(*sb);
}

TEST_F(ContainerNetwork, OnlyLoopbackExistsAndItIsUp) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = Exec(*sb, Command({"python3", "-c",
                              "import fcntl, socket, struct\n"
                              "names = [l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]]\n"
                              "print(' '.join(sorted(names)))\n"
                              "print(' '.join(n for _, n in socket.if_nameindex()))\n"
                              "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                              "req = struct.pack('16sH14x', b'lo', 0)\n"
                              "flags = struct.unpack('16sH14x', fcntl.ioctl(s, 0x8913, req))[1]\n"  // SIOCGIFFLAGS
                              "print('up' if flags & 1 else 'down')\n"
                              "print(open('/proc/net/route').read().count('\\n'))\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  // /proc/net/dev and the kernel's interface list agree: lo, up; the IPv4
  // routing table is its header line only (loopback routes live in the
  // local table).
  EXPECT_EQ(r.stdout(), "lo\nlo\nup\n1\n");
  Destroy(*sb);
}

TEST_F(ContainerNetwork, LoopbackCarriesTrafficInsideTheContainer) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // A server and a client in the same container, over 127.0.0.1 and ::1
  // when the kernel has IPv6.
  auto r = Exec(*sb, Command({"python3", "-c",
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
                              "t.join()\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "PING\n");
  Destroy(*sb);
}

TEST_F(ContainerNetwork, RootCannotAddARouteOrAnAddress) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // Without NET_ADMIN: no default route, no new address on lo, lo stays up.
  auto r = Exec(*sb, Command({"python3", "-c",
                              std::string(kAttempt) +
                              "import fcntl, socket, struct\n"
                              "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                              "def sin(a):\n"
                              "    return struct.pack('HH4s8x', socket.AF_INET, 0, socket.inet_aton(a))\n"
                              // struct rtentry: pad, dst, gateway, genmask, flags (RTF_UP|RTF_GATEWAY), ...
                              "rt = bytearray(120)\n"
                              "rt[8:24] = sin('0.0.0.0')\n"
                              "rt[24:40] = sin('127.0.0.1')\n"
                              "rt[40:56] = sin('0.0.0.0')\n"
                              "rt[56:58] = struct.pack('H', 3)\n"
                              "attempt('add_default_route', lambda: fcntl.ioctl(s, 0x890B, bytes(rt)))\n"  // SIOCADDRT
                              "attempt('set_address', lambda: fcntl.ioctl(s, 0x8916, "  // SIOCSIFADDR
                              "struct.pack('16s16s8x', b'lo', sin('10.0.0.1'))))\n"
                              "attempt('lo_down', lambda: fcntl.ioctl(s, 0x8914, struct.pack('16sH22x', b'lo', 0)))\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "add_default_route EPERM\nset_address EPERM\nlo_down EPERM\n");
  Destroy(*sb);
}

// Net namespaces of removed containers are reused (creating one costs
// ~1.2 ms of CPU), but only when nothing of the old container is left in
// them: here, a server that closed first leaves its port in TIME_WAIT, and
// the next containers must still be able to bind that port without
// SO_REUSEADDR, in a namespace other than the old one.
TEST_F(ContainerNetwork, APortLeftInTimeWaitDoesNotFollowTheNamespaceToTheNextContainer) {
  constexpr const char* kNetNs = "import os; print(os.stat('/proc/self/ns/net').st_ino)\n";
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto r = Exec(*a, Command({"python3", "-c",
                             "import os, socket\n"
                             "srv = socket.socket()\n"
                             "srv.bind(('127.0.0.1', 7777))\n"
                             "srv.listen(1)\n"
                             "c = socket.create_connection(('127.0.0.1', 7777))\n"
                             "s, _ = srv.accept()\n"
                             "s.close()\n"  // the server closes first: its end goes to TIME_WAIT
                             "c.recv(1)\n"
                             "c.close()\n"
                             "srv.close()\n"
                             "print(sum(' 06 ' in l for l in open('/proc/self/net/tcp')))\n"  // 06: TIME_WAIT
                             "print(os.stat('/proc/self/ns/net').st_ino)\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  std::istringstream out(r.stdout());
  std::string time_wait, old_ns;
  out >> time_wait >> old_ns;
  ASSERT_EQ(time_wait, "1") << "the probe did not leave a TIME_WAIT socket: " << r.stdout();
  Destroy(*a);
  for (int i = 0; i < 6; ++i) {
    auto b = Make();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    auto rb = Exec(*b, Command({"python3", "-c",
                                std::string("import socket\n"
                                            "s = socket.socket()\n"
                                            "s.bind(('127.0.0.1', 7777))\n"
                                            "print('bound')\n") +
                                    kNetNs}));
    ASSERT_EQ(rb.verdict(), v1::VERDICT_OK) << rb.error() << "\n" << rb.stderr();
    std::istringstream bo(rb.stdout());
    std::string bound, ns;
    bo >> bound >> ns;
    EXPECT_EQ(bound, "bound") << rb.stdout() << rb.stderr();
    EXPECT_NE(ns, old_ns) << "container " << i << " got the namespace with the TIME_WAIT socket";
    Destroy(*b);
  }
}

TEST_F(ContainerNetwork, NetNamespacesOfRemovedContainersAreReused) {
  std::set<std::string> seen;
  constexpr int kContainers = 12;
  for (int i = 0; i < kContainers; ++i) {
    auto sb = Make();
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    auto r = Exec(*sb, Command({"python3", "-c", "import os; print(os.stat('/proc/self/ns/net').st_ino)"}));
    ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
    seen.insert(r.stdout());
    Destroy(*sb);
  }
  // One after another, each removed before the next is made: the spawner
  // takes a namespace back when it reaps the container's init.
  EXPECT_LT(seen.size(), static_cast<size_t>(kContainers)) << "no net namespace was reused";
}

}  // namespace
}  // namespace dsec::testing
