// Helpers shared by the image tests: scratch dirs under /tmp/dsec-test-img-*
// (leak_check reports any left behind), trees as path -> description maps,
// rootfs fixtures, hand-written tar archives (for members `tar` refuses to
// write), and reading an EROFS image back with `fsck.erofs --extract`.
#pragma once

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dsec/v1/types.pb.h"
#include "runtime/files.hpp"
#include "harness/daemon.hpp"

namespace dsec::testing::img {

// relative path -> "dir 0755" | "file 0644 <content>" | "link -> <target>".
using Tree = std::map<std::string, std::string>;

// The absolute path of `prog` on PATH, or "".
inline std::string Which(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/sbin:/usr/bin:/sbin:/bin");
  for (std::string dir; std::getline(ss, dir, ':');) {
    std::string p = dir + "/" + prog;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Why the image tests cannot run here, or "".
inline std::string SkipReason() {
  if (::geteuid() != 0) return "image tests need root (mkfs.erofs keeps file owners)";
  for (const char* p : {"mkfs.erofs", "fsck.erofs"})
    if (Which(p).empty()) return std::string(p) + " is missing (apt-get install erofs-utils)";
  if (Which("tar").empty()) return "tar is missing";
  return "";
}

inline bool PathExists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

// rm -rf, never following symlinks.
inline void RemoveAll(const std::string& path) {
  if (!PathExists(path)) return;
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p) < 0 ? -1 : 0; }, 64,
      FTW_DEPTH | FTW_PHYS);
}

inline std::string MakeTempDir(const std::string& prefix = "/tmp/dsec-test-img-") {
  std::string tmpl = prefix + "XXXXXX";
  if (!::mkdtemp(tmpl.data())) return "";
  return tmpl;
}

inline void Put(const std::string& path, const std::string& content, mode_t mode = 0644) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  ::chmod(path.c_str(), mode);
}

inline void Dir(const std::string& path, mode_t mode = 0755) {
  ::mkdir(path.c_str(), mode);
  ::chmod(path.c_str(), mode);
}

inline std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : std::string();
}

// Names in a directory, sorted, without "." and "..".
inline std::vector<std::string> Ls(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) out.push_back(e->d_name);
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline void WalkInto(const std::string& root, const std::string& rel, Tree* t, std::map<std::string, std::string>* owners) {
  for (const auto& name : Ls(rel.empty() ? root : root + "/" + rel)) {
    std::string key = rel.empty() ? name : rel + "/" + name;
    std::string path = root + "/" + key;
    struct stat st;
    if (::lstat(path.c_str(), &st) < 0) continue;
    char mode[16];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    if (owners) (*owners)[key] = std::to_string(st.st_uid) + ":" + std::to_string(st.st_gid);
    if (S_ISDIR(st.st_mode)) {
      (*t)[key] = std::string("dir ") + mode;
      WalkInto(root, key, t, owners);
    } else if (S_ISREG(st.st_mode)) {
      (*t)[key] = std::string("file ") + mode + " " + Slurp(path);
    } else if (S_ISLNK(st.st_mode)) {
      char buf[4096];
      ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
      (*t)[key] = "link -> " + std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
    } else {
      (*t)[key] = "other";
    }
  }
}

// Everything below `root` (not `root` itself).
inline Tree Snapshot(const std::string& root, std::map<std::string, std::string>* owners = nullptr) {
  Tree t;
  WalkInto(root, "", &t, owners);
  return t;
}

// Runs `prog` (looked up on PATH) and returns its result.
inline ProcResult Run(const std::string& prog, std::vector<std::string> args) {
  args.insert(args.begin(), Which(prog));
  return RunProcess(args);
}

// Extracts `image` into a fresh `out` with fsck.erofs and returns its tree
// (owners too, when asked); a failed extraction is a test failure.
inline Tree ImageContents(const std::string& image, const std::string& out,
                          std::map<std::string, std::string>* owners = nullptr) {
  RemoveAll(out);
  auto r = Run("fsck.erofs", {"--extract=" + out, image});
  EXPECT_EQ(r.exit_code, 0) << "fsck.erofs --extract of " << image << ": " << r.out << r.err;
  Tree t = Snapshot(out, owners);
  RemoveAll(out);
  return t;
}

// A small rootfs with subdirs, a symlink, an executable, a private file and
// a compressible file; returns what it holds.
inline Tree MakeRootfs(const std::string& dir) {
  Dir(dir);
  Dir(dir + "/etc");
  Put(dir + "/etc/hostname", "box\n");
  Dir(dir + "/bin");
  Put(dir + "/bin/tool", "#!/bin/sh\necho tool\n", 0755);
  Dir(dir + "/usr");
  Dir(dir + "/usr/lib");
  Dir(dir + "/usr/lib/deep", 0750);
  Put(dir + "/usr/lib/deep/data.txt", "deep data\n", 0600);
  std::string big;
  for (int i = 0; big.size() < (256u << 10); ++i) big += "line " + std::to_string(i % 100) + " of a compressible file\n";
  Put(dir + "/big.txt", big);
  Dir(dir + "/empty", 0700);
  (void)::symlink("bin/tool", (dir + "/tool-link").c_str());
  return Tree{
      {"big.txt", "file 0644 " + big},
      {"bin", "dir 0755"},
      {"bin/tool", "file 0755 #!/bin/sh\necho tool\n"},
      {"empty", "dir 0700"},
      {"etc", "dir 0755"},
      {"etc/hostname", "file 0644 box\n"},
      {"tool-link", "link -> bin/tool"},
      {"usr", "dir 0755"},
      {"usr/lib", "dir 0755"},
      {"usr/lib/deep", "dir 0750"},
      {"usr/lib/deep/data.txt", "file 0600 deep data\n"},
  };
}

// A ustar archive written by hand, so a test can hold members that `tar`
// would refuse or rewrite ("../x", "/abs", links pointing anywhere).
class TarWriter {
 public:
  TarWriter& File(const std::string& name, const std::string& content, int mode = 0644) {
    return Add(name, '0', content, "", mode);
  }
  TarWriter& Directory(const std::string& name, int mode = 0755) { return Add(name, '5', "", "", mode); }
  TarWriter& Symlink(const std::string& name, const std::string& target) { return Add(name, '2', "", target, 0777); }
  TarWriter& Hardlink(const std::string& name, const std::string& target) {
    return Add(name, '1', "", target, 0644);
  }
  void WriteTo(const std::string& path) const { Put(path, data_ + std::string(1024, '\0')); }

 private:
  TarWriter& Add(const std::string& name, char type, const std::string& content, const std::string& link, int mode) {
    EXPECT_LT(name.size(), 100u) << name;
    EXPECT_LT(link.size(), 100u) << link;
    char h[512] = {};
    std::memcpy(h, name.data(), std::min<size_t>(name.size(), 99));
    std::snprintf(h + 100, 8, "%07o", mode);
    std::snprintf(h + 108, 8, "%07o", 0);
    std::snprintf(h + 116, 8, "%07o", 0);
    std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(content.size()));
    std::snprintf(h + 136, 12, "%011o", 1700000000);
    std::memset(h + 148, ' ', 8);
    h[156] = type;
    std::memcpy(h + 157, link.data(), std::min<size_t>(link.size(), 99));
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
    std::memcpy(h + 265, "root", 4);
    std::memcpy(h + 297, "root", 4);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);
    h[155] = ' ';
    data_.append(h, sizeof h);
    data_ += content;
    data_.append((512 - content.size() % 512) % 512, '\0');
    return *this;
  }
  std::string data_;
};

}  // namespace dsec::testing::img
