// The E2B door's API keys (DESIGN.md section 15): "e2b_" and 40 hex
// digits, as E2B's SDK checks them. Only a key's SHA-256 is stored (table
// `api_keys`, by the key's name), so the data dir does not hold a key,
// save the first: at its first start dsecd makes one and writes it to
// <data>/e2b.key (0600), as it does the SDK token, for the operator to hand
// out. Keys are checked on every call; Issue and Revoke take effect at once.
// Thread-safe. Nothing here knows about CAF.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dsec/status.hpp"
#include "dsec/store/v1/records.pb.h"
#include "state/store.hpp"

namespace dsec::e2b {

class ApiKeys {
 public:
  explicit ApiKeys(state::Store* store) : store_(store) {}
  // Loads the keys; with none, makes the first one (named "first") and
  // writes it to `first_path`. Returns what to log ("" when nothing new).
  Result<std::string> Load(const std::string& first_path);
  // A new key named `name` ([a-z0-9._-], at most 64 bytes; AlreadyExists
  // for a taken name): the key, shown once.
  Result<std::string> Issue(const std::string& name);
  // NotFound naming how to list them.
  Status Revoke(const std::string& name);
  std::vector<store::v1::ApiKeyRecord> List() const;
  // Whether `key` is one of the keys (compared by its SHA-256).
  bool Check(const std::string& key) const;
  // The console's `e2b-key ls | issue NAME | revoke NAME`: a reply line
  // (JSON, {"ok": ...} as the console's others).
  std::string Admin(const std::vector<std::string>& args);

 private:
  Result<std::string> Make(const std::string& name);
  state::Store* store_;
  mutable std::mutex mu_;
  std::set<std::string> hashes_;
};

}  // namespace dsec::e2b
