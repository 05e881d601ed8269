#include "drivers/guard/mask_layer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>

namespace dsec::guard {

namespace {

// `rel` (a directory of the image) in the layer, with the image's attributes.
Status Dir(const std::string& layer, const std::string& image_root, const std::string& rel) {
  std::string in_layer = layer + "/" + rel, in_image = image_root + "/" + rel;
  struct stat st;
  if (::lstat(in_layer.c_str(), &st) == 0) return Status::Ok();
  if (::lstat(in_image.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::InvalidArgument("hidden path's directory " + rel + " is not a directory of the image");
  if (::mkdir(in_layer.c_str(), 0700) != 0) return Status::FromErrno(errno, "mask layer: mkdir " + rel);
  if (::lchown(in_layer.c_str(), st.st_uid, st.st_gid) != 0 || ::chmod(in_layer.c_str(), st.st_mode & 07777) != 0)
    return Status::FromErrno(errno, "mask layer: the attributes of " + rel);
  timespec times[2] = {st.st_atim, st.st_mtim};
  (void)::utimensat(AT_FDCWD, in_layer.c_str(), times, AT_SYMLINK_NOFOLLOW);
  return Status::Ok();
}

}  // namespace

Status MakeMaskLayer(const std::string& layer, const std::string& image_root, const std::vector<std::string>& paths) {
  for (const auto& p : paths) {
    bool dotdot = p == ".." || p.rfind("../", 0) == 0 || p.find("/../") != std::string::npos ||
                  (p.size() >= 3 && p.compare(p.size() - 3, 3, "/..") == 0);
    if (p.empty() || p[0] == '/' || dotdot)
      return Status::InvalidArgument("mask layer: '" + p + "' is not a path relative to the task's root");
    for (size_t slash = p.find('/'); slash != std::string::npos; slash = p.find('/', slash + 1))
      DSEC_RETURN_IF_ERROR(Dir(layer, image_root, p.substr(0, slash)));
    std::string w = layer + "/" + p;
    if (::mknod(w.c_str(), S_IFCHR | 0, makedev(0, 0)) != 0 && errno != EEXIST)
      return Status::FromErrno(errno, "mask layer: the whiteout of " + p);
  }
  return Status::Ok();
}

}  // namespace dsec::guard
