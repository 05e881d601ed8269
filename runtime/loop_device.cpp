#include "runtime/loop_device.hpp"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dsec {

Result<std::string> AttachLoop(const std::string& file, bool read_only, UniqueFd* held) {
  UniqueFd ctl(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!ctl)
    return Status::FailedPrecondition(std::string("no /dev/loop-control (loop devices: modprobe loop): ") +
                                      std::strerror(errno));
  UniqueFd img(::open(file.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC));
  if (!img) return Status::FromErrno(errno, "open " + file);
  for (int attempt = 0; attempt < 16; ++attempt) {
    int n = ::ioctl(ctl.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return Status::FromErrno(errno, "find a free loop device");
    std::string dev = "/dev/loop" + std::to_string(n);
    UniqueFd loop(::open(dev.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC));
    if (!loop) return Status::FromErrno(errno, "open " + dev);
    loop_config cfg{};
    cfg.fd = static_cast<__u32>(img.get());
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (read_only ? LO_FLAGS_READ_ONLY : 0);
    std::strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), file.c_str(), LO_NAME_SIZE - 1);
    if (::ioctl(loop.get(), LOOP_CONFIGURE, &cfg) == 0) {
      *held = std::move(loop);
      return dev;
    }
    if (errno != EBUSY) return Status::FromErrno(errno, "bind " + dev + " to " + file);
    // Taken by someone else between the two calls: the next one.
  }
  return Status::ResourceExhausted("no free loop device for " + file);
}

}  // namespace dsec
