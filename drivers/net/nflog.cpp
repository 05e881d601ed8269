#include "drivers/net/nflog.hpp"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace dsec::net {

namespace {

// A config message for `group` carrying `attr` of `len` bytes; the
// kernel's answer.
Status Config(mnl_socket* nl, uint16_t group, uint16_t type, const void* attr, size_t len, const std::string& what) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
  nlh->nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  auto* g = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  g->nfgen_family = AF_UNSPEC;
  g->version = NFNETLINK_V0;
  g->res_id = htons(group);
  mnl_attr_put(nlh, type, len, attr);
  if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0) return Status::FromErrno(errno, what);
  ssize_t n = mnl_socket_recvfrom(nl, buf.data(), buf.size());
  if (n < 0) return Status::FromErrno(errno, what);
  if (mnl_cb_run(buf.data(), n, 0, 0, nullptr, nullptr) < 0) {
    if (errno == EBUSY) return Status::AlreadyExists(what + ": another program of this network namespace has it");
    return Status::FromErrno(errno, what);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Nflog>> Nflog::Open(uint16_t group) {
  std::unique_ptr<Nflog> l(new Nflog());
  l->nl_ = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (!l->nl_) return Status::FromErrno(errno, "nfnetlink socket");
  if (mnl_socket_bind(l->nl_, 0, MNL_SOCKET_AUTOPID) < 0) return Status::FromErrno(errno, "nfnetlink bind");
  std::string what = "the refusals' log group " + std::to_string(group);
  nfulnl_msg_config_cmd cmd{NFULNL_CFG_CMD_BIND};
  DSEC_RETURN_IF_ERROR(Config(l->nl_, group, NFULA_CFG_CMD, &cmd, sizeof cmd, what));
  nfulnl_msg_config_mode mode{};
  mode.copy_range = htonl(64);
  mode.copy_mode = NFULNL_COPY_PACKET;
  DSEC_RETURN_IF_ERROR(Config(l->nl_, group, NFULA_CFG_MODE, &mode, sizeof mode, what));
  // Each message at once (the kernel's default holds up to 100 for up to 1 s).
  uint32_t qthresh = htonl(1);
  DSEC_RETURN_IF_ERROR(Config(l->nl_, group, NFULA_CFG_QTHRESH, &qthresh, sizeof qthresh, what));
  int on = 1;  // a flood drops log messages; it never stops the reader
  (void)::setsockopt(l->fd(), SOL_NETLINK, NETLINK_NO_ENOBUFS, &on, sizeof on);
  return l;
}

Nflog::~Nflog() {
  if (nl_) mnl_socket_close(nl_);
}

int Nflog::fd() const { return mnl_socket_get_fd(nl_); }

int Nflog::ReadSome(char* buf, size_t size, LoggedPacket* out, int max) {
  ssize_t n = ::recv(fd(), buf, size, MSG_DONTWAIT);
  if (n <= 0) return -1;
  int count = 0;
  auto* nlh = reinterpret_cast<nlmsghdr*>(buf);
  int left = static_cast<int>(n);
  for (; mnl_nlmsg_ok(nlh, left) && count < max; nlh = mnl_nlmsg_next(nlh, &left)) {
    if (nlh->nlmsg_type != ((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET)) continue;
    const nlattr* prefix = nullptr;
    const nlattr* payload = nullptr;
    auto* tail = static_cast<const char*>(mnl_nlmsg_get_payload_tail(nlh));
    for (auto* a = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(nlh, sizeof(nfgenmsg)));
         mnl_attr_ok(a, static_cast<int>(tail - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
      if (mnl_attr_get_type(a) == NFULA_PREFIX) prefix = a;
      if (mnl_attr_get_type(a) == NFULA_PAYLOAD) payload = a;
    }
    if (!prefix || !payload) continue;
    const char* pp = static_cast<const char*>(mnl_attr_get_payload(prefix));
    std::string pre(pp, strnlen(pp, mnl_attr_get_payload_len(prefix)));
    if (pre.rfind("dsec ", 0) != 0) continue;
    LoggedPacket p;
    p.ifname = pre.substr(5, pre.find(' ', 5) - 5);
    const auto* ip = static_cast<const uint8_t*>(mnl_attr_get_payload(payload));
    size_t len = mnl_attr_get_payload_len(payload);
    if (len < 20 || (ip[0] >> 4) != 4) continue;
    size_t ihl = (ip[0] & 0xF) * 4;
    p.daddr = uint32_t{ip[16]} << 24 | uint32_t{ip[17]} << 16 | uint32_t{ip[18]} << 8 | ip[19];
    uint8_t proto = ip[9];
    p.proto = proto == IPPROTO_TCP ? "tcp" : proto == IPPROTO_UDP ? "udp" : proto == IPPROTO_ICMP ? "icmp"
                                                                                         : std::to_string(proto);
    if ((proto == IPPROTO_TCP || proto == IPPROTO_UDP) && len >= ihl + 4)
      p.dport = static_cast<uint16_t>(ip[ihl + 2] << 8 | ip[ihl + 3]);
    out[count++] = p;
  }
  return count;
}

}  // namespace dsec::net
