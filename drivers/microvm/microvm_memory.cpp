// A microVM's memory (docs/architecture.md "Snapshots and fork"): guest RAM
// is a memfd QEMU maps through /proc/self/fd/3, so the host can read it
// without a migration of every page, and new guests can map a snapshot's
// RAM copy-on-write.
//
// - A booted guest: an empty memfd, mapped shared (share=on). Pages the
//   guest frees go back to the host (the balloon punches them out).
// - A snapshot (SaveMachine): the guest stopped, QEMU's device state saved
//   with x-ignore-shared (its RAM left out), the RAM copied from QEMU's
//   mapping into <dest>/ram (sparse: only what is there), the guest
//   continued.
// - A guest made from a snapshot (a fork, a create --snapshot): one sealed
//   memfd per snapshot holds its RAM (BaseRam), mapped privately (share=off)
//   by every such guest, so they share each page none of them has written.
//   The seal (F_SEAL_WRITE) is what keeps it whole: QEMU 7.2's balloon
//   punches a freed page out of the file even under a private mapping, and
//   on a sealed memfd that fails (the page stays, the others keep theirs);
//   such a guest therefore does not return freed memory to the host.
// - A resumed guest (Pause with memory): its own memfd, filled from the
//   snapshot by QEMU's launcher inside the guest's cgroup (so the memory is
//   the guest's), mapped shared like a booted one.
// - A guest whose RAM is a private mapping (made from a snapshot) cannot
//   leave it out of the migration stream (QEMU 7.2's x-ignore-shared skips
//   shared blocks only): its snapshot or pause saves the RAM in `state`
//   (no `ram` file), and guests made from that map an empty memfd
//   privately and load their RAM from the stream: correct, slower, and
//   without sharing.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "drivers/microvm/microvm_driver.hpp"
#include "runtime/files.hpp"

namespace dsec::drivers {

namespace {

constexpr uint64_t kPage = 4096;

// Where QEMU maps guest RAM (the memfd named kRamName, `size` bytes), and
// whether shared. NotFound when it does not (a guest booted by an older dsecd).
Status FindRamMapping(pid_t pid, uint64_t size, uint64_t* addr, bool* shared) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  if (!maps) return Status::Unavailable("QEMU (pid " + std::to_string(pid) + ") is gone");
  std::string line;
  const std::string name = std::string("/memfd:") + MicrovmDriver::kRamName;
  while (std::getline(maps, line)) {
    if (line.find(name) == std::string::npos) continue;
    unsigned long long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s", &lo, &hi, perms) != 3) continue;
    if (hi - lo != size) continue;
    *addr = lo;
    *shared = perms[3] == 's';
    return Status::Ok();
  }
  return Status::NotFound("QEMU (pid " + std::to_string(pid) + ") maps no guest RAM of " + std::to_string(size) +
                          " bytes in a memfd (a guest booted before snapshots were possible: boot it again)");
}

// The pages of [0, size) that hold something: the data extents of the
// memfd behind /proc/pid/fd/3 and, for a private mapping, the pages present
// in QEMU's page table (its own copies). Runs of pages, as [begin, end).
Result<std::vector<std::pair<uint64_t, uint64_t>>> RamExtents(pid_t pid, uint64_t addr, uint64_t size, bool shared) {
  std::vector<bool> used(size / kPage, false);
  UniqueFd base(::open(("/proc/" + std::to_string(pid) + "/fd/3").c_str(), O_RDONLY | O_CLOEXEC));
  if (!base) return Status::FromErrno(errno, "open QEMU's guest RAM (/proc/" + std::to_string(pid) + "/fd/3)");
  for (off_t off = 0; static_cast<uint64_t>(off) < size;) {
    off_t data = ::lseek(base.get(), off, SEEK_DATA);
    if (data < 0) break;  // ENXIO: no data past off
    off_t hole = ::lseek(base.get(), data, SEEK_HOLE);
    if (hole < 0) hole = static_cast<off_t>(size);
    for (uint64_t p = data / kPage; p < std::min<uint64_t>(hole, size) / kPage; ++p) used[p] = true;
    off = hole;
  }
  if (!shared) {
    UniqueFd pm(::open(("/proc/" + std::to_string(pid) + "/pagemap").c_str(), O_RDONLY | O_CLOEXEC));
    if (!pm) return Status::FromErrno(errno, "open QEMU's pagemap");
    std::vector<uint64_t> entries(64 * 1024);
    for (uint64_t p = 0; p < used.size();) {
      size_t n = std::min<uint64_t>(entries.size(), used.size() - p);
      ssize_t got = ::pread(pm.get(), entries.data(), n * 8, static_cast<off_t>((addr / kPage + p) * 8));
      if (got <= 0) return got < 0 ? Status::FromErrno(errno, "read QEMU's pagemap")
                                   : Status::Internal("QEMU's pagemap ends early");
      for (size_t i = 0; i < static_cast<size_t>(got) / 8; ++i)
        if (entries[i] & (3ull << 62)) used[p + i] = true;  // present or swapped
      p += static_cast<uint64_t>(got) / 8;
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (uint64_t p = 0; p < used.size(); ++p) {
    if (!used[p]) continue;
    if (!runs.empty() && runs.back().second == p * kPage) runs.back().second += kPage;
    else runs.emplace_back(p * kPage, (p + 1) * kPage);
  }
  return runs;
}

Result<std::string> Qmp(const std::string& dir, const std::string& cmd, const std::string& args, int ms = 10'000) {
  return vm::QmpExecute(dir + "/q", cmd, args, ms);
}

// Until the migration (out or in) on `dir`'s QEMU is over; Ok when completed.
Status WaitMigration(const std::string& dir, int timeout_ms, const char* what) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int spin = 0;; ++spin) {
    auto r = Qmp(dir, "query-migrate", "");
    if (!r.ok()) return r.status().Annotate(what);
    auto j = nlohmann::json::parse(*r, nullptr, false);
    std::string status = j.is_object() ? j.value("status", "") : "";
    if (status == "completed") return Status::Ok();
    if (status == "failed" || status == "cancelled")
      return Status::Internal(std::string(what) + " failed: " + (j.is_object() ? j.value("error-desc", status) : status));
    if (std::chrono::steady_clock::now() > deadline)
      return Status::DeadlineExceeded(std::string(what) + " took more than " + std::to_string(timeout_ms) + " ms");
    // QEMU reports no event we can wait on here: poll, briefly at first.
    std::this_thread::sleep_for(std::chrono::milliseconds(spin < 20 ? 2 : 10));
  }
}

std::string Quoted(const std::string& path) { return "'" + path + "'"; }

}  // namespace

Status MicrovmDriver::SaveMachine(const Box& box, const std::string& dest, uint64_t max_bytes, bool stay_stopped,
                                  uint64_t* bytes) {
  if (dest.find('\'') != std::string::npos) return Status::InvalidArgument("a snapshot path with a quote: " + dest);
  uint64_t addr = 0;
  bool shared = false;
  DSEC_RETURN_IF_ERROR(FindRamMapping(box.pid, box.guest_memory, &addr, &shared));
  // Stopped unless dsecd paused it (a monitor slow to answer counts as
  // running: `stop` is harmless on a stopped guest, a live save is not).
  bool was_running = !box.paused && MachineState(box) != RunState::kPaused;
  if (was_running) {
    auto r = Qmp(box.dir, "stop", "");
    if (!r.ok()) return r.status().Annotate("stop the guest for its snapshot");
  }
  auto t0 = std::chrono::steady_clock::now();
  Status s = [&]() -> Status {
    auto caps = Qmp(box.dir, "migrate-set-capabilities",
                    R"({"capabilities":[{"capability":"x-ignore-shared","state":true}]})");
    if (!caps.ok()) return caps.status();
    // A private mapping (a guest made from a snapshot) is not left out:
    // its RAM goes into the stream (no `ram` file then), at disk speed.
    auto bw = Qmp(box.dir, "migrate-set-parameters", R"({"max-bandwidth":17179869184})");
    if (!bw.ok()) return bw.status();
    auto m = Qmp(box.dir, "migrate", nlohmann::json{{"uri", "exec:cat > " + Quoted(dest + "/state")}}.dump());
    if (!m.ok()) return m.status().Annotate("save the guest's device state");
    if (Status w = WaitMigration(box.dir, 300'000, "saving the guest's state"); !w.ok()) {
      (void)Qmp(box.dir, "migrate_cancel", "");
      return w;
    }
    struct stat st {};
    if (::stat((dest + "/state").c_str(), &st) < 0) return Status::FromErrno(errno, "stat " + dest + "/state");
    *bytes = static_cast<uint64_t>(st.st_size);
    if (!shared) {
      UniqueFd fd(::open((dest + "/state").c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd || ::fsync(fd.get()) < 0) return Status::FromErrno(errno, "fsync " + dest + "/state");
      if (max_bytes && *bytes > max_bytes)
        return Status::ResourceExhausted("the guest's state (" + std::to_string(*bytes) +
                                         " bytes) is more than the node's snapshot space left (" +
                                         std::to_string(max_bytes) + " bytes; dsecd --snapshot-gib)");
      return Status::Ok();
    }
    auto runs = RamExtents(box.pid, addr, box.guest_memory, shared);
    if (!runs.ok()) return runs.status();
    UniqueFd mem(::open(("/proc/" + std::to_string(box.pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC));
    if (!mem) return Status::FromErrno(errno, "open QEMU's memory");
    std::string ram_path = dest + "/ram";
    UniqueFd out(::open(ram_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out) return Status::FromErrno(errno, "create " + ram_path);
    if (::ftruncate(out.get(), static_cast<off_t>(box.guest_memory)) < 0)
      return Status::FromErrno(errno, "size " + ram_path);
    std::vector<char> buf(1 << 20);
    uint64_t copied = *bytes;
    for (auto [b, e] : *runs) {
      for (uint64_t off = b; off < e;) {
        size_t n = std::min<uint64_t>(buf.size(), e - off);
        ssize_t got = ::pread(mem.get(), buf.data(), n, static_cast<off_t>(addr + off));
        if (got <= 0) return got < 0 ? Status::FromErrno(errno, "read guest RAM at " + std::to_string(off))
                                     : Status::Internal("guest RAM ends early, at " + std::to_string(off));
        if (::pwrite(out.get(), buf.data(), got, static_cast<off_t>(off)) != got)
          return Status::FromErrno(errno, "write " + ram_path);
        off += got;
        copied += got;
      }
      if (max_bytes && copied > max_bytes)  // checked per run: a run is at most the guest's RAM
        return Status::ResourceExhausted("the guest's memory (" + std::to_string(copied) +
                                         "+ bytes) is more than the node's snapshot space left (" +
                                         std::to_string(max_bytes) + " bytes; dsecd --snapshot-gib)");
    }
    for (const std::string f : {"/state", "/ram"}) {
      UniqueFd fd(::open((dest + f).c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd || ::fsync(fd.get()) < 0) return Status::FromErrno(errno, "fsync " + dest + f);
    }
    *bytes = copied;
    return Status::Ok();
  }();
  if (was_running && !(s.ok() && stay_stopped)) {
    auto r = Qmp(box.dir, "cont", "");
    if (!r.ok() && s.ok()) s = r.status().Annotate("continue the guest after its snapshot");
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  if (s.ok()) Log(0, "microvm " + box.id + ": snapshot of " + std::to_string(*bytes >> 10) + " KiB of memory; the guest stood for " + std::to_string(ms) + " ms");
  return s;
}

Status MicrovmDriver::IncomingMachine(const Box& box, const std::string& dir) {
  if (dir.find('\'') != std::string::npos) return Status::InvalidArgument("a snapshot path with a quote: " + dir);
  auto caps = Qmp(box.dir, "migrate-set-capabilities",
                  R"({"capabilities":[{"capability":"x-ignore-shared","state":true}]})");
  if (!caps.ok()) return caps.status().Annotate("restore");
  auto in = Qmp(box.dir, "migrate-incoming", nlohmann::json{{"uri", "exec:cat " + Quoted(dir + "/state")}}.dump());
  if (!in.ok()) return in.status().Annotate("restore the guest's device state");
  DSEC_RETURN_IF_ERROR(WaitMigration(box.dir, 60'000, "restoring the guest's device state"));
  auto cont = Qmp(box.dir, "cont", "");
  return cont.ok() ? Status::Ok() : cont.status().Annotate("start the restored guest");
}

Result<std::shared_ptr<UniqueFd>> MicrovmDriver::BaseRam(const std::string& dir, uint64_t size) {
  std::lock_guard<std::mutex> lk(base_mu_);
  if (auto held = bases_[dir].lock()) return held;
  std::string path = dir + "/ram";
  UniqueFd src(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!src) return Status::FromErrno(errno, "open " + path);
  struct stat st;
  if (::fstat(src.get(), &st) < 0 || static_cast<uint64_t>(st.st_size) != size)
    return Status::FailedPrecondition(path + " does not hold " + std::to_string(size) + " bytes of guest memory");
  auto base = std::make_shared<UniqueFd>(::memfd_create(kRamName, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!*base) return Status::FromErrno(errno, "memfd_create");
  if (::ftruncate(base->get(), static_cast<off_t>(size)) < 0) return Status::FromErrno(errno, "size the memory");
  DSEC_RETURN_IF_ERROR(CopyData(src.get(), base->get(), size) == 0 ? Status::Ok()
                                                                   : Status::FromErrno(errno, "read " + path));
  if (::fcntl(base->get(), F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0)
    return Status::FromErrno(errno, "seal the snapshot's memory");
  // Stale entries (snapshots no guest maps any more) go as we pass.
  for (auto it = bases_.begin(); it != bases_.end();) it = it->second.expired() ? bases_.erase(it) : std::next(it);
  bases_[dir] = base;
  return base;
}

// Async-signal-safe (QEMU's launcher calls it between fork and exec).
int MicrovmDriver::CopyData(int src, int dst, uint64_t size) {
  for (off_t off = 0; static_cast<uint64_t>(off) < size;) {
    off_t data = ::lseek(src, off, SEEK_DATA);
    if (data < 0) return errno == ENXIO ? 0 : -1;
    off_t hole = ::lseek(src, data, SEEK_HOLE);
    if (hole < 0) return -1;
    off_t at = data;
    while (at < hole) {
      off_t in = at;
      if (::lseek(dst, at, SEEK_SET) < 0) return -1;
      ssize_t n = ::sendfile(dst, src, &in, static_cast<size_t>(hole - at));
      if (n <= 0) return -1;
      at += n;
    }
    off = hole;
  }
  return 0;
}

std::string MicrovmDriver::MachineFingerprint() const {
  // What a saved device state needs to load: the same QEMU (by its file)
  // and accelerator, and the same machine (the arguments LaunchMachine
  // gives; its version here).
  struct stat st{};
  ::stat(qemu_.c_str(), &st);
  return "microvm-1 " + qemu_ + " " + std::to_string(st.st_size) + "@" + std::to_string(st.st_mtim.tv_sec) + " " + accel();
}

}  // namespace dsec::drivers
