// Reads of watched files in containers (issue 29's read detector, DESIGN.md
// section 13): an image's watched list (ImageManifest.watched: git-watch's
// history past the checked-out commit) is marked in each container made on
// it with fanotify, one notification group per node, one inode mark per
// file on the container's own overlay inode. Only those inodes report, so
// no other file of any container costs more than the kernel's check that
// it has no mark; the container is known from the event's mount (each has
// its own mounts), the file from its inode.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::guard {

class ReadWatch {
 public:
  // Unavailable when the kernel lacks fanotify (or dsecd is not root).
  static Result<std::unique_ptr<ReadWatch>> Start(std::function<void(int level, const std::string&)> log);
  ~ReadWatch();
  ReadWatch(const ReadWatch&) = delete;
  ReadWatch& operator=(const ReadWatch&) = delete;

  // Marks `paths` (absolute in the container) in container `id`, whose
  // init is `init_pid`, as its files are now (resolved inside its root; a
  // path it lacks, or that is not a regular file, is skipped). How many
  // were marked. Again for the same id: its marks are added to.
  Result<size_t> Watch(const std::string& id, int init_pid, const std::vector<std::string>& paths);
  // The container went: its mounts are forgotten (its marks went with its
  // inodes).
  void Forget(const std::string& id);
  // Its reads since it was watched (in this dsecd), by path.
  std::map<std::string, uint64_t> Reads(const std::string& id) const;
  // Events lost to a full queue (the kernel's FAN_Q_OVERFLOW) since start.
  uint64_t Overflows() const;

 private:
  struct State;
  explicit ReadWatch(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace dsec::guard
