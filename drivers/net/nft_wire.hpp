// nf_tables over netlink, without libnftables: the per-sandbox changes
// (a sandbox's chain, counter, name sets, map entries; a policy change; a
// resolver's pin) built as netlink messages and sent as one transaction.
//
// Why not libnftables for these: before every command it reads back the
// chains, sets and objects of the whole ruleset (its cache), so a
// sandbox's rules cost more the more sandboxes the node has (0.57 ms with
// none, 1.54 ms with 240: docs/performance.md, net_bench). The batches
// here cost the same at any size. The node's table is still made from
// nft's own syntax (ruleset.hpp, NodeTable), once at start; ruleset.hpp's
// Sandbox* functions say the same batches in that syntax (what an operator
// reads in a failure's log) and net_ruleset_test checks that the kernel
// lists the same rules for both.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "drivers/net/policy.hpp"
#include "drivers/net/ruleset.hpp"
#include "dsec/status.hpp"

struct mnl_socket;
struct nlmsghdr;

namespace dsec::net {

// Messages to send as one transaction (NftSocket::Commit).
class NftBatch {
 public:
  NftBatch();
  // A new message of type NFT_MSG_* with `flags` (NLM_F_REQUEST and
  // NLM_F_ACK added); `what` names it in an error. Attributes go into the
  // returned header (at most 64 KiB in all) until the next Begin or End.
  nlmsghdr* Begin(uint16_t type, uint16_t flags, std::string what);
  void End();
  // An id for a set made in this batch (a rule names it before it exists).
  uint32_t NewSetId() { return ++set_ids_; }
  size_t size() const { return what_.size(); }
  bool empty() const { return what_.empty(); }

 private:
  friend class NftSocket;
  std::vector<char> scratch_, buf_;
  std::vector<std::string> what_;
  uint32_t set_ids_ = 0;
  bool open_ = false;
};

// A netlink socket to nf_tables in the namespace of the thread that opened it.
class NftSocket {
 public:
  static Result<std::unique_ptr<NftSocket>> Open();
  ~NftSocket();
  NftSocket(const NftSocket&) = delete;
  NftSocket& operator=(const NftSocket&) = delete;

  // Sends `batch` as one transaction: all of it applies, or none does
  // (then the kernel's error for the first message it refused, named).
  Status Commit(const NftBatch& batch);
  // The packets named counter `name` of inet table `table` counted.
  Result<uint64_t> CounterPackets(const std::string& table, const std::string& name);

 private:
  NftSocket() = default;
  std::mutex mu_;
  mnl_socket* nl_ = nullptr;
  uint32_t portid_ = 0, seq_ = 0;
};

// The per-sandbox batches (ruleset.hpp's Sandbox*, Pin), added to `b`.
void WireSandboxAdd(NftBatch& b, const NodeNet& node, const SandboxLink& link, const Policy& policy);
void WireSandboxReplace(NftBatch& b, const NodeNet& node, const SandboxLink& link, const Policy& old,
                        const Policy& policy);
void WireSandboxRemove(NftBatch& b, const NodeNet& node, const SandboxLink& link, const Policy& policy);
void WirePin(NftBatch& b, const NodeNet& node, const SandboxLink& link, size_t rule_index,
             const std::vector<uint32_t>& addrs, uint32_t ttl_s);

}  // namespace dsec::net
