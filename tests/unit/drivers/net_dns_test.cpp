// DNS messages as the node's resolver reads them (drivers/net/dns.hpp):
// what a stranger can send is refused, never followed past its end or
// around a loop; answers always fit a UDP reply.
#include "drivers/net/dns.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dsec::net::dns {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
const std::string kHeader("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00", 12);

TEST(Dns, AQueryIsReadBackWithItsNameInLowerCase) {
  auto q = AQuery(0x1234, "PyPI.Test");
  auto parsed = ParseQuery(q.data(), q.size());
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->id, 0x1234);
  EXPECT_EQ(parsed->name, "pypi.test");
  EXPECT_EQ(parsed->qtype, kTypeA);
  EXPECT_TRUE(parsed->rd);
}

TEST(Dns, MalformedQueriesAreRefused) {
  auto refused = [](const std::string& m) {
    auto b = Bytes(m);
    return !ParseQuery(b.data(), b.size());
  };
  EXPECT_TRUE(refused("short"));
  EXPECT_TRUE(refused(std::string("\x12\x34\x81\x80\x00\x01", 6) + std::string(20, 'a'))) << "a response";
  EXPECT_TRUE(refused(kHeader + std::string("\xc0\x0c\x00\x01\x00\x01", 6))) << "a pointer to itself";
  EXPECT_TRUE(refused(kHeader + std::string("\xc0\x20\x00\x01\x00\x01", 6))) << "a pointer forwards";
  EXPECT_TRUE(refused(kHeader + std::string("\x3f", 1) + "abc")) << "a label past the end";
  EXPECT_TRUE(refused(kHeader + std::string("\x01" "a\x00\x00\x01", 5))) << "no class";
  EXPECT_TRUE(refused(kHeader + std::string("\x81", 1) + std::string(200, 'a'))) << "a reserved label kind";
  std::string long_name;
  for (int i = 0; i < 5; ++i) long_name += std::string("\x3f", 1) + std::string(63, 'a');
  EXPECT_TRUE(refused(kHeader + long_name + std::string("\x00\x00\x01\x00\x01", 5))) << "a name over 255 bytes";
  std::string two = kHeader;
  two[5] = 2;
  EXPECT_TRUE(refused(two + std::string("\x01" "a\x00\x00\x01\x00\x01", 7))) << "two questions";
}

TEST(Dns, AnAnswerFitsUdpAndCarriesTheQuestionAsAsked) {
  auto qb = AQuery(7, "Example.test");
  auto q = ParseQuery(qb.data(), qb.size());
  ASSERT_TRUE(q);
  std::vector<uint32_t> many(100, 0xC6336402);
  auto a = Answer(*q, kNoError, many, 30);
  EXPECT_LE(a.size(), kMaxUdp);
  auto r = ParseResponse(a.data(), a.size());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, 7);
  EXPECT_EQ(r->name, "example.test");
  EXPECT_GT(r->addrs.size(), 20u);
  EXPECT_EQ(r->ttl, 30u);
  EXPECT_NE(std::string(a.begin(), a.end()).find("Example"), std::string::npos) << "the question's case kept";
  auto nx = Answer(*q, kNxDomain, {}, 0);
  EXPECT_EQ(nx[3] & 0xF, kNxDomain);
}

TEST(Dns, AResponseCutShortIsRefused) {
  auto qb = AQuery(7, "a.test");
  auto q = ParseQuery(qb.data(), qb.size());
  auto a = Answer(*q, kNoError, {0x01020304, 0x05060708}, 5);
  for (size_t cut = 1; cut < 16; ++cut) EXPECT_FALSE(ParseResponse(a.data(), a.size() - cut)) << cut;
  auto whole = ParseResponse(a.data(), a.size());
  ASSERT_TRUE(whole);
  EXPECT_THAT(whole->addrs, ::testing::ElementsAre(0x01020304u, 0x05060708u));
}

}  // namespace
}  // namespace dsec::net::dns
