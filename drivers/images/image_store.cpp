#include "drivers/images/image_store.hpp"

#include "drivers/images/lazy_images.hpp"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

#include "runtime/files.hpp"
#include "dsec/store/v1/records.pb.h"
#include "state/table.hpp"

namespace dsec::images {

Status CheckObjectName(const std::string& what, const std::string& name) {
  if (name.empty()) return Status::InvalidArgument(what + " name is empty");
  if (name.size() > 128) return Status::InvalidArgument(what + " name is longer than 128 bytes");
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              (i > 0 && (c == '.' || c == '_' || c == '-'));
    if (!ok)
      return Status::InvalidArgument(what + " name '" + name.substr(0, 128) +
                                     "' may hold lowercase letters, digits, '.', '_' and '-', "
                                     "and must start with a letter or digit");
  }
  return Status::Ok();
}

namespace {
std::string ParentDir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

Status CheckImageName(const std::string& name) {
  if (name == kHostImage)
    return Status::InvalidArgument("image name 'host' is the built-in host image; pick another name");
  return CheckObjectName("image", name);
}

Status CheckErofs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno(errno, "open " + path);
  unsigned char sb[128] = {};
  in.seekg(1024);
  in.read(reinterpret_cast<char*>(sb), sizeof sb);
  auto u32 = [&](size_t at) { return uint32_t(sb[at]) | uint32_t(sb[at + 1]) << 8 | uint32_t(sb[at + 2]) << 16 | uint32_t(sb[at + 3]) << 24; };
  if (in.gcount() < static_cast<std::streamsize>(sizeof sb) || u32(0) != 0xE0F5E1E2u)
    return Status::InvalidArgument(path + " is not an EROFS image (no EROFS superblock at offset 1024); make one with "
                                   "dsec-image build DIR NAME");
  unsigned bits = sb[12];
  uint64_t blocks = u32(36);
  struct stat st;
  if (::stat(path.c_str(), &st) < 0) return Status::FromErrno(errno, "stat " + path);
  if (bits < 9 || bits > 16 || (blocks << bits) > static_cast<uint64_t>(st.st_size))
    return Status::InvalidArgument(path + " is truncated or damaged: its superblock says " + std::to_string(blocks) +
                                   " blocks of " + std::to_string(1u << (bits > 16 ? 0 : bits)) + " bytes, the file has " +
                                   std::to_string(st.st_size) + " bytes");
  return Status::Ok();
}

Result<std::string> Sha256File(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno(errno, "open " + path);
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return Status::Internal("read " + path + " failed");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return "sha256:" + HexOf(md, len);
}

std::string Sha256Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return HexOf(md, len);
}

ImageStore::ImageStore(state::Store* store, std::string root) : store_(store), root_(std::move(root)) {
  // A root that cannot be made fails the first Register, saying why.
  (void)MakeDirs(root_, 0755);
}

std::string ImageFilePath(const std::string& root, const std::string& digest) {
  std::string hex = digest.rfind("sha256:", 0) == 0 ? digest.substr(7) : digest;
  return root + "/" + hex + ".erofs";
}

std::string ImageStore::FileFor(const std::string& digest) const { return ImageFilePath(root_, digest); }

Result<std::string> ImageStore::Open(const v1::ImageManifest& image) const {
  if (image.lazy()) {
    if (!lazy_)
      return Status::FailedPrecondition("image " + image.name() +
                                        " is lazy (fetched from a controller) and this dsecd serves no lazy images");
    auto file = lazy_->Open(image.digest());
    if (!file.ok()) return file.status().Annotate("image " + image.name());
    return file;
  }
  std::string file = image.file().empty() ? FileFor(image.digest()) : image.file();
  if (::access(file.c_str(), R_OK) < 0)
    return Status::FromErrno(errno, "image " + image.name() + ": its file " + file +
                                        " (push or build the image again: dsec-image build)");
  return file;
}

Result<v1::ImageManifest> ImageStore::Get(const std::string& name) const {
  auto m = state::TypedTable<v1::ImageManifest>(store_, state::Table::kImages).Get(name);
  if (!m.ok() && m.status().code() == Status::Code::kNotFound)
    return Status::NotFound("image '" + name + "' not found (dsec-image ls lists them; dsec-image build makes one)");
  return m;
}

Result<std::vector<v1::ImageManifest>> ImageStore::List() const {
  std::vector<v1::ImageManifest> out;
  auto st = state::TypedTable<v1::ImageManifest>(store_, state::Table::kImages)
                .Scan("", [&](const std::string&, v1::ImageManifest&& m) {
                  if (m.lazy())
                    m.set_cached_bytes(lazy_ ? lazy_->CachedBytes(m.digest())
                                             : LazyImages::CachedBytesIn(ParentDir(root_), m.digest()));
                  out.push_back(std::move(m));
                  return true;
                });
  if (!st.ok()) return st;
  return out;
}

Status ImageStore::Register(const v1::ImageManifest& manifest, bool replace) {
  DSEC_RETURN_IF_ERROR(CheckImageName(manifest.name()));
  if (manifest.lazy()) {
    if (!lazy_ || !lazy_->Has(manifest.digest()))
      return Status::FailedPrecondition("image " + manifest.name() + " is lazy and this node has no chunk map of " +
                                        manifest.digest());
    return Put(manifest, replace);
  }
  std::string expected = FileFor(manifest.digest());
  if (manifest.file() != expected)
    return Status::InvalidArgument("image " + manifest.name() + ": file " + manifest.file() +
                                   " is not where the store keeps digest " + manifest.digest() + " (" +
                                   expected + ")");
  struct stat st;
  if (::stat(expected.c_str(), &st) < 0) return Status::FromErrno(errno, "image " + manifest.name() + ": " + expected);
  if (static_cast<uint64_t>(st.st_size) != manifest.size_bytes())
    return Status::InvalidArgument("image " + manifest.name() + ": " + expected + " is " +
                                   std::to_string(st.st_size) + " bytes, the manifest says " +
                                   std::to_string(manifest.size_bytes()));
  DSEC_RETURN_IF_ERROR(CheckErofs(expected).Annotate("image " + manifest.name()));
  auto digest = Sha256File(expected);
  if (!digest.ok()) return digest.status();
  if (*digest != manifest.digest())
    return Status::InvalidArgument("image " + manifest.name() + ": " + expected + " has digest " + *digest +
                                   ", the manifest says " + manifest.digest());
  return Put(manifest, replace);
}

Status ImageStore::Put(const v1::ImageManifest& manifest, bool replace) {
  auto old = Get(manifest.name());
  if (old.ok()) {
    if (!replace)
      return Status::AlreadyExists("image '" + manifest.name() + "' already exists (digest " + old->digest() +
                                   "); remove it first (dsec-image rm) or build with --replace");
    auto users = Users(manifest.name());
    if (!users.empty())
      return Status::FailedPrecondition("image '" + manifest.name() + "' is in use by " + users.front() +
                                        (users.size() > 1 ? " and " + std::to_string(users.size() - 1) + " more" : "") +
                                        "; remove those sandboxes first");
  }
  state::WriteBatch b;
  state::TypedTable<v1::ImageManifest>(store_, state::Table::kImages).Put(&b, manifest.name(), manifest);
  DSEC_RETURN_IF_ERROR(store_->Write(b, true));
  // The replaced image's file goes when no name refers to it any more.
  if (old.ok() && old->digest() != manifest.digest()) (void)DropContent(*old);
  return Status::Ok();
}

std::vector<std::string> ImageStore::Users(const std::string& name) const {
  std::vector<std::string> users;
  Status s = state::TypedTable<store::v1::SandboxRow>(store_, state::Table::kSandboxes)
                 .Scan("", [&](const std::string&, store::v1::SandboxRow&& row) {
                   auto& r = *row.mutable_record();
                   if (r.spec().image() == name && r.phase() != v1::SANDBOX_PHASE_STOPPED)
                     users.push_back("sandbox " + r.id());
                   return true;
                 });
  // Unknown users are users: an image is not removed on a guess.
  if (!s.ok()) users.push_back("sandboxes the store could not list (" + s.message() + ")");
  if (extra_users_)
    for (auto& u : extra_users_(name)) users.push_back(std::move(u));
  return users;
}

Status ImageStore::Remove(const std::string& name) {
  auto m = Get(name);
  if (!m.ok()) return m.status();
  auto users = Users(name);
  if (!users.empty())
    return Status::FailedPrecondition("image '" + name + "' is in use by " + users.front() +
                                      (users.size() > 1 ? " and " + std::to_string(users.size() - 1) + " more" : "") +
                                      "; remove those sandboxes first");
  state::WriteBatch b;
  b.Delete(state::Table::kImages, name);
  DSEC_RETURN_IF_ERROR(store_->Write(b, true));
  return DropContent(*m);
}

// The content of an image no name refers to any more: its file, or a lazy
// image's chunk map (its cached chunks go when evicted).
Status ImageStore::DropContent(const v1::ImageManifest& gone) {
  auto all = List();
  bool shared = !all.ok();
  if (all.ok())
    for (const auto& other : *all) shared = shared || other.digest() == gone.digest();
  if (shared) return Status::Ok();
  if (gone.lazy()) {
    if (lazy_) lazy_->Remove(gone.digest());
    return Status::Ok();
  }
  if (::unlink(FileFor(gone.digest()).c_str()) < 0 && errno != ENOENT)
    return Status::FromErrno(errno, "image " + gone.name() + ": remove " + FileFor(gone.digest()));
  return Status::Ok();
}

}  // namespace dsec::images
