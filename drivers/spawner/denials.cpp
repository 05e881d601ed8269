// Containers' seccomp listeners: the syscalls a container's filter sends to
// user notification (NotifiedSyscalls, seccomp_filter.hpp) are answered
// EPERM here, as the filter's other denials are, and counted per sandbox;
// the counts go to dsecd (a Denied event per sandbox, once per loop), which
// flags them on session steps. The init sends its listener with the
// sandbox's id right before it executes the agent (container_init.cpp).
#include <linux/seccomp.h>
#include <seccomp.h>
#include <sys/ioctl.h>

#include <cstdlib>

#include "drivers/spawner/spawner_internal.hpp"

namespace dsec::fncall::internal {

Status Spawner::OpenNotify() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
    return Status::FromErrno(errno, "socketpair for seccomp listeners");
  // Above the slots, like our other descriptors.
  notify_rx_.Reset(::fcntl(sv[0], F_DUPFD_CLOEXEC, kFirstSpawnerFd));
  notify_tx_.Reset(::fcntl(sv[1], F_DUPFD_CLOEXEC, kFirstSpawnerFd));
  ::close(sv[0]);
  ::close(sv[1]);
  if (!notify_rx_ || !notify_tx_) return Status::FromErrno(errno, "keep the seccomp listener socket");
  ::fcntl(notify_rx_.get(), F_SETFL, ::fcntl(notify_rx_.get(), F_GETFL) | O_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kNotifyKey << 2;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, notify_rx_.get(), &ev) < 0)
    return Status::FromErrno(errno, "watch the seccomp listener socket");
  return Status::Ok();
}

void Spawner::OnNotifyReadable() {
  for (;;) {
    char id[65];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    iovec iov{id, sizeof id - 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(notify_rx_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) return;  // EAGAIN: all read
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    int fd;
    std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
    UniqueFd listener(::fcntl(fd, F_DUPFD_CLOEXEC, kFirstSpawnerFd));
    ::close(fd);
    if (!listener) continue;
    uint64_t key = next_key_++;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = key << 2;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener.get(), &ev) < 0) continue;
    listeners_[key] = Listener{std::move(listener), std::string(id, static_cast<size_t>(n))};
  }
}

void Spawner::OnListener(uint64_t key, uint32_t events) {
  auto it = listeners_.find(key);
  if (it == listeners_.end()) return;
  if (events & EPOLLIN) {
    // One per readiness: a receive with nothing pending would wait. (A
    // notification whose task died meanwhile is received as ENOENT.)
    seccomp_notif req;
    std::memset(&req, 0, sizeof req);
    if (::ioctl(it->second.fd.get(), SECCOMP_IOCTL_NOTIF_RECV, &req) == 0) {
      seccomp_notif_resp resp;
      std::memset(&resp, 0, sizeof resp);
      resp.id = req.id;
      resp.error = -EPERM;
      // Counted once answered: a call interrupted meanwhile (ENOENT) comes again.
      if (::ioctl(it->second.fd.get(), SECCOMP_IOCTL_NOTIF_SEND, &resp) == 0) {
        char* name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, req.data.nr);
        ++denied_[it->second.sandbox_id][name ? name : std::to_string(req.data.nr)];
        std::free(name);
      }
    }
  }
  // Every process under the filter is gone: so is the container.
  if (events & EPOLLHUP) listeners_.erase(it);  // closing leaves the epoll set
}

void Spawner::FlushDenied() {
  for (auto& [sandbox, calls] : denied_) {
    spawner::Event ev;
    auto* d = ev.mutable_denied();
    d->set_sandbox_id(sandbox);
    for (const auto& [name, n] : calls) (*d->mutable_calls())[name] = n;
    Send(ev);
  }
  denied_.clear();
}

}  // namespace dsec::fncall::internal
