// Devices and privileges of root in a container: no device node can be
// made even in its writable /dev, /dev holds only the usual harmless nodes
// and they work, device nodes an image ships are unusable, and root keeps
// only Docker-like capabilities (no SYS_ADMIN, NET_ADMIN, MKNOD, SYS_PTRACE,
// DAC_READ_SEARCH) under no_new_privs and the seccomp filter. That no device
// node can be made in /work or /tmp is checked for every kind
// (sandbox_host_view_test.cpp).
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

class ContainerDevices : public ContainerTest {};

// A container's /dev is a tmpfs of its own that root may write to (unlike
// fncall's, read-only): a device node is refused there too, for want of
// CAP_MKNOD, where a FIFO is made. (Device nodes in /work and /tmp, in
// every kind: sandbox_host_view_test.cpp.)
TEST_F(ContainerDevices, MknodInItsWritableDevFails) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // The first SCSI/SATA disk, a loop device, /dev/mem, /dev/kmsg, /dev/fuse.
  auto r = Exec(*sb, Command({"python3", "-c", kMknodProbe, "/dev/sda", "b", "8", "0", "/dev/loop0", "b", "7", "0",
                              "/dev/mem", "c", "1", "1", "/dev/kmsg", "c", "1", "11", "/dev/fuse", "c", "10", "229",
                              "/dev/fifo", "p", "0", "0"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 6u) << r.stdout();
  for (const char* dev : {"/dev/sda", "/dev/loop0", "/dev/mem", "/dev/kmsg", "/dev/fuse"})
    EXPECT_EQ(res[dev], "EPERM") << dev;
  // The same directory takes a FIFO: the refusal is the capability's, not
  // a read-only or unwritable /dev.
  EXPECT_EQ(res["/dev/fifo"], "made");
  Destroy(*sb);
}

TEST_F(ContainerDevices, DevHoldsOnlyTheUsualNodes) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = Exec(*sb, Command({"python3", "-c",
                              "import os, stat\n"
                              "for d, dirs, files in os.walk('/dev'):\n"
                              "    for n in sorted(dirs + files):\n"
                              "        st = os.lstat(os.path.join(d, n))\n"
                              "        if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode):\n"
                              "            kind = 'b' if stat.S_ISBLK(st.st_mode) else 'c'\n"
                              "            print(os.path.join(d, n), kind, os.major(st.st_rdev), os.minor(st.st_rdev))\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  // No disk, no memory, no kernel log, no tun, no fuse: the usual character
  // devices and the container's own pty multiplexer.
  EXPECT_EQ(r.stdout(),
            "/dev/full c 1 7\n/dev/null c 1 3\n/dev/random c 1 8\n/dev/tty c 5 0\n/dev/urandom c 1 9\n"
            "/dev/zero c 1 5\n/dev/pts/ptmx c 5 2\n");
  Destroy(*sb);
}

TEST_F(ContainerDevices, TheUsualNodesWork) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = Exec(*sb, Command({"python3", "-c",
                              "import errno, os\n"
                              "with open('/dev/null', 'wb') as f:\n"
                              "    print('null', f.write(b'x' * 4096))\n"
                              "with open('/dev/zero', 'rb') as f:\n"
                              "    print('zero', f.read(16) == bytes(16))\n"
                              "with open('/dev/urandom', 'rb') as f:\n"
                              "    print('urandom', len(f.read(16)))\n"
                              "try:\n"
                              "    with open('/dev/full', 'wb', buffering=0) as f:\n"
                              "        f.write(b'x')\n"
                              "except OSError as e:\n"
                              "    print('full', errno.errorcode[e.errno])\n"
                              "m, s = os.openpty()\n"
                              "os.write(s, b'hi\\n')\n"
                              "print('pty', os.read(m, 16).strip().decode())\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "null 4096\nzero True\nurandom 16\nfull ENOSPC\npty hi\n");
  Destroy(*sb);
}

TEST_F(ContainerDevices, DevAndItsShmAreTheContainersOwn) {
  const std::string kDevNullInode =
      "python3 -c \"import os; s = os.stat('/dev/null'); print(s.st_dev, s.st_ino)\"";
  // /dev (with /dev/shm in it) is a tmpfs per container: what one leaves
  // there, another never sees, and no inode of it is shared (a watch or a
  // lock on a shared /dev/null would be a channel between containers).
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto left = ShIn(*a, "echo x > /dev/left-behind && echo y > /dev/shm/left-behind && " + kDevNullInode);
  ASSERT_EQ(left.verdict(), v1::VERDICT_OK) << left.error() << left.stderr();
  auto other = ShIn(*b, "ls -A /dev/shm; test -e /dev/left-behind || echo clean; " + kDevNullInode);
  ASSERT_EQ(other.verdict(), v1::VERDICT_OK) << other.error() << other.stderr();
  std::string inode_a = left.stdout(), rest = other.stdout();
  ASSERT_NE(rest.find("clean\n"), std::string::npos) << rest;
  EXPECT_EQ(rest.substr(0, rest.find("clean\n")), "") << "another container's /dev/shm: " << rest;
  EXPECT_NE(rest.substr(rest.find("clean\n") + 6), inode_a) << "both containers' /dev/null is one inode";
  Destroy(*a);
  Destroy(*b);
}

TEST_F(ContainerDevices, DeviceNodesShippedInAnImageCannotBeOpened) {
  // An image is untrusted input (a tarball, an OCI layout): one may carry
  // device nodes. Here a loop device (block 7,0) and a copy of /dev/null
  // (char 1,3), both harmless on the host, at the image's top level.
  char tmpl[] = "/tmp/dsec-test-devimage-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  RootfsOptions ro;
  ro.programs = {"sh", "cat"};
  ro.python = false;
  Status made = MakeRootfs(dir, ro);
  bool nodes = ::mknod((dir + "/evil-loop").c_str(), S_IFBLK | 0666, makedev(7, 0)) == 0 &&
               ::mknod((dir + "/evil-null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "build", dir, "devnodes"});
  RunProcess({"/bin/rm", "-rf", dir});
  ASSERT_TRUE(made.ok()) << made.ToString();
  ASSERT_TRUE(nodes) << "mknod on the host failed";
  ASSERT_EQ(built.exit_code, 0) << built.err;

  auto spec = ContainerSpec("devnodes");
  auto sb = client_->Create(spec);
  if (sb.ok()) made_.push_back(*sb);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = ShIn(*sb,
                "for f in /evil-loop /evil-null; do "
                "  if [ -b $f ] || [ -c $f ]; then echo $f is-a-node; fi; "
                "  if ( : < $f ) 2>/dev/null; then echo $f opened; else echo $f refused; fi; "
                "done 2>&1");
  // (A subshell: a failed redirection of `:` ends a POSIX shell.)
  EXPECT_EQ(r.stdout(), "/evil-loop is-a-node\n/evil-loop refused\n/evil-null is-a-node\n/evil-null refused\n")
      << "device nodes of the image are usable in the container";
  Destroy(*sb);
  auto rm = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "rm", "devnodes"});
  EXPECT_EQ(rm.exit_code, 0) << rm.err;
}

TEST_F(ContainerDevices, RootHasOnlyDockerLikeCapabilities) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP
  // NET_BIND_SERVICE SYS_CHROOT AUDIT_WRITE SETFCAP: Docker's default set
  // without MKNOD and NET_RAW.
  const std::string kCaps = "00000000a00405fb";
  // The exec's own process and the agent (PID 1) alike.
  for (const char* who : {"self", "1"}) {
    auto r = Exec(*sb, Command({"cat", std::string("/proc/") + who + "/status"}));
    ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
    auto s = ParseStatus(r.stdout());
    EXPECT_EQ(s["Uid"], "0 0 0 0") << who;
    EXPECT_EQ(s["CapEff"], kCaps) << who;
    EXPECT_EQ(s["CapPrm"], kCaps) << who;
    EXPECT_EQ(s["CapBnd"], kCaps) << who;
    EXPECT_EQ(s["CapInh"], "0000000000000000") << who;
    EXPECT_EQ(s["CapAmb"], "0000000000000000") << who;
    EXPECT_EQ(s["NoNewPrivs"], "1") << who;
    EXPECT_EQ(s["Seccomp"], "2") << who;  // SECCOMP_MODE_FILTER
  }
  // What the missing ones would allow fails: setting the hostname
  // (SYS_ADMIN), taking lo down (NET_ADMIN), a raw socket (NET_RAW).
  auto r = Exec(*sb, Command({"python3", "-c",
                              "import errno, fcntl, socket, struct\n"
                              "def attempt(name, f):\n"
                              "    try:\n"
                              "        f()\n"
                              "        print(name, 'done')\n"
                              "    except OSError as e:\n"
                              "        print(name, errno.errorcode.get(e.errno, e.errno))\n"
                              "attempt('sethostname', lambda: socket.sethostname('evil'))\n"
                              "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                              "attempt('lo_down', lambda: fcntl.ioctl(s, 0x8914, struct.pack('16sH14x', b'lo', 0)))\n"
                              "attempt('raw_socket', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "sethostname EPERM\nlo_down EPERM\nraw_socket EPERM\n");
  Destroy(*sb);
}

}  // namespace
}  // namespace dsec::testing
