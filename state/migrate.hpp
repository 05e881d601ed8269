// Store formats, and bringing an older store up to date. A store's format
// is the meta row "format"; every writable open (OpenRocksStore) brings the
// store to kStoreFormat before anything reads it, in one synced batch.
//   1  every store before there was a format row: a `sandboxes` row was a
//      dsec.v1.SandboxRecord carrying its driver's state as field 10
//   2  a `sandboxes` row is a dsec.store.v1.SandboxRow (record + driver state)
#pragma once

#include "dsec/status.hpp"
#include "state/store.hpp"

namespace dsec::state {

inline constexpr int kStoreFormat = 2;

// Brings `store` to kStoreFormat: what the format row says, or 1 when there
// is none and the store holds rows (an empty store is simply marked).
// FailedPrecondition for a store of a newer format (written by a newer
// dsecd); Internal, naming the key, for a row that cannot be converted.
// Nothing is written unless every row converts.
Status MigrateStore(Store* store);

}  // namespace dsec::state
