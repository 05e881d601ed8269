// Images as content-addressed chunks (docs/images.md), the controller's
// side: an EROFS file is cut at 4 KiB block boundaries chosen by the
// blocks' content (a cut after a block whose hash has its low 4 bits zero,
// at least 16 KiB and at most 256 KiB apart: ~80 KiB on average). EROFS
// stores each file's data in whole blocks, so the same file in two images
// gives the same chunks wherever it lies, and two images of one family
// share the chunks of what they share. A chunk is named by the SHA-256 of
// its bytes. Blocking (reads and hashes files): call it off actor threads.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dsec/cluster/v1/cluster.pb.h"
#include "dsec/status.hpp"

namespace dsec::images {

inline constexpr uint32_t kChunkBlock = 4096;
inline constexpr uint32_t kChunkMin = 16 << 10;
inline constexpr uint32_t kChunkMax = 256 << 10;
// What one chunk request may ask for: at most this many chunks, and their
// bytes at most kChunkRequestBytes (a node's read-ahead stays below both).
inline constexpr size_t kChunkRequestCount = 256;
inline constexpr uint64_t kChunkRequestBytes = 8 << 20;

// The chunks of the file at `path` (whose digest is `image_digest`).
Result<cluster::v1::ChunkMap> CutIntoChunks(const std::string& path, const std::string& image_digest);

// A chunk map's sanity, as a node checks one before it serves the image
// from it: chunks in order, adjacent, within the size bounds, covering
// size_bytes exactly, digests of 64 hex digits, prefetch indices in range.
Status CheckChunkMap(const cluster::v1::ChunkMap& map);

// Tests (the controller console's chunk-fault, --test-hooks): the next `n`
// chunks served have their first byte flipped on the way out.
void CorruptNextServedChunks(int n);

// Whether `s` is 64 lower-case hex digits.
bool IsHexDigest(const std::string& s);

// The image service's index: every chunk of the images registered here,
// by digest, and where its bytes are (its first image's file). Maps are
// kept next to the image files (<root>/<hex>.chunks, made once per image)
// with what each image's first sandbox read first (<hex>.prefetch).
class ChunkIndex {
 public:
  explicit ChunkIndex(std::string root) : root_(std::move(root)) {}

  // The map of the image with `digest` (file `file`), with its prefetch
  // order when one was recorded. Made and saved when missing; indexed.
  Result<cluster::v1::ChunkMap> MapOf(const std::string& digest, const std::string& file);
  // Drops what the index knows of an image's file (it was removed).
  void Forget(const std::string& digest);

  // The bytes of each chunk asked for, in order. InvalidArgument for a
  // request past the bounds above or a digest that is not one; NotFound
  // naming the first digest no image here has.
  Result<std::vector<std::string>> Read(const std::vector<std::string>& digests) const;

  // Keeps `order` (chunk indices) as the image's prefetch order, unless it
  // has one: the first node's record stands.
  Status SetPrefetch(const std::string& digest, const std::vector<uint32_t>& order);

  struct Totals {
    uint64_t images = 0, chunks = 0, bytes = 0;  // over every indexed image
    uint64_t unique_chunks = 0, unique_bytes = 0;
  };
  Totals totals() const;

 private:
  struct Where {
    std::string file;
    uint64_t offset = 0;
    uint32_t length = 0;
  };
  struct Image {
    std::string file;
    std::vector<std::string> chunks;  // digests, in file order
    std::vector<uint32_t> lengths;
  };
  std::string Hex(const std::string& digest) const;
  void Index(const std::string& digest, const std::string& file, const cluster::v1::ChunkMap& map);

  std::string root_;
  mutable std::mutex mu_;
  std::map<std::string, Where> where_;  // chunk digest -> its bytes (in its first image's file)
  std::map<std::string, Image> images_;  // by image digest
};

}  // namespace dsec::images
