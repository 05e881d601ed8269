// Typed view of one table whose values are protobuf messages of type Msg.
#pragma once

#include <string>

#include "state/store.hpp"

namespace dsec::state {

template <class Msg>
class TypedTable {
 public:
  TypedTable(Store* store, Table table) : store_(store), table_(table) {}

  // NotFound when absent; Internal (naming table and key) when the bytes do not parse.
  Result<Msg> Get(const std::string& key) const {
    auto raw = store_->Get(table_, key);
    if (!raw.ok()) return raw.status();
    Msg msg;
    if (!msg.ParseFromString(*raw)) return CorruptValue(key);
    return msg;
  }

  // Visits parsed rows under `prefix`; a row that fails to parse stops the
  // scan with Internal naming it.
  template <class Fn>  // bool(const std::string& key, Msg&& msg)
  Status Scan(const std::string& prefix, Fn&& fn) const {
    return ScanFrom(prefix, prefix, std::forward<Fn>(fn));
  }
  // The same, from the first key >= `start`.
  template <class Fn>
  Status ScanFrom(const std::string& prefix, const std::string& start, Fn&& fn) const {
    Status bad;
    auto st = store_->ScanFrom(table_, prefix, start, [&](const std::string& k, const std::string& v) {
      Msg msg;
      if (!msg.ParseFromString(v)) {
        bad = CorruptValue(k);
        return false;
      }
      return fn(k, std::move(msg));
    });
    if (!st.ok()) return st;
    return bad;
  }

  void Put(WriteBatch* batch, const std::string& key, const Msg& msg) const {
    batch->Put(table_, key, msg.SerializeAsString());
  }
  void Delete(WriteBatch* batch, const std::string& key) const { batch->Delete(table_, key); }

  Table table() const { return table_; }

 private:
  Status CorruptValue(const std::string& key) const {
    return Status::Internal(std::string("store ") + store_->Describe() + ": table " +
                            TableName(table_) + " key '" + PrintableKey(table_, key) +
                            "' holds a value that is not a " + Msg::descriptor()->full_name() +
                            " (corrupt or from another version)");
  }
  Store* store_;
  Table table_;
};

}  // namespace dsec::state
