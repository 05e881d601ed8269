#include "drivers/spawner/container_init.hpp"

#include <fcntl.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>

#include <cerrno>
#include <initializer_list>

#include "drivers/spawner/raw_syscall.hpp"

namespace dsec::container {

namespace {

using fncall::raw::Call;

// A path under the root, built in a stack buffer (no malloc here).
struct Path {
  char buf[4096];
  Path(const char* root, const char* rel) {
    unsigned long n = 0;
    for (const char* p = root; *p && n < sizeof buf - 1; ++p) buf[n++] = *p;
    for (const char* p = rel; *p && n < sizeof buf - 1; ++p) buf[n++] = *p;
    buf[n] = 0;
  }
};

[[noreturn]] void Fail(ContainerSetup* s, const char* what, long rc) {
  s->failed_what = what;
  s->failed_errno = static_cast<int>(-rc);
  fncall::raw::Exit(1);
}

#define CHECK(call, what)            \
  do {                               \
    long rc_ = (call);               \
    if (rc_ < 0) Fail(s, what, rc_); \
  } while (0)

long Mkdir(const char* p, int mode) {
  long rc = Call(SYS_mkdir, p, mode);
  return rc == -EEXIST ? 0 : rc;
}

// The overlay's layers as /proc/self/fd/N, each opened here (O_PATH):
// fsconfig takes at most 255 bytes, which three or four layers under a
// data dir of 40 bytes or more pass. `out` gets the colon-separated list,
// `fds` what was opened (-1 past the last; closed once the overlay is
// made); 0 or a negative errno.
constexpr int kMaxLayers = 16;
long ShortLower(const char* lower, char* out, unsigned long cap, long (&fds)[kMaxLayers]) {
  unsigned long n = 0;
  int layers = 0;
  for (long& fd : fds) fd = -1;
  for (const char* p = lower; *p;) {
    char path[4096];
    unsigned long k = 0;
    while (*p && *p != ':' && k < sizeof path - 1) path[k++] = *p++;
    path[k] = 0;
    if (*p == ':') ++p;
    if (layers == kMaxLayers) return -E2BIG;
    long fd = Call(SYS_openat, AT_FDCWD, path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fd;
    fds[layers++] = fd;
    char digits[12];
    int d = 0;
    for (long v = fd; d == 0 || v > 0; v /= 10) digits[d++] = static_cast<char>('0' + v % 10);
    const char* prefix = n ? ":/proc/self/fd/" : "/proc/self/fd/";
    for (const char* c = prefix; *c; ++c) {
      if (n + 1 >= cap) return -ENAMETOOLONG;
      out[n++] = *c;
    }
    while (d > 0) {
      if (n + 1 >= cap) return -ENAMETOOLONG;
      out[n++] = digits[--d];
    }
  }
  out[n] = 0;
  return 0;
}

// Sends the seccomp filter's listener to the spawner (kInitSlotNotify), with
// the sandbox's id. Best effort: a listener that does not arrive is closed,
// and the syscalls it would have seen fail with ENOSYS, uncounted.
void HandListener(long listener, const char* sandbox_id) {
  unsigned long len = 0;
  while (sandbox_id && sandbox_id[len] && len < 64) ++len;
  iovec iov{const_cast<char*>(sandbox_id ? sandbox_id : "?"), len ? len : 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  int fd = static_cast<int>(listener);
  __builtin_memcpy(CMSG_DATA(c), &fd, sizeof fd);
  long sent = Call(SYS_sendmsg, kInitSlotNotify, &msg, MSG_NOSIGNAL);
  // Sent: the agent keeps a copy in the socket's slot (not close-on-exec;
  // it closes it in the programs it starts, and is not dumpable, so
  // nothing in the container can take it): a spawner of a later dsecd
  // takes it back (AdoptListener, write_watch.cpp) instead of the
  // container's notified calls failing with ENOSYS once this spawner is
  // gone. Not sent: no copy (its calls fail with ENOSYS, never wait).
  if (sent < 0 || Call(SYS_dup3, listener, kInitSlotNotify, 0) < 0) Call(SYS_close, kInitSlotNotify);
  Call(SYS_close, listener);
}

struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  unsigned long mask;
};

void DropCapabilities(ContainerSetup* s) {
  for (int cap = 0; cap < 64; ++cap) {
    if (kContainerCaps & (1ull << cap)) continue;
    long rc = Call(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0);
    if (rc == -EINVAL) break;  // past the last capability this kernel knows
    if (rc < 0) Fail(s, "drop a capability from the bounding set", rc);
  }
  CHECK(Call(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities");
  struct {
    unsigned version;
    int pid;
  } header{0x20080522 /*_LINUX_CAPABILITY_VERSION_3*/, 0};
  struct {
    unsigned effective, permitted, inheritable;
  } data[2] = {{static_cast<unsigned>(kContainerCaps), static_cast<unsigned>(kContainerCaps), 0},
               {static_cast<unsigned>(kContainerCaps >> 32), static_cast<unsigned>(kContainerCaps >> 32), 0}};
  CHECK(Call(SYS_capset, &header, data), "set the container's capabilities");
}

// What Docker protects in /proc. Root in the container is the host's root
// (no user namespace), so /proc/sys and friends are the host kernel's own
// knobs (core_pattern would run a program of the container's choosing as
// root on the host): read-only. The masked files leak host state.
void ProtectProc(ContainerSetup* s, const char* r) {
  for (const char* rel : {"/proc/sys", "/proc/sysrq-trigger", "/proc/bus", "/proc/fs", "/proc/irq"}) {
    Path p(r, rel);
    long rc = Call(SYS_mount, p.buf, p.buf, 0, MS_BIND | MS_REC, 0);
    if (rc == -ENOENT) continue;  // not in this kernel
    CHECK(rc, "bind a /proc path over itself");
    CHECK(Call(SYS_mount, 0, p.buf, 0, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, 0),
          "make a /proc path read-only");
  }
  Path null(r, "/dev/null");
  for (const char* rel : {"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug",
                          "/proc/latency_stats", "/proc/timer_stats"}) {
    Path p(r, rel);
    long rc = Call(SYS_mount, null.buf, p.buf, 0, MS_BIND, 0);
    if (rc != -ENOENT) CHECK(rc, "mask a /proc file");
  }
  for (const char* rel : {"/proc/acpi", "/proc/scsi"}) {
    Path p(r, rel);
    long rc = Call(SYS_mount, "none", p.buf, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0");
    if (rc != -ENOENT) CHECK(rc, "mask a /proc directory");
  }
}

}  // namespace

int ContainerInitEntry(void* arg) {
  auto* s = static_cast<ContainerSetup*>(arg);
  // Our own fd table with only the slots, then the spawner may go on.
  long unshared = Call(SYS_close_range, kInitFirstFree, ~0u, 2u /*CLOSE_RANGE_UNSHARE*/);
  if (unshared < 0) {
    // Still on the spawner's table, whose status slot it is about to reset:
    // say so (2) with the reason written first, and touch nothing after.
    s->failed_what = "unshare the fd table";
    s->failed_errno = static_cast<int>(-unshared);
  }
  __atomic_store_n(&s->handed_off, unshared < 0 ? 2 : 1, __ATOMIC_RELEASE);
  Call(SYS_futex, &s->handed_off, 1 /*FUTEX_WAKE*/, 1);
  if (unshared < 0) fncall::raw::Exit(1);
  // The status pipe closes when the agent is executed, or when we fail.
  CHECK(Call(SYS_fcntl, kInitSlotStatus, F_SETFD, FD_CLOEXEC), "keep the status pipe");
  Call(SYS_prctl, PR_SET_NAME, "dsec-cinit");
  unsigned long none = 0;
  Call(SYS_rt_sigprocmask, SIG_SETMASK, &none, 0, sizeof none);
  KernelSigaction dfl{SIG_DFL, 0, nullptr, 0};
  Call(SYS_rt_sigaction, SIGPIPE, &dfl, 0, sizeof(unsigned long));

  // No oom_score_adj here: we share the spawner's memory, and the kernel
  // applies such a write to every process sharing it. The spawner sets the
  // agent's once it runs (OnInitDone).
  for (int i = 0; i < s->cgroups; ++i) CHECK(fncall::raw::Write(kInitSlotCgroup + i, "0", 1), "join the container's cgroup");
  if (s->has_net_ns) CHECK(Call(SYS_setns, kInitSlotNet, CLONE_NEWNET), "enter the net namespace");

  // Still in the spawner's mount namespace, where the host's paths resolve:
  // the overlay root and the binds of /run/dsec and the agent binary as
  // detached mounts (nothing here changes the spawner's namespace).
  // nodev: device nodes shipped in an image are inert; /dev is our own.
  long fs = Call(SYS_fsopen, "overlay", FSOPEN_CLOEXEC);
  if (fs < 0) Fail(s, "fsopen(overlay) (Linux 5.2 or later is needed)", fs);
  char lower[256];
  long lower_fds[kMaxLayers];
  CHECK(ShortLower(s->lower, lower, sizeof lower, lower_fds), "open the overlay's lower layers");
  CHECK(Call(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "lowerdir", lower, 0), "overlay lowerdir");
  // What a grade copies of the upper dir must be whole files and plain
  // directories (drivers/guard/carry.hpp), whatever the host's defaults.
  CHECK(Call(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "redirect_dir", "off", 0), "overlay redirect_dir=off");
  CHECK(Call(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "metacopy", "off", 0), "overlay metacopy=off");
  CHECK(Call(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "upperdir", s->upper, 0), "overlay upperdir");
  CHECK(Call(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "workdir", s->work, 0), "overlay workdir");
  // Inode numbers that agree: the upper and the image are different
  // filesystems, and without xino readdir's d_ino and stat's st_ino differ
  // (find, tar, rsync and CPython's test_os compare them).
  CHECK(Call(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "xino", "on", 0), "overlay xino=on");
  CHECK(Call(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, 0, 0, 0), "create the overlay root");
  for (long fd : lower_fds)
    if (fd >= 0) Call(SYS_close, fd);
  long root_mnt = Call(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
  if (root_mnt < 0) Fail(s, "mount the overlay root", root_mnt);
  Call(SYS_close, fs);
  long run_mnt = Call(SYS_open_tree, AT_FDCWD, s->run_dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (run_mnt < 0) Fail(s, "bind /run/dsec", run_mnt);
  long agent_mnt = Call(SYS_open_tree, AT_FDCWD, s->agent_path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (agent_mnt < 0) Fail(s, "bind the agent binary", agent_mnt);
  // A clone of a shared mount (systemd makes / shared) is a peer of it:
  // the agent mounted on /run/dsec/agent would propagate to the host's
  // <data>/sandboxes/<id>/run/agent. Private, both, before anything moves.
  mount_attr priv{};
  priv.propagation = MS_PRIVATE;
  CHECK(Call(SYS_mount_setattr, run_mnt, "", AT_EMPTY_PATH, &priv, sizeof priv), "make the /run/dsec bind private");
  CHECK(Call(SYS_mount_setattr, agent_mnt, "", AT_EMPTY_PATH, &priv, sizeof priv),
        "make the agent bind private");
  // A copy of the empty base: the host's mount table never enters the
  // container's namespace.
  CHECK(Call(SYS_setns, kInitSlotMntBase, CLONE_NEWNS), "enter the container base mount namespace");
  CHECK(Call(SYS_unshare, CLONE_NEWNS), "unshare the mount namespace");
  // The slots are used; fd 3 (the fncall runners' root) is not ours.
  // (The status and listener slots stay, to the agent's execve.)
  Call(SYS_close_range, 3u, kInitSlotStatus - 1, 0u);
  const char* r = "/mnt";
  CHECK(Call(SYS_move_mount, root_mnt, "", AT_FDCWD, r, MOVE_MOUNT_F_EMPTY_PATH), "attach the overlay root");
  Call(SYS_close, root_mnt);
  // Normally all there already (the skeleton layer): then nothing is
  // written to the upper dir.
  for (const char* d : {"/proc", "/dev", "/run", "/run/dsec", "/tmp", "/work"}) CHECK(Mkdir(Path(r, d).buf, 0755), "mkdir in the root");
  struct stat tmp_st;
  if (Call(SYS_stat, Path(r, "/tmp").buf, &tmp_st) < 0 || (tmp_st.st_mode & 07777) != 01777)
    CHECK(Call(SYS_chmod, Path(r, "/tmp").buf, 01777), "chmod /tmp");
  CHECK(Call(SYS_mount, "proc", Path(r, "/proc").buf, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, 0), "mount /proc");
  // A minimal /dev of our own: the usual character devices, ptys, and shm
  // as a directory of the same tmpfs (one superblock fewer than a tmpfs of
  // its own; mknod needs CAP_MKNOD, which nothing here keeps). Not shared
  // with other containers: inotify, locks and timestamps on shared inodes
  // would be a channel between them.
  CHECK(Call(SYS_mount, "dev", Path(r, "/dev").buf, "tmpfs", MS_NOSUID, "mode=0755"), "mount /dev");
  struct Node {
    const char* name;
    unsigned major, minor;
  };
  for (const Node& n : {Node{"/dev/null", 1, 3}, Node{"/dev/zero", 1, 5}, Node{"/dev/full", 1, 7},
                        Node{"/dev/random", 1, 8}, Node{"/dev/urandom", 1, 9}, Node{"/dev/tty", 5, 0}}) {
    Path p(r, n.name);
    CHECK(Call(SYS_mknod, p.buf, S_IFCHR | 0666, makedev(n.major, n.minor)), "mknod in /dev");
    CHECK(Call(SYS_chmod, p.buf, 0666), "chmod in /dev");
  }
  Call(SYS_symlink, "/proc/self/fd", Path(r, "/dev/fd").buf);
  Call(SYS_symlink, "/proc/self/fd/0", Path(r, "/dev/stdin").buf);
  Call(SYS_symlink, "/proc/self/fd/1", Path(r, "/dev/stdout").buf);
  Call(SYS_symlink, "/proc/self/fd/2", Path(r, "/dev/stderr").buf);
  CHECK(Mkdir(Path(r, "/dev/pts").buf, 0755), "mkdir /dev/pts");
  CHECK(Mkdir(Path(r, "/dev/shm").buf, 01777), "mkdir /dev/shm");
  CHECK(Call(SYS_chmod, Path(r, "/dev/shm").buf, 01777), "chmod /dev/shm");  // mkdir honours the umask
  CHECK(Call(SYS_mount, "devpts", Path(r, "/dev/pts").buf, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"),
        "mount /dev/pts");
  Call(SYS_symlink, "pts/ptmx", Path(r, "/dev/ptmx").buf);
  ProtectProc(s, r);
  // A task's protected paths: each bound over itself, read-only. Root in
  // the container has no CAP_SYS_ADMIN to unmount or remount them, and a
  // mount point is not renamed or removed (EBUSY).
  for (int i = 0; i < s->read_only_count; ++i) {
    Path p(r, s->read_only[i]);
    CHECK(Call(SYS_mount, p.buf, p.buf, 0, MS_BIND | MS_REC, 0), "bind a protected path");
    CHECK(Call(SYS_mount, 0, p.buf, 0, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, 0),
          "make a protected path read-only");
  }
  // /run/dsec: the host's per-sandbox dir (the agent's socket), and the
  // agent binary over the empty file the host left there.
  CHECK(Call(SYS_move_mount, run_mnt, "", AT_FDCWD, Path(r, "/run/dsec").buf, MOVE_MOUNT_F_EMPTY_PATH),
        "attach /run/dsec");
  CHECK(Call(SYS_move_mount, agent_mnt, "", AT_FDCWD, Path(r, "/run/dsec/agent").buf, MOVE_MOUNT_F_EMPTY_PATH),
        "attach the agent binary");
  Call(SYS_close, run_mnt);
  Call(SYS_close, agent_mnt);
  CHECK(Call(SYS_mount, 0, Path(r, "/run/dsec/agent").buf, 0, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, 0),
        "remount the agent read-only");

  // The root over / and chroot into it (switch_root's way). Under it is only
  // the empty base; seccomp denies chroot to everything in the container, so
  // no one can climb out of the root to it. pivot_root would walk every
  // thread on the host.
  CHECK(Call(SYS_chdir, r), "chdir to the root");
  CHECK(Call(SYS_mount, ".", "/", 0, MS_MOVE, 0), "move the root over /");
  CHECK(Call(SYS_chroot, "."), "chroot into the root");
  CHECK(Call(SYS_chdir, "/"), "chdir /");

  // The agent's socket, bound while we may, then its directory read-only:
  // nothing in the container can replace it and impersonate the agent.
  long sock = Call(SYS_socket, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) Fail(s, "create the agent socket", sock);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const char* sp = "/run/dsec/agent.sock";
  for (int i = 0; sp[i]; ++i) addr.sun_path[i] = sp[i];
  Call(SYS_unlink, sp);
  CHECK(Call(SYS_bind, sock, &addr, sizeof addr), "bind the agent socket");
  CHECK(Call(SYS_chmod, sp, 0600), "chmod the agent socket");
  CHECK(Call(SYS_listen, sock, 64), "listen on the agent socket");
  // The container's own /etc/hosts, /etc/hostname, /etc/resolv.conf and /etc/machine-id
  // (written by dsecd in /run/dsec/etc), bound over the image's now that
  // the root is the container's: a symlink the image has there resolves
  // inside it. One that leads nowhere (a resolv.conf to a stub resolver
  // that does not run here) or to a directory is left as the image has it.
  // Before /run/dsec is read-only, so the binds stay writable, as Docker's.
  for (const char* name : {"hosts", "hostname", "resolv.conf", "machine-id"}) {
    Path src("/run/dsec/etc/", name), dst("/etc/", name);
    long rc = Call(SYS_mount, src.buf, dst.buf, 0, MS_BIND, 0);
    if (rc == -ENOENT || rc == -ENOTDIR || rc == -ELOOP || rc == -EISDIR) continue;
    CHECK(rc, "bind the container's /etc/hosts, /etc/hostname, /etc/resolv.conf or /etc/machine-id");
  }
  CHECK(Call(SYS_mount, 0, "/run/dsec", 0, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, 0),
        "remount /run/dsec read-only");

  if (s->hostname) {
    unsigned long n = fncall::raw::Strlen(s->hostname);
    CHECK(Call(SYS_sethostname, s->hostname, n), "set the hostname");
  }
  if (s->loopback_up) {
    // Loopback inside the container: its own, nothing else.
    long fd = Call(SYS_socket, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      ifreq ifr{};
      ifr.ifr_name[0] = 'l';
      ifr.ifr_name[1] = 'o';
      if (Call(SYS_ioctl, fd, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
        Call(SYS_ioctl, fd, SIOCSIFFLAGS, &ifr);
      }
      Call(SYS_close, fd);
    }
  }

  // The listening socket to fd 3, nothing else but stdio.
  if (sock != 3) {
    CHECK(Call(SYS_dup3, sock, 3, 0), "move the agent socket");
    Call(SYS_close, sock);
  } else {
    Call(SYS_fcntl, 3, F_SETFD, 0);
  }
  Call(SYS_close_range, 4u, kInitSlotStatus - 1, 0u);
  Call(SYS_close_range, kInitSlotNotify + 1, ~0u, 0u);
  // The spawner's priority (kContainerLaneNice) ends with the setup.
  CHECK(Call(SYS_setpriority, PRIO_PROCESS, 0, 0), "reset the nice value");
  DropCapabilities(s);
  CHECK(Call(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs");
  long listener = Call(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, s->seccomp);
  if (listener < 0) Fail(s, "install seccomp", listener);
  HandListener(listener, s->sandbox_id);
  __atomic_store_n(&s->reached_exec, 1, __ATOMIC_RELEASE);
  long rc = Call(SYS_execve, "/run/dsec/agent", s->agent_argv, s->agent_envp);
  Fail(s, "execute the agent (/run/dsec/agent)", rc);
}

}  // namespace dsec::container
