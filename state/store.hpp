// The store: tables (RocksDB column families) of protobuf values, written in
// atomic batches. Two implementations pass one shared test suite: RocksStore
// (durable) and MemStore (unit tests). Nothing here knows about CAF.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::state {

// One column family each. Keys are prefixed by their owner so one owner's
// rows go together (steps: session name + '\0' + big-endian index).
enum class Table : int {
  kMeta = 0,       // daemon-wide singletons (node id, schema version)
  kNodes,          // NodeRecord by node id
  kSandboxes,      // SandboxRecord by sandbox id
  kSessions,       // SessionRecord by session name
  kSteps,          // StepRecord by StepKey(session, index)
  kImages,         // image manifests by name
  kPlacements,     // a controller's directory: "b/<sandbox id>" or "s/<session>" -> node id
  kSnapshots,      // SnapshotInfo by name (a node's own snapshots)
  kApiKeys,        // store.v1.ApiKeyRecord by name (the E2B door's keys, hashed)
};
inline constexpr int kTableCount = 9;
const char* TableName(Table t);

// Puts and deletes applied atomically, in order.
class WriteBatch {
 public:
  struct Op {
    enum class Kind { kPut, kDelete, kDeletePrefix } kind;
    Table table;
    std::string key;     // the prefix for kDeletePrefix
    std::string value;   // kPut only
  };
  void Put(Table t, std::string key, std::string value);
  void Delete(Table t, std::string key);
  // Deletes every key starting with `prefix` (one owner's rows).
  void DeletePrefix(Table t, std::string prefix);
  // Appends other's ops after ours.
  void Append(WriteBatch&& other);
  const std::vector<Op>& ops() const { return ops_; }
  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }
  void Clear() { ops_.clear(); }

 private:
  std::vector<Op> ops_;
};

// Visitor for Scan: return false to stop early.
using ScanFn = std::function<bool(const std::string& key, const std::string& value)>;

class Store {
 public:
  virtual ~Store() = default;
  // Applies the batch atomically. sync=true returns only once the write is
  // durable (WAL fsync'd); sync=false may lose it in a crash.
  virtual Status Write(const WriteBatch& batch, bool sync) = 0;
  // NotFound when the key is absent.
  virtual Result<std::string> Get(Table t, const std::string& key) = 0;
  // Visits keys starting with `prefix` in ascending byte order.
  Status Scan(Table t, const std::string& prefix, const ScanFn& fn) { return ScanFrom(t, prefix, prefix, fn); }
  // The same, from the first key >= `start` (a page of one owner's rows
  // without reading the rows before it).
  virtual Status ScanFrom(Table t, const std::string& prefix, const std::string& start, const ScanFn& fn) = 0;
  // Where the data lives, for messages ("<memory>" for MemStore).
  virtual std::string Describe() const = 0;
};

struct RocksOptions {
  // Create the database and its column families when missing (default true).
  bool create_if_missing = true;
  // Write buffer per column family, bytes (default 16 MiB).
  size_t write_buffer_size = 16 << 20;
  // Open for reading only (dsec-replay): no lock is taken, so this works
  // beside a running dsecd (a snapshot as of the open); writes fail.
  bool read_only = false;
};

// Opens (or creates) a RocksDB store at `path`. A path already open by another
// process fails with FailedPrecondition naming the path.
Result<std::unique_ptr<Store>> OpenRocksStore(const std::string& path,
                                              const RocksOptions& options = {});
std::unique_ptr<Store> NewMemStore();

// Key of a step row: session + '\0' + 8-byte big-endian index, so a session's
// steps sort by index and share the prefix StepPrefix(session). `session`
// must not contain '\0' (it would make "a" a prefix of "a\0b"'s rows).
std::string StepKey(const std::string& session, uint64_t index);
std::string StepPrefix(const std::string& session);
// Parses a StepKey; false when malformed.
bool ParseStepKey(const std::string& key, std::string* session, uint64_t* index);

// A key of table `t` as it should appear in messages: a step key as
// "<session>#<index>", any other byte outside printable ASCII as \xNN (keys
// may be binary; a raw '\0' would cut the message short in C APIs and logs).
std::string PrintableKey(Table t, const std::string& key);

}  // namespace dsec::state
