// ListSandboxesRequest apart from any actor (actors/sandbox_list.hpp): its
// checks, its filters, a node's pages from its store and a controller's
// merge of nodes' pages.
#include "actors/sandbox_list.hpp"

#include <gmock/gmock.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "dsec/store/v1/records.pb.h"
#include "state/table.hpp"

namespace dsec {
namespace {

using ::testing::HasSubstr;

v1::SandboxRecord Rec(const std::string& id, v1::SandboxPhase phase = v1::SANDBOX_PHASE_RUNNING,
                      std::map<std::string, std::string> labels = {}) {
  v1::SandboxRecord r;
  r.set_id(id);
  r.set_phase(phase);
  r.mutable_spec()->set_kind(v1::KIND_CONTAINER);
  r.mutable_spec()->set_image("py311");
  for (const auto& [k, v] : labels) (*r.mutable_spec()->mutable_labels())[k] = v;
  r.set_created_ms(1000);
  return r;
}

void Put(state::Store* store, const v1::SandboxRecord& rec) {
  store::v1::SandboxRow row;
  *row.mutable_record() = rec;
  state::WriteBatch b;
  state::TypedTable<store::v1::SandboxRow>(store, state::Table::kSandboxes).Put(&b, rec.id(), row);
  ASSERT_TRUE(store->Write(b, false).ok());
}

std::vector<std::string> Ids(const v1::ListSandboxesReply& r) {
  std::vector<std::string> out;
  for (const auto& s : r.sandboxes()) out.push_back(s.id());
  return out;
}

TEST(SandboxList, ALimitAboveTheMaximumAndAForeignTokenAreRefusedNamingThem) {
  v1::ListSandboxesRequest req;
  req.set_limit(kMaxListLimit + 1);
  EXPECT_THAT(CheckListRequest(req).message(), HasSubstr("above the maximum of 1000"));
  req.set_limit(10);
  req.set_page_token("sb-3");
  Status s = CheckListRequest(req);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'sb-3' is not one this server gave"));
  req.set_page_token(ListPageToken("sb-3"));
  EXPECT_TRUE(CheckListRequest(req).ok());
  (*req.mutable_labels())["bad key"] = "v";
  EXPECT_THAT(CheckListRequest(req).message(), HasSubstr("label key 'bad key'"));
}

TEST(SandboxList, EveryFilterMustHold) {
  auto r = Rec("sb-1", v1::SANDBOX_PHASE_PAUSED, {{"job", "a"}, {"task", "7"}});
  r.set_owner("c1");
  r.set_session("j/p/s");
  r.set_node_id("n1");
  v1::ListSandboxesRequest req;
  EXPECT_TRUE(ListMatches(req, r));
  auto with = [&](auto set) {
    v1::ListSandboxesRequest q;
    set(&q);
    return ListMatches(q, r);
  };
  EXPECT_TRUE(with([](auto* q) { q->add_phases(v1::SANDBOX_PHASE_RUNNING); q->add_phases(v1::SANDBOX_PHASE_PAUSED); }));
  EXPECT_FALSE(with([](auto* q) { q->add_phases(v1::SANDBOX_PHASE_RUNNING); }));
  EXPECT_TRUE(with([](auto* q) { q->add_kinds(v1::KIND_CONTAINER); }));
  EXPECT_FALSE(with([](auto* q) { q->add_kinds(v1::KIND_MICROVM); }));
  EXPECT_TRUE(with([](auto* q) { q->set_image("py311"); }));
  EXPECT_FALSE(with([](auto* q) { q->set_image("host"); }));
  EXPECT_TRUE(with([](auto* q) { (*q->mutable_labels())["job"] = "a"; (*q->mutable_labels())["task"] = "7"; }));
  EXPECT_FALSE(with([](auto* q) { (*q->mutable_labels())["job"] = "a"; (*q->mutable_labels())["task"] = "8"; }));
  EXPECT_FALSE(with([](auto* q) { (*q->mutable_labels())["other"] = ""; }));
  EXPECT_TRUE(with([](auto* q) { q->set_owner("c1"); }));
  EXPECT_FALSE(with([](auto* q) { q->set_owner("c2"); }));
  EXPECT_TRUE(with([](auto* q) { q->set_created_after_ms(1000); }));
  EXPECT_FALSE(with([](auto* q) { q->set_created_after_ms(1001); }));
  EXPECT_TRUE(with([](auto* q) { q->set_session("j/p/s"); }));
  EXPECT_FALSE(with([](auto* q) { q->set_node("n2"); }));
  auto host = Rec("sb-2");
  host.mutable_spec()->clear_image();
  v1::ListSandboxesRequest h;
  h.set_image("host");
  EXPECT_TRUE(ListMatches(h, host)) << "no image is the host image";
}

TEST(SandboxList, PagesFromTheStoreCoverEveryMatchOnceInIdOrder) {
  auto store = state::NewMemStore();
  std::set<std::string> want;
  for (int i = 0; i < 257; ++i) {
    std::string id = "sb-" + std::to_string(1000 + i * 7 % 257);
    bool even = i % 2 == 0;
    ASSERT_NO_FATAL_FAILURE(Put(store.get(), Rec(id, v1::SANDBOX_PHASE_RUNNING, {{"even", even ? "y" : "n"}})));
    if (even) want.insert(id);
  }
  ASSERT_NO_FATAL_FAILURE(Put(store.get(), Rec("sb-gone", v1::SANDBOX_PHASE_STOPPED, {{"even", "y"}})));
  v1::ListSandboxesRequest req;
  (*req.mutable_labels())["even"] = "y";
  req.set_limit(10);
  std::vector<std::string> got;
  int pages = 0, shown = 0;
  for (;; ++pages) {
    auto page = ListFromStore(store.get(), req, [&](v1::SandboxRecord*) { ++shown; });
    ASSERT_EQ(page.status().code(), v1::Status::OK) << page.status().message();
    ASSERT_LE(page.sandboxes_size(), 10);
    for (const auto& id : Ids(page)) got.push_back(id);
    if (page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
  }
  EXPECT_EQ(got, std::vector<std::string>(want.begin(), want.end()));
  EXPECT_EQ(pages + 1, static_cast<int>((want.size() + 9) / 10));
  EXPECT_EQ(shown, static_cast<int>(want.size())) << "each listed record is shown once";
}

// The controller's merge, checked against one list of every node's rows:
// for random splits and page sizes, paging through merged pages lists
// exactly the matches, once each, in id order.
TEST(SandboxList, MergedPagesOfSeveralNodesAreThePagesOfAllTheirRows) {
  std::mt19937 rng(7);
  for (int round = 0; round < 40; ++round) {
    int nodes = 1 + static_cast<int>(rng() % 4);
    std::vector<std::unique_ptr<state::Store>> stores;
    for (int n = 0; n < nodes; ++n) stores.push_back(state::NewMemStore());
    std::set<std::string> all;
    int count = static_cast<int>(rng() % 120);
    for (int i = 0; i < count; ++i) {
      std::string id = "sb-" + std::to_string(rng() % 100000);
      if (!all.insert(id).second) continue;
      ASSERT_NO_FATAL_FAILURE(Put(stores[rng() % nodes].get(), Rec(id)));
    }
    v1::ListSandboxesRequest req;
    req.set_limit(1 + rng() % 25);
    std::vector<std::string> got;
    for (int guard = 0; guard < 1000; ++guard) {
      std::vector<v1::ListSandboxesReply> pages;
      for (auto& s : stores) pages.push_back(ListFromStore(s.get(), req, nullptr));
      auto merged = MergeListPages(req, std::move(pages));
      ASSERT_EQ(merged.status().code(), v1::Status::OK);
      ASSERT_LE(static_cast<uint32_t>(merged.sandboxes_size()), req.limit());
      for (const auto& id : Ids(merged)) got.push_back(id);
      if (merged.next_page_token().empty()) break;
      req.set_page_token(merged.next_page_token());
    }
    EXPECT_EQ(got, std::vector<std::string>(all.begin(), all.end())) << "round " << round;
  }
}

TEST(SandboxList, ANodesFailureFailsTheMergedPage) {
  v1::ListSandboxesRequest req;
  v1::ListSandboxesReply ok, bad;
  *ok.add_sandboxes() = Rec("sb-1");
  bad.mutable_status()->set_code(v1::Status::UNAVAILABLE);
  bad.mutable_status()->set_message("node n2 did not answer");
  auto merged = MergeListPages(req, {ok, bad});
  EXPECT_EQ(merged.status().code(), v1::Status::UNAVAILABLE);
  EXPECT_THAT(merged.status().message(), HasSubstr("n2"));
}

}  // namespace
}  // namespace dsec
