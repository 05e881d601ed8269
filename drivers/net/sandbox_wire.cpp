// The per-sandbox batches of nft_wire.hpp: ruleset.cpp's Sandbox* and Pin,
// rule for rule, as nf_tables messages (the expressions nft compiles the
// same text to).
#include <arpa/inet.h>
#include <endian.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "drivers/net/nft_wire.hpp"

namespace dsec::net {

namespace {

// nft's datatypes of the sets' keys (how `nft list` prints them).
constexpr uint32_t kTypeIpv4 = 7, kTypeProto = 12, kTypeService = 13;
constexpr uint32_t kCtEstablishedRelated = 0x2 | 0x4;  // NF_CT_STATE_BIT(ESTABLISHED, RELATED)
constexpr size_t kElemsPerMessage = 256;

std::string Chain(const SandboxLink& l) { return "s_" + l.ifname; }
std::string Counter(const SandboxLink& l) { return "r_" + l.ifname; }
std::string NameSet(const SandboxLink& l, size_t i) { return "n" + std::to_string(i) + "_" + l.ifname; }

void U32(nlmsghdr* h, uint16_t type, uint32_t v) { mnl_attr_put_u32(h, type, htonl(v)); }
void Str(nlmsghdr* h, uint16_t type, const std::string& s) { mnl_attr_put_strz(h, type, s.c_str()); }
// A nested nft_data value.
void Data(nlmsghdr* h, uint16_t type, const void* p, size_t n) {
  nlattr* d = mnl_attr_nest_start(h, type);
  mnl_attr_put(h, NFTA_DATA_VALUE, n, p);
  mnl_attr_nest_end(h, d);
}
void Verdict(nlmsghdr* h, uint16_t type, int code, const std::string& chain) {
  nlattr* d = mnl_attr_nest_start(h, type);
  nlattr* v = mnl_attr_nest_start(h, NFTA_DATA_VERDICT);
  U32(h, NFTA_VERDICT_CODE, static_cast<uint32_t>(code));
  if (!chain.empty()) Str(h, NFTA_VERDICT_CHAIN, chain);
  mnl_attr_nest_end(h, v);
  mnl_attr_nest_end(h, d);
}

// A rule's expressions, one at a time: Expr("name", [&] { attributes }).
class RuleMsg {
 public:
  RuleMsg(NftBatch& b, const NodeNet& n, const SandboxLink& l, const std::string& what) {
    h_ = b.Begin(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, "a rule of chain " + Chain(l) + " (" + what + ")");
    Str(h_, NFTA_RULE_TABLE, n.table);
    Str(h_, NFTA_RULE_CHAIN, Chain(l));
    list_ = mnl_attr_nest_start(h_, NFTA_RULE_EXPRESSIONS);
  }
  template <typename F>
  void Expr(const char* name, F fill) {
    nlattr* e = mnl_attr_nest_start(h_, NFTA_LIST_ELEM);
    mnl_attr_put_strz(h_, NFTA_EXPR_NAME, name);
    nlattr* d = mnl_attr_nest_start(h_, NFTA_EXPR_DATA);
    fill(h_);
    mnl_attr_nest_end(h_, d);
    mnl_attr_nest_end(h_, e);
  }
  void Meta(uint32_t key) {
    Expr("meta", [&](nlmsghdr* h) { U32(h, NFTA_META_DREG, NFT_REG_1), U32(h, NFTA_META_KEY, key); });
  }
  void Cmp(uint32_t op, const void* p, size_t n) {
    Expr("cmp", [&](nlmsghdr* h) {
      U32(h, NFTA_CMP_SREG, NFT_REG_1), U32(h, NFTA_CMP_OP, op), Data(h, NFTA_CMP_DATA, p, n);
    });
  }
  void Payload(uint32_t base, uint32_t offset, uint32_t len) {
    Expr("payload", [&](nlmsghdr* h) {
      U32(h, NFTA_PAYLOAD_DREG, NFT_REG_1), U32(h, NFTA_PAYLOAD_BASE, base);
      U32(h, NFTA_PAYLOAD_OFFSET, offset), U32(h, NFTA_PAYLOAD_LEN, len);
    });
  }
  void Lookup(const std::string& set, uint32_t id, bool invert) {
    Expr("lookup", [&](nlmsghdr* h) {
      Str(h, NFTA_LOOKUP_SET, set);
      if (id) U32(h, NFTA_LOOKUP_SET_ID, id);
      U32(h, NFTA_LOOKUP_SREG, NFT_REG_1);
      if (invert) U32(h, NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
    });
  }
  void Jump(int code, const std::string& chain = "") {
    Expr("immediate", [&](nlmsghdr* h) {
      U32(h, NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT), Verdict(h, NFTA_IMMEDIATE_DATA, code, chain);
    });
  }
  // `meta nfproto ipv4`: what nft puts before an IPv4 match in an inet table.
  void Ipv4() {
    uint8_t v = NFPROTO_IPV4;
    Meta(NFT_META_NFPROTO), Cmp(NFT_CMP_EQ, &v, 1);
  }
  nlmsghdr* h() { return h_; }

 private:
  nlmsghdr* h_;
  nlattr* list_;
  friend void EndRule(NftBatch& b, RuleMsg& r);
};
void EndRule(NftBatch& b, RuleMsg& r) {
  mnl_attr_nest_end(r.h_, r.list_);
  b.End();
}

// An anonymous constant set in `b` of `keys` (each `len` bytes, network
// order); with `interval`, keys pair up as [first, last+1) (a last of the
// key space's end has no end element). Its batch id.
uint32_t AnonSet(NftBatch& b, const NodeNet& n, uint32_t type, uint32_t len, bool interval,
                 const std::vector<std::pair<std::vector<uint8_t>, bool>>& elems) {
  uint32_t id = b.NewSetId();
  nlmsghdr* h = b.Begin(NFT_MSG_NEWSET, NLM_F_CREATE, "an anonymous set");
  Str(h, NFTA_SET_TABLE, n.table);
  Str(h, NFTA_SET_NAME, "__set%d");
  U32(h, NFTA_SET_FLAGS, NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | (interval ? NFT_SET_INTERVAL : 0));
  U32(h, NFTA_SET_KEY_TYPE, type);
  U32(h, NFTA_SET_KEY_LEN, len);
  U32(h, NFTA_SET_ID, id);
  b.End();
  h = b.Begin(NFT_MSG_NEWSETELEM, NLM_F_CREATE, "an anonymous set's elements");
  Str(h, NFTA_SET_ELEM_LIST_TABLE, n.table);
  Str(h, NFTA_SET_ELEM_LIST_SET, "__set%d");
  U32(h, NFTA_SET_ELEM_LIST_SET_ID, id);
  nlattr* list = mnl_attr_nest_start(h, NFTA_SET_ELEM_LIST_ELEMENTS);
  for (const auto& [key, end] : elems) {
    nlattr* e = mnl_attr_nest_start(h, NFTA_LIST_ELEM);
    Data(h, NFTA_SET_ELEM_KEY, key.data(), key.size());
    if (end) U32(h, NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
    mnl_attr_nest_end(h, e);
  }
  mnl_attr_nest_end(h, list);
  b.End();
  return id;
}

std::vector<uint8_t> Be16(uint32_t v) { return {static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)}; }

// `meta l4proto tcp|udp|{ tcp, udp }` and `th dport ...` of `rule`; sets
// first (a rule names a set made before it in the batch).
struct Transport {
  uint32_t proto_set = 0, port_set = 0;
};
Transport TransportSets(NftBatch& b, const NodeNet& n, const Rule& r) {
  Transport t;
  if (r.proto == Proto::kAny)
    t.proto_set = AnonSet(b, n, kTypeProto, 1, false, {{{IPPROTO_TCP}, false}, {{IPPROTO_UDP}, false}});
  if (r.ports.size() > 1) {
    std::vector<PortRange> ports = r.ports;
    std::sort(ports.begin(), ports.end(), [](auto& a, auto& c) { return a.first < c.first; });
    std::vector<PortRange> merged;
    for (const auto& p : ports)
      if (!merged.empty() && p.first <= static_cast<uint32_t>(merged.back().last) + 1)
        merged.back().last = std::max(merged.back().last, p.last);
      else
        merged.push_back(p);
    std::vector<std::pair<std::vector<uint8_t>, bool>> elems;
    for (const auto& p : merged) {
      elems.push_back({Be16(p.first), false});
      if (p.last < 65535) elems.push_back({Be16(p.last + 1u), true});
    }
    t.port_set = AnonSet(b, n, kTypeService, 2, true, elems);
  }
  return t;
}
void PutTransport(RuleMsg& m, const Rule& r, const Transport& t) {
  m.Meta(NFT_META_L4PROTO);
  if (t.proto_set) {
    m.Lookup("__set%d", t.proto_set, false);
  } else {
    uint8_t p = r.proto == Proto::kTcp ? IPPROTO_TCP : IPPROTO_UDP;
    m.Cmp(NFT_CMP_EQ, &p, 1);
  }
  if (r.ports.empty()) return;
  m.Payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
  if (t.port_set) return m.Lookup("__set%d", t.port_set, false);
  uint16_t first = htons(r.ports[0].first), last = htons(r.ports[0].last);
  if (first == last) return m.Cmp(NFT_CMP_EQ, &first, 2);
  m.Expr("range", [&](nlmsghdr* h) {
    U32(h, NFTA_RANGE_SREG, NFT_REG_1), U32(h, NFTA_RANGE_OP, NFT_RANGE_EQ);
    Data(h, NFTA_RANGE_FROM_DATA, &first, 2), Data(h, NFTA_RANGE_TO_DATA, &last, 2);
  });
}

// `verb` (NFT_MSG_NEWSET, NFT_MSG_DELSET) the name sets of `p`'s name
// entries; the new ones' batch ids by entry.
std::vector<uint32_t> NameSets(NftBatch& b, const NodeNet& n, const SandboxLink& l, const Policy& p, uint16_t verb) {
  std::vector<uint32_t> ids(p.rules.size());
  for (size_t i = 0; i < p.rules.size(); ++i) {
    if (!p.rules[i].is_name()) continue;
    bool add = verb == NFT_MSG_NEWSET;
    nlmsghdr* h = b.Begin(verb, add ? NLM_F_CREATE : 0, "set " + NameSet(l, i));
    Str(h, NFTA_SET_TABLE, n.table);
    Str(h, NFTA_SET_NAME, NameSet(l, i));
    if (add) {
      ids[i] = b.NewSetId();
      U32(h, NFTA_SET_FLAGS, NFT_SET_TIMEOUT);
      U32(h, NFTA_SET_KEY_TYPE, kTypeIpv4);
      U32(h, NFTA_SET_KEY_LEN, 4);
      U32(h, NFTA_SET_ID, ids[i]);
    }
    b.End();
  }
  return ids;
}

// ruleset.cpp's Fill: the sandbox chain's rules for `p`.
void Fill(NftBatch& b, const NodeNet& n, const SandboxLink& l, const Policy& p, const std::vector<uint32_t>& set_ids) {
  {
    RuleMsg m(b, n, l, "established");
    uint32_t mask = kCtEstablishedRelated, zero = 0;
    m.Expr("ct", [](nlmsghdr* h) { U32(h, NFTA_CT_DREG, NFT_REG_1), U32(h, NFTA_CT_KEY, NFT_CT_STATE); });
    m.Expr("bitwise", [&](nlmsghdr* h) {
      U32(h, NFTA_BITWISE_SREG, NFT_REG_1), U32(h, NFTA_BITWISE_DREG, NFT_REG_1), U32(h, NFTA_BITWISE_LEN, 4);
      Data(h, NFTA_BITWISE_MASK, &mask, 4), Data(h, NFTA_BITWISE_XOR, &zero, 4);
    });
    m.Cmp(NFT_CMP_NEQ, &zero, 4);
    m.Jump(NF_ACCEPT);
    EndRule(b, m);
  }
  for (size_t i = 0; i < p.rules.size(); ++i) {
    const Rule& r = p.rules[i];
    Transport t = TransportSets(b, n, r);
    RuleMsg m(b, n, l, r.text);
    m.Ipv4();
    m.Payload(NFT_PAYLOAD_NETWORK_HEADER, 16, 4);  // ip daddr
    if (r.is_name()) {
      m.Lookup(NameSet(l, i), set_ids[i], false);
    } else {
      uint32_t mask = r.prefix ? htonl(~uint32_t{0} << (32 - r.prefix)) : 0, net = htonl(r.addr) & mask, zero = 0;
      if (r.prefix < 32)
        m.Expr("bitwise", [&](nlmsghdr* h) {
          U32(h, NFTA_BITWISE_SREG, NFT_REG_1), U32(h, NFTA_BITWISE_DREG, NFT_REG_1), U32(h, NFTA_BITWISE_LEN, 4);
          Data(h, NFTA_BITWISE_MASK, &mask, 4), Data(h, NFTA_BITWISE_XOR, &zero, 4);
        });
      m.Cmp(NFT_CMP_EQ, &net, 4);
    }
    PutTransport(m, r, t);
    m.Jump(NF_ACCEPT);
    EndRule(b, m);
  }
  if (p.mode == v1::NETWORK_MODE_OPEN) {
    Rule any;
    Transport t = TransportSets(b, n, any);
    RuleMsg m(b, n, l, "open");
    m.Ipv4();
    m.Payload(NFT_PAYLOAD_NETWORK_HEADER, 16, 4);
    m.Lookup("special", 0, true);
    PutTransport(m, any, t);
    m.Jump(NF_ACCEPT);
    EndRule(b, m);
  }
  if (n.log_group) {
    RuleMsg m(b, n, l, "log");
    m.Expr("limit", [&](nlmsghdr* h) {
      mnl_attr_put_u64(h, NFTA_LIMIT_RATE, htobe64(n.log_rate));
      mnl_attr_put_u64(h, NFTA_LIMIT_UNIT, htobe64(1));
      U32(h, NFTA_LIMIT_BURST, 5), U32(h, NFTA_LIMIT_TYPE, NFT_LIMIT_PKTS), U32(h, NFTA_LIMIT_FLAGS, 0);
    });
    m.Expr("log", [&](nlmsghdr* h) {
      mnl_attr_put_u16(h, NFTA_LOG_GROUP, htons(n.log_group));
      Str(h, NFTA_LOG_PREFIX, "dsec " + l.ifname + " ");
    });
    EndRule(b, m);
  }
  RuleMsg m(b, n, l, "refuse");
  m.Expr("objref", [&](nlmsghdr* h) {
    U32(h, NFTA_OBJREF_IMM_TYPE, NFT_OBJECT_COUNTER), Str(h, NFTA_OBJREF_IMM_NAME, Counter(l));
  });
  m.Jump(NFT_JUMP, "refuse");
  EndRule(b, m);
}

// One element of `set`: `key`, and a verdict jumping to `chain` when not empty.
void Element(NftBatch& b, const NodeNet& n, const std::string& set, uint16_t verb, const void* key, size_t len,
             const std::string& chain) {
  nlmsghdr* h = b.Begin(verb, verb == NFT_MSG_NEWSETELEM ? NLM_F_CREATE : 0, "an element of set " + set);
  Str(h, NFTA_SET_ELEM_LIST_TABLE, n.table);
  Str(h, NFTA_SET_ELEM_LIST_SET, set);
  nlattr* list = mnl_attr_nest_start(h, NFTA_SET_ELEM_LIST_ELEMENTS);
  nlattr* e = mnl_attr_nest_start(h, NFTA_LIST_ELEM);
  Data(h, NFTA_SET_ELEM_KEY, key, len);
  if (!chain.empty()) Verdict(h, NFTA_SET_ELEM_DATA, NFT_JUMP, chain);
  mnl_attr_nest_end(h, e);
  mnl_attr_nest_end(h, list);
  b.End();
}
void Egress(NftBatch& b, const NodeNet& n, const SandboxLink& l, uint16_t verb) {
  char ifname[IFNAMSIZ] = {};
  std::strncpy(ifname, l.ifname.c_str(), IFNAMSIZ - 1);
  Element(b, n, "egress", verb, ifname, IFNAMSIZ, verb == NFT_MSG_NEWSETELEM ? Chain(l) : "");
}
void Exposed(NftBatch& b, const NodeNet& n, const SandboxLink& l, const Policy& p, uint16_t verb) {
  for (uint16_t port : p.expose) {
    uint8_t key[8] = {};  // ipv4_addr . inet_service, each in a 4-byte register
    uint32_t a = htonl(l.addr);
    uint16_t pt = htons(port);
    std::memcpy(key, &a, 4), std::memcpy(key + 4, &pt, 2);
    Element(b, n, "exposed", verb, key, sizeof key, "");
  }
}
void Object(NftBatch& b, const NodeNet& n, const std::string& name, uint16_t verb) {
  nlmsghdr* h = b.Begin(verb, verb == NFT_MSG_NEWOBJ ? NLM_F_CREATE : 0, "counter " + name);
  Str(h, NFTA_OBJ_TABLE, n.table);
  Str(h, NFTA_OBJ_NAME, name);
  U32(h, NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER);
  if (verb == NFT_MSG_NEWOBJ) {
    nlattr* d = mnl_attr_nest_start(h, NFTA_OBJ_DATA);
    mnl_attr_put_u64(h, NFTA_COUNTER_BYTES, 0), mnl_attr_put_u64(h, NFTA_COUNTER_PACKETS, 0);
    mnl_attr_nest_end(h, d);
  }
  b.End();
}
void ChainMsg(NftBatch& b, const NodeNet& n, const SandboxLink& l, uint16_t verb, uint16_t flags) {
  nlmsghdr* h = b.Begin(verb, flags, "chain " + Chain(l));
  Str(h, NFTA_CHAIN_TABLE, n.table);
  Str(h, verb == NFT_MSG_DELRULE ? uint16_t{NFTA_RULE_CHAIN} : uint16_t{NFTA_CHAIN_NAME}, Chain(l));
  b.End();
}

}  // namespace

void WireSandboxAdd(NftBatch& b, const NodeNet& n, const SandboxLink& l, const Policy& p) {
  ChainMsg(b, n, l, NFT_MSG_NEWCHAIN, NLM_F_CREATE);
  Object(b, n, Counter(l), NFT_MSG_NEWOBJ);
  auto ids = NameSets(b, n, l, p, NFT_MSG_NEWSET);
  Fill(b, n, l, p, ids);
  Exposed(b, n, l, p, NFT_MSG_NEWSETELEM);
  Egress(b, n, l, NFT_MSG_NEWSETELEM);  // last: until here the forward chain drops its packets
}

void WireSandboxReplace(NftBatch& b, const NodeNet& n, const SandboxLink& l, const Policy& old, const Policy& p) {
  ChainMsg(b, n, l, NFT_MSG_DELRULE, 0);  // flush: every rule of the chain
  NameSets(b, n, l, old, NFT_MSG_DELSET);
  auto ids = NameSets(b, n, l, p, NFT_MSG_NEWSET);
  Fill(b, n, l, p, ids);
}

void WireSandboxRemove(NftBatch& b, const NodeNet& n, const SandboxLink& l, const Policy& p) {
  Egress(b, n, l, NFT_MSG_DELSETELEM);  // first: nothing jumps to the chain while it goes
  ChainMsg(b, n, l, NFT_MSG_DELCHAIN, 0);
  Object(b, n, Counter(l), NFT_MSG_DELOBJ);
  NameSets(b, n, l, p, NFT_MSG_DELSET);
  Exposed(b, n, l, p, NFT_MSG_DELSETELEM);
}

void WirePin(NftBatch& b, const NodeNet& n, const SandboxLink& l, size_t i, const std::vector<uint32_t>& addrs,
             uint32_t ttl_s) {
  uint64_t ms = htobe64(uint64_t{std::max<uint32_t>(ttl_s, 1)} * 1000);
  for (size_t at = 0; at < addrs.size(); at += kElemsPerMessage) {
    nlmsghdr* h = b.Begin(NFT_MSG_NEWSETELEM, NLM_F_CREATE, "the addresses pinned in set " + NameSet(l, i));
    Str(h, NFTA_SET_ELEM_LIST_TABLE, n.table);
    Str(h, NFTA_SET_ELEM_LIST_SET, NameSet(l, i));
    nlattr* list = mnl_attr_nest_start(h, NFTA_SET_ELEM_LIST_ELEMENTS);
    for (size_t k = at; k < addrs.size() && k < at + kElemsPerMessage; ++k) {
      nlattr* e = mnl_attr_nest_start(h, NFTA_LIST_ELEM);
      uint32_t a = htonl(addrs[k]);
      Data(h, NFTA_SET_ELEM_KEY, &a, 4);
      mnl_attr_put_u64(h, NFTA_SET_ELEM_TIMEOUT, ms);
      mnl_attr_nest_end(h, e);
    }
    mnl_attr_nest_end(h, list);
    b.End();
  }
}

}  // namespace dsec::net
