#include "drivers/net/nft_wire.hpp"

#include <arpa/inet.h>
#include <endian.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

namespace dsec::net {

namespace {

constexpr size_t kScratch = 64 << 10;

// The header every nf_tables message starts with.
nlmsghdr* PutHeader(char* at, uint16_t type, uint16_t flags, uint32_t seq, uint16_t res_id) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(at);
  nlh->nlmsg_type = type;
  nlh->nlmsg_flags = NLM_F_REQUEST | flags;
  nlh->nlmsg_seq = seq;
  auto* g = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  g->nfgen_family = res_id ? AF_UNSPEC : NFPROTO_INET;
  g->version = NFNETLINK_V0;
  g->res_id = htons(res_id);
  return nlh;
}

}  // namespace

NftBatch::NftBatch() : scratch_(kScratch) {}

nlmsghdr* NftBatch::Begin(uint16_t type, uint16_t flags, std::string what) {
  if (open_) End();
  open_ = true;
  what_.push_back(std::move(what));
  return PutHeader(scratch_.data(), static_cast<uint16_t>((NFNL_SUBSYS_NFTABLES << 8) | type), NLM_F_ACK | flags, 0,
                   0);
}

void NftBatch::End() {
  if (!open_) return;
  open_ = false;
  auto* nlh = reinterpret_cast<nlmsghdr*>(scratch_.data());
  buf_.insert(buf_.end(), scratch_.data(), scratch_.data() + MNL_ALIGN(nlh->nlmsg_len));
}

Result<std::unique_ptr<NftSocket>> NftSocket::Open() {
  std::unique_ptr<NftSocket> s(new NftSocket());
  s->nl_ = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (!s->nl_) return Status::FromErrno(errno, "nf_tables netlink socket");
  if (mnl_socket_bind(s->nl_, 0, MNL_SOCKET_AUTOPID) < 0) return Status::FromErrno(errno, "nf_tables netlink bind");
  s->portid_ = mnl_socket_get_portid(s->nl_);
  int one = 1;
  // Acks without the request echoed; big batches (256 entries) fit one send.
  (void)mnl_socket_setsockopt(s->nl_, NETLINK_CAP_ACK, &one, sizeof one);
  int size = 8 << 20;
  (void)::setsockopt(mnl_socket_get_fd(s->nl_), SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size);
  (void)::setsockopt(mnl_socket_get_fd(s->nl_), SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size);
  // A kernel that never answers is an error, not a hang.
  timeval tv{10, 0};
  (void)::setsockopt(mnl_socket_get_fd(s->nl_), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return s;
}

NftSocket::~NftSocket() {
  if (nl_) mnl_socket_close(nl_);
}

Status NftSocket::Commit(const NftBatch& in) {
  if (in.open_) return Status::Internal("nf_tables batch committed with a message still open");
  if (in.empty()) return Status::Ok();
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<char> out;
  out.reserve(in.buf_.size() + 2 * MNL_NLMSG_HDRLEN + 2 * 16);
  char head[64];
  uint32_t first = ++seq_;
  nlmsghdr* b = PutHeader(head, NFNL_MSG_BATCH_BEGIN, 0, first, NFNL_SUBSYS_NFTABLES);
  out.insert(out.end(), head, head + b->nlmsg_len);
  size_t msgs_at = out.size();
  out.insert(out.end(), in.buf_.begin(), in.buf_.end());
  for (size_t off = msgs_at; off < out.size();) {
    auto* nlh = reinterpret_cast<nlmsghdr*>(out.data() + off);
    nlh->nlmsg_seq = ++seq_;
    off += MNL_ALIGN(nlh->nlmsg_len);
  }
  b = PutHeader(head, NFNL_MSG_BATCH_END, 0, ++seq_, NFNL_SUBSYS_NFTABLES);
  out.insert(out.end(), head, head + b->nlmsg_len);
  if (mnl_socket_sendto(nl_, out.data(), out.size()) < 0) return Status::FromErrno(errno, "send an nf_tables batch");

  // One answer per message (errors are sent once the whole batch ran, the
  // acks of the messages that passed with them); one for the batch's
  // header instead when the kernel refused the batch as a whole.
  size_t want = in.what_.size(), got = 0;
  int err = 0;
  std::string failed;
  std::vector<char> rx(MNL_SOCKET_BUFFER_SIZE * 4);
  while (got < want) {
    ssize_t n = mnl_socket_recvfrom(nl_, rx.data(), rx.size());
    if (n < 0) return Status::FromErrno(errno, "read nf_tables' answer to a batch of " + std::to_string(want));
    int len = static_cast<int>(n);
    for (auto* nlh = reinterpret_cast<nlmsghdr*>(rx.data()); mnl_nlmsg_ok(nlh, len); nlh = mnl_nlmsg_next(nlh, &len)) {
      if (nlh->nlmsg_type != NLMSG_ERROR || nlh->nlmsg_seq < first || nlh->nlmsg_seq > seq_) continue;
      auto* e = static_cast<nlmsgerr*>(mnl_nlmsg_get_payload(nlh));
      if (nlh->nlmsg_seq == first) {  // the batch itself
        return Status::FromErrno(-e->error, "nf_tables refused a batch of " + std::to_string(want) + " messages");
      }
      ++got;
      if (e->error != 0 && !err) {
        err = -e->error;
        size_t i = nlh->nlmsg_seq - first - 1;
        failed = i < in.what_.size() ? in.what_[i] : "message " + std::to_string(i);
      }
    }
  }
  if (err) return Status::FromErrno(err, "nf_tables refused " + failed);
  return Status::Ok();
}

Result<uint64_t> NftSocket::CounterPackets(const std::string& table, const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  char buf[512];
  uint32_t seq = ++seq_;
  nlmsghdr* nlh = PutHeader(buf, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ, NLM_F_ACK, seq, 0);
  mnl_attr_put_strz(nlh, NFTA_OBJ_TABLE, table.c_str());
  mnl_attr_put_strz(nlh, NFTA_OBJ_NAME, name.c_str());
  mnl_attr_put_u32(nlh, NFTA_OBJ_TYPE, htonl(NFT_OBJECT_COUNTER));
  if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) return Status::FromErrno(errno, "ask nf_tables for " + name);
  std::vector<char> rx(MNL_SOCKET_BUFFER_SIZE);
  struct Got {
    uint64_t packets = 0;
    bool seen = false;
  } got;
  auto on_obj = [](const nlmsghdr* m, void* data) -> int {
    auto* g = static_cast<Got*>(data);
    // Casts: libmnl's attribute walks are C macros over void*.
    const char* end = static_cast<const char*>(mnl_nlmsg_get_payload_tail(m));
    for (auto* a = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(m, sizeof(nfgenmsg)));
         mnl_attr_ok(a, static_cast<int>(end - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
      if (mnl_attr_get_type(a) != NFTA_OBJ_DATA) continue;
      const char* in_end = reinterpret_cast<const char*>(a) + a->nla_len;
      for (auto* in = static_cast<const nlattr*>(mnl_attr_get_payload(a));
           mnl_attr_ok(in, static_cast<int>(in_end - reinterpret_cast<const char*>(in))); in = mnl_attr_next(in))
        if (mnl_attr_get_type(in) == NFTA_COUNTER_PACKETS && mnl_attr_get_payload_len(in) == 8) {
          g->packets = be64toh(mnl_attr_get_u64(in));
          g->seen = true;
        }
    }
    return MNL_CB_OK;
  };
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(nl_, rx.data(), rx.size());
    if (n < 0) return Status::FromErrno(errno, "read nf_tables' answer for " + name);
    int rc = mnl_cb_run(rx.data(), static_cast<size_t>(n), seq, portid_, on_obj, &got);
    if (rc == MNL_CB_ERROR) return Status::FromErrno(errno, "nf_tables: counter " + name + " of table " + table);
    if (rc == MNL_CB_STOP) break;
  }
  if (!got.seen) return Status::NotFound("nf_tables: counter " + name + " of table " + table + " has no packet count");
  return got.packets;
}

}  // namespace dsec::net
