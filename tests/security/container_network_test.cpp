// The container's own network mechanism: net namespaces recycled from
// removed containers, and what must not follow one to the next container.
// What every kind's network must hold (no route out, no host listener in
// reach, the loopback as the kind says) is sandbox_network_test.cpp.

#include <set>
#include <sstream>
#include <string>

#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

class ContainerNetwork : public ContainerTest {};

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
