// Images on demand, a node's side (docs/images.md). A lazy image is a chunk
// map (drivers/images/chunks.hpp) the controller sent; its file is
// <data>/run/lazy/<hex>.erofs in a FUSE filesystem that dsec-lazyfs (a
// process of its own, so a dsecd restart does not take the images of
// running sandboxes away) serves by asking this class, over a Unix socket,
// for byte ranges. Chunks come from the image service when first read,
// read ahead up to 1 MiB, are checked against their digest before use and
// again whenever read from the node's chunk cache (<data>/image-cache,
// shared by every image and sandbox of the node, least recently used out
// first above its size limit). A chunk is fetched once however many
// sandboxes read it at once. The first reads of an image with no recorded
// prefetch order are recorded and sent to the image service; an image
// that comes with one is prefetched in the background.
// Nothing here knows about CAF: the fetch and the record are callbacks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsec/cluster/v1/cluster.pb.h"
#include "dsec/status.hpp"

namespace dsec::images {

struct LazyOptions {
  std::string data_dir;
  uint64_t cache_bytes = 20ull << 30;   // dsecd --image-cache-gib
  int fetch_timeout_s = 30;             // a read waits this long for the service, then EIO
  uint64_t readahead_bytes = 1 << 20;
  int record_window_s = 30;             // an image's first reads are recorded this long (dsecd --image-record-s)
  std::string lazyfs;                   // the dsec-lazyfs binary
  // The image service: the bytes of each chunk asked for, in order.
  std::function<Result<std::vector<std::string>>(const std::vector<std::string>& digests)> fetch;
  // What an image's first reads were (chunk indices, in order): best effort.
  std::function<void(const std::string& image_digest, const std::vector<uint32_t>& order)> record;
  // dsec-lazyfs died: the lazy images it served (their sandboxes' reads
  // fail from now on). It is started again right after.
  std::function<void(const std::vector<std::string>& image_digests, const std::string& why)> lost;
  std::function<void(int level, const std::string& line)> log;  // 0 info, 1 warn, 2 error
};

struct LazyStats {
  uint64_t images = 0;
  uint64_t fetch_requests = 0;     // requests to the image service
  uint64_t chunks_fetched = 0, bytes_fetched = 0;
  uint64_t chunks_fetched_again = 0;  // fetched although fetched before (evicted or corrupt since)
  uint64_t cache_hits = 0, cache_misses = 0;  // chunk reads from the cache / that had to fetch
  uint64_t digest_failures = 0;    // chunks refused: from the wire or from the cache
  uint64_t evictions = 0;
  uint64_t cached_chunks = 0, cached_bytes = 0;
  uint64_t prefetched_chunks = 0;
  uint64_t fetch_failures = 0;     // reads answered EIO: the service was not there in time
  uint64_t lazyfs_restarts = 0;
  int lazyfs_pid = 0;
};

class LazyImages {
 public:
  explicit LazyImages(LazyOptions o);
  // Stops its threads. dsec-lazyfs and its mount stay while an image
  // mount uses them (running sandboxes outlive dsecd); otherwise go.
  ~LazyImages();

  // Dirs, the socket, the cache's index and the maps of <data>/image-cache;
  // dsec-lazyfs adopted (after a restart) or started.
  Status Start();

  // Takes `map` as the image's (checked; saved before it answers). An
  // image with a prefetch order starts prefetching it in the background.
  Status Add(const cluster::v1::ChunkMap& map);
  bool Has(const std::string& image_digest) const;
  // The lazy file of the image; Unavailable when dsec-lazyfs is not up.
  Result<std::string> Open(const std::string& image_digest) const;
  // Forgets the image's map (its cached chunks go when evicted).
  void Remove(const std::string& image_digest);

  uint64_t CachedBytes(const std::string& image_digest) const;
  // Every lazy image's digest -> CachedBytes (a heartbeat's).
  std::map<std::string, uint64_t> CachedByImage() const;
  LazyStats stats() const;
  std::string mount_dir() const;

  // What the cache at `data_dir` holds of an image now (dsec-image ls on a
  // node's data dir, dsecd running or not): 0 for an image it has no map of.
  static uint64_t CachedBytesIn(const std::string& data_dir, const std::string& image_digest);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsec::images
