// The image registry of a node: manifests in the `images` table, EROFS files
// in <data>/images/<hex digest>.erofs (content-addressed, so two names for
// the same content share one file). Blocking (it hashes files): call it off
// the actor threads. Nothing here knows about CAF.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "drivers/images/image_source.hpp"
#include "dsec/status.hpp"
#include "dsec/v1/types.pb.h"
#include "state/store.hpp"

namespace dsec::images {

class LazyImages;

// The name of the built-in image that exposes the host's /usr read-only.
inline constexpr const char* kHostImage = "host";

// [a-z0-9][a-z0-9._-]*, at most 128 bytes, not "host". InvalidArgument
// saying what is wrong otherwise.
Status CheckImageName(const std::string& name);
// The same rule for other names ("snapshot"), without the "host" one.
Status CheckObjectName(const std::string& what, const std::string& name);

// Whether the file at `path` is a whole EROFS image: its superblock's magic
// at offset 1024, and at least as many bytes as the superblock's block
// count says. InvalidArgument naming the file and what is wrong.
Status CheckErofs(const std::string& path);

// "sha256:<hex>" of a file.
Result<std::string> Sha256File(const std::string& path);
// SHA-256 of `data`, hex (no prefix).
std::string Sha256Hex(const std::string& data);

// Where a store rooted at `root` keeps the file of `digest`.
std::string ImageFilePath(const std::string& root, const std::string& digest);

class ImageStore final : public ImageSource {
 public:
  // `root`: the directory of EROFS files (created when missing).
  ImageStore(state::Store* store, std::string root);

  const std::string& root() const { return root_; }
  // The file an image with this digest lives in.
  std::string FileFor(const std::string& digest) const;

  // NotFound (saying how to list images) when there is no such image.
  Result<v1::ImageManifest> Get(const std::string& name) const override;
  // The registered file (it is whole: Register checked it).
  Result<std::string> Open(const v1::ImageManifest& image) const override;
  Result<std::vector<v1::ImageManifest>> List() const;

  // Checks the manifest's file (under root, size, digest) and stores it.
  // AlreadyExists when the name is taken and `replace` is false; with
  // `replace`, FailedPrecondition if the old image is in use.
  Status Register(const v1::ImageManifest& manifest, bool replace);

  // Removes an unused image; its file too when no other name shares it.
  // FailedPrecondition naming the sandboxes that use it otherwise.
  Status Remove(const std::string& name);

  // Who uses an image: sandboxes of the `sandboxes` table that are not
  // stopped, plus whatever `extra_users` (e.g. live mounts) reports.
  std::vector<std::string> Users(const std::string& name) const;
  void set_extra_users(std::function<std::vector<std::string>(const std::string&)> f) {
    extra_users_ = std::move(f);
  }
  // A cluster node's lazy images (lazy_images.hpp): a manifest with `lazy`
  // set is registered without a file of its own (its chunk map must be
  // there), opened as the lazy file, and listed with what is cached.
  void set_lazy(LazyImages* lazy) { lazy_ = lazy; }

 private:
  state::Store* store_;
  std::string root_;
  std::function<std::vector<std::string>(const std::string&)> extra_users_;
  LazyImages* lazy_ = nullptr;

  Status Put(const v1::ImageManifest& manifest, bool replace);
  Status DropContent(const v1::ImageManifest& gone);
};

}  // namespace dsec::images
