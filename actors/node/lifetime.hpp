// When a plain sandbox ends: at its ttl, after its idle timeout (pause or
// destroy) or once its owner has been gone for the lease. Shared by the
// sandbox actor, which acts on it, and the node's listings, which show it.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "dsec/v1/types.pb.h"

namespace dsec {

struct SandboxEnd {
  int64_t at_ms = 0;         // 0: none
  const char* because = "";  // "ttl", "idle timeout", "owner gone"
  const char* action = "";   // "destroy", "pause"
};

// From the record; `busy`: an exec or file call is running (no idle period).
// rec.owner_gone_ms() says since when its owner has been gone (0: connected).
SandboxEnd NextEnd(const v1::SandboxRecord& rec, bool busy);

// A stored record as a listing shows it: its owner's absence as the node
// knows it (`gone_since`: owner -> since when; absent: connected) and its
// next end (expires_ms, expires_because, expiry_action; an exec running now
// is not known here, so an idle end may be shown that the exec postpones).
void ShowEnd(v1::SandboxRecord* rec, const std::unordered_map<std::string, int64_t>& gone_since);

}  // namespace dsec
