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
  // Each message comes with its sender's pid (the init's, later its
  // agent's, on the host): the agent's own file calls are dsecd's.
  int on = 1;
  if (::setsockopt(notify_rx_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof on) < 0)
    return Status::FromErrno(errno, "SO_PASSCRED on the seccomp listener socket");
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
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(ucred))];
    iovec iov{id, sizeof id - 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(notify_rx_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) return;  // EAGAIN: all read
    UniqueFd listener;
    pid_t sender = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
        listener.Reset(::fcntl(fd, F_DUPFD_CLOEXEC, kFirstSpawnerFd));
        ::close(fd);
      } else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
        sender = cred.pid;
      }
    }
    if (listener) AddListener(std::move(listener), std::string(id, static_cast<size_t>(n)), sender);
  }
}

void Spawner::OnListener(uint64_t key, uint32_t events, bool poll_first) {
  auto it = listeners_.find(key);
  if (it == listeners_.end()) return;
  // A receive with nothing pending would wait: one per readiness, then
  // more while poll says there are (watched writes come in bursts).
  for (int i = 0; (events & EPOLLIN) && i < 32; ++i) {
    pollfd more{it->second.fd.get(), POLLIN, 0};
    if ((i > 0 || poll_first) && (::poll(&more, 1, 0) <= 0 || !(more.revents & POLLIN))) break;
    seccomp_notif req;
    std::memset(&req, 0, sizeof req);
    if (::ioctl(it->second.fd.get(), SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) {
      // Nothing to answer (ENOENT: a notification whose task died meanwhile).
    } else if (auto w = watched_writes_.find(req.data.nr); w != watched_writes_.end()) {
      AnswerWrite(it->second, *w->second, req);
    } else {
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
  std::set<std::string> sandboxes;
  for (const auto& [sandbox, calls] : denied_) sandboxes.insert(sandbox);
  for (const auto& [sandbox, writes] : writes_) sandboxes.insert(sandbox);
  for (const auto& sandbox : sandboxes) {
    spawner::Event ev;
    auto* d = ev.mutable_denied();
    d->set_sandbox_id(sandbox);
    for (const auto& [name, n] : denied_[sandbox]) (*d->mutable_calls())[name] = n;
    for (const auto& [what, n] : writes_[sandbox]) (*d->mutable_writes())[what] = n;
    Send(ev);
  }
  denied_.clear();
  writes_.clear();
}

}  // namespace dsec::fncall::internal
