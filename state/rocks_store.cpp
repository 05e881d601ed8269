// RocksStore: the durable Store, one RocksDB column family per Table.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "state/migrate.hpp"
#include "state/store.hpp"
#include "state/store_internal.hpp"

namespace dsec::state {

namespace {

using internal::HasPrefix;

// The smallest key greater than every key starting with `prefix`: drop
// trailing 0xff bytes and increment the last remaining one. False when none
// exists (empty or all-0xff prefix), so the range has no upper bound.
bool PrefixSuccessor(const std::string& prefix, std::string* out) {
  std::string s = prefix;
  while (!s.empty() && static_cast<unsigned char>(s.back()) == 0xff) s.pop_back();
  if (s.empty()) return false;
  s.back() = static_cast<char>(static_cast<unsigned char>(s.back()) + 1);
  *out = std::move(s);
  return true;
}

// RocksDB reports a held LOCK file as an IOError whose text is all we get:
// "While lock file: <path>/LOCK: Resource temporarily unavailable" from
// another process, "lock hold by current process" from this one.
bool IsLockedByOtherProcess(const rocksdb::Status& s) {
  return s.IsIOError() && s.ToString().find("While lock file") != std::string::npos;
}
bool IsLockedByThisProcess(const rocksdb::Status& s) {
  return s.IsIOError() && s.ToString().find("lock hold by current process") != std::string::npos;
}

class RocksStore final : public Store {
 public:
  RocksStore(std::string path, std::unique_ptr<rocksdb::DB> db,
             std::vector<rocksdb::ColumnFamilyHandle*> handles,
             std::array<rocksdb::ColumnFamilyHandle*, kTableCount> tables)
      : path_(std::move(path)), db_(std::move(db)), handles_(std::move(handles)), cf_(tables) {}

  ~RocksStore() override {
    // Handles must go before the DB; Close() waits for background work so the
    // LOCK is released by the time the destructor returns (reopen in-process).
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
    db_->Close();
  }

  Status Write(const WriteBatch& batch, bool sync) override {
    rocksdb::WriteBatch wb;
    const auto& ops = batch.ops();
    for (size_t i = 0; i < ops.size(); ++i) {
      const auto& op = ops[i];
      if (!internal::ValidTable(op.table)) return internal::BadTable(path_, op.table);
      auto* cf = cf_[static_cast<int>(op.table)];
      rocksdb::Status s;
      switch (op.kind) {
        case WriteBatch::Op::Kind::kPut: s = wb.Put(cf, op.key, op.value); break;
        case WriteBatch::Op::Kind::kDelete: s = wb.Delete(cf, op.key); break;
        case WriteBatch::Op::Kind::kDeletePrefix: s = AddDeletePrefix(batch, i, &wb); break;
      }
      if (!s.ok()) return FromRocks(s, "build write batch");
    }
    rocksdb::WriteOptions wo;
    wo.sync = sync;
    return FromRocks(db_->Write(wo, &wb), "write");
  }

  Result<std::string> Get(Table t, const std::string& key) override {
    if (!internal::ValidTable(t)) return internal::BadTable(path_, t);
    std::string value;
    auto s = db_->Get(rocksdb::ReadOptions(), cf_[static_cast<int>(t)], key, &value);
    if (s.IsNotFound()) return internal::KeyNotFound(path_, t, key);
    if (!s.ok()) return FromRocks(s, std::string("get from table ") + TableName(t));
    return value;
  }

  Status ScanFrom(Table t, const std::string& prefix, const std::string& start, const ScanFn& fn) override {
    if (!internal::ValidTable(t)) return internal::BadTable(path_, t);
    rocksdb::ReadOptions ro;
    // The bound lets RocksDB stop at the prefix's end instead of reading on
    // into the next owner's rows (and their tombstones).
    std::string upper;
    rocksdb::Slice upper_slice;
    if (PrefixSuccessor(prefix, &upper)) {
      upper_slice = upper;
      ro.iterate_upper_bound = &upper_slice;
    }
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf_[static_cast<int>(t)]));
    for (it->Seek(std::max(prefix, start)); it->Valid(); it->Next()) {
      std::string key = it->key().ToString();
      if (!HasPrefix(key, prefix)) break;
      if (!fn(key, it->value().ToString())) return Status::Ok();
    }
    return FromRocks(it->status(), std::string("scan table ") + TableName(t));
  }

  std::string Describe() const override { return path_; }

 private:
  // Adds op `i` (a DeletePrefix) of `batch` to `wb`.
  rocksdb::Status AddDeletePrefix(const WriteBatch& batch, size_t i, rocksdb::WriteBatch* wb) {
    const auto& op = batch.ops()[i];
    auto* cf = cf_[static_cast<int>(op.table)];
    std::string end;
    if (PrefixSuccessor(op.key, &end)) return wb->DeleteRange(cf, op.key, end);
    // No upper bound to give DeleteRange: delete key by key. The iterator sees
    // only what is already stored, so rows put earlier in this same batch are
    // deleted explicitly too.
    rocksdb::Status s;
    for (size_t j = 0; j < i && s.ok(); ++j) {
      const auto& prev = batch.ops()[j];
      if (prev.kind == WriteBatch::Op::Kind::kPut && prev.table == op.table &&
          HasPrefix(prev.key, op.key)) {
        s = wb->Delete(cf, prev.key);
      }
    }
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf));
    for (it->Seek(op.key); s.ok() && it->Valid() && HasPrefix(it->key().ToString(), op.key);
         it->Next()) {
      s = wb->Delete(cf, it->key());
    }
    return s.ok() ? it->status() : s;
  }

  Status FromRocks(const rocksdb::Status& s, const std::string& what) const {
    if (s.ok()) return Status::Ok();
    std::string msg = "store " + path_ + ": " + what + ": " + s.ToString();
    if (s.IsNoSpace()) return Status::ResourceExhausted(msg);
    return Status::Internal(msg);
  }

  std::string path_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // every open CF, owned
  std::array<rocksdb::ColumnFamilyHandle*, kTableCount> cf_;  // by Table, borrowed
};

}  // namespace

Result<std::unique_ptr<Store>> OpenRocksStore(const std::string& path,
                                              const RocksOptions& options) {
  std::error_code ec;
  if (!options.create_if_missing && !std::filesystem::exists(path + "/CURRENT", ec)) {
    return Status::NotFound("store " + path +
                            " does not exist (create_if_missing is off; was the data dir moved?)");
  }

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = options.create_if_missing;
  db_options.create_missing_column_families = true;
  rocksdb::ColumnFamilyOptions cf_options;
  cf_options.write_buffer_size = options.write_buffer_size;

  // RocksDB refuses to open unless every existing column family is named,
  // including ones a newer version may have added: open them all.
  std::vector<std::string> names;
  if (!rocksdb::DB::ListColumnFamilies(db_options, path, &names).ok()) names.clear();
  auto add_name = [&names](const std::string& n) {
    for (const auto& have : names) {
      if (have == n) return;
    }
    names.push_back(n);
  };
  add_name(rocksdb::kDefaultColumnFamilyName);
  for (int i = 0; i < kTableCount; ++i) add_name(TableName(static_cast<Table>(i)));

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const auto& n : names) descriptors.emplace_back(n, cf_options);

  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  if (options.read_only) {
    // Only the column families that exist may be named read-only.
    std::vector<std::string> existing;
    if (!rocksdb::DB::ListColumnFamilies(db_options, path, &existing).ok())
      return Status::NotFound("store " + path + " does not exist or is not a dsec store");
    for (int i = 0; i < kTableCount; ++i)
      if (std::find(existing.begin(), existing.end(), TableName(static_cast<Table>(i))) == existing.end())
        return Status::FailedPrecondition("store " + path + " has no table '" + TableName(static_cast<Table>(i)) +
                                          "' (written by an older dsec? start dsecd on it once)");
    descriptors.clear();
    for (const auto& n : existing) descriptors.emplace_back(n, cf_options);
  }
  rocksdb::Status s = options.read_only
                          ? rocksdb::DB::OpenForReadOnly(db_options, path, descriptors, &handles, &raw)
                          : rocksdb::DB::Open(db_options, path, descriptors, &handles, &raw);
  if (IsLockedByOtherProcess(s)) {
    return Status::FailedPrecondition("store " + path +
                                      " is in use by another process (is another dsecd running "
                                      "on this data dir?)");
  }
  if (IsLockedByThisProcess(s)) {
    return Status::FailedPrecondition(
        "store " + path + " is already open in this process (open it once and share it)");
  }
  if (!s.ok()) return Status::Internal("store " + path + ": open: " + s.ToString());
  std::unique_ptr<rocksdb::DB> db(raw);

  std::array<rocksdb::ColumnFamilyHandle*, kTableCount> tables{};
  for (int i = 0; i < kTableCount; ++i) {
    const std::string name = TableName(static_cast<Table>(i));
    for (auto* h : handles) {
      if (h->GetName() == name) tables[i] = h;
    }
  }
  std::unique_ptr<Store> store(new RocksStore(path, std::move(db), std::move(handles), tables));
  // A read-only open (dsec-replay beside a running dsecd) reads the store as
  // it is: what it reads (sessions, steps) is the same in every format.
  if (!options.read_only) DSEC_RETURN_IF_ERROR(MigrateStore(store.get()));
  return store;
}

}  // namespace dsec::state
