// The built-in `host` image as a sandbox root: a read-only tmpfs holding the
// host's /usr (and /bin, /lib*, /sbin as the host lays them out), a minimal
// generated /etc (no shadow, no keys), a few device nodes, and empty mount
// points for /proc, /tmp and /work. Built once per spawner in its own mount
// namespace; runners enter it with setns and copy it with unshare(CLONE_NEWNS),
// which costs a few mounts instead of the host's whole mount table.
// Mount syscalls live here and in runner.cpp only.
#pragma once

#include <sys/types.h>

#include <string>

#include "dsec/status.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::fncall {

struct RootOptions {
  uid_t uid = 65534;           // the sandbox user (owner of /work)
  gid_t gid = 65534;
  std::string user = "sandbox";
};

// Builds the root in a new mount namespace and returns an fd for it. Must be
// called while the process is single-threaded (it forks).
Result<UniqueFd> BuildHostRootNamespace(const RootOptions& opts);

// A mount namespace whose whole content is an empty read-only tmpfs with one
// directory, /mnt: what a container's mount namespace starts from. The
// container's root is mounted on /mnt and moved over /, so nothing of the
// host's mount table is ever in a container's namespace, and no
// pivot_root is needed (pivot_root walks every thread on the host, which
// grows with the containers up). Same calling rule as above.
Result<UniqueFd> BuildContainerBaseNamespace();

// The /etc entries copied from the host (everything else is generated).
const char* const* HostEtcAllowList();

}  // namespace dsec::fncall
