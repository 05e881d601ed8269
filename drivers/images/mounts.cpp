#include "drivers/images/mounts.hpp"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "runtime/files.hpp"

namespace dsec::images {

namespace {
std::string Hex(const std::string& digest) {
  return digest.rfind("sha256:", 0) == 0 ? digest.substr(7) : digest;
}
}  // namespace

ImageMounts::ImageMounts(std::string dir) : dir_(std::move(dir)) { (void)MakeDirs(dir_, 0755); }

std::string ImageMounts::PathFor(const std::string& digest) const { return dir_ + "/" + Hex(digest); }

Result<std::string> ImageMounts::Acquire(const v1::ImageManifest& image) {
  std::lock_guard<std::mutex> lk(mu_);
  std::string path = PathFor(image.digest());
  auto it = refs_.find(image.digest());
  if (it != refs_.end()) {
    ++it->second;
    return path;
  }
  if (::mkdir(path.c_str(), 0755) < 0 && errno != EEXIST) return Status::FromErrno(errno, "image mount point " + path);
  // mount(2) of the file itself: EROFS reads blocks on demand, no loop device.
  if (::mount(image.file().c_str(), path.c_str(), "erofs", MS_RDONLY | MS_NODEV | MS_NOSUID, nullptr) < 0) {
    int e = errno;
    ::rmdir(path.c_str());
    return Status::FromErrno(e, "mount image " + image.name() + " (" + image.file() + ") at " + path +
                                    (e == ENODEV ? " (this kernel has no EROFS)" : ""));
  }
  refs_[image.digest()] = 1;
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
  auto it = refs_.find(digest);
  if (it == refs_.end()) return;
  if (--it->second > 0) return;
  refs_.erase(it);
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
      (void)Unmount(it->first);
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
