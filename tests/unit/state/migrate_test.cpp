// Store formats (state/migrate.hpp): an older store is brought up to date
// when it is opened, a newer one is refused, and a row that cannot be
// converted stops the migration before anything is written.
#include "state/migrate.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "dsec/store/v1/records.pb.h"
#include "state/store.hpp"
#include "tests/unit/state/temp_dir.hpp"

namespace dsec::state {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

// A `sandboxes` row as format 1 wrote it: the record with the driver's
// state as its field 10 (what SandboxRowV1Extra names).
std::string FormatOneRow(const std::string& id, const std::string& driver_state) {
  v1::SandboxRecord rec;
  rec.set_id(id);
  rec.set_phase(v1::SANDBOX_PHASE_RUNNING);
  rec.mutable_spec()->set_image("py311");
  store::v1::SandboxRowV1Extra extra;
  extra.set_driver_state(driver_state);
  return rec.SerializeAsString() + extra.SerializeAsString();
}

class MigrateTest : public ::testing::Test {
 protected:
  // Writes `rows` into a fresh store and takes its format row away (or
  // sets it to `format`), as an older (newer) dsecd would have left it.
  void Prepare(const std::vector<std::pair<std::string, std::string>>& rows, const std::string& format = "") {
    auto store = OpenRocksStore(dir_.db());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    WriteBatch b;
    for (const auto& [k, v] : rows) b.Put(Table::kSandboxes, k, v);
    if (format.empty()) b.Delete(Table::kMeta, "format");
    else b.Put(Table::kMeta, "format", format);
    ASSERT_TRUE((*store)->Write(b, true).ok());
  }
  TempDir dir_;
};

TEST_F(MigrateTest, ANewStoreIsMarkedWithTheCurrentFormat) {
  auto store = OpenRocksStore(dir_.db());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(*(*store)->Get(Table::kMeta, "format"), std::to_string(kStoreFormat));
  auto mem = NewMemStore();
  ASSERT_TRUE(MigrateStore(mem.get()).ok());
  EXPECT_EQ(*mem->Get(Table::kMeta, "format"), std::to_string(kStoreFormat));
}

TEST_F(MigrateTest, FormatOneSandboxRowsKeepTheirRecordAndDriverState) {
  ASSERT_NO_FATAL_FAILURE(Prepare({{"sb-a", FormatOneRow("sb-a", "state-a")}, {"sb-b", FormatOneRow("sb-b", "")}}));
  auto store = OpenRocksStore(dir_.db());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(*(*store)->Get(Table::kMeta, "format"), "2");
  for (const auto& [id, state] : {std::pair<std::string, std::string>{"sb-a", "state-a"}, {"sb-b", ""}}) {
    auto raw = (*store)->Get(Table::kSandboxes, id);
    ASSERT_TRUE(raw.ok()) << raw.status().ToString();
    store::v1::SandboxRow row;
    ASSERT_TRUE(row.ParseFromString(*raw)) << id;
    EXPECT_EQ(row.record().id(), id);
    EXPECT_EQ(row.record().spec().image(), "py311");
    EXPECT_EQ(row.record().phase(), v1::SANDBOX_PHASE_RUNNING);
    EXPECT_EQ(row.driver_state(), state);
    // The public record carries nothing of the driver's (no unknown field 10).
    EXPECT_TRUE(row.record().GetReflection()->GetUnknownFields(row.record()).empty()) << id;
  }
}

TEST_F(MigrateTest, ACurrentStoreIsLeftAlone) {
  store::v1::SandboxRow row;
  row.mutable_record()->set_id("sb-c");
  row.set_driver_state("kept");
  ASSERT_NO_FATAL_FAILURE(Prepare({{"sb-c", row.SerializeAsString()}}, "2"));
  auto store = OpenRocksStore(dir_.db());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(*(*store)->Get(Table::kSandboxes, "sb-c"), row.SerializeAsString());
}

TEST_F(MigrateTest, ANewerFormatIsRefusedNamingIt) {
  ASSERT_NO_FATAL_FAILURE(Prepare({}, "99"));
  auto store = OpenRocksStore(dir_.db());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("format 99"));
  EXPECT_THAT(store.status().message(), HasSubstr("newer dsecd"));
}

TEST_F(MigrateTest, AnUnreadableRowStopsItBeforeAnythingIsWritten) {
  std::string garbage("\xff\xff\xff\xff", 4);
  ASSERT_NO_FATAL_FAILURE(Prepare({{"sb-good", FormatOneRow("sb-good", "s")}, {"sb-bad", garbage}}));
  auto store = OpenRocksStore(dir_.db());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Status::Code::kInternal);
  EXPECT_THAT(store.status().message(), HasSubstr("sb-bad"));
  // Read-only, the store is as it was: no format row, the good row unconverted.
  RocksOptions ro;
  ro.read_only = true;
  auto still = OpenRocksStore(dir_.db(), ro);
  ASSERT_TRUE(still.ok()) << still.status().ToString();
  EXPECT_EQ((*still)->Get(Table::kMeta, "format").status().code(), Status::Code::kNotFound);
  EXPECT_EQ(*(*still)->Get(Table::kSandboxes, "sb-good"), FormatOneRow("sb-good", "s"));
}

}  // namespace
}  // namespace dsec::state
