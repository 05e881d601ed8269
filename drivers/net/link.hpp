// A sandbox's link to the node: a veth pair whose host end (`host_if`,
// the name ruleset.hpp keys a sandbox's rules on) holds the gateway
// address, and whose other end, moved into the sandbox's network
// namespace, is its eth0 with the sandbox's address and a default route
// through the gateway. Made through rtnetlink (libmnl), with no `ip`
// process per sandbox.
#pragma once

#include <cstdint>
#include <string>

#include "dsec/status.hpp"

namespace dsec::net {

struct VethSpec {
  std::string host_if;   // the host end's name (at most 15 bytes)
  uint32_t gateway = 0;  // the host end's address (host byte order)
  uint32_t addr = 0;     // the sandbox end's
  uint8_t prefix = 30;
  int netns_fd = -1;     // the sandbox's network namespace (an open fd)
};

// Makes the pair, from the calling thread's network namespace (the
// host's); on failure nothing of it is left. Errors name the step and the
// interface.
Status MakeVeth(const VethSpec& spec);
// A VM's link: a persistent tap named `spec.host_if` (IFF_VNET_HDR) with
// the gateway address, up, that the VM's QEMU opens by name; the guest's
// side is its virtio NIC, which its /init addresses (dsec.net=). netns_fd
// and addr are not used. On failure nothing of it is left.
Status MakeTap(const VethSpec& spec);
// Removes a link of this namespace by name (a veth pair goes whole); Ok
// when it is already gone.
Status RemoveLink(const std::string& name);

}  // namespace dsec::net
