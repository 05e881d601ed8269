// Containers from one another: B sees none of A's files and processes,
// shares no IPC objects or abstract sockets with A, and each has its own
// hostname (its sandbox id); a removed container leaves nothing to the one
// that reuses its dir. That no sandbox can signal another's program by its
// host pid is checked for every kind (sandbox_host_view_test.cpp).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

class ContainerIsolation : public ContainerTest {};

std::string Token() { return "dsec-secret-" + std::to_string(std::random_device{}()); }

// Host pids of the processes in a container's cgroup whose command line is
// exactly `argv` (NUL-separated on the host side).
std::vector<pid_t> HostPidsRunning(const std::string& sandbox_id, const std::vector<std::string>& argv) {
  std::string want;
  for (const auto& a : argv) want += a + '\0';
  std::vector<pid_t> out;
  std::ifstream procs("/sys/fs/cgroup/pids/dsec-test/c/" + sandbox_id + "/cgroup.procs");
  for (pid_t p; procs >> p;) {
    std::ifstream cmd("/proc/" + std::to_string(p) + "/cmdline");
    std::string line((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (line == want) out.push_back(p);
  }
  return out;
}

// Walks the container's whole tree (/proc left out) for files named secret,
// x, y or z and for files holding `token`: prints "True found: nothing" when
// there are none (True: more than 100 files were read).
v1::ExecRequest SearchFor(const std::string& token) {
  return Command({"python3", "-c",
                  "import os, sys\n"
                  "token = sys.argv[1].encode()\n"
                  "files, hits = 0, []\n"
                  "for d, dirs, names in os.walk('/'):\n"
                  "    if d == '/':\n"
                  "        dirs.remove('proc')\n"
                  "    for n in names + dirs:\n"
                  "        if n in ('secret', 'x', 'y', 'z'):\n"
                  "            hits.append(os.path.join(d, n))\n"
                  "    for n in names:\n"
                  "        p = os.path.join(d, n)\n"
                  "        if not os.path.isfile(p) or os.path.islink(p):\n"
                  "            continue\n"
                  "        files += 1\n"
                  "        try:\n"
                  "            with open(p, 'rb') as f:\n"
                  "                if token in f.read():\n"
                  "                    hits.append(p)\n"
                  "        except OSError:\n"
                  "            pass\n"
                  "print(files > 100, 'found:', ' '.join(hits) or 'nothing')\n",
                  token});
}

TEST_F(ContainerIsolation, FilesOfOneAreNotVisibleInAnother) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  std::string token = Token();
  ASSERT_EQ(ShIn(*a, "echo " + token + " > /work/secret && echo " + token + " > /tmp/x && echo " + token +
                         " > /dev/shm/y && echo " + token + " > /root/z")
                .verdict(),
            v1::VERDICT_OK);
  ASSERT_EQ(ShIn(*a, "cat /work/secret").stdout(), token + "\n");

  // B: not where A put them, and nowhere else either: every file of B's
  // tree (/proc left out), by name and by content.
  auto where = ShIn(*b, "ls -A /work /tmp /dev/shm /root");
  EXPECT_EQ(where.stdout(), "/dev/shm:\n\n/root:\n\n/tmp:\n\n/work:\n") << where.stderr();
  auto search = Exec(*b, SearchFor(token));
  ASSERT_EQ(search.verdict(), v1::VERDICT_OK) << search.error() << "\n" << search.stderr();
  EXPECT_EQ(search.stdout(), "True found: nothing\n");
  Destroy(*a);
  Destroy(*b);
}

TEST_F(ContainerIsolation, NothingOfARemovedContainerReachesTheOneThatReusesItsDir) {
  // A removed container's dir is emptied and kept for the next one.
  auto free_dirs = [] { return daemon_->Admin("stats")["container"].value("free_dirs", -1); };
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::string token = Token();
  // Files everywhere, a process still writing, and the root dir itself
  // changed (its mode and an extended attribute live in the upper dir).
  ASSERT_EQ(ShIn(*a, "for d in /work /tmp /root /etc; do echo " + token + " > $d/secret; done; "
                     "mkdir -p /work/x/y && echo " + token + " > /work/x/y/z; "
                     "(while :; do echo " + token + " >> /tmp/x; sleep 0.01; done) > /dev/null 2>&1 & "
                     "chmod 0700 / && python3 -c \"import os; os.setxattr('/', 'user.dsec', b'" + token + "')\"")
                .verdict(),
            v1::VERDICT_OK);
  Destroy(*a);
  int kept = free_dirs();
  ASSERT_GE(kept, 1) << "the removed container's dir was not kept";

  auto b = Make();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(free_dirs(), kept - 1) << "the new container did not take the kept dir";
  auto search = Exec(*b, SearchFor(token));
  ASSERT_EQ(search.verdict(), v1::VERDICT_OK) << search.error() << "\n" << search.stderr();
  EXPECT_EQ(search.stdout(), "True found: nothing\n");
  auto root = Exec(*b, Command({"python3", "-c",
                                "import os\n"
                                "print(oct(os.stat('/').st_mode & 0o7777), os.listxattr('/'))\n"}));
  EXPECT_EQ(root.stdout(), "0o755 []\n") << root.stderr();
  Destroy(*b);
}

TEST_F(ContainerIsolation, ProcessesOfOneAreNotVisibleInAnother) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  ASSERT_EQ(ShIn(*a, "sleep 777 > /dev/null 2>&1 &").verdict(), v1::VERDICT_OK);
  ASSERT_EQ(HostPidsRunning(a->id(), {"sleep", "777"}).size(), 1u) << "A's sleep 777 is not running";
  // ps, and /proc read directly: B has its agent and the command itself.
  auto ps = ShIn(*b, "ps -e -o pid= -o args=");
  ASSERT_EQ(ps.verdict(), v1::VERDICT_OK) << ps.error() << "\n" << ps.stderr();
  EXPECT_EQ(ps.stdout().find("777"), std::string::npos) << ps.stdout();
  auto proc = Exec(*b, Command({"python3", "-c",
                                "import os\n"
                                "for p in sorted(int(d) for d in os.listdir('/proc') if d.isdigit()):\n"
                                "    print(open('/proc/%d/cmdline' % p, 'rb').read().replace(b'\\0', b' ').replace(b'\\n', b' ').decode())\n"}));
  ASSERT_EQ(proc.verdict(), v1::VERDICT_OK) << proc.error() << "\n" << proc.stderr();
  EXPECT_EQ(proc.stdout().find("sleep"), std::string::npos) << proc.stdout();
  std::istringstream lines(proc.stdout());
  std::string agent, self, more;
  std::getline(lines, agent);
  std::getline(lines, self);
  EXPECT_EQ(agent.rfind("dsec-agent ", 0), 0u) << proc.stdout();
  EXPECT_EQ(self.rfind("python3 -c ", 0), 0u) << proc.stdout();
  EXPECT_FALSE(std::getline(lines, more)) << proc.stdout();
  Destroy(*a);
  Destroy(*b);
}

TEST_F(ContainerIsolation, EachHasItsSandboxIdAsHostname) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  EXPECT_NE(a->id(), b->id());
  EXPECT_EQ(ShIn(*a, "hostname").stdout(), a->id() + "\n");
  EXPECT_EQ(ShIn(*b, "hostname").stdout(), b->id() + "\n");
  EXPECT_EQ(ShIn(*b, "cat /proc/sys/kernel/hostname").stdout(), b->id() + "\n");
  Destroy(*a);
  Destroy(*b);
}

TEST_F(ContainerIsolation, SysVSharedMemoryIsNotShared) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  // A makes a segment under a fixed key; B looks it up by that key.
  constexpr const char* kShm =
      "import ctypes, errno, sys\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "key, flags = 0x0D5EC, int(sys.argv[1])\n"
      "r = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(4096), ctypes.c_int(flags))\n"
      "print('id' if r >= 0 else errno.errorcode[ctypes.get_errno()])\n";
  auto made = Exec(*a, Command({"python3", "-c", kShm, std::to_string(01000 | 0666)}));  // IPC_CREAT
  EXPECT_EQ(made.stdout(), "id\n") << made.stderr();
  auto found_a = Exec(*a, Command({"python3", "-c", kShm, "0"}));
  EXPECT_EQ(found_a.stdout(), "id\n") << found_a.stderr();
  auto found_b = Exec(*b, Command({"python3", "-c", kShm, "0"}));
  EXPECT_EQ(found_b.stdout(), "ENOENT\n") << found_b.stderr();
  Destroy(*a);
  Destroy(*b);
}

TEST_F(ContainerIsolation, AbstractUnixSocketsAreNotShared) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  std::string name = Token();
  // A listens (in the background, so it keeps listening after the exec).
  auto listen = Exec(*a, Command({"python3", "-c",
                                  "import os, socket, sys\n"
                                  "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                                  "s.bind('\\0' + sys.argv[1])\n"
                                  "s.listen(4)\n"
                                  "if os.fork() == 0:\n"
                                  "    os.setsid()\n"
                                  "    os.closerange(0, 3)\n"
                                  "    while True:\n"
                                  "        s.accept()[0].close()\n"
                                  "print('listening')\n",
                                  name}));
  ASSERT_EQ(listen.stdout(), "listening\n") << listen.stderr();
  constexpr const char* kConnect = kAbstractConnectProbe;
  // Reachable in A, so the socket is there; not from B.
  EXPECT_EQ(Exec(*a, Command({"python3", "-c", kConnect, name})).stdout(), "connected\n");
  EXPECT_EQ(Exec(*b, Command({"python3", "-c", kConnect, name})).stdout(), "ECONNREFUSED\n");
  Destroy(*a);
  Destroy(*b);
}

}  // namespace
}  // namespace dsec::testing
