// LazyImages' insides, shared by lazy_images.cpp (the cache, fetches, the
// socket) and lazy_process.cpp (dsec-lazyfs: start, adopt, watch, stop).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "drivers/images/lazy_images.hpp"

namespace dsec::images {

class LazyImages::Impl {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Impl(LazyOptions o);

  struct Image {
    cluster::v1::ChunkMap map;
    std::vector<uint64_t> ends;  // end offset of each chunk
    // The first reads on this node, while no prefetch order came with it.
    bool recording = false;
    bool read_yet = false;
    Clock::time_point first_read;
    std::vector<uint32_t> order;
    std::set<uint32_t> ordered;
  };

  // ---- lazy_images.cpp
  Status LoadCache();
  Status AddMap(const cluster::v1::ChunkMap& map, bool save);
  std::shared_ptr<Image> Find(const std::string& hex) const;
  // Bytes [offset, offset+length) of image `hex`: 0, or the errno to answer.
  int ReadAt(const std::string& hex, uint64_t offset, uint32_t length, std::string* out);
  int ChunkBytes(Image& im, uint32_t index, std::string* out);
  bool ReadCached(const cluster::v1::ImageChunk& c, std::string* out);
  int Ensure(Image& im, uint32_t index, bool prefetch);
  int FetchGroup(const std::vector<std::string>& digests, Clock::time_point deadline, bool prefetch);
  void EvictLocked();
  void Record(Image& im, uint32_t index);
  void FlushRecords(bool all);
  void Prefetch(std::shared_ptr<Image> im);
  std::string ChunkPath(const std::string& digest) const;
  Status Listen();
  void AcceptLoop();
  void Serve(int fd);
  void Log(int level, const std::string& line) const {
    if (o.log) o.log(level, line);
  }

  // ---- lazy_process.cpp
  Status StartOrAdopt();
  Status StartLazyfs();
  void KeeperLoop();
  void LazyfsDied();
  // At stop: dsec-lazyfs goes when no image mount reads through it.
  void StopLazyfsIfUnused();

  LazyOptions o;
  std::string cache_dir, chunk_dir, map_dir, run_dir, mnt, sock_path, pid_path;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::shared_ptr<Image>> images;  // by hex digest
  struct Cached {
    uint64_t size = 0;
    std::list<std::string>::iterator lru;
  };
  std::unordered_map<std::string, Cached> cached;  // by chunk digest
  std::list<std::string> lru;                      // most recent first
  uint64_t cached_total = 0;
  std::set<std::string> inflight, ever_fetched;
  LazyStats st;

  std::atomic<bool> stopping{false};
  std::atomic<bool> up{false};
  int listen_fd = -1;
  std::thread acceptor, keeper;
  // A connection's thread by its fd while it serves; then ended, joined at
  // the next accept (a closed connection leaves no thread or stack).
  std::map<int, std::thread> conns;
  std::vector<std::thread> ended, prefetchers;
  uint64_t refused_conns = 0;
  int lazyfs_pid = 0;
  int pidfd = -1;
};

}  // namespace dsec::images
