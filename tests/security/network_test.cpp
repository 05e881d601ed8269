// Network from inside a sandbox: only a loopback that is down and cannot be
// brought up; the host's listeners (TCP on 127.0.0.1, abstract unix sockets)
// and the outside world are out of reach.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "runtime/unique_fd.hpp"
#include "tests/support/fncall_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using Network = FncallTest;

TEST_F(Network, CannotConnectToAHostTcpListener) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // ephemeral
  UniqueFd listener = NonBlockingListener(AF_INET, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ASSERT_TRUE(listener) << std::strerror(errno);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string port = std::to_string(ntohs(addr.sin_port));

  auto r = Run({"python3", "-c", kConnectProbe, "4", "127.0.0.1", port, "4", "localhost", port});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 2u) << r.stdout();
  // Fails at once (the loopback is down), not by waiting for a timeout;
  // localhost is 127.0.0.1 in the sandbox's /etc/hosts.
  EXPECT_EQ(res["127.0.0.1"], "ENETUNREACH") << port;
  EXPECT_EQ(res["localhost"], "ENETUNREACH") << port;
  ExpectNothingAccepted(listener);
}

TEST_F(Network, CannotConnectToAHostAbstractUnixSocket) {
  // Abstract unix sockets belong to the net namespace, not the file system.
  std::string name = "dsec-security-" + std::to_string(std::random_device{}());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  UniqueFd listener = NonBlockingListener(AF_UNIX, reinterpret_cast<sockaddr*>(&addr), len);
  ASSERT_TRUE(listener) << std::strerror(errno);

  auto r = Run({"python3", "-c",
                "import errno, socket, sys\n"
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                "s.settimeout(3)\n"
                "try:\n"
                "    s.connect('\\0' + sys.argv[1])\n"
                "    print('connected')\n"
                "except OSError as e:\n"
                "    print(errno.errorcode.get(e.errno, e.errno))\n",
                name});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "ECONNREFUSED\n");
  ExpectNothingAccepted(listener);
}

TEST_F(Network, CannotReachTheOutside) {
  auto r = Run({"python3", "-c", kConnectProbe, "4", "1.1.1.1", "53", "4", "8.8.8.8", "443", "6",
                "2606:4700:4700::1111", "53"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 3u) << r.stdout();
  // No route (IPv4) or no source address (IPv6, with lo down not even ::1):
  // the attempt fails at once instead of timing out.
  EXPECT_EQ(res["1.1.1.1"], "ENETUNREACH");
  EXPECT_EQ(res["8.8.8.8"], "ENETUNREACH");
  EXPECT_EQ(res["2606:4700:4700::1111"], "EADDRNOTAVAIL");
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

TEST_F(Network, OnlyADownLoopbackThatCannotBeBroughtUp) {
  auto r = Run({"python3", "-c",
                "import errno, fcntl, socket, struct\n"
                "SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1\n"
                "print(' '.join(n for _, n in socket.if_nameindex()))\n"
                "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                "req = struct.pack('16sH14x', b'lo', 0)\n"
                "flags = struct.unpack('16sH14x', fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]\n"
                "print('up' if flags & IFF_UP else 'down')\n"
                "try:\n"
                "    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack('16sH14x', b'lo', flags | IFF_UP))\n"
                "    print('raised')\n"
                "except OSError as e:\n"
                "    print(errno.errorcode.get(e.errno, e.errno))\n"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "lo\ndown\nEPERM\n");
}

}  // namespace
}  // namespace dsec::testing
