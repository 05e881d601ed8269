// Helpers shared by the Store implementations; not part of the interface.
#pragma once

#include <string>

#include "state/store.hpp"

namespace dsec::state::internal {

// Table comes from callers as an enum, but a stray cast must not index past
// the per-table arrays.
inline bool ValidTable(Table t) {
  int i = static_cast<int>(t);
  return i >= 0 && i < kTableCount;
}

inline Status BadTable(const std::string& where, Table t) {
  return Status::InvalidArgument("store " + where + ": no table number " +
                                 std::to_string(static_cast<int>(t)));
}

inline Status KeyNotFound(const std::string& where, Table t, const std::string& key) {
  return Status::NotFound("store " + where + ": table " + TableName(t) + " has no key '" +
                          PrintableKey(t, key) + "'");
}

inline bool HasPrefix(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace dsec::state::internal
