#include "state/migrate.hpp"

#include <cstdlib>
#include <string>

#include "dsec/store/v1/records.pb.h"

namespace dsec::state {

namespace {

constexpr const char* kFormatKey = "format";

// Format 1 -> 2: each `sandboxes` row's bytes are read twice, once as the
// record (field 10 now reserved there: dropped) and once as the extra
// fields; written back as a SandboxRow.
Status SandboxRowsToV2(Store* store, WriteBatch* b) {
  Status bad;
  Status s = store->Scan(Table::kSandboxes, "", [&](const std::string& key, const std::string& raw) {
    store::v1::SandboxRow row;
    store::v1::SandboxRowV1Extra extra;
    if (!row.mutable_record()->ParseFromString(raw) || !extra.ParseFromString(raw)) {
      bad = Status::Internal("store " + store->Describe() + ": migrating to format 2: sandboxes row '" +
                             PrintableKey(Table::kSandboxes, key) +
                             "' is not a format-1 SandboxRecord; move the data dir aside or remove that row");
      return false;
    }
    row.mutable_record()->DiscardUnknownFields();
    row.set_driver_state(extra.driver_state());
    b->Put(Table::kSandboxes, key, row.SerializeAsString());
    return true;
  });
  return s.ok() ? bad : s;
}

}  // namespace

Status MigrateStore(Store* store) {
  int format = 1;
  auto have = store->Get(Table::kMeta, kFormatKey);
  if (have.ok()) {
    format = std::atoi(have->c_str());
    if (format < 1) return Status::Internal("store " + store->Describe() + ": format row holds '" + *have + "'");
  } else if (have.status().code() != Status::Code::kNotFound) {
    return have.status();
  }
  if (format == kStoreFormat) return Status::Ok();
  if (format > kStoreFormat)
    return Status::FailedPrecondition("store " + store->Describe() + " is in format " + std::to_string(format) +
                                      ", written by a newer dsecd; this one reads format " +
                                      std::to_string(kStoreFormat) + " and older (run the newer dsecd on it)");
  WriteBatch b;
  if (format < 2) DSEC_RETURN_IF_ERROR(SandboxRowsToV2(store, &b));
  b.Put(Table::kMeta, kFormatKey, std::to_string(kStoreFormat));
  return store->Write(b, /*sync=*/true).Annotate("store " + store->Describe() + ": migrating to format " +
                                                 std::to_string(kStoreFormat));
}

}  // namespace dsec::state
