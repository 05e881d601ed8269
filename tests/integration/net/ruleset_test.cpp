// The network policy's kernel side (drivers/net/ruleset.hpp) against the
// kernel, in network namespaces this test makes and removes: a "host" with
// the node's table and forwarding, two "sandboxes" linked to it by veth
// pairs (dsv1, dsv2), and an "internet" (198.51.100.0/24, TEST-NET-2) with
// listeners on two addresses. No packet leaves these namespaces.
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "drivers/net/link.hpp"
#include "drivers/net/nft.hpp"
#include "drivers/net/nft_wire.hpp"
#include "drivers/net/node_network.hpp"
#include "drivers/net/ruleset.hpp"
#include "harness/daemon.hpp"
#include "runtime/unique_fd.hpp"
#include "tests/support/dns_server.hpp"
#include "tests/support/netns.hpp"

namespace dsec::net {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

const std::string kPid = std::to_string(::getpid());
const std::string kHost = "dsn" + kPid + "h", kSbA = "dsn" + kPid + "a", kSbB = "dsn" + kPid + "b",
                  kNet = "dsn" + kPid + "i";
constexpr uint16_t kResolverPort = 5353;

using testing::InNs;
using testing::Sh;

int Connect(const std::string& ns, const std::string& ip, uint16_t port) { return testing::ConnectFrom(ns, ip, port); }

UniqueFd Listen(const std::string& ns, const std::string& ip, uint16_t port) {
  int err = 0;
  UniqueFd s = testing::ListenIn(ns, ip, port, &err);
  if (!s) ADD_FAILURE() << "listen " << ip << ":" << port << " in " << ns << ": " << std::strerror(err);
  return s;
}

Policy Parsed(v1::NetworkMode mode, std::vector<std::string> allow) {
  v1::NetworkPolicy p;
  p.set_mode(mode);
  for (auto& a : allow) p.add_allow(a);
  auto parsed = ParsePolicy(p);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? *parsed : Policy{};
}

class Ruleset : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) return Skip("needs root (network namespaces, nftables)");
    if (!Sh("command -v ip >/dev/null")) return Skip("needs iproute2's ip: apt-get install iproute2");
    std::string err;
    if (!Sh("ip netns add " + kHost, &err)) return Skip("cannot make a network namespace: " + err);
    made_ = true;
    // Whether the kernel has nf_tables is probed apart from dsec; on a
    // kernel that has it, Nft failing to open is the test's failure.
    // (its symbols in /proc/kallsyms, built in or loaded).
    bool kernel_nft = Sh("grep -q nf_tables_ /proc/kallsyms");
    nft_ = InNs(kHost, [&] {
      auto n = Nft::Open();
      if (!n.ok()) (kernel_nft ? Fail : Skip)(n.status().ToString() + (kernel_nft ? "" : " (no nf_tables here)"));
      return n.ok() ? std::move(*n) : nullptr;
    });
    if (!nft_) return;
    wire_ = InNs(kHost, [&] {
      auto w = NftSocket::Open();
      if (!w.ok()) Fail(w.status().ToString());
      return w.ok() ? std::move(*w) : nullptr;
    });
    if (!wire_) return;
    const std::string h = "ip -n " + kHost + " ";
    const std::string steps[] = {"ip netns add " + kSbA, "ip netns add " + kSbB, "ip netns add " + kNet,
                           h + "link set lo up",
                           "ip netns exec " + kHost + " sysctl -qw net.ipv4.ip_forward=1",
                           h + "link add dsv1 type veth peer name eth0 netns " + kSbA,
                           h + "link add dsv2 type veth peer name eth0 netns " + kSbB,
                           h + "link add up0 type veth peer name eth0 netns " + kNet,
                           h + "addr add 100.96.0.1/30 dev dsv1", h + "link set dsv1 up",
                           h + "addr add 100.96.0.5/30 dev dsv2", h + "link set dsv2 up",
                           h + "addr add 198.51.100.1/24 dev up0", h + "link set up0 up",
                           "ip -n " + kSbA + " addr add 100.96.0.2/30 dev eth0", "ip -n " + kSbA + " link set eth0 up",
                           "ip -n " + kSbA + " link set lo up", "ip -n " + kSbA + " route add default via 100.96.0.1",
                           "ip -n " + kSbB + " addr add 100.96.0.6/30 dev eth0", "ip -n " + kSbB + " link set eth0 up",
                           "ip -n " + kSbB + " route add default via 100.96.0.5",
                           "ip -n " + kNet + " addr add 198.51.100.2/24 dev eth0",
                           "ip -n " + kNet + " addr add 198.51.100.3/24 dev eth0", "ip -n " + kNet + " link set eth0 up"};
    for (const auto& s : steps)
      if (!Sh(s, &err)) return Fail(s + ": " + err);
    node_.resolver_port = kResolverPort;
    if (auto r = InNs(kHost, [] { return nft_->Run(NodeTable(node_)); }); !r.ok()) return Fail(r.status().ToString());
    for (auto [ip, port] : {std::pair<const char*, uint16_t>{"198.51.100.2", 80}, {"198.51.100.2", 8080},
                            {"198.51.100.3", 80}})
      listeners_.push_back(Listen(kNet, ip, port));
    listeners_.push_back(Listen(kHost, "0.0.0.0", 7000));  // "dsecd's port"
    listeners_.push_back(Listen(kSbB, "100.96.0.6", 80));  // another sandbox's server
    for (auto& [link, ns] : {std::pair<SandboxLink*, const char*>{&a_, "a"}, {&b_, "b"}}) {
      Status add = Wire([&](NftBatch& b) { WireSandboxAdd(b, node_, *link, Parsed(v1::NETWORK_MODE_NONE, {})); });
      if (!add.ok()) return Fail(std::string("sandbox ") + ns + ": " + add.ToString());
    }
  }
  static void TearDownTestSuite() {
    listeners_.clear();
    wire_.reset();
    nft_.reset();
    if (made_)
      for (const auto& ns : {kHost, kSbA, kSbB, kNet}) Sh("ip netns del " + ns + " 2>/dev/null");
  }
  static void Skip(const std::string& why) { skip_ = why; }
  static void Fail(const std::string& why) { failure_ = why; }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(failure_.empty()) << failure_;
  }

  // A batch `fill` makes, committed in the host (dsecd's path, nft_wire.hpp).
  static Status Wire(const std::function<void(NftBatch&)>& fill) {
    NftBatch b;
    fill(b);
    return InNs(kHost, [&] { return wire_->Commit(b); });
  }
  // Sandbox a's policy, replaced in one batch; how long it took.
  static double Apply(const Policy& p) {
    auto t0 = Clock::now();
    Status r = Wire([&](NftBatch& b) { WireSandboxReplace(b, node_, a_, a_policy_, p); });
    EXPECT_TRUE(r.ok()) << r.ToString();
    if (r.ok()) a_policy_ = p;
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  // Packets sandbox a's chain refused so far.
  static long Refused() {
    auto n = InNs(kHost, [] { return wire_->CounterPackets(node_.table, "r_" + a_.ifname); });
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n.ok() ? static_cast<long>(*n) : -1;
  }
  // What the kernel lists for `what` (nft's syntax).
  static std::string Listed(const std::string& what) {
    auto out = InNs(kHost, [&] { return nft_->Run("list " + what); });
    return out.ok() ? *out : out.status().ToString();
  }

  static inline std::unique_ptr<Nft> nft_;
  static inline std::unique_ptr<NftSocket> wire_;
  static inline NodeNet node_;
  static inline SandboxLink a_{"dsv1", 0x64600002}, b_{"dsv2", 0x64600006};
  static inline Policy a_policy_;  // what sandbox a's rules are now (SandboxReplace needs the old policy)
  static inline std::vector<UniqueFd> listeners_;
  static inline bool made_ = false;
  static inline std::string skip_, failure_;
};

TEST_F(Ruleset, NoneReachesNothingAndIsRefusedAtOnce) {
  Apply(Parsed(v1::NETWORK_MODE_NONE, {}));
  long before = Refused();
  auto t0 = Clock::now();
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), ECONNREFUSED);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0) << "refused, not left to time out";
  EXPECT_EQ(Refused(), before + 1) << "the refusal is counted in the sandbox's chain";
}

TEST_F(Ruleset, AllowOpensTheListedAddressAndPortAndNothingElse) {
  Apply(Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.2:80/tcp"}));
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), 0) << "the allowed address:port answers";
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 8080), ECONNREFUSED) << "another port of the same address";
  EXPECT_EQ(Connect(kSbA, "198.51.100.3", 80), ECONNREFUSED) << "another address";
  EXPECT_EQ(Connect(kSbA, "100.96.0.1", 7000), ECONNREFUSED) << "the host's own port";
  EXPECT_EQ(Connect(kSbA, "100.96.0.6", 80), ECONNREFUSED) << "another sandbox";
  EXPECT_EQ(Connect(kSbB, "198.51.100.2", 80), ECONNREFUSED) << "sandbox b's policy is its own (none)";
}

TEST_F(Ruleset, APolicyChangeHoldsForTheNextConnection) {
  Apply(Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.2:80"}));
  ASSERT_EQ(Connect(kSbA, "198.51.100.2", 80), 0);
  double ms = Apply(Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.3:80"}));
  std::printf("policy replaced in %.2f ms\n", ms);
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), ECONNREFUSED) << "the old entry is gone at once";
  EXPECT_EQ(Connect(kSbA, "198.51.100.3", 80), 0) << "the new one holds at once";
  EXPECT_LT(ms, 100.0);
  // Entries that overlap (an address inside an allowed range, on other
  // ports) are taken: each entry is a rule of its own.
  Apply(Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.3:80", "198.51.100.0/24:8080", "198.51.100.2:8080,9000/tcp"}));
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 8080), 0) << "added to the list";
  EXPECT_EQ(Connect(kSbA, "198.51.100.3", 80), 0) << "and the list kept";
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), ECONNREFUSED) << "and nothing else";
}

TEST_F(Ruleset, ANamesAddressesAreReachableForTheirTtlOnly) {
  Policy p = Parsed(v1::NETWORK_MODE_ALLOW, {"pypi.test:80"});
  Apply(p);
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), ECONNREFUSED) << "nothing until the resolver answers";
  Status pin = Wire([&](NftBatch& b) { WirePin(b, node_, a_, 0, {0xC6336402}, 1); });
  ASSERT_TRUE(pin.ok()) << pin.ToString();
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), 0) << "the answered address, on the entry's port";
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 8080), ECONNREFUSED) << "not on another port";
  // The pin's timeout (1 s) ends it: polled, bounded at 5 s.
  auto deadline = Clock::now() + std::chrono::seconds(5);
  int r = 0;
  while ((r = Connect(kSbA, "198.51.100.2", 80)) == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polling the kernel's set, bounded
  EXPECT_EQ(r, ECONNREFUSED) << "the address outlived its TTL";
}

TEST_F(Ruleset, OpenReachesPublicAddressesButNotTheHostOrOtherSandboxes) {
  Apply(Parsed(v1::NETWORK_MODE_OPEN, {}));
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 8080), 0);
  EXPECT_EQ(Connect(kSbA, "198.51.100.3", 80), 0);
  EXPECT_EQ(Connect(kSbA, "100.96.0.1", 7000), ECONNREFUSED) << "the host's own port";
  EXPECT_EQ(Connect(kSbA, "100.96.0.6", 80), ECONNREFUSED) << "another sandbox";
}

TEST_F(Ruleset, EveryDnsQueryGoesToTheNodesResolver) {
  Apply(Parsed(v1::NETWORK_MODE_OPEN, {}));
  // The "resolver": the node's port every query is redirected to.
  auto resolver = InNs(kHost, [] {
    UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in a = testing::Ipv4Addr("0.0.0.0", kResolverPort);
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ADD_FAILURE() << std::strerror(errno);
    return s;
  });
  InNs(kSbA, [] {
    UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in to = testing::Ipv4Addr("198.51.100.2", 53);  // "another resolver", straight
    return ::sendto(s.get(), "query", 5, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  });
  pollfd p{resolver.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 3000), 1) << "the query did not reach the node's resolver";
  char buf[16];
  sockaddr_in from{};
  socklen_t len = sizeof from;
  ssize_t n = ::recvfrom(resolver.get(), buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "query");
  char ip[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
  EXPECT_STREQ(ip, "100.96.0.2") << "the resolver knows the sandbox by its address";
}

TEST_F(Ruleset, ARemovedSandboxsInterfaceReachesNothing) {
  Policy open = Parsed(v1::NETWORK_MODE_OPEN, {});
  Apply(open);
  ASSERT_EQ(Connect(kSbA, "198.51.100.2", 80), 0);
  Status rm = Wire([&](NftBatch& b) { WireSandboxRemove(b, node_, a_, open); });
  ASSERT_TRUE(rm.ok()) << rm.ToString();
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), ECONNREFUSED) << "an interface without a chain is refused";
  Status add = Wire([&](NftBatch& b) { WireSandboxAdd(b, node_, a_, open); });
  ASSERT_TRUE(add.ok()) << add.ToString();
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), 0);
}

// dsec's own link (drivers/net/link.hpp): a veth pair made through
// rtnetlink into a sandbox's namespace carries its traffic under the
// ruleset, and goes whole.
TEST_F(Ruleset, AVethLinkMadeThroughRtnetlinkCarriesASandboxsTraffic) {
  const std::string ns = "dsn" + kPid + "c";
  ASSERT_TRUE(Sh("ip netns add " + ns));
  UniqueFd netns(::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
  VethSpec spec;
  spec.host_if = "dsv3";
  spec.gateway = 0x64600009;  // 100.96.0.9/30
  spec.addr = 0x6460000A;     // 100.96.0.10
  spec.netns_fd = netns.get();
  auto t0 = Clock::now();
  Status made = InNs(kHost, [&] { return MakeVeth(spec); });
  std::printf("veth link made in %.2f ms\n", std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  EXPECT_TRUE(made.ok()) << made.ToString();
  SandboxLink c{"dsv3", spec.addr};
  Policy p = Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.2:80"});
  Status add = Wire([&](NftBatch& b) { WireSandboxAdd(b, node_, c, p); });
  EXPECT_TRUE(add.ok()) << add.ToString();
  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), 0) << "through dsec's link and the sandbox's chain";
  EXPECT_EQ(Connect(ns, "198.51.100.3", 80), ECONNREFUSED) << "under its policy";
  EXPECT_EQ(Connect(ns, "100.96.0.2", 80), ECONNREFUSED) << "not to sandbox a";
  // A second link of the same name is refused, naming it; the first stays.
  Status again = InNs(kHost, [&] { return MakeVeth(spec); });
  EXPECT_FALSE(again.ok());
  EXPECT_THAT(again.message(), HasSubstr("dsv3"));
  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), 0);
  Status rm = Wire([&](NftBatch& b) { WireSandboxRemove(b, node_, c, p); });
  EXPECT_TRUE(rm.ok()) << rm.ToString();
  EXPECT_TRUE(InNs(kHost, [] { return RemoveLink("dsv3"); }).ok());
  EXPECT_TRUE(InNs(kHost, [] { return RemoveLink("dsv3"); }).ok()) << "gone already is fine";
  EXPECT_EQ(InNs(ns, [] { return if_nametoindex("eth0"); }), 0u) << "the sandbox's end went with it";
  Sh("ip netns del " + ns);
}

// The node's side (node_network.hpp), in the same host namespace with a
// table and interface prefix of its own: slots, attach, replace, a restart
// that re-adopts, release; and an attach that fails leaves nothing.
TEST_F(Ruleset, TheNodeNetworkAttachesReplacesReadoptsAndReleases) {
  NodeNetworkOptions o;
  o.rules.table = "dsecw";
  o.rules.ifprefix = "dsw";
  o.rules.resolver_port = kResolverPort + 1;
  o.pool = 0x64700000;  // 100.112.0.0/16
  o.pool_prefix = 16;
  auto start = [&] { return InNs(kHost, [&] { return NodeNetwork::Start(o); }); };
  auto nn = start();
  ASSERT_TRUE(nn.ok()) << nn.status().ToString();
  EXPECT_EQ((*nn)->slots(), 16384u);
  const std::string ns = "dsn" + kPid + "d";
  ASSERT_TRUE(Sh("ip netns add " + ns));
  UniqueFd netns(::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
  auto net = (*nn)->Reserve("sb-d");
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  EXPECT_EQ(net->ifname, "dsw0");
  EXPECT_EQ(Ipv4Text(net->gateway), "100.112.0.1");
  EXPECT_EQ(Ipv4Text(net->addr), "100.112.0.2");
  EXPECT_EQ((*nn)->Reserve("sb-d").status().code(), Status::Code::kAlreadyExists);
  Policy p = Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.2:80"});
  Status attached = InNs(kHost, [&] { return (*nn)->Attach("sb-d", netns.get(), p); });
  ASSERT_TRUE(attached.ok()) << attached.ToString();
  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), 0);
  EXPECT_EQ(Connect(ns, "198.51.100.3", 80), ECONNREFUSED);
  // DNS, sent to any address, is answered by the node: NXDOMAIN (no
  // resolver of listed names yet), never by another server.
  int rcode = InNs(ns, [] {
    UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    const unsigned char q[] = {0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 4, 'p', 'y', 'p', 'i',
                               4, 't', 'e', 's', 't', 0, 0, 1, 0, 1};
    sockaddr_in to = testing::Ipv4Addr("198.51.100.2", 53);
    ::sendto(s.get(), q, sizeof q, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
    pollfd p{s.get(), POLLIN, 0};
    unsigned char r[512];
    if (::poll(&p, 1, 3000) != 1 || ::recv(s.get(), r, sizeof r, 0) < 12 || r[0] != 0x12 || r[1] != 0x34) return -1;
    return r[3] & 0x0f;
  });
  EXPECT_EQ(rcode, 3) << "NXDOMAIN from the node's resolver port";
  // A stranger's garbage on that port (short, a response, a compression
  // pointer, a name past the end, 512 random bytes) is dropped unanswered
  // and costs nothing; a good query after it is still answered.
  int after = InNs(kHost, [&] {
    UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in to = testing::Ipv4Addr("127.0.0.1", kResolverPort + 1);
    auto send = [&](const std::string& d) { ::sendto(s.get(), d.data(), d.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to); };
    std::string header("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00", 12);
    send("x");
    send(std::string("\x12\x34\x81\x80\x00\x01", 6) + std::string(20, 'a'));
    send(header + std::string("\xc0\x0c\x00\x01\x00\x01", 6));
    send(header + std::string("\x3f", 1) + "abc");
    std::string noise(512, '\0');
    for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>((i * 131 + 7) & 0xff);
    send(noise);
    pollfd p{s.get(), POLLIN, 0};
    if (::poll(&p, 1, 300) == 1) return -2;  // garbage was answered
    send(header + std::string("\x01" "a\x00\x00\x01\x00\x01", 7));
    unsigned char r[512];
    if (::poll(&p, 1, 3000) != 1 || ::recv(s.get(), r, sizeof r, 0) < 12) return -1;
    return r[3] & 0x0f;
  });
  EXPECT_EQ(after, 5) << "-2: garbage answered; -1: the good query after it was not (REFUSED: not a sandbox)";
  ASSERT_TRUE((*nn)->Replace("sb-d", Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.3:80"})).ok());
  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), ECONNREFUSED);
  EXPECT_EQ(Connect(ns, "198.51.100.3", 80), 0);

  // dsecd restarts: the table is made anew (the link is refused until its
  // sandbox is re-adopted), the link and its slot are kept.
  nn->reset();
  nn = start();
  ASSERT_TRUE(nn.ok()) << nn.status().ToString();
  EXPECT_EQ(Connect(ns, "198.51.100.3", 80), ECONNREFUSED) << "not yet re-adopted";
  Policy p3 = Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.3:80"});
  Status readopted = InNs(kHost, [&] { return (*nn)->Readopt("sb-d", *net, p3); });
  ASSERT_TRUE(readopted.ok()) << readopted.ToString();
  EXPECT_EQ(Connect(ns, "198.51.100.3", 80), 0);
  auto other = (*nn)->Reserve("sb-e");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->slot, net->slot) << "a re-adopted slot is not given again";

  // An attach that fails (no such namespace) leaves no link; its slot goes
  // with Release.
  Status bad = InNs(kHost, [&] { return (*nn)->Attach("sb-e", -1, p); });
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.message(), HasSubstr("sb-e"));
  EXPECT_EQ(InNs(kHost, [&] { return if_nametoindex(other->ifname.c_str()); }), 0u) << "nothing of it left";
  EXPECT_TRUE(InNs(kHost, [&] { return (*nn)->Release("sb-e"); }).ok());

  EXPECT_TRUE(InNs(kHost, [&] { return (*nn)->Release("sb-d"); }).ok());
  EXPECT_EQ(InNs(ns, [] { return if_nametoindex("eth0"); }), 0u) << "the link went with the release";
  EXPECT_EQ((*nn)->attached(), 0u);
  auto again = (*nn)->Reserve("sb-f");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(InNs(kHost, [&] { return nft_->Run(NodeTableRemove(o.rules)); }).ok());
  Sh("ip netns del " + ns);
}

// A NodeNetwork of the test's own (table dsec<tag>, links ds<tag><n>, pool
// 100.<pool>.0.0/16, resolver port `port`, asking `upstream`) with one
// sandbox `id`, attached in a namespace of its own under `policy`; all of
// it removed when it goes, an assertion's early return included.
struct OwnNode {
  OwnNode(Nft* nft, const std::string& tag, uint8_t pool, uint16_t port, const std::string& upstream,
          const std::string& id, const Policy& policy)
      : nft(nft), id(id), ns("dsn" + kPid + tag) {
    o.rules.table = "dsec" + tag;
    o.rules.ifprefix = "ds" + tag;
    o.rules.resolver_port = port;
    o.rules.log_group = port;
    o.pool = 0x64000000u | uint32_t{pool} << 16;
    o.pool_prefix = 16;
    o.upstream = {testing::Ipv4Addr(upstream, 53)};
    auto started = InNs(kHost, [&] { return NodeNetwork::Start(o); });
    if (!started.ok()) {
      ADD_FAILURE() << started.status().ToString();
      return;
    }
    nn = std::move(*started);
    if (!Sh("ip netns add " + ns)) {
      ADD_FAILURE() << "ip netns add " << ns;
      return;
    }
    made_ns = true;
    UniqueFd netns(::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
    auto reserved = nn->Reserve(id);
    if (!reserved.ok()) {
      ADD_FAILURE() << reserved.status().ToString();
      return;
    }
    net = *reserved;
    Status attached = InNs(kHost, [&] { return nn->Attach(id, netns.get(), policy); });
    if (!attached.ok()) {
      ADD_FAILURE() << attached.ToString();
      return;
    }
    ok = true;
  }
  ~OwnNode() {
    if (nn) {
      EXPECT_TRUE(InNs(kHost, [&] { return nn->Release(id); }).ok());
    }
    nn.reset();
    EXPECT_TRUE(InNs(kHost, [&] { return nft->Run(NodeTableRemove(o.rules)); }).ok());
    if (made_ns) Sh("ip netns del " + ns);
  }
  Nft* nft;  // the test's, for the table's removal
  NodeNetworkOptions o;
  std::unique_ptr<NodeNetwork> nn;
  std::string id, ns;
  SandboxNet net;
  bool ok = false, made_ns = false;
};

// The node's resolver: a sandbox's listed names resolve through the
// upstream (a DNS server of the test's internet) and their addresses, only
// those and only on the entry's ports, become reachable; unlisted names
// are NXDOMAIN without reaching the upstream, counted with the refused
// connections (from the kernel's log); answers are cached; a policy
// change pins the cached answers of the names it keeps.
TEST_F(Ruleset, TheResolverAnswersListedNamesAndPinsOnlyTheirAddresses) {
  testing::DnsServer upstream(kNet, "198.51.100.2", 53,
                              {{"pypi.test", {"198.51.100.2", 60}}, {"files.pypi.test", {"198.51.100.3", 60}}});
  ASSERT_TRUE(upstream.ok());
  Policy p = Parsed(v1::NETWORK_MODE_ALLOW, {"pypi.test:80/tcp"});
  OwnNode node(nft_.get(), "r", 113, kResolverPort + 2, "198.51.100.2", "sb-r", p);
  ASSERT_TRUE(node.ok);
  const auto& nn = node.nn;
  const std::string& ns = node.ns;
  const SandboxNet* net = &node.net;
  const std::string gw = Ipv4Text(net->gateway);

  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), ECONNREFUSED) << "not before its name is resolved";
  auto t0 = Clock::now();
  auto a = testing::AskDns(ns, gw, "PyPI.test");
  double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_EQ(a.rcode, 0);
  EXPECT_THAT(a.addrs, ::testing::ElementsAre("198.51.100.2"));
  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), 0) << "its address, on the entry's port";
  EXPECT_EQ(Connect(ns, "198.51.100.2", 8080), ECONNREFUSED) << "not on another port";
  EXPECT_EQ(Connect(ns, "198.51.100.3", 80), ECONNREFUSED) << "nor another address";
  t0 = Clock::now();
  auto again = testing::AskDns(ns, "198.51.100.3", "pypi.test");  // to "another server": ours answers
  double cached_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_THAT(again.addrs, ::testing::ElementsAre("198.51.100.2"));
  std::printf("resolver: %.2f ms through the upstream, %.2f ms cached\n", first_ms, cached_ms);
  EXPECT_EQ(testing::AskDns(ns, gw, "pypi.test", 28).rcode, 0) << "AAAA of a listed name: no records, no error";
  EXPECT_EQ(testing::AskDns(ns, gw, "files.pypi.test").rcode, 3) << "an unlisted name under a listed one";
  EXPECT_EQ(testing::AskDns(ns, gw, "exfil-6162.evil.test").rcode, 3);
  EXPECT_THAT(upstream.asked(), ::testing::ElementsAre("pypi.test")) << "unlisted names never leave the node; "
                                                                         "the second ask was cached";

  // What was refused: counted by the kernel, sampled by its log.
  v1::NetworkReport r;
  auto deadline = Clock::now() + std::chrono::seconds(5);
  do {
    auto got = nn->Report("sb-r");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    r = *got;
  } while (r.recent_size() < 5 && Clock::now() < deadline &&
           (std::this_thread::sleep_for(std::chrono::milliseconds(20)), true));  // the log is read on its own thread
  EXPECT_EQ(r.address(), Ipv4Text(net->addr));
  EXPECT_EQ(r.refused_packets(), 3u) << "three refused connects";
  EXPECT_EQ(r.refused_names(), 2u);
  std::vector<std::string> what;
  for (const auto& x : r.recent()) what.push_back(x.what());
  EXPECT_THAT(what, ::testing::IsSupersetOf({"tcp 198.51.100.2:8080", "tcp 198.51.100.3:80", "name files.pypi.test",
                                             "name exfil-6162.evil.test"}));

  // A flood of denied connects: every one counted by the kernel, the
  // record keeps a bounded few (net_bench measures a neighbour's connects
  // during one).
  const int kFlood = 5000;
  InNs(ns, [&] {
    for (int i = 0; i < kFlood; ++i) {
      UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      sockaddr_in to = testing::Ipv4Addr("198.51.100.3", static_cast<uint16_t>(1000 + i % 5000));
      ::connect(s.get(), reinterpret_cast<sockaddr*>(&to), sizeof to);
    }
    return 0;
  });
  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), 0) << "what it is allowed still answers at once";
  auto flooded = nn->Report("sb-r");
  ASSERT_TRUE(flooded.ok());
  EXPECT_EQ(flooded->refused_packets(), 3u + kFlood) << "each denied connect counted";
  EXPECT_LE(flooded->recent_size(), 32) << "the record's memory is bounded";

  // A change that drops the name, then one that lists it again: its cached
  // answer is pinned with the change, no query needed.
  ASSERT_TRUE(nn->Replace("sb-r", Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.3:80"})).ok());
  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), ECONNREFUSED) << "its pins went with the old list";
  ASSERT_TRUE(nn->Replace("sb-r", p).ok());
  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), 0) << "pinned again from the cache";
  EXPECT_EQ(upstream.asked().size(), 1u);

  // Two entries naming one name (an ADD of other ports): an answer opens
  // the ports of both.
  ASSERT_TRUE(nn->Replace("sb-r", Parsed(v1::NETWORK_MODE_ALLOW, {"pypi.test:80/tcp", "*.test:8080/tcp"})).ok());
  EXPECT_THAT(testing::AskDns(ns, gw, "pypi.test").addrs, ::testing::ElementsAre("198.51.100.2"));
  EXPECT_EQ(Connect(ns, "198.51.100.2", 80), 0);
  EXPECT_EQ(Connect(ns, "198.51.100.2", 8080), 0) << "the second entry's port too";

  EXPECT_TRUE(InNs(kHost, [&] { return nn->Release("sb-r"); }).ok());
  EXPECT_EQ(nn->Report("sb-r").status().code(), Status::Code::kNotFound);
}

// An upstream that never answers: one sandbox's queries wait on it 32 at a
// time, the rest are answered SERVFAIL at once, so it cannot hold the
// node's whole pending table.
TEST_F(Ruleset, OneSandboxCannotFillTheResolversPendingTable) {
  UniqueFd silent = InNs(kNet, [] {
    UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in a = testing::Ipv4Addr("198.51.100.3", 53);
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return UniqueFd();
    return s;
  });
  ASSERT_TRUE(silent);
  OwnNode node(nft_.get(), "q", 114, kResolverPort + 3, "198.51.100.3", "sb-q", Parsed(v1::NETWORK_MODE_ALLOW, {"*.slow.test"}));
  ASSERT_TRUE(node.ok);
  const SandboxNet* net = &node.net;
  const std::string& ns = node.ns;
  std::vector<size_t> first = InNs(ns, [&] {
    std::vector<UniqueFd> socks;
    for (int i = 0; i < 40; ++i) {
      UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      std::string label = "n" + std::to_string(i);
      std::vector<unsigned char> q = {0x51, 0x7a, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0};
      q.push_back(static_cast<unsigned char>(label.size()));
      q.insert(q.end(), label.begin(), label.end());
      for (const char* l : {"slow", "test"}) {
        q.push_back(4);
        q.insert(q.end(), l, l + 4);
      }
      q.insert(q.end(), {0, 0, 1, 0, 1});
      sockaddr_in to = testing::Ipv4Addr(Ipv4Text(net->gateway), 53);
      ::sendto(s.get(), q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
      socks.push_back(std::move(s));
    }
    // The first 8 answers: the upstream is silent, so the 32 it was asked
    // are answered only after its timeouts (two tries of 1.5 s); the 8 past
    // the limit are told SERVFAIL at once, so they come first.
    std::vector<size_t> first;
    std::vector<bool> seen(socks.size());
    auto end = Clock::now() + std::chrono::seconds(30);
    while (first.size() < 8 && Clock::now() < end) {
      std::vector<pollfd> p;
      for (auto& s : socks) p.push_back({s.get(), POLLIN, 0});
      if (::poll(p.data(), p.size(), 1000) < 0) break;
      for (size_t i = 0; i < p.size(); ++i) {
        unsigned char r[512];
        if (!p[i].revents || seen[i]) continue;
        seen[i] = true;
        if (::recv(socks[i].get(), r, sizeof r, 0) >= 12 && (r[3] & 0x0f) == 2) first.push_back(i);
      }
    }
    return first;
  });
  std::sort(first.begin(), first.end());
  EXPECT_EQ(first, (std::vector<size_t>{32, 33, 34, 35, 36, 37, 38, 39}))
      << "32 wait on the upstream; the other 8 are told SERVFAIL at once";
  // And only the 32 were asked of the upstream (each was sent before the
  // refusals were, so they are in its socket's queue by now).
  std::set<std::string> asked;
  unsigned char q[512];
  for (ssize_t n; (n = ::recv(silent.get(), q, sizeof q, MSG_DONTWAIT)) > 12;) {
    std::string name;
    for (size_t at = 12; at < static_cast<size_t>(n) && q[at]; at += q[at] + 1u)
      name.append(reinterpret_cast<char*>(q + at + 1), std::min<size_t>(q[at], static_cast<size_t>(n) - at - 1)) += '.';
    asked.insert(name);
  }
  EXPECT_EQ(asked.size(), 32u) << "the upstream was asked for each waiting name once, and for no refused one";
}

// A batch is one transaction: a bad line undoes the good ones before it,
// in nft's syntax (the node's table) and on the wire (every sandbox's).
TEST_F(Ruleset, ABadBatchIsRefusedWithTheReasonAndChangesNothing) {
  Apply(Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.2:80"}));
  auto r = InNs(kHost, [] { return nft_->Run("flush chain inet dsec s_dsv1\nadd rule inet dsec s_dsv1 nonsense\n"); });
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("nftables refused the batch: Error: syntax error"));
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), 0) << "the flush before the bad line did not apply";
  // A new policy, then a pin into a set sandbox a does not have.
  Status w = Wire([&](NftBatch& b) {
    WireSandboxReplace(b, node_, a_, a_policy_, Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.3:80"}));
    WirePin(b, node_, a_, 7, {0xC6336402}, 60);
  });
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.message(), HasSubstr("nf_tables refused the addresses pinned in set n7_dsv1"));
  EXPECT_EQ(Connect(kSbA, "198.51.100.2", 80), 0) << "the new policy before the bad message did not apply";
  EXPECT_EQ(Connect(kSbA, "198.51.100.3", 80), ECONNREFUSED);
}

// The wire batches are nft's text, expression for expression: for each
// kind of entry, the kernel lists the same chain, sets and map entries
// for a sandbox made each way (the log rule too), after a change, and
// nothing of either after their removal.
TEST_F(Ruleset, TheKernelListsTheSameRulesForTheTextAndTheWireBatches) {
  NodeNet node = node_;
  node.log_group = 7;
  SandboxLink text{"dsv7", 0x64600022}, wire{"dsv8", 0x64600026};
  auto same = [&](const std::string& step) {
    auto norm = [&](std::string t) {
      for (size_t at; (at = t.find("dsv7")) != std::string::npos;) t.replace(at, 4, "dsv8");
      return std::regex_replace(t, std::regex("100\\.96\\.0\\.34"), "100.96.0.38");
    };
    std::string listed_text = norm(Listed("chain inet dsec s_dsv7")), listed_wire = Listed("chain inet dsec s_dsv8");
    EXPECT_EQ(listed_text, listed_wire) << step;
    EXPECT_THAT(listed_wire, HasSubstr("s_dsv8")) << step;
    std::string sets = Listed("sets inet dsec");
    for (int i = 0; i < 8; ++i) {
      bool t = sets.find("n" + std::to_string(i) + "_dsv7") != std::string::npos;
      EXPECT_EQ(t, sets.find("n" + std::to_string(i) + "_dsv8") != std::string::npos) << step << ": set n" << i;
      // Without the time each pin has left (they were made apart).
      auto set = [&](const char* dsv) {
        return std::regex_replace(Listed("set inet dsec n" + std::to_string(i) + "_" + dsv),
                                  std::regex(" expires [0-9hms]+"), "");
      };
      if (t) {
        EXPECT_EQ(norm(set("dsv7")), set("dsv8")) << step;
      }
    }
    std::string map = Listed("map inet dsec egress"), exposed = Listed("set inet dsec exposed");
    EXPECT_EQ(map.find("\"dsv7\" : jump s_dsv7") != std::string::npos,
              map.find("\"dsv8\" : jump s_dsv8") != std::string::npos) << step << "\n" << map;
    EXPECT_EQ(exposed.find("100.96.0.34 . 8080") != std::string::npos,
              exposed.find("100.96.0.38 . 8080") != std::string::npos) << step << "\n" << exposed;
  };
  Policy many = Parsed(v1::NETWORK_MODE_ALLOW, {"198.51.100.2:80/tcp", "10.0.0.0/8:80,443,1000-2000", "198.51.100.3",
                                                "pypi.test:443", "*.example.test/udp", "198.51.100.0/24:1000-2000/udp",
                                                "198.51.100.4:65000-65535,22,23,24", "192.0.2.1:53/udp"});
  many.expose = {8080};
  auto text_ok = [&](const std::string& batch) {
    auto r = InNs(kHost, [&] { return nft_->Run(batch); });
    EXPECT_TRUE(r.ok()) << r.status().ToString();
  };
  text_ok(SandboxAdd(node, text, many) + Pin(node, text, 3, {0xC6336402, 0xC6336403}, 3600));
  ASSERT_TRUE(Wire([&](NftBatch& b) {
                WireSandboxAdd(b, node, wire, many);
                WirePin(b, node, wire, 3, {0xC6336402, 0xC6336403}, 3600);
              }).ok());
  {
    SCOPED_TRACE("added");
    same("an allow-list of every kind of entry");
  }
  EXPECT_THAT(Listed("set inet dsec n3_dsv8"), HasSubstr("198.51.100.2 timeout 1h"));
  Policy text_policy = many;
  for (const Policy& next : {Parsed(v1::NETWORK_MODE_OPEN, {}), Parsed(v1::NETWORK_MODE_NONE, {}),
                             Parsed(v1::NETWORK_MODE_ALLOW, {"a.test:80", "b.test"})}) {
    Policy old = text_policy;
    text_ok(SandboxReplace(node, text, old, next));
    ASSERT_TRUE(Wire([&](NftBatch& b) { WireSandboxReplace(b, node, wire, old, next); }).ok());
    text_policy = next;
    same("replaced by a policy of mode " + std::to_string(next.mode) + " with " + std::to_string(next.rules.size()));
  }
  Policy last = text_policy;
  last.expose = {8080};
  text_ok(SandboxRemove(node, text, last));
  ASSERT_TRUE(Wire([&](NftBatch& b) { WireSandboxRemove(b, node, wire, last); }).ok());
  std::string after = Listed("table inet dsec");
  for (const char* gone : {"dsv7", "dsv8", "100.96.0.34", "100.96.0.38"})
    EXPECT_THAT(after, ::testing::Not(HasSubstr(gone))) << "both removed whole";
}

}  // namespace
}  // namespace dsec::net
