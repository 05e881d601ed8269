// The Store contract, run against every backend (RocksStore, MemStore), plus
// what only the durable RocksStore promises (reopen, the process lock).
#include "state/store.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dsec/v1/types.pb.h"
#include "state/table.hpp"
#include "tests/unit/state/temp_dir.hpp"

namespace dsec::state {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

using Rows = std::vector<std::pair<std::string, std::string>>;

enum class Backend { kRocks, kMem };

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kMem) {
      store_ = NewMemStore();
      return;
    }
    dir_ = std::make_unique<TempDir>();
    auto opened = OpenRocksStore(dir_->db());
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
  }
  void TearDown() override {
    store_.reset();  // closes RocksDB before its files go
    dir_.reset();
  }

  void Put(Table t, const std::string& key, const std::string& value) {
    WriteBatch b;
    b.Put(t, key, value);
    ASSERT_TRUE(store_->Write(b, /*sync=*/false).ok());
  }
  Rows ScanAll(Table t, const std::string& prefix) {
    Rows rows;
    auto st = store_->Scan(t, prefix, [&](const std::string& k, const std::string& v) {
      rows.emplace_back(k, v);
      return true;
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return rows;
  }
  bool Has(Table t, const std::string& key) { return store_->Get(t, key).ok(); }

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, PutThenGet) {
  Put(Table::kSessions, "s1", "one");
  auto got = store_->Get(Table::kSessions, "s1");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "one");
  Put(Table::kSessions, "s1", "two");
  EXPECT_EQ(*store_->Get(Table::kSessions, "s1"), "two");
}

TEST_P(StoreTest, TablesAreSeparate) {
  Put(Table::kSessions, "k", "session");
  Put(Table::kNodes, "k", "node");
  EXPECT_EQ(*store_->Get(Table::kSessions, "k"), "session");
  EXPECT_EQ(*store_->Get(Table::kNodes, "k"), "node");
  EXPECT_FALSE(Has(Table::kImages, "k"));
}

TEST_P(StoreTest, MissingKeyIsNotFoundNamingTableAndKey) {
  auto got = store_->Get(Table::kSandboxes, "sb-404");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("sandboxes"));
  EXPECT_THAT(got.status().message(), HasSubstr("sb-404"));
  EXPECT_THAT(got.status().message(), HasSubstr(store_->Describe()));
}

TEST_P(StoreTest, MissingStepKeyIsPrintable) {
  auto got = store_->Get(Table::kSteps, StepKey("job/1", 7));
  ASSERT_EQ(got.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("'job/1#7'"));
  EXPECT_EQ(got.status().message().find('\0'), std::string::npos);
}

TEST_P(StoreTest, Delete) {
  Put(Table::kNodes, "n1", "x");
  WriteBatch b;
  b.Delete(Table::kNodes, "n1");
  b.Delete(Table::kNodes, "never-there");  // deleting nothing is fine
  ASSERT_TRUE(store_->Write(b, false).ok());
  EXPECT_EQ(store_->Get(Table::kNodes, "n1").status().code(), Status::Code::kNotFound);
}

TEST_P(StoreTest, DeletePrefixRemovesExactlyOneOwnersSteps) {
  WriteBatch b;
  for (uint64_t i : {0, 1, 255, 256}) b.Put(Table::kSteps, StepKey("a", i), "a");
  for (uint64_t i : {0, 1}) b.Put(Table::kSteps, StepKey("ab", i), "ab");
  b.Put(Table::kSteps, StepKey("b", 0), "b");
  b.Put(Table::kSessions, "a", "session a");
  ASSERT_TRUE(store_->Write(b, false).ok());

  WriteBatch del;
  del.DeletePrefix(Table::kSteps, StepPrefix("a"));
  ASSERT_TRUE(store_->Write(del, false).ok());

  EXPECT_TRUE(ScanAll(Table::kSteps, StepPrefix("a")).empty());
  EXPECT_EQ(ScanAll(Table::kSteps, StepPrefix("ab")).size(), 2u);
  EXPECT_EQ(ScanAll(Table::kSteps, StepPrefix("b")).size(), 1u);
  EXPECT_TRUE(Has(Table::kSessions, "a"));  // other tables untouched
}

TEST_P(StoreTest, DeletePrefixIsOrderedWithinTheBatch) {
  // Puts before the delete in the same batch go; puts after it stay.
  WriteBatch b;
  b.Put(Table::kSteps, StepKey("s", 1), "before");
  b.DeletePrefix(Table::kSteps, StepPrefix("s"));
  b.Put(Table::kSteps, StepKey("s", 2), "after");
  ASSERT_TRUE(store_->Write(b, false).ok());
  EXPECT_FALSE(Has(Table::kSteps, StepKey("s", 1)));
  EXPECT_TRUE(Has(Table::kSteps, StepKey("s", 2)));
}

TEST_P(StoreTest, DeletePrefixWithNoSuccessor) {
  // An all-0xff prefix has no upper bound key; RocksStore deletes row by row.
  const std::string ff = "\xff\xff";
  Put(Table::kImages, ff, "1");
  Put(Table::kImages, ff + "\xff\xff", "2");
  Put(Table::kImages, ff + "z", "3");
  Put(Table::kImages, "\xfe\xff", "keep");
  Put(Table::kImages, "\xff", "keep");
  WriteBatch b;
  b.Put(Table::kImages, ff + "new", "put earlier in the batch");
  b.DeletePrefix(Table::kImages, ff);
  b.Put(Table::kImages, ff + "after", "put later in the batch");
  ASSERT_TRUE(store_->Write(b, false).ok());
  EXPECT_EQ(ScanAll(Table::kImages, ""), (Rows{{"\xfe\xff", "keep"},
                                               {"\xff", "keep"},
                                               {ff + "after", "put later in the batch"}}));
}

TEST_P(StoreTest, DeleteEmptyPrefixClearsOneTable) {
  Put(Table::kImages, "a", "1");
  Put(Table::kImages, "\xff", "2");
  Put(Table::kNodes, "a", "3");
  WriteBatch b;
  b.DeletePrefix(Table::kImages, "");
  ASSERT_TRUE(store_->Write(b, false).ok());
  EXPECT_TRUE(ScanAll(Table::kImages, "").empty());
  EXPECT_TRUE(Has(Table::kNodes, "a"));
}

TEST_P(StoreTest, ScanVisitsPrefixInByteOrder) {
  for (const char* k : {"sb-2", "sb-10", "sc", "sb-1", "s", "sb-"}) Put(Table::kSandboxes, k, k);
  EXPECT_EQ(ScanAll(Table::kSandboxes, "sb-"),
            (Rows{{"sb-", "sb-"}, {"sb-1", "sb-1"}, {"sb-10", "sb-10"}, {"sb-2", "sb-2"}}));
  EXPECT_EQ(ScanAll(Table::kSandboxes, "").size(), 6u);
  EXPECT_TRUE(ScanAll(Table::kSandboxes, "zz").empty());
}

TEST_P(StoreTest, ScanStopsWhenVisitorSaysSo) {
  for (const char* k : {"a", "b", "c"}) Put(Table::kMeta, k, k);
  std::vector<std::string> seen;
  auto st = store_->Scan(Table::kMeta, "", [&](const std::string& k, const std::string&) {
    seen.push_back(k);
    return seen.size() < 2;
  });
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"}));
}

TEST_P(StoreTest, ScanVisitorMayUseTheStore) {
  Put(Table::kMeta, "a", "1");
  auto st = store_->Scan(Table::kMeta, "", [&](const std::string& k, const std::string&) {
    EXPECT_TRUE(store_->Get(Table::kMeta, k).ok());
    Put(Table::kNodes, k, "copied");
    return true;
  });
  EXPECT_TRUE(st.ok());
  EXPECT_TRUE(Has(Table::kNodes, "a"));
}

TEST_P(StoreTest, StepKeysSortByIndexNumerically) {
  const std::vector<uint64_t> indices = {256, 10, 2, 0, 1ull << 40, 255, 1};
  for (uint64_t i : indices) Put(Table::kSteps, StepKey("job/7", i), std::to_string(i));
  Put(Table::kSteps, StepKey("job/70", 5), "other session");
  std::vector<uint64_t> order;
  for (const auto& [key, value] : ScanAll(Table::kSteps, StepPrefix("job/7"))) {
    std::string session;
    uint64_t index = 0;
    ASSERT_TRUE(ParseStepKey(key, &session, &index));
    EXPECT_EQ(session, "job/7");
    EXPECT_EQ(value, std::to_string(index));
    order.push_back(index);
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 1, 2, 10, 255, 256, 1ull << 40}));
}

TEST_P(StoreTest, ScanFromStartsAtAStepAndStaysInItsSession) {
  for (uint64_t i : {0, 1, 2, 10, 255, 256}) Put(Table::kSteps, StepKey("job/7", i), std::to_string(i));
  Put(Table::kSteps, StepKey("job/70", 5), "other session");
  Put(Table::kSteps, StepKey("job/8", 0), "next session");
  std::vector<std::string> seen;
  auto st = store_->ScanFrom(Table::kSteps, StepPrefix("job/7"), StepKey("job/7", 3),
                             [&](const std::string&, const std::string& v) {
                               seen.push_back(v);
                               return true;
                             });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(seen, (std::vector<std::string>{"10", "255", "256"}));
  // A start before the prefix is the prefix; one past its end finds nothing.
  seen.clear();
  ASSERT_TRUE(store_->ScanFrom(Table::kSteps, StepPrefix("job/7"), "", [&](const std::string&, const std::string& v) {
                  seen.push_back(v);
                  return true;
                }).ok());
  EXPECT_EQ(seen.size(), 6u);
  seen.clear();
  ASSERT_TRUE(store_->ScanFrom(Table::kSteps, StepPrefix("job/7"), StepKey("job/7", 1000),
                               [&](const std::string&, const std::string& v) {
                                 seen.push_back(v);
                                 return true;
                               })
                  .ok());
  EXPECT_TRUE(seen.empty());
}

TEST_P(StoreTest, BatchIsAtomic) {
  Put(Table::kNodes, "old", "x");
  WriteBatch good;
  good.Put(Table::kSessions, "s", "1");
  good.Put(Table::kSteps, StepKey("s", 0), "step");
  good.Delete(Table::kNodes, "old");
  ASSERT_TRUE(store_->Write(good, true).ok());
  EXPECT_TRUE(Has(Table::kSessions, "s"));
  EXPECT_TRUE(Has(Table::kSteps, StepKey("s", 0)));
  EXPECT_FALSE(Has(Table::kNodes, "old"));

  // A bad op anywhere in a batch leaves the store as it was.
  WriteBatch bad;
  bad.Put(Table::kSessions, "t", "1");
  bad.Delete(Table::kSessions, "s");
  bad.Put(static_cast<Table>(kTableCount + 3), "k", "v");
  auto st = store_->Write(bad, true);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_FALSE(Has(Table::kSessions, "t"));
  EXPECT_TRUE(Has(Table::kSessions, "s"));
}

TEST_P(StoreTest, TypedTableRoundTripsProtos) {
  TypedTable<v1::SessionRecord> sessions(store_.get(), Table::kSessions);
  TypedTable<v1::StepRecord> steps(store_.get(), Table::kSteps);
  v1::SessionRecord rec;
  rec.set_name("job/1");
  rec.set_phase(v1::SESSION_PHASE_OPEN);
  rec.set_step_count(3);
  WriteBatch b;
  sessions.Put(&b, rec.name(), rec);
  for (uint64_t i = 0; i < 3; ++i) {
    v1::StepRecord step;
    step.set_session(rec.name());
    step.set_index(i);
    step.mutable_request()->add_argv("echo");
    steps.Put(&b, StepKey(rec.name(), i), step);
  }
  ASSERT_TRUE(store_->Write(b, true).ok());

  auto got = sessions.Get("job/1");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->phase(), v1::SESSION_PHASE_OPEN);
  EXPECT_EQ(got->step_count(), 3u);
  EXPECT_EQ(sessions.Get("job/2").status().code(), Status::Code::kNotFound);

  std::vector<uint64_t> seen;
  auto st = steps.Scan(StepPrefix("job/1"), [&](const std::string&, v1::StepRecord&& s) {
    seen.push_back(s.index());
    return true;
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 1, 2}));
}

TEST_P(StoreTest, CorruptValueIsInternalNamingTableAndKey) {
  // A field tag whose varint never ends: no message parses from it.
  Put(Table::kSessions, "job/9", "\xff\xff\xff");
  TypedTable<v1::SessionRecord> sessions(store_.get(), Table::kSessions);
  auto got = sessions.Get("job/9");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Status::Code::kInternal);
  EXPECT_THAT(got.status().message(), HasSubstr("sessions"));
  EXPECT_THAT(got.status().message(), HasSubstr("job/9"));
  EXPECT_THAT(got.status().message(), HasSubstr("dsec.v1.SessionRecord"));

  Put(Table::kSteps, StepKey("job/9", 1), "\xff\xff\xff");
  TypedTable<v1::StepRecord> steps(store_.get(), Table::kSteps);
  auto st = steps.Scan(StepPrefix("job/9"), [](const std::string&, v1::StepRecord&&) {
    return true;
  });
  EXPECT_EQ(st.code(), Status::Code::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("steps"));
  EXPECT_THAT(st.message(), HasSubstr("job/9#1"));
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values(Backend::kRocks, Backend::kMem),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param == Backend::kRocks ? "Rocks" : "Mem";
                         });

// What only the durable store promises.
constexpr char kChildOpenEnv[] = "DSEC_STATE_TEST_CHILD_OPEN";

// In the child of OpenHeldByAnotherProcessFails: try the open, exit 0 when it
// fails the way a second dsecd must see it fail, 1 otherwise. Never returns.
[[maybe_unused]] const bool kChildOpenCheck = [] {
  const char* path = getenv(kChildOpenEnv);
  if (path == nullptr) return false;
  auto store = OpenRocksStore(path);
  bool expected = !store.ok() && store.status().code() == Status::Code::kFailedPrecondition &&
                  store.status().message().find(path) != std::string::npos &&
                  store.status().message().find("in use by another process") != std::string::npos;
  if (!expected) fprintf(stderr, "child open: %s\n", store.status().ToString().c_str());
  _exit(expected ? 0 : 1);
}();

class RocksStoreTest : public ::testing::Test {
 protected:
  void TearDown() override { dir_.reset(); }
  std::unique_ptr<TempDir> dir_ = std::make_unique<TempDir>();
};

TEST_F(RocksStoreTest, DataSurvivesReopen) {
  {
    auto store = OpenRocksStore(dir_->db());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    WriteBatch b;
    b.Put(Table::kSessions, "s", "kept");
    b.Put(Table::kSteps, StepKey("s", 1), "step");
    ASSERT_TRUE((*store)->Write(b, true).ok());
  }
  RocksOptions no_create;
  no_create.create_if_missing = false;
  auto store = OpenRocksStore(dir_->db(), no_create);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(*(*store)->Get(Table::kSessions, "s"), "kept");
  EXPECT_EQ(*(*store)->Get(Table::kSteps, StepKey("s", 1)), "step");
}

TEST_F(RocksStoreTest, SecondOpenOfOnePathFails) {
  auto first = OpenRocksStore(dir_->db());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = OpenRocksStore(dir_->db());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Status::Code::kFailedPrecondition)
      << second.status().ToString();
  EXPECT_THAT(second.status().message(), HasSubstr(dir_->db()));
}

// The production case: a second dsecd on the same data dir. The other process
// is this test binary again; ChildOpenCheck below runs before main() there.
TEST_F(RocksStoreTest, OpenHeldByAnotherProcessFails) {
  auto held = OpenRocksStore(dir_->db());
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  std::string env = std::string(kChildOpenEnv) + "=" + dir_->db();
  char* argv[] = {const_cast<char*>("state_test"), nullptr};
  char* envp[] = {env.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "the child's open did not fail as expected";
}

TEST_F(RocksStoreTest, MissingStoreWithoutCreateIsNotFound) {
  RocksOptions no_create;
  no_create.create_if_missing = false;
  auto store = OpenRocksStore(dir_->db(), no_create);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(store.status().message(), HasSubstr(dir_->db()));
}

TEST_F(RocksStoreTest, DescribeIsThePath) {
  auto store = OpenRocksStore(dir_->db());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Describe(), dir_->db());
}

// The key encoding itself, independent of any backend.
TEST(StepKeyTest, RoundTrips) {
  for (uint64_t i : {0ull, 1ull, 256ull, ~0ull}) {
    std::string session;
    uint64_t index = 1234;
    ASSERT_TRUE(ParseStepKey(StepKey("job/1/0", i), &session, &index));
    EXPECT_EQ(session, "job/1/0");
    EXPECT_EQ(index, i);
  }
  EXPECT_EQ(StepKey("s", 0).substr(0, 2), StepPrefix("s"));
}

TEST(StepKeyTest, RejectsMalformed) {
  std::string session;
  uint64_t index = 0;
  EXPECT_FALSE(ParseStepKey("", &session, &index));
  EXPECT_FALSE(ParseStepKey("plain-session-key", &session, &index));
  const std::string key = StepKey("s", 3);
  EXPECT_FALSE(ParseStepKey(key.substr(0, key.size() - 1), &session, &index));  // short
  EXPECT_FALSE(ParseStepKey(key + "x", &session, &index));                      // long
  EXPECT_FALSE(ParseStepKey(std::string("a\0b", 3) + StepKey("", 1), &session, &index));
}

TEST(PrintableKeyTest, EscapesBinary) {
  EXPECT_EQ(PrintableKey(Table::kSteps, StepKey("job/1", 42)), "job/1#42");
  EXPECT_EQ(PrintableKey(Table::kNodes, std::string("a\0\xff\\", 4)), "a\\x00\\xff\\x5c");
}

}  // namespace
}  // namespace dsec::state
