#include "drivers/images/chunks.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>

#include "runtime/files.hpp"
#include "runtime/metrics.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::images {

namespace {

// A block's content hash for the cut decision (not its name): 64-bit
// multiply-xor over its words. Cheap; any change in the block changes it.
uint64_t BlockHash(const unsigned char* p, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  }
  return h;
}

std::string Sha256Of(const unsigned char* p, size_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(p, n, md, &len, EVP_sha256(), nullptr);
  return HexOf(md, len);
}

std::atomic<int> g_corrupt{0};

}  // namespace

void CorruptNextServedChunks(int n) { g_corrupt = n; }

bool IsHexDigest(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

Result<cluster::v1::ChunkMap> CutIntoChunks(const std::string& path, const std::string& image_digest) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Status::FromErrno(errno, "open " + path);
  cluster::v1::ChunkMap map;
  map.set_image_digest(image_digest);
  std::vector<unsigned char> buf(4 << 20);
  std::vector<unsigned char> chunk;
  chunk.reserve(kChunkMax);
  uint64_t at = 0;  // file offset of `chunk`'s first byte
  auto cut = [&] {
    if (chunk.empty()) return;
    auto* c = map.add_chunks();
    c->set_digest(Sha256Of(chunk.data(), chunk.size()));
    c->set_offset(at);
    c->set_length(static_cast<uint32_t>(chunk.size()));
    at += chunk.size();
    chunk.clear();
  };
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "read " + path);
    if (n == 0) break;
    for (size_t i = 0; i < static_cast<size_t>(n); i += kChunkBlock) {
      size_t len = std::min<size_t>(kChunkBlock, static_cast<size_t>(n) - i);
      chunk.insert(chunk.end(), buf.data() + i, buf.data() + i + len);
      if (chunk.size() >= kChunkMax || (chunk.size() >= kChunkMin && (BlockHash(buf.data() + i, len) & 0xf) == 0))
        cut();
    }
  }
  cut();
  map.set_size_bytes(at);
  return map;
}

Status CheckChunkMap(const cluster::v1::ChunkMap& map) {
  uint64_t at = 0;
  for (int i = 0; i < map.chunks_size(); ++i) {
    const auto& c = map.chunks(i);
    if (!IsHexDigest(c.digest()) || c.offset() != at || c.length() == 0 || c.length() > kChunkMax)
      return Status::InvalidArgument("chunk map of " + map.image_digest() + ": chunk " + std::to_string(i) +
                                     " is not a 1.." + std::to_string(kChunkMax) + "-byte chunk with a digest at offset " +
                                     std::to_string(at));
    at += c.length();
  }
  if (at != map.size_bytes())
    return Status::InvalidArgument("chunk map of " + map.image_digest() + " covers " + std::to_string(at) +
                                   " bytes of " + std::to_string(map.size_bytes()));
  for (uint32_t p : map.prefetch())
    if (p >= static_cast<uint32_t>(map.chunks_size()))
      return Status::InvalidArgument("chunk map of " + map.image_digest() + ": prefetch index " + std::to_string(p) +
                                     " is past its " + std::to_string(map.chunks_size()) + " chunks");
  return Status::Ok();
}

std::string ChunkIndex::Hex(const std::string& digest) const {
  return digest.rfind("sha256:", 0) == 0 ? digest.substr(7) : digest;
}

void ChunkIndex::Index(const std::string& digest, const std::string& file, const cluster::v1::ChunkMap& map) {
  std::lock_guard<std::mutex> lk(mu_);
  Image& mine = images_[digest];
  mine = Image{file, {}, {}};
  for (const auto& c : map.chunks()) {
    mine.chunks.push_back(c.digest());
    mine.lengths.push_back(c.length());
    where_.emplace(c.digest(), Where{file, c.offset(), c.length()});
  }
}

Result<cluster::v1::ChunkMap> ChunkIndex::MapOf(const std::string& digest, const std::string& file) {
  std::string hex = Hex(digest);
  if (!IsHexDigest(hex)) return Status::InvalidArgument("'" + digest.substr(0, 80) + "' is not a sha256 digest");
  std::string saved = root_ + "/" + hex + ".chunks";
  cluster::v1::ChunkMap map;
  auto text = ReadFileToString(saved);
  bool have = text.ok() && map.ParseFromString(*text) && map.image_digest() == digest && CheckChunkMap(map).ok();
  if (!have) {
    auto cut = CutIntoChunks(file, digest);
    if (!cut.ok()) return cut.status();
    map = std::move(*cut);
    map.clear_prefetch();
    DSEC_RETURN_IF_ERROR(WriteFileAtomic(saved, map.SerializeAsString()));
  }
  Index(digest, file, map);
  map.clear_prefetch();
  if (auto order = ReadFileToString(root_ + "/" + hex + ".prefetch"); order.ok()) {
    cluster::v1::ChunkMap p;
    if (p.ParseFromString(*order)) {
      for (uint32_t i : p.prefetch())
        if (i < static_cast<uint32_t>(map.chunks_size())) map.add_prefetch(i);
    }
  }
  return map;
}

void ChunkIndex::Forget(const std::string& digest) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!images_.erase(digest)) return;
  // A chunk stays while another image has it, served from that one's file.
  where_.clear();
  for (const auto& [image, im] : images_) {
    (void)image;
    uint64_t off = 0;
    for (size_t i = 0; i < im.chunks.size(); off += im.lengths[i], ++i)
      where_.emplace(im.chunks[i], Where{im.file, off, im.lengths[i]});
  }
  std::string hex = Hex(digest);
  ::unlink((root_ + "/" + hex + ".chunks").c_str());
  ::unlink((root_ + "/" + hex + ".prefetch").c_str());
}

Result<std::vector<std::string>> ChunkIndex::Read(const std::vector<std::string>& digests) const {
  if (digests.size() > kChunkRequestCount)
    return Status::InvalidArgument("a chunk request asks for " + std::to_string(digests.size()) +
                                   " chunks; at most " + std::to_string(kChunkRequestCount));
  std::vector<Where> at;
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& d : digests) {
      if (!IsHexDigest(d)) return Status::InvalidArgument("'" + d.substr(0, 80) + "' is not a chunk digest");
      auto w = where_.find(d);
      if (w == where_.end()) return Status::NotFound("no image here has chunk " + d);
      bytes += w->second.length;
      at.push_back(w->second);
    }
  }
  if (bytes > kChunkRequestBytes)
    return Status::InvalidArgument("a chunk request asks for " + std::to_string(bytes) + " bytes; at most " +
                                   std::to_string(kChunkRequestBytes));
  std::vector<std::string> out;
  out.reserve(at.size());
  for (const auto& w : at) {
    UniqueFd fd(::open(w.file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return Status::FromErrno(errno, "open " + w.file);
    std::string b(w.length, '\0');
    ssize_t n = ::pread(fd.get(), b.data(), b.size(), static_cast<off_t>(w.offset));
    if (n != static_cast<ssize_t>(b.size()))
      return Status::Internal("read " + w.file + " at " + std::to_string(w.offset) + ": short or failed");
    if (g_corrupt.load() > 0 && g_corrupt.fetch_sub(1) > 0) b[0] = static_cast<char>(b[0] ^ 0x5a);
    out.push_back(std::move(b));
  }
  metrics::CountImageChunks("served", out.size());
  metrics::ImageBytes().At(metrics::Labels({{"what", "served"}})).Add(bytes);
  return out;
}

Status ChunkIndex::SetPrefetch(const std::string& digest, const std::vector<uint32_t>& order) {
  std::string hex = Hex(digest);
  if (!IsHexDigest(hex)) return Status::InvalidArgument("'" + digest.substr(0, 80) + "' is not a sha256 digest");
  size_t chunks = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = images_.find(digest);
    if (it == images_.end()) return Status::NotFound("no image here has digest " + digest);
    chunks = it->second.chunks.size();
  }
  std::string path = root_ + "/" + hex + ".prefetch";
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return Status::Ok();
  cluster::v1::ChunkMap p;
  std::set<uint32_t> seen;
  for (uint32_t i : order)
    if (i < chunks && seen.insert(i).second) p.add_prefetch(i);
  return WriteFileAtomic(path, p.SerializeAsString());
}

ChunkIndex::Totals ChunkIndex::totals() const {
  std::lock_guard<std::mutex> lk(mu_);
  Totals t;
  std::set<std::string> seen;
  for (const auto& [image, im] : images_) {
    (void)image;
    t.images++;
    for (size_t i = 0; i < im.chunks.size(); ++i) {
      t.chunks++;
      t.bytes += im.lengths[i];
      if (seen.insert(im.chunks[i]).second) {
        t.unique_chunks++;
        t.unique_bytes += im.lengths[i];
      }
    }
  }
  return t;
}

}  // namespace dsec::images
