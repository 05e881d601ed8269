// WriteBatch, table names and the step key encoding shared by every store.
#include "state/store.hpp"

#include <cassert>
#include <cstdio>

namespace dsec::state {

namespace {
constexpr size_t kIndexBytes = 8;

std::string EscapeBytes(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace

const char* TableName(Table t) {
  // These names are the column family names on disk: never rename one.
  switch (t) {
    case Table::kMeta: return "meta";
    case Table::kNodes: return "nodes";
    case Table::kSandboxes: return "sandboxes";
    case Table::kSessions: return "sessions";
    case Table::kSteps: return "steps";
    case Table::kImages: return "images";
    case Table::kPlacements: return "placements";
    case Table::kSnapshots: return "snapshots";
    case Table::kApiKeys: return "api_keys";
  }
  return "unknown";
}

void WriteBatch::Put(Table t, std::string key, std::string value) {
  ops_.push_back(Op{Op::Kind::kPut, t, std::move(key), std::move(value)});
}

void WriteBatch::Delete(Table t, std::string key) {
  ops_.push_back(Op{Op::Kind::kDelete, t, std::move(key), {}});
}

void WriteBatch::DeletePrefix(Table t, std::string prefix) {
  ops_.push_back(Op{Op::Kind::kDeletePrefix, t, std::move(prefix), {}});
}

void WriteBatch::Append(WriteBatch&& other) {
  if (ops_.empty()) {
    ops_ = std::move(other.ops_);
  } else {
    ops_.reserve(ops_.size() + other.ops_.size());
    for (auto& op : other.ops_) ops_.push_back(std::move(op));
  }
  other.ops_.clear();
}

std::string StepPrefix(const std::string& session) {
  assert(session.find('\0') == std::string::npos && "session names cannot hold NUL");
  std::string key = session;
  key.push_back('\0');
  return key;
}

std::string StepKey(const std::string& session, uint64_t index) {
  std::string key = StepPrefix(session);
  // Big-endian so byte order (RocksDB's comparator) is numeric order.
  for (int shift = 56; shift >= 0; shift -= 8) {
    key.push_back(static_cast<char>((index >> shift) & 0xff));
  }
  return key;
}

bool ParseStepKey(const std::string& key, std::string* session, uint64_t* index) {
  if (key.size() < kIndexBytes + 1) return false;
  size_t sep = key.size() - kIndexBytes - 1;
  if (key[sep] != '\0') return false;
  // A NUL earlier on would mean a session name StepKey refuses to build.
  if (key.find('\0') != sep) return false;
  uint64_t v = 0;
  for (size_t i = sep + 1; i < key.size(); ++i) {
    v = (v << 8) | static_cast<unsigned char>(key[i]);
  }
  if (session) *session = key.substr(0, sep);
  if (index) *index = v;
  return true;
}

std::string PrintableKey(Table t, const std::string& key) {
  std::string session;
  uint64_t index = 0;
  if (t == Table::kSteps && ParseStepKey(key, &session, &index)) {
    return EscapeBytes(session) + "#" + std::to_string(index);
  }
  return EscapeBytes(key);
}

}  // namespace dsec::state
