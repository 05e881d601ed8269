#include "drivers/guard/task_paths.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dsec::guard {

Result<TaskPaths> FindTaskPaths(const std::string& root, const std::vector<PathGlob>& globs, size_t limit) {
  TaskPaths out;
  struct stat top;
  if (::lstat(root.c_str(), &top) != 0 || !S_ISDIR(top.st_mode))
    return Status::NotFound("the task's root " + root + " is not a directory of the image");
  std::vector<std::string> dirs = {""};
  while (!dirs.empty()) {
    std::string rel_dir = dirs.back();
    dirs.pop_back();
    std::string abs_dir = rel_dir.empty() ? root : root + "/" + rel_dir;
    DIR* d = ::opendir(abs_dir.c_str());
    if (!d) return Status::FromErrno(errno, "read the image's " + abs_dir);
    std::vector<std::pair<std::string, bool>> entries;
    while (dirent* e = ::readdir(d)) {
      if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
      bool dir = e->d_type == DT_DIR;
      if (e->d_type == DT_UNKNOWN) {
        struct stat st;
        dir = ::lstat((abs_dir + "/" + e->d_name).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
      }
      entries.emplace_back(e->d_name, dir);
    }
    ::closedir(d);
    out.read_entries += entries.size();
    for (const auto& [name, dir] : entries) {
      std::string rel = rel_dir.empty() ? name : rel_dir + "/" + name;
      if (const PathGlob* g = FirstMatch(globs, rel)) {
        if (out.paths.size() >= limit)
          return Status::ResourceExhausted("the task's globs match more than " + std::to_string(limit) +
                                           " paths of the image ('" + g->text() +
                                           "' among them): name directories (dir/**) rather than their files");
        out.paths.push_back(rel);
        continue;  // its tree goes with it
      }
      if (!dir) continue;
      for (const auto& g : globs)
        if (g.MayMatchUnder(rel)) {
          dirs.push_back(rel);
          break;
        }
    }
  }
  std::sort(out.paths.begin(), out.paths.end());
  return out;
}

}  // namespace dsec::guard
