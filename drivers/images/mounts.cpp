#include "drivers/images/mounts.hpp"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "runtime/files.hpp"
#include "runtime/loop_device.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::images {

namespace {
std::string Hex(const std::string& digest) {
  return digest.rfind("sha256:", 0) == 0 ? digest.substr(7) : digest;
}
// mount(2) of the file itself: EROFS reads blocks on demand, no loop device
// (Linux 6.12 and later). An older kernel (Debian 12's 6.1) wants a block
// device (ENOTBLK): then a read-only loop device over the file, which goes
// with the mount (autoclear).
Status MountImageFile(const std::string& file, const std::string& at) {
  constexpr unsigned long kFlags = MS_RDONLY | MS_NODEV | MS_NOSUID;
  if (::mount(file.c_str(), at.c_str(), "erofs", kFlags, nullptr) == 0) return Status::Ok();
  int e = errno;
  if (e == ENODEV) return Status::FailedPrecondition("this kernel has no EROFS (modprobe erofs)");
  if (e != ENOTBLK) return Status::FromErrno(e, "erofs");
  UniqueFd held;
  auto dev = AttachLoop(file, /*read_only=*/true, &held);
  if (!dev.ok())
    return Status(dev.status().code(), "this kernel mounts EROFS from block devices only, and " + dev.status().message());
  if (::mount(dev->c_str(), at.c_str(), "erofs", kFlags, nullptr) < 0)
    return Status::FromErrno(errno, "erofs on " + *dev);
  return Status::Ok();
}

}  // namespace

// A dir that cannot be made fails the first Acquire, saying why.
ImageMounts::ImageMounts(std::string dir) : dir_(std::move(dir)) { (void)MakeDirs(dir_, 0755); }

std::string ImageMounts::PathFor(const std::string& digest) const { return dir_ + "/" + Hex(digest); }

Result<std::string> ImageMounts::Acquire(const v1::ImageManifest& image) {
  std::lock_guard<std::mutex> lk(mu_);
  std::string path = PathFor(image.digest());
  auto it = refs_.find(image.digest());
  if (it != refs_.end()) {
    // A lazy image's file is served by dsec-lazyfs: if that died and was
    // started again, the mount reads through the dead one. Its users keep
    // it (detached); the image is mounted afresh for the new ones.
    struct stat now;
    bool readable = ::stat(image.file().c_str(), &now) == 0;
    auto dev = dev_.find(image.digest());
    bool moved = readable && dev != dev_.end() && dev->second != 0 && dev->second != now.st_dev;
    if (readable && !moved) {
      ++it->second;
      return path;
    }
    stale_[image.digest()] += it->second;
    refs_.erase(it);
    ::umount2(path.c_str(), MNT_DETACH);
  }
  if (::mkdir(path.c_str(), 0755) < 0 && errno != EEXIST) return Status::FromErrno(errno, "image mount point " + path);
  Status mounted = MountImageFile(image.file(), path);
  if (!mounted.ok()) {
    ::rmdir(path.c_str());
    return Status(mounted.code(), "mount image " + image.name() + " (" + image.file() + ") at " + path + ": " +
                                      mounted.message());
  }
  refs_[image.digest()] = 1;
  struct stat file;
  dev_[image.digest()] = ::stat(image.file().c_str(), &file) == 0 ? file.st_dev : 0;
  return path;
}

Status ImageMounts::Unmount(const std::string& digest) {
  std::string path = PathFor(digest);
  if (::umount2(path.c_str(), MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
    return Status::FromErrno(errno, "unmount image " + path);
  ::rmdir(path.c_str());
  return Status::Ok();
}

void ImageMounts::Release(const std::string& digest) {
  std::lock_guard<std::mutex> lk(mu_);
  // The users of a mount left detached go first (any release counts: the
  // sum of users is what is right, and the new mount goes at its last).
  if (auto s = stale_.find(digest); s != stale_.end()) {
    if (--s->second == 0) stale_.erase(s);
    return;
  }
  auto it = refs_.find(digest);
  if (it == refs_.end()) return;
  if (--it->second > 0) return;
  refs_.erase(it);
  // Still mounted (busy): the next start's Adopt and DropUnused take it.
  (void)Unmount(digest);
}

void ImageMounts::Adopt() {
  std::lock_guard<std::mutex> lk(mu_);
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  std::string prefix = dir_ + "/";
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string id, parent, dev, root, mnt;
    ss >> id >> parent >> dev >> root >> mnt;
    if (mnt.rfind(prefix, 0) != 0) continue;
    std::string hex = mnt.substr(prefix.size());
    if (hex.find('/') != std::string::npos) continue;
    refs_.emplace("sha256:" + hex, 0);
  }
}

void ImageMounts::DropUnused() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = refs_.begin(); it != refs_.end();) {
    if (it->second == 0) {
      (void)Unmount(it->first);  // still busy: tried again at the next start
      it = refs_.erase(it);
    } else {
      ++it;
    }
  }
}

std::map<std::string, int> ImageMounts::Snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  return refs_;
}

}  // namespace dsec::images
