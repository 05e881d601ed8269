// Image mounts of a node: each image is mounted once, read-only, straight
// from its EROFS file with mount(2) (no loop device), at
// <run>/images/<hex digest>, and shared by every container of that image
// (one page cache). Reference-counted; unmounted when the last user goes.
// Mounts live in the host mount namespace, so they outlive a dsecd crash
// together with the containers using them; Adopt() takes them back.
#pragma once

#include <map>
#include <mutex>
#include <sys/types.h>
#include <string>
#include <vector>

#include "dsec/status.hpp"
#include "dsec/v1/types.pb.h"

namespace dsec::images {

class ImageMounts {
 public:
  explicit ImageMounts(std::string dir);  // <data>/run/images

  // The mount point of `image`, mounting it when nobody uses it yet.
  Result<std::string> Acquire(const v1::ImageManifest& image);
  // One user fewer; unmounts at zero.
  void Release(const std::string& digest);
  // After a restart: existing mounts under dir are adopted with no users;
  // call Acquire for each re-adopted sandbox, then DropUnused().
  void Adopt();
  void DropUnused();
  // Image digests mounted now, with their users.
  std::map<std::string, int> Snapshot() const;
  std::string PathFor(const std::string& digest) const;

 private:
  Status Unmount(const std::string& digest);
  std::string dir_;
  mutable std::mutex mu_;
  std::map<std::string, int> refs_;  // digest -> users
  std::map<std::string, dev_t> dev_;  // digest -> device of the file it was mounted from (0: unknown)
  std::map<std::string, int> stale_;  // digest -> users of a mount left detached (its file's server died)
};

}  // namespace dsec::images
