#include "drivers/net/link.hpp"

// <net/if.h> before the kernel's headers: then they leave its IFF_* alone.
#include <net/if.h>

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/if_tun.h>
#include <linux/veth.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "drivers/net/policy.hpp"

namespace dsec::net {

namespace {

// A route netlink socket of the calling thread's network namespace.
class Rtnl {
 public:
  static Result<std::unique_ptr<Rtnl>> Open() {
    std::unique_ptr<Rtnl> r(new Rtnl());
    r->nl_ = mnl_socket_open(NETLINK_ROUTE);
    if (!r->nl_) return Status::FromErrno(errno, "rtnetlink socket");
    if (mnl_socket_bind(r->nl_, 0, MNL_SOCKET_AUTOPID) < 0) return Status::FromErrno(errno, "rtnetlink bind");
    r->portid_ = mnl_socket_get_portid(r->nl_);
    return r;
  }
  ~Rtnl() {
    if (nl_) mnl_socket_close(nl_);
  }
  Rtnl(const Rtnl&) = delete;
  Rtnl& operator=(const Rtnl&) = delete;

  // A new request of `type` with `flags` (NLM_F_REQUEST | NLM_F_ACK added).
  nlmsghdr* Begin(uint16_t type, uint16_t flags) {
    nlmsghdr* nlh = mnl_nlmsg_put_header(buf_.data());
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    nlh->nlmsg_seq = ++seq_;
    return nlh;
  }
  // Sends it and waits for the kernel's answer: Ok, or its errno naming
  // `what` (and in *err).
  Status Call(nlmsghdr* nlh, const std::string& what, int* err = nullptr) {
    auto fail = [&](int e) {
      if (err) *err = e;
      return Status::FromErrno(e, what);
    };
    if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) return fail(errno);
    std::vector<char> in(MNL_SOCKET_BUFFER_SIZE);
    for (;;) {
      ssize_t n = mnl_socket_recvfrom(nl_, in.data(), in.size());
      if (n < 0) return fail(errno);
      int rc = mnl_cb_run(in.data(), static_cast<size_t>(n), seq_, portid_, nullptr, nullptr);
      if (rc == MNL_CB_ERROR) return fail(errno);
      if (rc == MNL_CB_STOP) return Status::Ok();
    }
  }

 private:
  Rtnl() : buf_(MNL_SOCKET_BUFFER_SIZE) {}
  mnl_socket* nl_ = nullptr;
  uint32_t portid_ = 0, seq_ = 0;
  std::vector<char> buf_;
};

ifinfomsg* PutIfinfo(nlmsghdr* nlh) {
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  return ifm;
}

// The index of interface `name` of this namespace, or NotFound.
Result<unsigned> Index(const char* name) {
  unsigned index = if_nametoindex(name);
  if (!index) return Status::FromErrno(errno, std::string("no interface ") + name);
  return index;
}

Status Up(Rtnl& nl, const char* name) {
  auto index = Index(name);
  if (!index.ok()) return index.status();
  nlmsghdr* nlh = nl.Begin(RTM_NEWLINK, 0);
  ifinfomsg* ifm = PutIfinfo(nlh);
  ifm->ifi_index = static_cast<int>(*index);
  ifm->ifi_flags = IFF_UP;
  ifm->ifi_change = IFF_UP;
  return nl.Call(nlh, std::string("set ") + name + " up");
}

Status AddAddress(Rtnl& nl, const char* name, uint32_t addr, uint8_t prefix) {
  auto index = Index(name);
  if (!index.ok()) return index.status();
  nlmsghdr* nlh = nl.Begin(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifaddrmsg)));
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = prefix;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = *index;
  uint32_t be = htonl(addr);
  mnl_attr_put(nlh, IFA_LOCAL, sizeof be, &be);
  mnl_attr_put(nlh, IFA_ADDRESS, sizeof be, &be);
  return nl.Call(nlh, std::string("address ") + NetText(addr, prefix) + " on " + name);
}

Status DefaultRoute(Rtnl& nl, const char* name, uint32_t gateway) {
  auto index = Index(name);
  if (!index.ok()) return index.status();
  nlmsghdr* nlh = nl.Begin(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL);
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  rtm->rtm_family = AF_INET;
  rtm->rtm_table = RT_TABLE_MAIN;
  rtm->rtm_protocol = RTPROT_BOOT;
  rtm->rtm_scope = RT_SCOPE_UNIVERSE;
  rtm->rtm_type = RTN_UNICAST;
  uint32_t be = htonl(gateway);
  mnl_attr_put(nlh, RTA_GATEWAY, sizeof be, &be);
  mnl_attr_put_u32(nlh, RTA_OIF, *index);
  return nl.Call(nlh, std::string("default route via ") + Ipv4Text(gateway));
}

// The sandbox's end, from a thread in its namespace.
Status ConfigurePeer(const VethSpec& spec) {
  Status out;
  std::thread t([&] {
    if (::setns(spec.netns_fd, CLONE_NEWNET) != 0) {
      out = Status::FromErrno(errno, "enter the sandbox's network namespace");
      return;
    }
    auto nl = Rtnl::Open();
    if (!nl.ok()) {
      out = nl.status();
      return;
    }
    // `lo` is up since its namespace was made (the spawner's pool).
    out = AddAddress(**nl, "eth0", spec.addr, spec.prefix);
    if (out.ok()) out = Up(**nl, "eth0");
    if (out.ok()) out = DefaultRoute(**nl, "eth0", spec.gateway);
  });
  t.join();
  return out;
}

}  // namespace

Status MakeVeth(const VethSpec& spec) {
  if (spec.host_if.empty() || spec.host_if.size() >= IFNAMSIZ)
    return Status::InvalidArgument("interface name '" + spec.host_if + "' is not 1-15 bytes");
  auto nl = Rtnl::Open();
  if (!nl.ok()) return nl.status();
  // The host's end up as it is made (one round trip less).
  nlmsghdr* nlh = (*nl)->Begin(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
  ifinfomsg* host = PutIfinfo(nlh);
  host->ifi_flags = host->ifi_change = IFF_UP;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, spec.host_if.c_str());
  nlattr* info = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
  mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
  nlattr* data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
  nlattr* peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
  PutIfinfo(nlh);
  mnl_attr_put_strz(nlh, IFLA_IFNAME, "eth0");
  mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, static_cast<uint32_t>(spec.netns_fd));
  mnl_attr_nest_end(nlh, peer);
  mnl_attr_nest_end(nlh, data);
  mnl_attr_nest_end(nlh, info);
  DSEC_RETURN_IF_ERROR((*nl)->Call(nlh, "make veth " + spec.host_if));
  Status st = AddAddress(**nl, spec.host_if.c_str(), spec.gateway, spec.prefix);
  if (st.ok()) st = ConfigurePeer(spec);
  if (!st.ok()) {
    (void)RemoveLink(spec.host_if);  // best effort: the failure below is what the caller needs
    return st.Annotate("link " + spec.host_if);
  }
  return Status::Ok();
}

Status MakeTap(const VethSpec& spec) {
  if (spec.host_if.empty() || spec.host_if.size() >= IFNAMSIZ)
    return Status::InvalidArgument("interface name '" + spec.host_if + "' is not 1-15 bytes");
  {
    int fd = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open /dev/net/tun (for tap " + spec.host_if + ")");
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, spec.host_if.c_str(), IFNAMSIZ - 1);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    int err = 0;
    if (::ioctl(fd, TUNSETIFF, &ifr) < 0 || ::ioctl(fd, TUNSETPERSIST, 1) < 0) err = errno;
    ::close(fd);
    if (err) return Status::FromErrno(err, "make tap " + spec.host_if);
  }
  auto nl = Rtnl::Open();
  Status st = nl.ok() ? AddAddress(**nl, spec.host_if.c_str(), spec.gateway, spec.prefix) : nl.status();
  if (st.ok()) st = Up(**nl, spec.host_if.c_str());
  if (!st.ok()) {
    (void)RemoveLink(spec.host_if);
    return st.Annotate("link " + spec.host_if);
  }
  return Status::Ok();
}

Status RemoveLink(const std::string& name) {
  auto nl = Rtnl::Open();
  if (!nl.ok()) return nl.status();
  nlmsghdr* nlh = (*nl)->Begin(RTM_DELLINK, 0);
  PutIfinfo(nlh);
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  int err = 0;
  Status st = (*nl)->Call(nlh, "remove link " + name, &err);
  return err == ENODEV ? Status::Ok() : st;
}

}  // namespace dsec::net
