// The network policy's text forms (drivers/net/policy.hpp): what each entry
// opens, and each bad entry refused naming itself and what is wrong.
#include "drivers/net/policy.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>


namespace dsec::net {
namespace {

using ::testing::HasSubstr;

Rule Parsed(const std::string& text) {
  auto r = ParseRule(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : Rule{};
}

TEST(NetPolicy, AddressesNetworksPortsAndProtocols) {
  Rule a = Parsed("10.1.2.3");
  EXPECT_EQ(Ipv4Text(a.addr), "10.1.2.3");
  EXPECT_EQ(a.prefix, 32);
  EXPECT_TRUE(a.ports.empty());
  EXPECT_TRUE(a.OpensPort(Proto::kTcp, 1) && a.OpensPort(Proto::kUdp, 65535));

  Rule n = Parsed("10.0.0.0/8:80,443,8000-8100/tcp");
  EXPECT_EQ(n.prefix, 8);
  EXPECT_EQ(n.proto, Proto::kTcp);
  EXPECT_TRUE(n.OpensPort(Proto::kTcp, 80));
  EXPECT_TRUE(n.OpensPort(Proto::kTcp, 8050));
  EXPECT_FALSE(n.OpensPort(Proto::kTcp, 81));
  EXPECT_FALSE(n.OpensPort(Proto::kUdp, 80)) << "tcp only";
  EXPECT_EQ(n.text, "10.0.0.0/8:80,443,8000-8100/tcp");

  Rule u = Parsed("192.0.2.1:53/udp");
  EXPECT_TRUE(u.OpensPort(Proto::kUdp, 53));
  EXPECT_FALSE(u.OpensPort(Proto::kTcp, 53));
  EXPECT_EQ(Parsed("0.0.0.0/0").prefix, 0);
}

TEST(NetPolicy, NamesExactAndUnderASuffix) {
  Rule exact = Parsed("PyPI.org:443");
  EXPECT_EQ(exact.name, "pypi.org");
  EXPECT_FALSE(exact.wildcard);
  EXPECT_TRUE(exact.MatchesName("pypi.org"));
  EXPECT_TRUE(exact.MatchesName("PYPI.ORG."));
  EXPECT_FALSE(exact.MatchesName("files.pypi.org"));
  EXPECT_FALSE(exact.MatchesName("evilpypi.org"));

  Rule wild = Parsed("*.pythonhosted.org");
  EXPECT_TRUE(wild.wildcard);
  EXPECT_TRUE(wild.MatchesName("files.pythonhosted.org"));
  EXPECT_TRUE(wild.MatchesName("a.b.pythonhosted.org."));
  EXPECT_FALSE(wild.MatchesName("pythonhosted.org")) << "*.suffix is what is under it, not the suffix";
  EXPECT_FALSE(wild.MatchesName("evilpythonhosted.org"));
  EXPECT_FALSE(wild.MatchesName(".pythonhosted.org"));
  Rule addr = Parsed("10.1.2.3");
  EXPECT_FALSE(addr.MatchesName("10.1.2.3")) << "an address entry lists no name";
}

// Acceptance 5 of the networking issue: each bad entry a clear error
// naming the entry.
TEST(NetPolicy, BadEntriesAreRefusedNamingThemAndWhy) {
  struct Case {
    const char* entry;
    const char* says;
  } cases[] = {
      {"10.1.2.300", "is not an IPv4 address"},
      {"10.1.2", "is not an IPv4 address"},
      {"10.1.2.3/33", "prefix after '/' is 0-32"},
      {"10.1.2.3/8", "did you mean 10.0.0.0/8?"},
      {"10.1.2.3:0", "'0' is not a port (1-65535)"},
      {"10.1.2.3:70000", "'70000' is not a port (1-65535)"},
      {"10.1.2.3:", "no port after it"},
      {"10.1.2.3:80,", "an empty port"},
      {"10.1.2.3:90-80", "ends before it starts"},
      {"a.*.example.com", "wildcard goes only at the front"},
      {"example.*", "wildcard goes only at the front"},
      {"*", "wildcard goes only at the front"},
      {"*.", "needs a name after it"},
      {"", "an empty entry"},
      {":80", "no address or name"},
      {"exa mple.com", "' ' is not allowed in a name"},
      {"example..com", "an empty label"},
      {"-example.com", "starts with '-'"},
      {"[2001:db8::1]:443", "IPv6 entries are not supported"},
      {"2001:db8::1", "IPv6 entries are not supported"},
      {"example.com/24", "'/' in a name"},
  };
  for (const auto& c : cases) {
    auto r = ParseRule(c.entry);
    ASSERT_FALSE(r.ok()) << c.entry;
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << c.entry;
    EXPECT_THAT(r.status().message(), HasSubstr(std::string("network entry '") + c.entry + "'"));
    EXPECT_THAT(r.status().message(), HasSubstr(c.says)) << c.entry;
  }
  auto long_name = ParseRule(std::string(64, 'a') + ".com");
  EXPECT_THAT(long_name.status().message(), HasSubstr("longer than 63"));
  auto huge = ParseRule(std::string(400, 'a'));
  EXPECT_THAT(huge.status().message(), HasSubstr("above the maximum of 300"));
}

TEST(NetPolicy, APolicyIsItsModeItsListAndItsPortsWithinBounds) {
  v1::NetworkPolicy p;
  auto none = ParsePolicy(p);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->mode, v1::NETWORK_MODE_NONE) << "unset is none";

  p.set_mode(v1::NETWORK_MODE_ALLOW);
  EXPECT_THAT(ParsePolicy(p).status().message(), HasSubstr("empty list allows nothing"));
  p.add_allow("pypi.org:443");
  p.add_allow("10.0.0.0/8");
  p.add_expose(8080);
  auto allow = ParsePolicy(p);
  ASSERT_TRUE(allow.ok()) << allow.status().ToString();
  EXPECT_EQ(allow->rules.size(), 2u);
  EXPECT_EQ(allow->expose, std::vector<uint16_t>{8080});

  v1::NetworkPolicy list_unused = p;
  list_unused.set_mode(v1::NETWORK_MODE_OPEN);
  EXPECT_THAT(ParsePolicy(list_unused).status().message(), HasSubstr("needs mode allow (the mode is open"));

  v1::NetworkPolicy bad = p;
  bad.add_allow("10.1.2.3:70000");
  EXPECT_THAT(ParsePolicy(bad).status().message(), HasSubstr("network entry '10.1.2.3:70000'"));

  v1::NetworkPolicy many = p;
  for (size_t i = 0; i < kMaxRules; ++i) many.add_allow("10.0.0.1");
  EXPECT_THAT(ParsePolicy(many).status().message(), HasSubstr("above the maximum of 256"));

  v1::NetworkPolicy ports = p;
  ports.add_expose(0);
  EXPECT_THAT(ParsePolicy(ports).status().message(), HasSubstr("exposed port 0 is not a port"));
  ports = p;
  ports.add_expose(8080);
  EXPECT_THAT(ParsePolicy(ports).status().message(), HasSubstr("exposed twice"));

  v1::NetworkPolicy mode;
  mode.set_mode(static_cast<v1::NetworkMode>(9));
  EXPECT_THAT(ParsePolicy(mode).status().message(), HasSubstr("mode 9 is not none, allow or open"));
}

TEST(NetPolicy, PrivateLinkLocalLoopbackAndMulticastAreSpecial) {
  for (const char* a : {"10.9.8.7", "127.0.0.1", "169.254.169.254", "172.16.0.1", "172.31.255.255", "192.168.1.1",
                        "100.64.0.1", "224.0.0.1", "255.255.255.255", "0.0.0.0"})
    EXPECT_STRNE(Special(*ParseIpv4(a)), "") << a;
  for (const char* a : {"8.8.8.8", "151.101.0.223", "172.32.0.1", "192.0.2.1", "11.0.0.1"})
    EXPECT_STREQ(Special(*ParseIpv4(a)), "") << a;
}

}  // namespace
}  // namespace dsec::net
