#include "drivers/vm/guest.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/files.hpp"
#include "runtime/frame.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers::vm {

namespace {

// One entry of a newc cpio archive (the format the kernel unpacks).
void CpioEntry(std::string* out, const std::string& name, uint32_t mode, const std::string& data) {
  static uint32_t ino = 0x7d5ec000;
  char hdr[111];
  std::snprintf(hdr, sizeof hdr, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", ino++, mode, 0u, 0u,
                1u, 0u, static_cast<uint32_t>(data.size()), 0u, 0u, 0u, 0u, static_cast<uint32_t>(name.size() + 1), 0u);
  out->append(hdr, 110);
  out->append(name);
  out->push_back('\0');
  while (out->size() % 4) out->push_back('\0');
  out->append(data);
  while (out->size() % 4) out->push_back('\0');
}

}  // namespace

std::string PrepareCommand(const std::string& guest_dir) { return "dsec-image guest --dir " + guest_dir; }

Result<Guest> LoadGuest(const std::string& guest_dir, const std::string& init_path, const std::string& agent_path,
                        const std::string& initrd_path) {
  Guest g;
  g.kernel = guest_dir + "/vmlinux";
  std::string base = guest_dir + "/base.cpio";
  struct stat st;
  if (::stat(g.kernel.c_str(), &st) < 0 || ::stat(base.c_str(), &st) < 0)
    return Status::FailedPrecondition("the VM guest (kernel and initramfs) is not prepared in " + guest_dir +
                                      ": run `" + PrepareCommand(guest_dir) + "` (needs apt-get, lz4, cpio, busybox-static)");
  int format = 1;
  if (auto txt = ReadFileToString(guest_dir + "/guest.txt"); txt.ok()) {
    std::istringstream in(*txt);
    std::string key, value;
    while (in >> key >> value) {
      if (key == "kernel") g.kernel_version = value;
      if (key == "format") format = std::atoi(value.c_str());
    }
  }
  if (format != kGuestFormat)
    return Status::FailedPrecondition("the VM guest in " + guest_dir + " was prepared by " +
                                      (format < kGuestFormat ? "an older" : "a newer") + " dsec-image (format " +
                                      std::to_string(format) + "; this dsecd boots format " +
                                      std::to_string(kGuestFormat) + "): run `" + PrepareCommand(guest_dir) +
                                      "` again");
  auto cpio = ReadFileToString(base);
  if (!cpio.ok()) return cpio.status().Annotate("the VM guest's initramfs");
  auto init = ReadFileToString(init_path);
  if (!init.ok()) return init.status().Annotate("the VM guest's /init (tools/guest/init, installed as dsec-guest-init)");
  auto agent = ReadFileToString(agent_path);
  if (!agent.ok()) return agent.status().Annotate("dsec-agent (for the VM guest)");
  std::string out = std::move(*cpio);
  while (out.size() % 4) out.push_back('\0');
  CpioEntry(&out, "init", 0100755, *init);
  CpioEntry(&out, "dsec", 040755, "");
  CpioEntry(&out, "dsec/agent", 0100755, *agent);
  CpioEntry(&out, "TRAILER!!!", 0, "");
  DSEC_RETURN_IF_ERROR(WriteFileAtomic(initrd_path, out, 0644));
  g.initrd = initrd_path;
  return g;
}

Result<std::string> ChooseAccelerator(const std::string& want, std::string* why) {
  bool hw = ::access("/sys/module/kvm_intel", F_OK) == 0 || ::access("/sys/module/kvm_amd", F_OK) == 0;
  UniqueFd kvm(::open("/dev/kvm", O_RDWR | O_CLOEXEC));
  bool usable = kvm && hw;
  if (!kvm) *why = std::string("/dev/kvm: ") + std::strerror(errno);
  else if (!hw) *why = "/dev/kvm is not backed by hardware virtualisation (no kvm_intel or kvm_amd; e.g. kvm_pvm)";
  else *why = "/dev/kvm with hardware virtualisation";
  if (want == "tcg") {
    *why = "tcg asked for (--vm-accel tcg)";
    return std::string("tcg");
  }
  if (want == "kvm" && !usable) return Status::FailedPrecondition("--vm-accel kvm, but " + *why);
  if (want != "auto" && want != "kvm")
    return Status::InvalidArgument("--vm-accel must be auto, kvm or tcg, not '" + want + "'");
  return std::string(usable ? "kvm" : "tcg");
}

uint64_t HostTscKhz() {
  static const uint64_t khz = [] {
    auto mono = [] {
      timespec ts;
      ::clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
      return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
    };
    uint64_t t0 = mono(), c0 = __rdtsc();
    ::usleep(50'000);
    uint64_t t1 = mono(), c1 = __rdtsc();
    if (t1 <= t0) return uint64_t{0};
    return static_cast<uint64_t>((c1 - c0) * 1000000ull / (t1 - t0));
  }();
  return khz;
}

namespace {

std::string Cmdline(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : s)
    if (c == '\0') c = ' ';
  return s;
}

}  // namespace

std::vector<pid_t> ProcessesWith(const std::string& marker) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (!end || *end || pid <= 0) continue;
    if (Cmdline(static_cast<pid_t>(pid)).find(marker) != std::string::npos) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

bool ProcessHas(pid_t pid, const std::string& marker) {
  return pid > 0 && Cmdline(pid).find(marker) != std::string::npos;
}

Result<std::string> QmpExecute(const std::string& socket, const std::string& command, const std::string& arguments,
                               int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket.size() >= sizeof addr.sun_path) return Status::InvalidArgument("QMP socket path too long: " + socket);
  std::memcpy(addr.sun_path, socket.c_str(), socket.size() + 1);
  UniqueFd fd;
  for (;;) {
    fd.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    int err = errno;
    // QEMU's monitor serves one client at a time: another may be on it.
    if ((err == ECONNREFUSED || err == EAGAIN) && Clock::now() < deadline) {
      ::usleep(10'000);
      continue;
    }
    return Status::Unavailable("QMP at " + socket + ": connect: " + std::strerror(err));
  }
  std::string buf;
  // Reads up to the next line that is not an event; at most 1 MiB.
  auto next = [&](nlohmann::json* msg) -> Status {
    for (;;) {
      size_t nl;
      while ((nl = buf.find('\n')) != std::string::npos) {
        std::string line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object())
          return Status::Internal("QMP at " + socket + ": not a JSON object: " + line.substr(0, 200));
        if (j.contains("event")) continue;
        *msg = std::move(j);
        return Status::Ok();
      }
      if (buf.size() > (1u << 20)) return Status::Internal("QMP at " + socket + ": a line of over 1 MiB");
      int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (left <= 0) return Status::Unavailable("QMP at " + socket + " did not answer '" + command + "' in time");
      pollfd p{fd.get(), POLLIN, 0};
      int rc = ::poll(&p, 1, left);
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) continue;
      char chunk[8192];
      ssize_t n = ::read(fd.get(), chunk, sizeof chunk);
      if (n <= 0) return Status::Unavailable("QMP at " + socket + ": closed (QEMU exited?)");
      buf.append(chunk, static_cast<size_t>(n));
    }
  };
  nlohmann::json msg;
  DSEC_RETURN_IF_ERROR(next(&msg));  // the greeting
  std::string cap = "{\"execute\":\"qmp_capabilities\"}\n";
  if (WriteFull(fd.get(), cap.data(), cap.size()) != 0) return Status::Unavailable("QMP at " + socket + ": write");
  DSEC_RETURN_IF_ERROR(next(&msg));
  std::string req = "{\"execute\":" + nlohmann::json(command).dump() +
                    (arguments.empty() ? std::string() : ",\"arguments\":" + arguments) + "}\n";
  if (WriteFull(fd.get(), req.data(), req.size()) != 0) return Status::Unavailable("QMP at " + socket + ": write");
  DSEC_RETURN_IF_ERROR(next(&msg));
  if (msg.contains("error")) {
    std::string desc = msg["error"].value("desc", msg["error"].dump());
    return Status::FailedPrecondition("QMP " + command + ": " + desc);
  }
  return msg.contains("return") ? msg["return"].dump() : std::string("{}");
}

std::string FindInPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string p = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string cand = p.substr(start, end - start) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

namespace {
bool SignalAndWait(pid_t pid, int sig, int timeout_ms) {
  UniqueFd pfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pfd) return errno == ESRCH;
  if (sig) ::syscall(SYS_pidfd_send_signal, pfd.get(), sig, nullptr, 0);
  pollfd p{pfd.get(), POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}
}  // namespace

bool KillAndWait(pid_t pid, int timeout_ms) { return SignalAndWait(pid, SIGKILL, timeout_ms); }
bool WaitGone(pid_t pid, int timeout_ms) { return SignalAndWait(pid, 0, timeout_ms); }

}  // namespace dsec::drivers::vm
