// What every OCI runtime gives a container: its own /etc/hosts (localhost
// and its hostname), /etc/hostname and /etc/resolv.conf. Written in
// <base>/run/etc/ and bound over the image's by the init (nothing of the
// image is copied, and they are not part of the container's changes).
#pragma once

#include <cstdint>
#include <string>

#include "dsec/status.hpp"
#include "dsec/v1/types.pb.h"

namespace dsec::drivers {

inline constexpr const char* kEtcFiles[] = {"hosts", "hostname", "resolv.conf", "machine-id"};

// `nameserver`: the sandbox's gateway, where its DNS goes (0: no network,
// no name server).
Status WriteEtcFiles(const std::string& base, const std::string& hostname, const v1::NetworkPolicy& net,
                     uint32_t nameserver = 0);

}  // namespace dsec::drivers
