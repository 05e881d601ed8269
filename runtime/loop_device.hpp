// Loop devices, through raw ioctls (loop-control, LOOP_CONFIGURE): a file
// bound to a free /dev/loopN for a mount that needs a block device.
#pragma once

#include <string>

#include "dsec/status.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec {

// Binds `file` to a free loop device (read-only when `read_only`) and
// returns its path, the device held open in `*held`. The device detaches
// itself on its last close (autoclear): hold it until it is mounted, and it
// goes when the mount does (or at once, if the mount failed).
// FailedPrecondition when the host has no loop devices.
Result<std::string> AttachLoop(const std::string& file, bool read_only, UniqueFd* held);

}  // namespace dsec
