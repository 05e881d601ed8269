#include "drivers/images/builder.hpp"
#include "drivers/images/git_scrub.hpp"

#include <archive.h>
#include <cstdio>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <chrono>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "drivers/images/image_store.hpp"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"

extern char** environ;

namespace dsec::images {

namespace {

using nlohmann::json;

bool Exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Splits an archive member name into clean components; false when it is
// absolute after stripping, or climbs with "..".
bool CleanPath(const std::string& raw, std::vector<std::string>* parts) {
  std::stringstream ss(raw);
  std::string p;
  parts->clear();
  while (std::getline(ss, p, '/')) {
    if (p.empty() || p == ".") continue;
    if (p == "..") return false;
    parts->push_back(p);
  }
  return true;
}

std::string Join(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += (i ? "/" : "") + parts[i];
  return out;
}


// Whether every directory on the way to `rel` inside `root` is a real
// directory (no symlink): whiteouts never act through a symlink.
bool NoSymlinkOnTheWay(const std::string& root, const std::vector<std::string>& parts, size_t n) {
  std::string cur = root;
  for (size_t i = 0; i < n; ++i) {
    cur += "/" + parts[i];
    struct stat st;
    if (::lstat(cur.c_str(), &st) < 0 || !S_ISDIR(st.st_mode)) return false;
  }
  return true;
}

struct ArchiveReader {
  archive* a = archive_read_new();
  ~ArchiveReader() { archive_read_free(a); }
};

Status OpenArchive(ArchiveReader& r, const std::string& path) {
  archive_read_support_filter_all(r.a);
  archive_read_support_format_tar(r.a);
  archive_read_support_format_gnutar(r.a);
  if (archive_read_open_filename(r.a, path.c_str(), 1 << 16) != ARCHIVE_OK)
    return Status::InvalidArgument("cannot read " + path + " as a tar archive: " + archive_error_string(r.a));
  return Status::Ok();
}

// Pass 1 of a layer: find and apply its whiteouts.
Status ApplyWhiteouts(const std::string& archive, const std::string& dest) {
  ArchiveReader r;
  DSEC_RETURN_IF_ERROR(OpenArchive(r, archive));
  archive_entry* e;
  int rc;
  std::vector<std::string> parts;
  while ((rc = archive_read_next_header(r.a, &e)) == ARCHIVE_OK) {
    std::string name = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
    if (!CleanPath(name, &parts) || parts.empty()) continue;
    const std::string& base = parts.back();
    if (base.rfind(".wh.", 0) != 0) continue;
    // ".wh.", ".wh.." and ".wh..." name no file of a lower layer; acted on,
    // they would wipe this directory or its parent (at the top, the tree).
    if (base == ".wh." || base == ".wh.." || base == ".wh...")
      return Status::InvalidArgument("archive " + archive + ": whiteout '" + name + "' names no file");
    if (!NoSymlinkOnTheWay(dest, parts, parts.size() - 1)) continue;
    std::string dir = dest + (parts.size() > 1 ? "/" + Join(parts, parts.size() - 1) : "");
    if (base == ".wh..wh..opq") {
      // Opaque: the lower layers' content of this directory is hidden.
      if (DIR* d = ::opendir(dir.c_str())) {
        std::vector<std::string> kids;
        while (dirent* de = ::readdir(d))
          if (std::strcmp(de->d_name, ".") != 0 && std::strcmp(de->d_name, "..") != 0) kids.push_back(de->d_name);
        ::closedir(d);
        for (const auto& k : kids) DSEC_RETURN_IF_ERROR(RemoveTree(dir + "/" + k).Annotate("archive " + archive));
      }
    } else {
      // (Absent is fine: a whiteout may name what no lower layer had.)
      DSEC_RETURN_IF_ERROR(RemoveTree(dir + "/" + base.substr(4)).Annotate("archive " + archive));
    }
  }
  if (rc != ARCHIVE_EOF) return Status::InvalidArgument("corrupt archive " + archive + ": " + archive_error_string(r.a));
  return Status::Ok();
}

}  // namespace

const char* SourceKindName(SourceKind k) {
  switch (k) {
    case SourceKind::kDirectory: return "dir";
    case SourceKind::kTarball: return "tar";
    case SourceKind::kOciLayout: return "oci";
    case SourceKind::kDockerArchive: return "docker";
  }
  return "?";
}

Status Unpack(const std::string& archive, const std::string& dest, bool whiteouts) {
  if (whiteouts) DSEC_RETURN_IF_ERROR(ApplyWhiteouts(archive, dest));
  // libarchive resolves members against the working directory, and its
  // "no absolute paths" check needs relative names: work from `dest`.
  int saved = ::open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (saved < 0 || ::chdir(dest.c_str()) < 0) {
    int e = errno;
    if (saved >= 0) ::close(saved);
    return Status::FromErrno(e, "unpack into " + dest);
  }
  struct Back {
    int fd;
    ~Back() {
      (void)!::fchdir(fd);
      ::close(fd);
    }
  } back{saved};
  ArchiveReader r;
  DSEC_RETURN_IF_ERROR(OpenArchive(r, archive));
  std::unique_ptr<::archive, int (*)(::archive*)> out(archive_write_disk_new(), archive_write_free);
  // Members never land outside `dest`: absolute paths and ".." are refused,
  // and a symlink already on disk in a member's way (an earlier layer's
  // `etc -> /etc`) is replaced by a real directory rather than followed, so
  // a later `etc/passwd` stays in the tree.
  int flags = ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_XATTR |
              ARCHIVE_EXTRACT_UNLINK | ARCHIVE_EXTRACT_SECURE_SYMLINKS | ARCHIVE_EXTRACT_SECURE_NODOTDOT |
              ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS;
  archive_write_disk_set_options(out.get(), flags);
  archive_write_disk_set_standard_lookup(out.get());
  archive_entry* e;
  int rc;
  std::vector<std::string> parts;
  while ((rc = archive_read_next_header(r.a, &e)) == ARCHIVE_OK) {
    std::string name = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
    if (!CleanPath(name, &parts))
      return Status::InvalidArgument("archive " + archive + ": member '" + name + "' climbs out with '..'");
    if (parts.empty()) continue;  // "./" itself
    if (whiteouts && parts.back().rfind(".wh.", 0) == 0) continue;
    archive_entry_set_pathname(e, Join(parts, parts.size()).c_str());
    if (const char* hl = archive_entry_hardlink(e)) {
      std::vector<std::string> hp;
      if (!CleanPath(hl, &hp) || hp.empty())
        return Status::InvalidArgument("archive " + archive + ": hard link '" + name + "' points out of the tree");
      archive_entry_set_hardlink(e, Join(hp, hp.size()).c_str());
    }
    if (archive_write_header(out.get(), e) != ARCHIVE_OK)
      return Status::InvalidArgument("archive " + archive + ": cannot unpack '" + name +
                                     "': " + archive_error_string(out.get()));
    const void* buf;
    size_t size;
    la_int64_t off;
    int drc;
    while ((drc = archive_read_data_block(r.a, &buf, &size, &off)) == ARCHIVE_OK)
      if (archive_write_data_block(out.get(), buf, size, off) != ARCHIVE_OK)
        return Status::Internal("archive " + archive + ": write '" + name + "': " + archive_error_string(out.get()));
    if (drc != ARCHIVE_EOF)
      return Status::InvalidArgument("corrupt archive " + archive + " at '" + name + "': " + archive_error_string(r.a));
    if (archive_write_finish_entry(out.get()) != ARCHIVE_OK)
      return Status::Internal("archive " + archive + ": finish '" + name + "': " + archive_error_string(out.get()));
  }
  if (rc != ARCHIVE_EOF) return Status::InvalidArgument("corrupt archive " + archive + ": " + archive_error_string(r.a));
  return Status::Ok();
}

namespace {

Result<json> ReadJson(const std::string& path) {
  auto s = ReadFileToString(path);
  if (!s.ok()) return s.status();
  auto j = json::parse(*s, nullptr, false);
  if (j.is_discarded()) return Status::InvalidArgument(path + " is not valid JSON");
  return j;
}

std::string BlobPath(const std::string& layout, const std::string& digest) {
  auto colon = digest.find(':');
  if (colon == std::string::npos || digest.find('/') != std::string::npos) return {};
  return layout + "/blobs/" + digest.substr(0, colon) + "/" + digest.substr(colon + 1);
}

// The layer files of an OCI layout, bottom first.
Result<std::vector<std::string>> OciLayers(const std::string& layout) {
  auto index = ReadJson(layout + "/index.json");
  if (!index.ok()) return index.status();
  if (!index->contains("manifests") || !(*index)["manifests"].is_array() || (*index)["manifests"].empty())
    return Status::InvalidArgument(layout + "/index.json lists no manifests");
  // Prefer linux/amd64 when several platforms are listed.
  json chosen = (*index)["manifests"][0];
  for (const auto& m : (*index)["manifests"]) {
    auto p = m.value("platform", json::object());
    if (p.value("os", "") == "linux" && p.value("architecture", "") == "amd64") chosen = m;
  }
  std::string path = BlobPath(layout, chosen.value("digest", ""));
  if (path.empty()) return Status::InvalidArgument(layout + ": bad manifest digest in index.json");
  auto manifest = ReadJson(path);
  if (!manifest.ok())
    return manifest.status().Annotate(layout + "/index.json names manifest " + chosen.value("digest", "?"));
  // An index of indexes (multi-platform): descend once.
  if (manifest->contains("manifests") && !manifest->contains("layers")) {
    json inner = (*manifest)["manifests"][0];
    for (const auto& m : (*manifest)["manifests"]) {
      auto p = m.value("platform", json::object());
      if (p.value("os", "") == "linux" && p.value("architecture", "") == "amd64") inner = m;
    }
    path = BlobPath(layout, inner.value("digest", ""));
    manifest = ReadJson(path);
    if (!manifest.ok()) return manifest.status();
  }
  if (!manifest->contains("layers") || !(*manifest)["layers"].is_array())
    return Status::InvalidArgument(path + " is not an image manifest (no layers)");
  std::vector<std::string> layers;
  for (const auto& l : (*manifest)["layers"]) {
    std::string p = BlobPath(layout, l.value("digest", ""));
    if (p.empty() || !Exists(p)) return Status::InvalidArgument(layout + ": layer blob " + l.value("digest", "?") + " is missing");
    layers.push_back(p);
  }
  return layers;
}

// The layer files of a `docker save` layout, bottom first.
Result<std::vector<std::string>> DockerLayers(const std::string& layout) {
  auto manifest = ReadJson(layout + "/manifest.json");
  if (!manifest.ok()) return manifest.status();
  if (!manifest->is_array() || manifest->empty() || !(*manifest)[0].contains("Layers"))
    return Status::InvalidArgument(layout + "/manifest.json lists no image with Layers");
  std::vector<std::string> layers;
  for (const auto& l : (*manifest)[0]["Layers"]) {
    std::vector<std::string> parts;
    if (!l.is_string() || !CleanPath(l.get<std::string>(), &parts) || parts.empty())
      return Status::InvalidArgument(layout + "/manifest.json: bad layer path");
    std::string p = layout + "/" + Join(parts, parts.size());
    if (!Exists(p)) return Status::InvalidArgument(layout + ": layer " + l.get<std::string>() + " is missing");
    layers.push_back(p);
  }
  return layers;
}

// A root filesystem that happens to hold a manifest.json or an index.json at
// its top is still a root filesystem: image layouts never have these.
bool LooksLikeRootfsTop(const std::string& name) {
  return name == "usr" || name == "etc" || name == "bin" || name == "lib" || name == "sbin";
}

SourceKind LayoutKind(const std::string& dir) {
  for (const char* top : {"usr", "etc", "bin", "lib", "sbin"})
    if (Exists(dir + "/" + top)) return SourceKind::kDirectory;
  if (Exists(dir + "/oci-layout") || (Exists(dir + "/index.json") && IsDir(dir + "/blobs"))) return SourceKind::kOciLayout;
  if (Exists(dir + "/manifest.json")) return SourceKind::kDockerArchive;
  return SourceKind::kDirectory;
}

// Whether a tarball is an image archive (has oci-layout / manifest.json at its top).
bool ArchiveIsImageLayout(const std::string& path) {
  ArchiveReader r;
  if (!OpenArchive(r, path).ok()) return false;
  archive_entry* e;
  std::vector<std::string> parts;
  bool layout = false;
  while (archive_read_next_header(r.a, &e) == ARCHIVE_OK) {
    const char* n = archive_entry_pathname(e);
    if (!n || !CleanPath(n, &parts) || parts.empty()) continue;
    if (LooksLikeRootfsTop(parts[0])) return false;
    if (parts.size() == 1 && (parts[0] == "oci-layout" || parts[0] == "manifest.json" || parts[0] == "index.json"))
      layout = true;
  }
  return layout;
}

struct TreeCount {
  uint64_t files = 0, bytes = 0;
};
thread_local TreeCount* g_count = nullptr;
int CountOne(const char*, const struct stat* st, int, struct FTW*) {
  ++g_count->files;
  if (S_ISREG(st->st_mode)) g_count->bytes += static_cast<uint64_t>(st->st_size);
  return 0;
}

Status RunMkfs(const std::string& out, const std::string& tree, const BuildOptions& o, bool all_root) {
  std::vector<std::string> args = {"mkfs.erofs", "--quiet"};
  if (o.compression == "lz4") args.push_back("-zlz4");
  else if (o.compression == "lz4hc") args.push_back("-zlz4hc");
  else if (o.compression != "none")
    return Status::InvalidArgument("compression '" + o.compression + "' is not one of none, lz4, lz4hc");
  // Uncompressed files' data stays block-aligned (no tail packed into the
  // inode), so a VM mounting the image with DAX maps every file's pages
  // straight from the host's page cache.
  if (o.compression == "none") args.push_back("-Enoinline_data");
  if (all_root) args.push_back("--all-root");
  args.push_back(out);
  args.push_back(tree);
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  int err[2];
  if (::pipe2(err, O_CLOEXEC) < 0) return Status::FromErrno(errno, "pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = posix_spawnp(&pid, "mkfs.erofs", &fa, nullptr, av.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(err[1]);
  if (rc != 0) {
    ::close(err[0]);
    return Status::Unavailable("cannot run mkfs.erofs: " + std::string(std::strerror(rc)) +
                               " (install erofs-utils: apt-get install erofs-utils)");
  }
  std::string msg;
  char buf[4096];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status::Internal("mkfs.erofs failed on " + tree + ": " + msg);
  return Status::Ok();
}

}  // namespace

Result<v1::ImageManifest> BuildImage(const std::string& source_in, const std::string& name,
                                     const std::string& store_root, const BuildOptions& o) {
  DSEC_RETURN_IF_ERROR(CheckImageName(name));
  std::string source = AbsolutePath(source_in);
  struct stat st;
  if (::stat(source.c_str(), &st) < 0)
    return Status::NotFound("source " + source_in + " does not exist (give a directory, a tarball or an OCI layout)");
  DSEC_RETURN_IF_ERROR(MakeDirs(store_root, 0755));
  std::string scratch = o.scratch_dir.empty() ? store_root + "/.build-" + RandomHex(12) : o.scratch_dir;
  DSEC_RETURN_IF_ERROR(MakeDirs(scratch, 0700));
  struct Cleanup {
    std::string dir;
    // A destructor cannot fail the build; what it cannot remove is said.
    ~Cleanup() {
      if (Status s = RemoveTree(dir); !s.ok()) std::fprintf(stderr, "dsec-image: scratch dir left behind: %s\n", s.message().c_str());
    }
  } cleanup{scratch};
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };

  SourceKind kind;
  std::string layout;  // for OCI/docker sources
  std::string tree;    // what mkfs.erofs packs
  bool all_root = false;
  if (S_ISDIR(st.st_mode)) {
    kind = LayoutKind(source);
    if (kind == SourceKind::kDirectory) {
      tree = source;
      all_root = !o.keep_owners;
    } else {
      layout = source;
    }
  } else if (S_ISREG(st.st_mode)) {
    if (ArchiveIsImageLayout(source)) {
      say("unpacking image archive " + source_in);
      layout = scratch + "/layout";
      DSEC_RETURN_IF_ERROR(MakeDirs(layout, 0700));
      DSEC_RETURN_IF_ERROR(Unpack(source, layout, false));
      kind = LayoutKind(layout);
      if (kind == SourceKind::kDirectory)
        return Status::InvalidArgument(source_in + " looked like an image archive but has no oci-layout or manifest.json");
    } else {
      kind = SourceKind::kTarball;
      tree = scratch + "/rootfs";
      DSEC_RETURN_IF_ERROR(MakeDirs(tree, 0755));
      say("unpacking " + source_in);
      DSEC_RETURN_IF_ERROR(Unpack(source, tree, false));
    }
  } else {
    return Status::InvalidArgument("source " + source_in + " is neither a directory nor a file");
  }
  if (kind == SourceKind::kOciLayout || kind == SourceKind::kDockerArchive) {
    auto layers = kind == SourceKind::kOciLayout ? OciLayers(layout) : DockerLayers(layout);
    if (!layers.ok()) return layers.status();
    tree = scratch + "/rootfs";
    DSEC_RETURN_IF_ERROR(MakeDirs(tree, 0755));
    for (size_t i = 0; i < layers->size(); ++i) {
      say("applying layer " + std::to_string(i + 1) + "/" + std::to_string(layers->size()));
      DSEC_RETURN_IF_ERROR(Unpack((*layers)[i], tree, true).Annotate("layer " + std::to_string(i + 1)));
    }
  }

  if (o.git_scrub) {
    if (tree == source) {  // the user's directory: scrub a copy
      std::string copy = scratch + "/rootfs";
      say("copying " + source_in + " to scrub its git history");
      int rc = RunToFile({"/bin/cp", "-a", "--reflink=auto", source + "/.", copy}, scratch + "/cp.log");
      if (rc != 0) {
        auto log = ReadFileToString(scratch + "/cp.log");
        return Status::Internal("copy " + source_in + " for --git-scrub: cp exited " + std::to_string(rc) + ": " +
                                (log.ok() ? *log : ""));
      }
      tree = copy;
    }
    auto scrubbed = ScrubGitHistory(tree);
    if (!scrubbed.ok()) return scrubbed.status();
    if (scrubbed->empty()) say("git-scrub: no git repository in the tree");
    for (const auto& r : *scrubbed) say(ScrubSummary(r));
  }
  std::vector<std::string> watched;
  if (!o.git_scrub && o.git_watch) {
    auto future = FindFutureHistory(tree, kMaxWatchedFiles);
    if (!future.ok()) say(future.status().message() + ": reads of repositories' future history are not flagged");
    for (const auto& r : future.ok() ? *future : std::vector<WatchedRepo>{}) {
      say(WatchSummary(r));
      for (const auto& f : r.files) watched.push_back(f);
    }
  }
  TreeCount count;
  g_count = &count;
  ::nftw(tree.c_str(), CountOne, 64, FTW_PHYS);
  g_count = nullptr;
  say("packing " + std::to_string(count.files) + " entries (" + std::to_string(count.bytes >> 20) + " MiB) with mkfs.erofs");
  std::string out = scratch + "/image.erofs";
  DSEC_RETURN_IF_ERROR(RunMkfs(out, tree, o, all_root));
  // Padded to a 2 MiB multiple (EROFS ignores what follows its last
  // block): the vm kind attaches it as virtio-pmem, which maps whole 2 MiB
  // pages. Sparse: the padding costs no disk.
  if (::stat(out.c_str(), &st) < 0) return Status::FromErrno(errno, "stat " + out);
  constexpr off_t kAlign = 2 << 20;
  off_t padded = (st.st_size + kAlign - 1) / kAlign * kAlign;
  if (padded != st.st_size && ::truncate(out.c_str(), padded) < 0) return Status::FromErrno(errno, "pad " + out);
  auto digest = Sha256File(out);
  if (!digest.ok()) return digest.status();
  std::string final_path = ImageFilePath(store_root, *digest);
  if (::rename(out.c_str(), final_path.c_str()) < 0) return Status::FromErrno(errno, "move the image to " + final_path);
  ::chmod(final_path.c_str(), 0644);
  struct stat fst;
  ::stat(final_path.c_str(), &fst);

  v1::ImageManifest m;
  m.set_name(name);
  m.set_digest(*digest);
  m.set_size_bytes(static_cast<uint64_t>(fst.st_size));
  m.set_source(std::string(SourceKindName(kind)) + ":" + source);
  m.set_file(final_path);
  m.set_files(count.files);
  m.set_content_bytes(count.bytes);
  m.set_compression(o.compression);
  m.set_created_ms(WallClockMs());
  for (auto& f : watched) m.add_watched(std::move(f));
  return m;
}

Result<v1::ImageManifest> PushImage(const std::string& file, const std::string& name, const std::string& store_root) {
  DSEC_RETURN_IF_ERROR(CheckErofs(file));
  DSEC_RETURN_IF_ERROR(MakeDirs(store_root, 0755));
  std::string scratch = store_root + "/.push-" + RandomHex(12);
  std::error_code ec;
  if (!std::filesystem::copy_file(file, scratch, ec)) {
    ::unlink(scratch.c_str());
    return Status::Internal("copy " + file + " to " + scratch + ": " + ec.message());
  }
  struct stat st;
  if (::stat(scratch.c_str(), &st) < 0) return Status::FromErrno(errno, "stat " + scratch);
  constexpr off_t kAlign = 2 << 20;
  off_t padded = (st.st_size + kAlign - 1) / kAlign * kAlign;
  if (padded != st.st_size && ::truncate(scratch.c_str(), padded) < 0) return Status::FromErrno(errno, "pad " + scratch);
  auto digest = Sha256File(scratch);
  if (!digest.ok()) return digest.status();
  std::string final_path = ImageFilePath(store_root, *digest);
  if (::rename(scratch.c_str(), final_path.c_str()) < 0) {
    ::unlink(scratch.c_str());
    return Status::FromErrno(errno, "move the image to " + final_path);
  }
  ::chmod(final_path.c_str(), 0644);
  v1::ImageManifest m;
  m.set_name(name);
  m.set_digest(*digest);
  m.set_size_bytes(static_cast<uint64_t>(padded));
  m.set_source("erofs:" + file);
  m.set_file(final_path);
  m.set_compression("as pushed");
  m.set_created_ms(WallClockMs());
  return m;
}

}  // namespace dsec::images
