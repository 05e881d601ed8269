// The disk under container sandboxes: a btrfs filesystem mounted on
// <data>/sandboxes, from a sparse file of a fixed size (<data>/sandboxes.img,
// made at the first start, loop-mounted), with simple quotas on. Each
// sandbox dir is a subvolume with a quota group limit, so the kernel refuses
// a write past a sandbox's disk limit (EDQUOT) and the node's own disk holds
// at most the file: one sandbox can neither fill the node nor starve the
// others beyond the file's size. Usage is read from the quota tree (one
// ioctl, as of the last transaction commit). A removed sandbox's subvolume
// is deleted; its quota group goes with its data.
//
// Why btrfs: the kernels dsec runs on may lack quota formats (this machine
// kind has CONFIG_QUOTA but neither QFMT_V2 nor XFS_QUOTA: no ext4 or XFS
// project quotas), while btrfs quota groups need none. Raw ioctls only
// (loop-control, BTRFS_IOC_*); mkfs.btrfs (btrfs-progs) makes the file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dsec/status.hpp"

namespace dsec::drivers {

struct SandboxDiskOptions {
  std::string dir;            // <data>/sandboxes: the mount point
  std::string image;          // <data>/sandboxes.img
  uint64_t size_bytes = 64ull << 30;  // of a new image; at most 90% of the free space where it lives
  std::function<void(int level, const std::string& text)> log;
};

class SandboxDisk {
 public:
  // Mounts the filesystem on options.dir (making the image first when
  // there is none; an existing mount of it is used as it is).
  // FailedPrecondition saying what this host lacks.
  static Result<std::unique_ptr<SandboxDisk>> Open(SandboxDiskOptions options);
  ~SandboxDisk();

  // A new sandbox dir `name` under dir: an empty subvolume.
  Status MakeDir(const std::string& name);
  // Deletes the subvolume `name` and everything in it.
  Status RemoveDir(const std::string& name);
  // The most `name` may hold (its quota group's referenced bytes).
  Status SetLimit(const std::string& name, uint64_t bytes);
  // Bytes `name` holds, as of the last commit.
  Result<uint64_t> Usage(const std::string& name) const;
  // Unmounts (the loop device goes with it) when no sandbox dir is left in
  // it; with sandboxes left (they outlive dsecd) it stays for the next start.
  void Close();
  uint64_t size_bytes() const { return size_; }

 private:
  explicit SandboxDisk(SandboxDiskOptions o) : opts_(std::move(o)) {}
  Result<uint64_t> SubvolumeId(const std::string& name) const;
  void Log(int level, const std::string& text) const;
  SandboxDiskOptions opts_;
  uint64_t size_ = 0;
  bool closed_ = false;
};

}  // namespace dsec::drivers
