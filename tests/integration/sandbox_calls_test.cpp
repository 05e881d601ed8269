// The calls of the house issue against a real dsecd: SetTimeout, labels
// (metadata) and ListSandboxes, through the C++ SDK.
#include <gmock/gmock.h>

#include <chrono>
#include <set>
#include <thread>

#include "runtime/clock.hpp"
#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using SandboxCalls = DaemonTest;

v1::SandboxSpec Labelled(std::map<std::string, std::string> labels) {
  v1::SandboxSpec spec = FncallSpec();
  for (const auto& [k, v] : labels) (*spec.mutable_labels())[k] = v;
  return spec;
}

TEST_F(SandboxCalls, SetTimeoutMovesTheEndBothWaysAndTheSandboxEndsThere) {
  v1::SandboxSpec spec = FncallSpec();
  spec.set_ttl_s(3600);
  auto sb = client_->Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  int64_t before = WallClockMs();
  auto later = sb->SetTimeout(7200);
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_NEAR(static_cast<double>(later->expires_ms() - before), 7200e3, 5e3);
  EXPECT_EQ(later->expires_because(), "ttl");
  auto soon = sb->SetTimeout(1);
  ASSERT_TRUE(soon.ok()) << soon.status().ToString();
  EXPECT_LE(soon->expires_ms(), WallClockMs() + 1000);
  // It ends there: gone, saying why (polling, bounded by the new end + 5 s).
  Status gone;
  for (auto deadline = WallClockMs() + 6000; WallClockMs() < deadline;) {
    gone = sb->Get().status();
    if (gone.code() == Status::Code::kNotFound) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(gone.code(), Status::Code::kNotFound) << gone.ToString();
  EXPECT_THAT(gone.message(), HasSubstr("ttl"));
}

TEST_F(SandboxCalls, SetTimeoutPastTheMaximumOrOfZeroIsRefusedAndChangesNothing) {
  auto sb = client_->Create(FncallSpec());
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto was = sb->Get();
  ASSERT_TRUE(was.ok());
  auto tooLong = sb->SetTimeout(8u * 24 * 3600);  // the default maximum is 7 days
  EXPECT_EQ(tooLong.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(tooLong.status().message(), HasSubstr("--sandbox-max-ttl"));
  EXPECT_THAT(tooLong.status().message(), HasSubstr(sb->id()));
  auto zero = sb->SetTimeout(0);
  EXPECT_EQ(zero.status().code(), Status::Code::kInvalidArgument);
  auto now = sb->Get();
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->ttl_deadline_ms(), was->ttl_deadline_ms());
  EXPECT_TRUE(sb->Destroy().ok());
  auto gone = sb->SetTimeout(10);
  EXPECT_EQ(gone.status().code(), Status::Code::kNotFound) << gone.status().ToString();
}

TEST_F(SandboxCalls, LabelsAreKeptShownAndBoundedNamingTheKey) {
  auto sb = client_->Create(Labelled({{"job", "j1"}, {"task", "t/7"}}));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->spec().labels().at("job"), "j1");
  EXPECT_EQ(rec->spec().labels().at("task"), "t/7");
  auto console = daemon_->Admin("inspect " + sb->id());
  EXPECT_EQ(console["sandbox"]["spec"]["labels"].value("job", ""), "j1") << console.dump();
  std::map<std::string, std::string> many;
  for (int i = 0; i < 65; ++i) many["k" + std::to_string(i)] = "v";
  auto tooMany = client_->Create(Labelled(many));
  EXPECT_EQ(tooMany.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(tooMany.status().message(), HasSubstr("65 labels, above the maximum of 64"));
  auto badKey = client_->Create(Labelled({{"a=b", "v"}}));
  EXPECT_THAT(badKey.status().message(), HasSubstr("label key 'a=b'"));
  auto longValue = client_->Create(Labelled({{"big", std::string(4097, 'x')}}));
  EXPECT_THAT(longValue.status().message(), HasSubstr("the value of label 'big' is 4097 bytes"));
  EXPECT_TRUE(sb->Destroy().ok());
}

TEST_F(SandboxCalls, ListSandboxesFiltersAndPagesInIdOrder) {
  std::set<std::string> mine;
  std::vector<Sandbox> made;
  for (int i = 0; i < 25; ++i) {
    auto sb = client_->Create(Labelled({{"suite", "list"}, {"parity", i % 2 ? "odd" : "even"}}));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    if (i % 2 == 0) mine.insert(sb->id());
    made.push_back(*sb);
  }
  v1::ListSandboxesRequest req;
  (*req.mutable_labels())["suite"] = "list";
  (*req.mutable_labels())["parity"] = "even";
  req.add_phases(v1::SANDBOX_PHASE_RUNNING);
  req.add_kinds(v1::KIND_FNCALL);
  req.set_owner(client_->client_id());
  req.set_limit(4);
  std::vector<std::string> got;
  for (int guard = 0; guard < 20; ++guard) {
    auto page = client_->ListSandboxes(req);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    EXPECT_LE(page->sandboxes_size(), 4);
    for (const auto& r : page->sandboxes()) {
      got.push_back(r.id());
      EXPECT_EQ(r.spec().labels().at("parity"), "even");
      EXPECT_GT(r.expires_ms(), 0) << "listed records show their end";
    }
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(got, std::vector<std::string>(mine.begin(), mine.end()));
  v1::ListSandboxesRequest bad;
  bad.set_page_token("garbage");
  auto refused = client_->ListSandboxes(bad);
  EXPECT_EQ(refused.status().code(), Status::Code::kInvalidArgument);
  for (const auto& sb : made) EXPECT_TRUE(sb.Destroy().ok());
}

}  // namespace
}  // namespace dsec::testing
