#include "actors/node/image_worker.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "actors/node/context.hpp"
#include "drivers/images/chunks.hpp"
#include "drivers/images/image_store.hpp"
#include "drivers/images/lazy_images.hpp"
#include "drivers/images/snapshot_store.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec {

namespace {

v1::ImageReply Reply(const Status& st, v1::ImageManifest m = {}) {
  v1::ImageReply r;
  ToProto(st, r.mutable_status());
  *r.mutable_image() = std::move(m);
  return r;
}

bool IsDigest(const std::string& d) {
  if (d.size() != 7 + 64 || d.compare(0, 7, "sha256:") != 0) return false;
  for (size_t i = 7; i < d.size(); ++i)
    if (!((d[i] >= '0' && d[i] <= '9') || (d[i] >= 'a' && d[i] <= 'f'))) return false;
  return true;
}

// Up to kImageChunk bytes at `offset` of the file of a registered image
// (only those: the path is made from a checked digest, and the digest must
// be one an image here has).
Result<std::string> Chunk(const images::ImageStore& store, const std::string& digest, uint64_t offset) {
  if (!IsDigest(digest)) return Status::InvalidArgument("'" + digest.substr(0, 80) + "' is not a sha256 digest");
  auto all = store.List();
  if (!all.ok()) return all.status();
  bool known = false;
  for (const auto& m : *all) known = known || m.digest() == digest;
  if (!known) return Status::NotFound("no image here has digest " + digest);
  UniqueFd fd(::open(store.FileFor(digest).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Status::FromErrno(errno, "open " + store.FileFor(digest));
  std::string out(kImageChunk, '\0');
  ssize_t n = ::pread(fd.get(), out.data(), out.size(), static_cast<off_t>(offset));
  if (n < 0) return Status::FromErrno(errno, "read " + store.FileFor(digest));
  out.resize(static_cast<size_t>(n));
  return out;
}

// Registers an image that came from a controller: Ok when this node has
// it already under that name, refused when the name has another digest.
Status RegisterFetched(images::ImageStore& store, const v1::ImageManifest& m) {
  Status reg = store.Register(m, false);
  if (reg.code() != Status::Code::kAlreadyExists) return reg;
  auto old = store.Get(m.name());
  if (old.ok() && old->digest() == m.digest()) return Status::Ok();
  return Status::FailedPrecondition("this node has another image named " + m.name() + " (digest " +
                                    (old.ok() ? old->digest() : std::string("?")) + "); remove it here first");
}

// Gets `m`'s file from `source` (blocking: this worker has its own thread),
// checks it and registers it.
Status Fetch(caf::actor_system& sys, images::ImageStore& store, const v1::ImageManifest& m, const caf::actor& source) {
  if (!IsDigest(m.digest())) return Status::InvalidArgument("'" + m.digest().substr(0, 80) + "' is not a sha256 digest");
  DSEC_RETURN_IF_ERROR(images::CheckImageName(m.name()));
  std::string final_path = store.FileFor(m.digest());
  struct stat st;
  bool have_file = ::stat(final_path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) == m.size_bytes();
  if (!have_file) {
    std::string part = final_path + ".part";
    UniqueFd fd(::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) return Status::FromErrno(errno, "create " + part);
    caf::scoped_actor self{sys};
    uint64_t offset = 0;
    Status failed;
    while (offset < m.size_bytes() && failed.ok()) {
      self->request(source, std::chrono::seconds(60), image_chunk_atom::value, m.digest(), offset)
          .receive(
              [&](std::string& bytes) {
                if (bytes.empty() || offset + bytes.size() > m.size_bytes()) {
                  failed = Status::Internal("the source sent " + std::to_string(bytes.size()) + " bytes at offset " +
                                            std::to_string(offset) + " of a " + std::to_string(m.size_bytes()) +
                                            "-byte image");
                  return;
                }
                for (size_t done = 0; done < bytes.size();) {
                  ssize_t w = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
                  if (w < 0 && errno == EINTR) continue;
                  if (w < 0) {
                    failed = Status::FromErrno(errno, "write " + part);
                    return;
                  }
                  done += static_cast<size_t>(w);
                }
                offset += bytes.size();
              },
              [&](caf::error& e) { failed = Status::Unavailable("fetching the image: " + sys.render(e)); });
    }
    if (failed.ok() && ::fsync(fd.get()) < 0) failed = Status::FromErrno(errno, "fsync " + part);
    fd.Reset();
    if (failed.ok() && ::rename(part.c_str(), final_path.c_str()) < 0)
      failed = Status::FromErrno(errno, "rename " + part);
    if (!failed.ok()) {
      ::unlink(part.c_str());
      return failed;
    }
  }
  v1::ImageManifest here = m;
  here.set_file(final_path);
  // Register checks the size and the digest of what arrived.
  Status reg = RegisterFetched(store, here);
  if (!reg.ok() && !have_file) ::unlink(final_path.c_str());
  return reg;
}

bool Registered(const images::ImageStore& store, const std::string& digest) {
  auto all = store.List();
  if (!all.ok()) return false;
  for (const auto& m : *all)
    if (m.digest() == digest && !m.lazy()) return true;
  return false;
}

// The chunk map of a registered image (the index learns its chunks).
Result<cluster::v1::ChunkMap> MapOf(const images::ImageStore& store, images::ChunkIndex& chunks,
                                    const std::string& digest) {
  if (!IsDigest(digest)) return Status::InvalidArgument("'" + digest.substr(0, 80) + "' is not a sha256 digest");
  if (!Registered(store, digest)) return Status::NotFound("no image here has digest " + digest);
  return chunks.MapOf(digest, store.FileFor(digest));
}

// A node takes an image as lazy: its chunk map, then its manifest.
Status TakeLazy(NodeContext& ctx, images::ImageStore& store, const v1::ImageManifest& m,
                const cluster::v1::ChunkMap& map) {
  if (!ctx.lazy)
    return Status::FailedPrecondition("this dsecd serves no lazy images (only a cluster node does)");
  if (!IsDigest(m.digest()) || map.image_digest() != m.digest() || map.size_bytes() != m.size_bytes())
    return Status::InvalidArgument("the chunk map of image " + m.name() + " is not of its digest and size");
  DSEC_RETURN_IF_ERROR(images::CheckImageName(m.name()));
  DSEC_RETURN_IF_ERROR(ctx.lazy->Add(map));
  v1::ImageManifest here = m;
  here.set_lazy(true);
  here.clear_cached_bytes();
  here.set_file(ctx.lazy->mount_dir() + "/" + m.digest().substr(7) + ".erofs");
  return RegisterFetched(store, here);
}

image_worker_actor::behavior_type ImageWorker(image_worker_actor::pointer self, std::shared_ptr<NodeContext> ctx) {
  auto store = std::make_shared<images::ImageStore>(ctx->store, ctx->options.image_root);
  store->set_lazy(ctx->lazy.get());
  auto chunks = std::make_shared<images::ChunkIndex>(ctx->options.image_root);
  // Every registered image's chunks, indexed once (at the first chunk request).
  auto indexed = std::make_shared<bool>(false);
  auto index_all = [store, chunks, indexed, ctx] {
    if (*indexed) return;
    *indexed = true;
    auto all = store->List();
    if (!all.ok()) return;
    for (const auto& m : *all)
      if (!m.lazy())
        if (auto map = chunks->MapOf(m.digest(), store->FileFor(m.digest())); !map.ok())
          ctx->log->warn("image service: image {} cannot be cut into chunks: {}", m.name(), map.status().message());
  };
  // A snapshot stands on its image: the image is in use while it is there.
  if (auto snaps = ctx->snapshots)
    store->set_extra_users([snaps](const std::string& name) { return snaps->OnImage(name); });
  return {
      [store, ctx, chunks](const v1::RegisterImageRequest& req) {
        if (req.manifest().lazy())
          return Reply(Status::InvalidArgument("a lazy image comes from the controller; register its file instead"));
        Status st = store->Register(req.manifest(), req.replace());
        if (st.ok()) ctx->log->info("image {} registered ({}, {} bytes)", req.manifest().name(),
                                    req.manifest().digest(), req.manifest().size_bytes());
        if (st.ok() && ctx->options.image_service) {
          auto started = std::chrono::steady_clock::now();
          auto map = chunks->MapOf(req.manifest().digest(), store->FileFor(req.manifest().digest()));
          if (map.ok())
            ctx->log->info("image service: {} is {} chunks (cut in {:.2f} s)", req.manifest().name(),
                           map->chunks_size(),
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
          else
            ctx->log->warn("image service: {} cannot be cut into chunks: {}", req.manifest().name(),
                           map.status().message());
        }
        return Reply(st, req.manifest());
      },
      [store](const v1::GetImageRequest& req) {
        auto m = store->Get(req.name());
        return m.ok() ? Reply(Status::Ok(), *m) : Reply(m.status());
      },
      [store](const v1::ListImagesRequest&) {
        v1::ImagesReply r;
        auto all = store->List();
        if (!all.ok()) ToProto(all.status(), r.mutable_status());
        else
          for (auto& m : *all) *r.add_images() = std::move(m);
        return r;
      },
      [store, ctx, chunks](const v1::RemoveImageRequest& req) {
        auto m = store->Get(req.name());
        Status st = m.ok() ? store->Remove(req.name()) : m.status();
        if (st.ok()) ctx->log->info("image {} removed", req.name());
        if (st.ok() && !Registered(*store, m->digest())) chunks->Forget(m->digest());
        return m.ok() ? Reply(st, *m) : Reply(st);
      },
      [store](image_chunk_atom, const std::string& digest, uint64_t offset) -> caf::result<std::string> {
        auto c = Chunk(*store, digest, offset);
        if (!c.ok()) return caf::make_error(caf::sec::invalid_argument, c.status().message());
        return std::move(*c);
      },
      [store, chunks](chunk_map_atom, const std::string& digest) -> caf::result<cluster::v1::ChunkMap> {
        auto map = MapOf(*store, *chunks, digest);
        if (!map.ok()) return caf::make_error(caf::sec::invalid_argument, map.status().message());
        return std::move(*map);
      },
      [chunks, index_all](chunks_atom, const std::vector<std::string>& digests)
          -> caf::result<std::vector<std::string>> {
        auto got = chunks->Read(digests);
        if (!got.ok() && got.status().code() == Status::Code::kNotFound) {
          index_all();
          got = chunks->Read(digests);
        }
        if (!got.ok()) return caf::make_error(caf::sec::invalid_argument, got.status().message());
        return std::move(*got);
      },
      [store, chunks, ctx](prefetch_atom, const cluster::v1::ChunkMap& m) {
        if (!MapOf(*store, *chunks, m.image_digest()).ok()) return;
        Status st = chunks->SetPrefetch(m.image_digest(), {m.prefetch().begin(), m.prefetch().end()});
        if (st.ok())
          ctx->log->info("image service: {} has a prefetch order ({} chunks its first sandbox read first)",
                         m.image_digest(), m.prefetch_size());
        else
          ctx->log->warn("image service: prefetch order of {}: {}", m.image_digest(), st.message());
      },
      [store, ctx](lazy_image_atom, const v1::ImageManifest& m, const cluster::v1::ChunkMap& map) {
        if (auto have = store->Get(m.name()); have.ok() && have->digest() == m.digest())
          return Reply(Status::Ok(), *have);
        Status st = TakeLazy(*ctx, *store, m, map);
        if (st.ok())
          ctx->log->info("image {} taken lazily ({}, {} bytes in {} chunks, {} to prefetch)", m.name(), m.digest(),
                         m.size_bytes(), map.chunks_size(), map.prefetch_size());
        else
          ctx->log->warn("image {} could not be taken lazily: {}", m.name(), st.message());
        auto reg = store->Get(m.name());
        return Reply(st, reg.ok() ? *reg : m);
      },
      [self, store, ctx](fetch_image_atom, const v1::ImageManifest& m, const caf::actor& source) {
        if (auto have = store->Get(m.name()); have.ok() && have->digest() == m.digest())
          return Reply(Status::Ok(), *have);
        auto started = std::chrono::steady_clock::now();
        Status st = Fetch(self->system(), *store, m, source);
        if (st.ok())
          ctx->log->info("image {} fetched ({}, {} bytes) in {:.2f} s", m.name(), m.digest(), m.size_bytes(),
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
        else
          ctx->log->warn("image {} could not be fetched: {}", m.name(), st.message());
        auto reg = store->Get(m.name());
        return Reply(st, reg.ok() ? *reg : m);
      },
  };
}

}  // namespace

image_worker_actor SpawnImageWorker(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx) {
  return parent->spawn<caf::detached>(ImageWorker, std::move(ctx));
}

}  // namespace dsec
