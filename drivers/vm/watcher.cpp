#include "drivers/vm/watcher.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/frame.hpp"

namespace dsec::drivers::vm {

namespace {

// Reads lines from a blocking-with-deadline socket until one that is not
// an event; used for the greeting and the capabilities' answer only.
bool Handshake(int fd, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string buf;
  int answers = 0;
  bool sent = false;
  while (answers < 2) {
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      auto j = nlohmann::json::parse(buf.substr(0, nl), nullptr, false);
      buf.erase(0, nl + 1);
      if (j.is_object() && (j.contains("QMP") || j.contains("return"))) ++answers;
    }
    if (answers == 1 && !sent) {
      std::string cap = "{\"execute\":\"qmp_capabilities\"}\n";
      if (WriteFull(fd, cap.data(), cap.size()) != 0) return false;
      sent = true;
    }
    if (answers >= 2) break;
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) continue;
    char chunk[4096];
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n <= 0) return false;
    buf.append(chunk, static_cast<size_t>(n));
    if (buf.size() > (1u << 20)) return false;
  }
  return true;
}

constexpr uint64_t kWake = 0;

}  // namespace

VmWatcher::VmWatcher(Ended ended) : ended_(std::move(ended)) {
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWake;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
  thread_ = std::thread([this] { Run(); });
}

VmWatcher::~VmWatcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

size_t VmWatcher::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return entries_.size();
}

Status VmWatcher::Watch(const std::string& id, pid_t pid, const std::string& event_socket) {
  Unwatch(id);
  Entry e;
  e.id = id;
  e.pidfd.Reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!e.pidfd) return Status::FromErrno(errno, "watch VM " + id + ": pidfd_open(" + std::to_string(pid) + ")");
  if (!event_socket.empty()) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (event_socket.size() >= sizeof addr.sun_path) return Status::InvalidArgument("event socket path too long");
    std::memcpy(addr.sun_path, event_socket.c_str(), event_socket.size() + 1);
    e.qmp.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(e.qmp.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
      return Status::FromErrno(errno, "watch VM " + id + ": connect " + event_socket);
    if (!Handshake(e.qmp.get(), 10'000))
      return Status::Unavailable("watch VM " + id + ": QMP handshake on " + event_socket);
  }
  std::lock_guard<std::mutex> lk(mu_);
  e.key = next_key_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = e.key << 1;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, e.pidfd.get(), &ev);
  ev.data.u64 = (e.key << 1) | 1;
  if (e.qmp) ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, e.qmp.get(), &ev);
  by_id_[id] = e.key;
  uint64_t key = e.key;
  entries_.emplace(key, std::move(e));
  return Status::Ok();
}

void VmWatcher::Drop(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.pidfd.get(), nullptr);
  if (it->second.qmp) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.qmp.get(), nullptr);
  by_id_.erase(it->second.id);
  entries_.erase(it);
}

void VmWatcher::Unwatch(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_id_.find(id);
  if (it != by_id_.end()) Drop(it->second);
}

void VmWatcher::Run() {
  epoll_event events[64];
  for (;;) {
    int n = ::epoll_wait(epoll_.get(), events, 64, -1);
    if (n < 0 && errno != EINTR) return;
    std::vector<std::pair<std::string, std::string>> ended;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
      for (int i = 0; i < n; ++i) {
        uint64_t tag = events[i].data.u64;
        if (tag == kWake) {
          uint64_t v;
          (void)!::read(wake_.get(), &v, sizeof v);
          continue;
        }
        auto it = entries_.find(tag >> 1);
        if (it == entries_.end()) continue;
        Entry& e = it->second;
        std::string what;
        if ((tag & 1) == 0) {
          what = "exited";
        } else {
          char chunk[8192];
          ssize_t r = ::read(e.qmp.get(), chunk, sizeof chunk);
          if (r <= 0) {
            what = "exited";  // the monitor closes when QEMU ends
          } else {
            e.buf.append(chunk, static_cast<size_t>(r));
            size_t nl;
            while (what.empty() && (nl = e.buf.find('\n')) != std::string::npos) {
              auto j = nlohmann::json::parse(e.buf.substr(0, nl), nullptr, false);
              e.buf.erase(0, nl + 1);
              if (!j.is_object()) continue;
              std::string event = j.value("event", "");
              if (event == "SHUTDOWN" || event == "RESET") {
                what = j.contains("data") && j["data"].is_object() ? j["data"].value("reason", "shutdown") : "shutdown";
              } else if (event == "GUEST_PANICKED") {
                what = "guest-panic";
              }
            }
            if (e.buf.size() > (1u << 20)) e.buf.clear();  // no line that long is an event we want
          }
        }
        if (!what.empty()) {
          ended.emplace_back(e.id, what);
          Drop(it->first);
        }
      }
    }
    for (auto& [id, what] : ended) ended_(id, what);
  }
}

}  // namespace dsec::drivers::vm
