#include "drivers/images/lazy_images.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "drivers/images/chunks.hpp"
#include "drivers/images/lazy_images_impl.hpp"
#include "drivers/images/lazy_wire.hpp"
#include "runtime/files.hpp"
#include "runtime/metrics.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::images {

namespace {

constexpr size_t kRecordMax = 16384;
// Connections on the lazy socket served at once: dsec-lazyfs keeps one per
// FUSE worker thread (libfuse's default is at most 10).
constexpr size_t kMaxLazyConns = 256;

std::string HexOfDigest(const std::string& digest) {
  return digest.rfind("sha256:", 0) == 0 ? digest.substr(7) : digest;
}

std::string Sha256Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return HexOf(md, len);
}

using lazywire::ReadFull;
using lazywire::WriteFull;

// A thread's last verified chunk: a read that spans a chunk in several
// FUSE requests reads and checks it once.
thread_local std::string t_memo_digest;
thread_local std::string t_memo_bytes;

}  // namespace

LazyImages::Impl::Impl(LazyOptions opts) : o(std::move(opts)) {
  cache_dir = o.data_dir + "/image-cache";
  chunk_dir = cache_dir + "/chunks";
  map_dir = cache_dir + "/maps";
  run_dir = o.data_dir + "/run";
  mnt = run_dir + "/lazy";
  sock_path = run_dir + "/lazy.sock";
  pid_path = run_dir + "/lazyfs.pid";
}

std::string LazyImages::Impl::ChunkPath(const std::string& digest) const {
  return chunk_dir + "/" + digest.substr(0, 2) + "/" + digest;
}

// The cache's index from its files (oldest first out, by their mtime) and
// the maps of the images this node was given.
Status LazyImages::Impl::LoadCache() {
  for (const auto& d : {cache_dir, chunk_dir, map_dir, run_dir})
    DSEC_RETURN_IF_ERROR(MakeDirs(d, 0700));
  std::vector<std::pair<int64_t, std::pair<std::string, uint64_t>>> found;
  for (const auto& sub : ListSubdirs(chunk_dir))
    for (const auto& name : ListEntries(chunk_dir + "/" + sub)) {
      std::string path = chunk_dir + "/" + sub + "/" + name;
      struct stat s;
      if (!IsHexDigest(name) || ::stat(path.c_str(), &s) < 0) {
        ::unlink(path.c_str());  // a write cut short (a .tmp) or not ours
        continue;
      }
      found.push_back({s.st_mtim.tv_sec * 1000000000ll + s.st_mtim.tv_nsec, {name, uint64_t(s.st_size)}});
    }
  std::sort(found.begin(), found.end());
  std::lock_guard<std::mutex> lk(mu);
  for (const auto& [t, f] : found) {
    (void)t;
    lru.push_front(f.first);
    cached[f.first] = Cached{f.second, lru.begin()};
    cached_total += f.second;
  }
  for (const auto& name : ListEntries(map_dir)) {
    auto text = ReadFileToString(map_dir + "/" + name);
    cluster::v1::ChunkMap m;
    if (!text.ok() || !m.ParseFromString(*text) || !CheckChunkMap(m).ok()) {
      Log(1, "image cache: map " + name + " is unreadable; removed (the controller sends it again with a placement)");
      ::unlink((map_dir + "/" + name).c_str());
      continue;
    }
    auto im = std::make_shared<Image>();
    im->map = std::move(m);
    uint64_t end = 0;
    for (const auto& c : im->map.chunks()) im->ends.push_back(end += c.length());
    images[HexOfDigest(im->map.image_digest())] = im;
  }
  EvictLocked();
  return Status::Ok();
}

Status LazyImages::Impl::AddMap(const cluster::v1::ChunkMap& map, bool save) {
  DSEC_RETURN_IF_ERROR(CheckChunkMap(map));
  std::string hex = HexOfDigest(map.image_digest());
  if (!IsHexDigest(hex)) return Status::InvalidArgument("'" + map.image_digest().substr(0, 80) + "' is not a digest");
  auto im = std::make_shared<Image>();
  im->map = map;
  uint64_t end = 0;
  for (const auto& c : im->map.chunks()) im->ends.push_back(end += c.length());
  im->recording = map.prefetch_size() == 0 && static_cast<bool>(o.record);
  if (save) DSEC_RETURN_IF_ERROR(WriteFileAtomic(map_dir + "/" + hex, map.SerializeAsString(), 0600));
  {
    std::lock_guard<std::mutex> lk(mu);
    images[hex] = im;
  }
  if (map.prefetch_size() > 0 && !stopping) {
    std::lock_guard<std::mutex> lk(mu);
    prefetchers.emplace_back([this, im] { Prefetch(im); });
  }
  return Status::Ok();
}

std::shared_ptr<LazyImages::Impl::Image> LazyImages::Impl::Find(const std::string& hex) const {
  std::lock_guard<std::mutex> lk(mu);
  auto it = images.find(hex);
  return it == images.end() ? nullptr : it->second;
}

int LazyImages::Impl::ReadAt(const std::string& hex, uint64_t offset, uint32_t length, std::string* out) {
  out->clear();
  auto im = Find(hex);
  if (!im) return ENOENT;
  uint64_t size = im->map.size_bytes();
  if (offset >= size || length == 0) return 0;
  uint64_t end = std::min<uint64_t>(offset + length, size);
  auto first = static_cast<uint32_t>(std::upper_bound(im->ends.begin(), im->ends.end(), offset) - im->ends.begin());
  out->reserve(end - offset);
  std::string bytes;
  for (uint32_t i = first; i < im->ends.size() && out->size() < end - offset; ++i) {
    if (int e = ChunkBytes(*im, i, &bytes)) return e;
    uint64_t start = im->map.chunks(i).offset();
    uint64_t from = offset > start ? offset - start : 0;
    uint64_t to = std::min<uint64_t>(bytes.size(), end - start);
    out->append(bytes, from, to - from);
  }
  return 0;
}

int LazyImages::Impl::ChunkBytes(Image& im, uint32_t index, std::string* out) {
  const auto& c = im.map.chunks(index);
  Record(im, index);
  if (t_memo_digest == c.digest()) {
    *out = t_memo_bytes;
    return 0;
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (ReadCached(c, out)) {
      t_memo_digest = c.digest();
      t_memo_bytes = *out;
      return 0;
    }
    if (int e = Ensure(im, index, false)) return e;
  }
  Log(2, "image cache: chunk " + c.digest() + " of " + im.map.image_digest() +
             " could not be kept long enough to read (a cache far too small?)");
  return EIO;
}

bool LazyImages::Impl::ReadCached(const cluster::v1::ImageChunk& c, std::string* out) {
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = cached.find(c.digest());
    if (it == cached.end()) return false;
    lru.splice(lru.begin(), lru, it->second.lru);
  }
  auto bytes = ReadFileToString(ChunkPath(c.digest()));
  bool good = bytes.ok() && bytes->size() == c.length() && Sha256Hex(*bytes) == c.digest();
  std::lock_guard<std::mutex> lk(mu);
  if (!good) {
    if (bytes.ok()) {
      st.digest_failures++;
      metrics::CountImageChunks("digest_failure");
      Log(1, "image cache: chunk " + c.digest() + " in the cache does not match its digest; removed, fetched again");
    }
    ::unlink(ChunkPath(c.digest()).c_str());
    auto it = cached.find(c.digest());
    if (it != cached.end()) {
      cached_total -= it->second.size;
      lru.erase(it->second.lru);
      cached.erase(it);
    }
    return false;
  }
  st.cache_hits++;
  metrics::CountImageChunks("cache_hit");
  *out = std::move(*bytes);
  return true;
}

// Chunk `index` in the cache: fetched with what follows it (read-ahead),
// or waited for when another read is fetching it.
int LazyImages::Impl::Ensure(Image& im, uint32_t index, bool prefetch) {
  auto deadline = Clock::now() + std::chrono::seconds(o.fetch_timeout_s);
  const std::string& want = im.map.chunks(index).digest();
  std::unique_lock<std::mutex> lk(mu);
  while (!cached.count(want) && inflight.count(want)) {
    if (stopping || cv.wait_until(lk, deadline) == std::cv_status::timeout) {
      st.fetch_failures++;
      return EIO;
    }
  }
  if (cached.count(want)) return 0;
  std::vector<std::string> group;
  uint64_t bytes = 0;
  for (uint32_t j = index; j < static_cast<uint32_t>(im.map.chunks_size()) && group.size() < kChunkRequestCount; ++j) {
    const auto& c = im.map.chunks(j);
    if (cached.count(c.digest()) || inflight.count(c.digest())) {
      if (j == index) continue;
      break;
    }
    if (j > index && bytes + c.length() > o.readahead_bytes) break;
    group.push_back(c.digest());
    inflight.insert(c.digest());
    bytes += c.length();
  }
  if (!prefetch) {
    st.cache_misses++;
    metrics::CountImageChunks("cache_miss");
  }
  lk.unlock();
  int e = FetchGroup(group, deadline, prefetch);
  lk.lock();
  for (const auto& d : group) inflight.erase(d);
  cv.notify_all();
  return e;
}

int LazyImages::Impl::FetchGroup(const std::vector<std::string>& all, Clock::time_point deadline, bool prefetch) {
  std::vector<std::string> digests = all;
  auto backoff = std::chrono::milliseconds(100);
  std::string last_error;
  while (!digests.empty()) {
    if (!o.fetch) return EIO;
    {
      std::lock_guard<std::mutex> lk(mu);
      st.fetch_requests++;
    }
    auto got = o.fetch(digests);
    std::vector<std::string> again;
    if (got.ok() && got->size() == digests.size()) {
      for (size_t i = 0; i < digests.size(); ++i) {
        const std::string& d = digests[i];
        std::string& b = (*got)[i];
        if (Sha256Hex(b) != d) {
          std::lock_guard<std::mutex> lk(mu);
          st.digest_failures++;
          metrics::CountImageChunks("digest_failure");
          Log(1, "image cache: chunk " + d + " arrived with another digest; refused, fetched again");
          again.push_back(d);
          continue;
        }
        std::string path = ChunkPath(d);
        (void)MakeDirs(chunk_dir + "/" + d.substr(0, 2), 0700);
        // No fsync: a chunk a crash cut short fails its digest and is fetched again.
        Status w = WriteFileAtomic(path, b, 0600);
        std::lock_guard<std::mutex> lk(mu);
        if (!w.ok()) {
          Log(2, "image cache: " + w.message());
          return EIO;
        }
        if (!cached.count(d)) {
          lru.push_front(d);
          cached[d] = Cached{b.size(), lru.begin()};
          cached_total += b.size();
        }
        st.chunks_fetched++;
        st.bytes_fetched += b.size();
        metrics::CountImageChunks("fetched");
        metrics::ImageBytes().At(metrics::Labels({{"what", "fetched"}})).Add(b.size());
        if (prefetch) {
          st.prefetched_chunks++;
          metrics::CountImageChunks("prefetched");
        }
        if (!ever_fetched.insert(d).second) {
          st.chunks_fetched_again++;
          metrics::CountImageChunks("fetched_again");
        }
      }
      std::lock_guard<std::mutex> lk(mu);
      EvictLocked();
    } else {
      last_error = got.ok() ? "the service answered " + std::to_string(got->size()) + " chunks of " +
                                  std::to_string(digests.size())
                            : got.status().message();
      again = digests;
    }
    digests = std::move(again);
    if (digests.empty()) break;
    if (stopping || Clock::now() + backoff > deadline) {
      std::lock_guard<std::mutex> lk(mu);
      st.fetch_failures++;
      metrics::CountImageChunks("fetch_failure");
      Log(2, "image cache: " + std::to_string(digests.size()) + " chunk(s) from " + digests.front() +
                 " not had within " + std::to_string(o.fetch_timeout_s) + " s (" + last_error +
                 "); the read fails with EIO");
      return EIO;
    }
    // Waiting for the image service to come back: a retry's pause.
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  return 0;
}

void LazyImages::Impl::EvictLocked() {
  while (cached_total > o.cache_bytes && !lru.empty()) {
    std::string victim = lru.back();
    lru.pop_back();
    auto it = cached.find(victim);
    if (it != cached.end()) {
      cached_total -= it->second.size;
      cached.erase(it);
    }
    ::unlink(ChunkPath(victim).c_str());
    st.evictions++;
    metrics::CountImageChunks("evicted");
  }
}

void LazyImages::Impl::Record(Image& im, uint32_t index) {
  if (!im.recording) return;
  std::lock_guard<std::mutex> lk(mu);
  if (!im.recording) return;
  if (!im.read_yet) {
    im.read_yet = true;
    im.first_read = Clock::now();
  }
  if (im.order.size() < kRecordMax && im.ordered.insert(index).second) im.order.push_back(index);
}

// Sends what images' first reads were once their window has passed (or,
// with `all`, now).
void LazyImages::Impl::FlushRecords(bool all) {
  std::vector<std::pair<std::string, std::vector<uint32_t>>> out;
  {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& [hex, im] : images) {
      (void)hex;
      if (!im->recording || !im->read_yet) continue;
      if (!all && Clock::now() - im->first_read < std::chrono::seconds(o.record_window_s)) continue;
      im->recording = false;
      out.emplace_back(im->map.image_digest(), std::move(im->order));
    }
  }
  for (auto& [digest, order] : out) {
    Log(0, "image cache: " + digest + "'s first reads (" + std::to_string(order.size()) +
               " chunks) go to the image service as its prefetch order");
    if (o.record) o.record(digest, order);
  }
}

void LazyImages::Impl::Prefetch(std::shared_ptr<Image> im) {
  for (uint32_t i : im->map.prefetch()) {
    if (stopping) return;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (cached.count(im->map.chunks(i).digest())) continue;
    }
    if (Ensure(*im, i, true) != 0) {
      Log(1, "image cache: prefetch of " + im->map.image_digest() + " stopped: the image service did not answer");
      return;
    }
  }
  Log(0, "image cache: prefetched " + im->map.image_digest() + " (" + std::to_string(im->map.prefetch_size()) +
             " chunks in its order)");
}

Status LazyImages::Impl::Listen() {
  ::unlink(sock_path.c_str());
  listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd < 0) return Status::FromErrno(errno, "socket");
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (sock_path.size() >= sizeof(a.sun_path)) return Status::InvalidArgument("socket path too long: " + sock_path);
  std::strcpy(a.sun_path, sock_path.c_str());
  if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) < 0 || ::chmod(sock_path.c_str(), 0600) < 0 ||
      ::listen(listen_fd, 64) < 0)
    return Status::FromErrno(errno, "listen on " + sock_path);
  acceptor = std::thread([this] { AcceptLoop(); });
  return Status::Ok();
}

void LazyImages::Impl::AcceptLoop() {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (stopping) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EBADF || errno == EINVAL) return;
      continue;
    }
    std::vector<std::thread> done;
    {
      std::lock_guard<std::mutex> lk(mu);
      done.swap(ended);
      if (conns.size() >= kMaxLazyConns) {
        // dsec-lazyfs opens one per FUSE thread: more is not it.
        if (refused_conns++ % 1000 == 0)
          Log(2, "lazy images: refused a connection on " + sock_path + ": " + std::to_string(kMaxLazyConns) +
                     " are open already");
        ::close(fd);
      } else {
        auto& slot = conns[fd];
        if (slot.joinable()) ended.push_back(std::move(slot));  // not expected: Serve drops its entry as it closes
        slot = std::thread([this, fd] { Serve(fd); });
      }
    }
    for (auto& t : done) t.join();
  }
}

// One dsec-lazyfs thread's connection: requests one at a time.
void LazyImages::Impl::Serve(int fd) {
  std::string data;
  for (;;) {
    lazywire::Request rq;
    if (!ReadFull(fd, &rq, sizeof rq) || rq.name_len > lazywire::kMaxName) break;
    std::string name(rq.name_len, '\0');
    if (!ReadFull(fd, name.data(), name.size())) break;
    lazywire::Reply rp;
    data.clear();
    std::string hex = name.size() > 6 && name.compare(name.size() - 6, 6, ".erofs") == 0
                          ? name.substr(0, name.size() - 6)
                          : std::string();
    if (rq.op == lazywire::kList) {
      std::lock_guard<std::mutex> lk(mu);
      for (const auto& [h, im] : images) {
        (void)im;
        if (data.size() + h.size() + 7 > lazywire::kMaxList) break;
        data += h + ".erofs\n";
      }
    } else if (!IsHexDigest(hex)) {
      rp.err = ENOENT;
    } else if (rq.op == lazywire::kStat) {
      auto im = Find(hex);
      if (im) rp.size = im->map.size_bytes();
      else rp.err = ENOENT;
    } else if (rq.op == lazywire::kRead) {
      rp.err = ReadAt(hex, rq.offset, std::min(rq.length, lazywire::kMaxRead), &data);
      if (rp.err) data.clear();
    } else {
      rp.err = EINVAL;
    }
    rp.data_len = static_cast<uint32_t>(data.size());
    if (!WriteFull(fd, &rp, sizeof rp) || !WriteFull(fd, data.data(), data.size())) break;
  }
  std::lock_guard<std::mutex> lk(mu);
  auto me = conns.find(fd);
  if (me == conns.end()) return;
  ::close(fd);  // its number is taken again only after its entry is gone (the acceptor waits for mu)
  ended.push_back(std::move(me->second));
  conns.erase(me);
}

// ---- the public face

LazyImages::LazyImages(LazyOptions o) : impl_(std::make_unique<Impl>(std::move(o))) {}

LazyImages::~LazyImages() {
  auto& m = *impl_;
  m.stopping = true;
  m.cv.notify_all();
  if (m.listen_fd >= 0) ::shutdown(m.listen_fd, SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lk(m.mu);
    for (const auto& [fd, t] : m.conns) ::shutdown(fd, SHUT_RDWR);
  }
  if (m.acceptor.joinable()) m.acceptor.join();
  if (m.keeper.joinable()) m.keeper.join();
  std::vector<std::thread> threads;
  std::vector<int> open_fds;  // taken from their threads here: closed once those are joined
  {
    std::lock_guard<std::mutex> lk(m.mu);
    threads.swap(m.ended);
    for (auto& [fd, t] : m.conns) {
      open_fds.push_back(fd);
      threads.push_back(std::move(t));
    }
    m.conns.clear();
    for (auto& t : m.prefetchers) threads.push_back(std::move(t));
    m.prefetchers.clear();
  }
  for (auto& t : threads)
    if (t.joinable()) t.join();
  for (int fd : open_fds) ::close(fd);
  if (m.listen_fd >= 0) ::close(m.listen_fd);
  m.FlushRecords(true);
  m.StopLazyfsIfUnused();
}

Status LazyImages::Start() {
  DSEC_RETURN_IF_ERROR(impl_->LoadCache());
  DSEC_RETURN_IF_ERROR(impl_->Listen());
  return impl_->StartOrAdopt();
}

Status LazyImages::Add(const cluster::v1::ChunkMap& map) { return impl_->AddMap(map, true); }

bool LazyImages::Has(const std::string& image_digest) const {
  return impl_->Find(HexOfDigest(image_digest)) != nullptr;
}

Result<std::string> LazyImages::Open(const std::string& image_digest) const {
  std::string hex = HexOfDigest(image_digest);
  if (!impl_->Find(hex))
    return Status::NotFound("this node has no chunk map of image " + image_digest +
                            " (the controller sends it with a placement)");
  if (!impl_->up)
    return Status::Unavailable("the lazy image file server (dsec-lazyfs) is not running on this node; it is being "
                               "started again (see dsecd's log)");
  return impl_->mnt + "/" + hex + ".erofs";
}

void LazyImages::Remove(const std::string& image_digest) {
  std::string hex = HexOfDigest(image_digest);
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->images.erase(hex);
  ::unlink((impl_->map_dir + "/" + hex).c_str());
}

namespace {
// What `cached` holds of `map`, each distinct chunk once.
template <class Cached>
uint64_t HeldOf(const cluster::v1::ChunkMap& map, const Cached& cached) {
  uint64_t n = 0;
  std::set<std::string> seen;
  for (const auto& c : map.chunks())
    if (cached.count(c.digest()) && seen.insert(c.digest()).second) n += c.length();
  return n;
}
}  // namespace

uint64_t LazyImages::CachedBytes(const std::string& image_digest) const {
  auto im = impl_->Find(HexOfDigest(image_digest));
  if (!im) return 0;
  std::lock_guard<std::mutex> lk(impl_->mu);
  return HeldOf(im->map, impl_->cached);
}

std::map<std::string, uint64_t> LazyImages::CachedByImage() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::map<std::string, uint64_t> out;
  for (const auto& [hex, im] : impl_->images) out[im->map.image_digest()] = HeldOf(im->map, impl_->cached);
  return out;
}

LazyStats LazyImages::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  LazyStats s = impl_->st;
  s.images = impl_->images.size();
  s.cached_chunks = impl_->cached.size();
  s.cached_bytes = impl_->cached_total;
  s.lazyfs_pid = impl_->up ? impl_->lazyfs_pid : 0;
  return s;
}

std::string LazyImages::mount_dir() const { return impl_->mnt; }

uint64_t LazyImages::CachedBytesIn(const std::string& data_dir, const std::string& image_digest) {
  LazyOptions o;
  o.data_dir = data_dir;
  Impl probe(std::move(o));
  std::string hex = HexOfDigest(image_digest);
  auto text = ReadFileToString(probe.map_dir + "/" + hex);
  cluster::v1::ChunkMap m;
  if (!text.ok() || !m.ParseFromString(*text)) return 0;
  uint64_t n = 0;
  std::set<std::string> seen;
  struct stat s;
  for (const auto& c : m.chunks())
    if (seen.insert(c.digest()).second && ::stat(probe.ChunkPath(c.digest()).c_str(), &s) == 0) n += c.length();
  return n;
}

}  // namespace dsec::images
