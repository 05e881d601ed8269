// MemStore: the Store for unit tests. Same semantics as RocksStore (atomic
// batches, byte-ordered scans), nothing durable.
#include <array>
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "state/store.hpp"
#include "state/store_internal.hpp"

namespace dsec::state {

namespace {

constexpr char kWhere[] = "<memory>";

class MemStore final : public Store {
 public:
  Status Write(const WriteBatch& batch, bool /*sync*/) override {
    // Check everything first so a bad op leaves the store untouched, as an
    // atomic RocksDB batch would.
    for (const auto& op : batch.ops()) {
      if (!internal::ValidTable(op.table)) return internal::BadTable(kWhere, op.table);
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& op : batch.ops()) {
      auto& rows = tables_[static_cast<int>(op.table)];
      switch (op.kind) {
        case WriteBatch::Op::Kind::kPut: rows[op.key] = op.value; break;
        case WriteBatch::Op::Kind::kDelete: rows.erase(op.key); break;
        case WriteBatch::Op::Kind::kDeletePrefix: {
          auto it = rows.lower_bound(op.key);
          while (it != rows.end() && internal::HasPrefix(it->first, op.key)) it = rows.erase(it);
          break;
        }
      }
    }
    return Status::Ok();
  }

  Result<std::string> Get(Table t, const std::string& key) override {
    if (!internal::ValidTable(t)) return internal::BadTable(kWhere, t);
    std::lock_guard<std::mutex> lock(mu_);
    const auto& rows = tables_[static_cast<int>(t)];
    auto it = rows.find(key);
    if (it == rows.end()) return internal::KeyNotFound(kWhere, t, key);
    return it->second;
  }

  Status ScanFrom(Table t, const std::string& prefix, const std::string& start, const ScanFn& fn) override {
    if (!internal::ValidTable(t)) return internal::BadTable(kWhere, t);
    // Copy, then visit unlocked: the visitor may call back into the store, and
    // it sees a consistent snapshot as a RocksDB iterator would.
    std::vector<std::pair<std::string, std::string>> rows;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto& table = tables_[static_cast<int>(t)];
      for (auto it = table.lower_bound(std::max(prefix, start));
           it != table.end() && internal::HasPrefix(it->first, prefix); ++it) {
        rows.emplace_back(it->first, it->second);
      }
    }
    for (const auto& [key, value] : rows) {
      if (!fn(key, value)) break;
    }
    return Status::Ok();
  }

  std::string Describe() const override { return kWhere; }

 private:
  std::mutex mu_;
  std::array<std::map<std::string, std::string>, kTableCount> tables_;
};

}  // namespace

std::unique_ptr<Store> NewMemStore() { return std::make_unique<MemStore>(); }

}  // namespace dsec::state
