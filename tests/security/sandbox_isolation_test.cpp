// Two sandboxes of a kind see nothing of each other while programs run in
// both, once per registered kind: a file A writes (in /work, /tmp and
// wherever else it may write) is nowhere in B; B's /proc and ps list none
// of A's processes; A's System V shared memory segment, semaphore set and
// message queue are not in B's ipc namespace; A's abstract unix socket
// cannot be reached from B. A's program holds what it made until the host
// has seen it do so and B's check has run (Hold, Release), so the two are
// proven to overlap. A new kind is tested by being registered. What is
// particular to one kind's mechanism stays in that kind's tests: fncall's
// one-shot runs (the next run starts clean, background processes die with
// their run, System V objects left behind never reach a run that gets the
// recycled ipc namespace: cross_run_test.cpp), the container's recycled dir
// and its hostname (container_isolation_test.cpp).
//
// The holding is seen from the host, in its /proc (HostProcessesWithArg),
// as in sandbox_fork_bomb_test.cpp and sandbox_host_view_test.cpp: a kind
// whose programs the host cannot see (a VM's guest) needs another sign,
// such as its exec's streamed output.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/kind_sandbox_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

// Python run before what A makes: `token` (argv[1]) is the test's own.
constexpr const char* kHoldPrelude =
    "import ctypes, errno, os, socket, subprocess, sys\n"
    "token = sys.argv[1]\n";

// Python run after what A makes: a child whose command line holds
// "held-<token>" (A's program's own holds only the token) sleeps until it
// is killed, and A's program waits for it, then prints how it ended. So the
// child shows on the host only once A has made everything, and A's program
// cannot end before the child does. Its output goes nowhere: the exec's
// output pipes are A's program's alone.
constexpr const char* kHold =
    "held = subprocess.Popen(['python3', '-c', 'import time; time.sleep(300)', 'held-' + token],\n"
    "                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "print('held', held.wait(), flush=True)\n";

// Python: how many System V objects the reader's ipc namespace has, as
// "listed <shm> <sem> <msg>" (each /proc/sysvipc file is a header line and
// one line per object; ipcs reads the same files).
constexpr const char* kListSysV =
    "def count(kind):\n"
    "    with open('/proc/sysvipc/' + kind) as f:\n"
    "        return len(f.read().splitlines()) - 1\n"
    "print('listed', count('shm'), count('sem'), count('msg'), flush=True)\n";

// Python: looks through every file system the program may write (from
// /proc/self/mounts; /proc, /sys and the kernel's own file systems left
// out), each whole, for a file or dir whose name holds argv[1] and for a
// file that holds it. A file of A's could only be in B through a file
// system that A can write, and A and B are of one kind and one spec: what
// is read-only in B (fncall's host dirs, the container's /run/dsec) is
// read-only in A. Prints B's /work and /tmp, which of the two the search
// went through, and what it found.
constexpr const char* kSearchWritable =
    "import os, sys\n"
    "token = sys.argv[1]\n"
    "kernel = ('proc', 'sysfs', 'cgroup', 'cgroup2', 'devpts', 'mqueue', 'debugfs', 'tracefs', 'securityfs', 'bpf')\n"
    "with open('/proc/self/mounts') as f:\n"
    "    mounts = [line.split()[1:4] for line in f]\n"
    "points = set(m[0] for m in mounts)\n"
    "roots = sorted(set(p for p, fs, opts in mounts\n"
    "                   if 'rw' in opts.split(',') and fs not in kernel and p.split('/')[1] not in ('proc', 'sys')))\n"
    "hits, visited = [], set()\n"
    "def look(p):\n"
    "    if token in os.path.basename(p):\n"
    "        hits.append(p)\n"
    "    if os.path.isfile(p) and not os.path.islink(p):\n"
    "        try:\n"
    "            with open(p, 'rb') as f:\n"
    "                if token.encode() in f.read():\n"
    "                    hits.append(p)\n"
    "        except OSError:\n"
    "            pass\n"
    "for root in roots:\n"
    "    if not os.path.isdir(root):\n"  // a file mounted on its own (/etc/hosts)
    "        look(root)\n"
    "        continue\n"
    "    for d, dirs, names in os.walk(root):\n"
    "        visited.add(d)\n"
    // Another mount under this one is searched as a root of its own when
    // it may be written, and not at all when it may not.
    "        dirs[:] = [n for n in dirs if os.path.join(d, n) not in points]\n"
    "        for n in dirs:\n"
    "            if token in n:\n"
    "                hits.append(os.path.join(d, n))\n"
    "        for n in names:\n"
    "            look(os.path.join(d, n))\n"
    "print('work', ' '.join(sorted(os.listdir('/work'))))\n"
    "print('tmp', ' '.join(sorted(os.listdir('/tmp'))))\n"
    "print('searched', ' '.join(p for p in ('/work', '/tmp') if os.path.realpath(p) in visited))\n"
    "print('found', ' '.join(sorted(set(hits))) or 'nothing')\n";

// Python: the pids of /proc (the probe's own as "self"), those whose command
// line holds argv[1] + argv[2] (given in two pieces, so that the probe's own
// command line does not hold it), how many processes ps lists, and whether
// any of ps's command lines holds it.
constexpr const char* kListProcesses =
    "import os, subprocess, sys\n"
    "token = (sys.argv[1] + sys.argv[2]).encode()\n"
    "pids = sorted(int(d) for d in os.listdir('/proc') if d.isdigit())\n"
    "seen = []\n"
    "for p in pids:\n"
    "    try:\n"
    "        with open('/proc/%d/cmdline' % p, 'rb') as f:\n"
    "            if token in f.read():\n"
    "                seen.append(str(p))\n"
    "    except OSError:\n"
    "        pass\n"
    "print('pids', ' '.join('self' if p == os.getpid() else str(p) for p in pids))\n"
    "print('cmdline', ' '.join(seen) or 'nowhere')\n"
    "listed = subprocess.run(['ps', '-e', '-o', 'pid='], capture_output=True, text=True).stdout.split()\n"
    "print('ps', len(listed))\n"
    "args = subprocess.run(['ps', '-e', '-o', 'args='], capture_output=True).stdout\n"
    "print('ps_args', 'seen' if token in args else 'nowhere')\n";

// A is the fixture's sandbox (sb_), B a second one of the same kind and
// spec, made before A's program starts.
class SandboxIsolation : public KindSandboxTest {
 protected:
  void SetUp() override {
    KindSandboxTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    token_ = UniqueToken("dsec-isolation");
    auto b = NewSandbox();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    b_.emplace(*b);
  }

  void TearDown() override {
    // A failed assertion can leave A's program holding: let it go before
    // the sandboxes are destroyed.
    if (!token_.empty())
      for (pid_t p : HostProcessesWithArg(HeldArg())) ::kill(p, SIGKILL);
    KindSandboxTest::TearDown();
  }

  std::string HeldArg() const { return "held-" + token_; }

  // Starts `make` (python, run after kHoldPrelude) in A and returns once A's
  // program holds what it made: its held child is on the host. Fails the
  // test, with A's output, when A's program ends first or 30 s pass.
  void Hold(const std::string& make) {
    v1::ExecRequest req = Command({"python3", "-c", std::string(kHoldPrelude) + make + kHold, token_});
    req.mutable_limits()->set_timeout_ms(60000);  // a bound, should the host never let it go
    holder_ = sb_->ExecAsync(req);
    // The wait on A's exec is the pause between two looks at the host's /proc.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((held_ = HostProcessesWithArg(HeldArg())).empty() && std::chrono::steady_clock::now() < deadline &&
           holder_.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
    }
    if (held_.size() == 1u) return;
    std::string why = "was still running";
    if (holder_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      auto r = holder_.get();
      why = r.ok() ? "ended: " + r->error() + "\n" + r->stdout() + r->stderr() : r.status().ToString();
    }
    FAIL() << held_.size() << " held children of A's program on the host, not 1; A's program " << why;
  }

  // Lets A's program go, once B's check is done, and returns A's "name
  // result" lines. First it checks that A held on all through B's check:
  // A's exec had not ended and its held child was the same process. The
  // host kills the held child; A's program then ends by itself, saying
  // "held -9".
  std::map<std::string, std::string> Release() {
    EXPECT_NE(holder_.wait_for(std::chrono::seconds(0)), std::future_status::ready)
        << "A's program ended before B's check was done: the check proved nothing";
    std::vector<pid_t> still = HostProcessesWithArg(HeldArg());
    EXPECT_EQ(still, held_) << "A's held child did not last through B's check";
    for (pid_t p : still) ::kill(p, SIGKILL);
    if (holder_.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      ADD_FAILURE() << "A's program did not end once its held child was killed";
      return {};
    }
    auto r = holder_.get();
    if (!r.ok()) {
      ADD_FAILURE() << "A's exec: " << r.status().ToString();
      return {};
    }
    EXPECT_EQ(r->verdict(), v1::VERDICT_OK) << r->error() << "\n" << r->stderr();
    auto out = ParseResults(r->stdout());
    EXPECT_EQ(out["held"], "-9") << "A's program did not hold until the host let it go:\n" << r->stdout();
    return out;
  }

  std::optional<Sandbox> b_;
  std::string token_;
  std::future<Result<v1::ExecResult>> holder_;  // A's exec
  std::vector<pid_t> held_;                     // A's held child, on the host
};

TEST_P(SandboxIsolation, FilesOfOneAreNotVisibleInAnother) {
  // A writes a file named by the token and holding it in each of these
  // dirs it may write: /work and /tmp in every kind (in fncall /dev/shm and
  // /var/tmp are links to /tmp, its root is read-only), the others where a
  // kind has them writable (the container's /root).
  ASSERT_NO_FATAL_FAILURE(Hold("wrote = []\n"
                               "for d in ('/work', '/tmp', '/dev/shm', '/var/tmp', '/root'):\n"
                               "    try:\n"
                               "        with open(os.path.join(d, token), 'w') as f:\n"
                               "            f.write(token + '\\n')\n"
                               "        wrote.append(d)\n"
                               "    except OSError:\n"
                               "        pass\n"
                               "print('wrote', ' '.join(wrote), flush=True)\n"));
  // B: not where A put them, and nowhere else B may write, by name or by
  // content.
  auto b = Exec(*b_, Command({"python3", "-c", kSearchWritable, token_}));
  auto a = Release();
  EXPECT_EQ(a["wrote"].rfind("/work /tmp", 0), 0u) << "A did not write its files: " << a["wrote"];
  ASSERT_EQ(b.verdict(), v1::VERDICT_OK) << b.error() << "\n" << b.stderr();
  auto res = ParseResults(b.stdout());
  ASSERT_EQ(res.size(), 4u) << b.stdout();
  EXPECT_EQ(res["work"], "") << "B sees files in /work";
  EXPECT_EQ(res["tmp"], "") << "B sees files in /tmp";
  EXPECT_EQ(res["searched"], "/work /tmp") << "the search did not go through B's /work and /tmp";
  EXPECT_EQ(res["found"], "nothing") << "B sees A's files";
}

TEST_P(SandboxIsolation, ProcessesOfOneAreNotVisibleInAnother) {
  // A runs two processes whose command lines hold the token: its program
  // and the held child.
  ASSERT_NO_FATAL_FAILURE(Hold(""));
  auto b = Exec(*b_, Command({"python3", "-c", kListProcesses, token_.substr(0, 5), token_.substr(5)}));
  Release();
  ASSERT_EQ(b.verdict(), v1::VERDICT_OK) << b.error() << "\n" << b.stderr();
  auto res = ParseResults(b.stdout());
  ASSERT_EQ(res.size(), 4u) << b.stdout();
  // B's /proc has its PID 1 and the probe; ps lists those and itself.
  EXPECT_EQ(res["pids"], "1 self") << b.stdout();
  EXPECT_EQ(res["cmdline"], "nowhere") << "B's /proc lists A's processes";
  EXPECT_EQ(res["ps"], "3") << b.stdout();
  EXPECT_EQ(res["ps_args"], "nowhere") << "B's ps lists A's processes";
}

TEST_P(SandboxIsolation, SysVObjectsAreNotShared) {
  // A makes a shared memory segment, a semaphore set and a message queue
  // under fixed keys (IPC_CREAT | IPC_EXCL | 0600: new ones, its own), and
  // counts them in its ipc namespace.
  ASSERT_NO_FATAL_FAILURE(Hold(
      std::string("libc = ctypes.CDLL(None, use_errno=True)\n"
                  "def made(name, r):\n"
                  "    print(name, 'made' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()),\n"
                  "          flush=True)\n"
                  "made('shm', libc.shmget(0x5ec1, 4096, 0o3600))\n"
                  "made('sem', libc.semget(0x5ec2, 1, 0o3600))\n"
                  "made('msg', libc.msgget(0x5ec3, 0o3600))\n") +
      kListSysV));
  // B looks them up by A's keys, and counts what its namespace has.
  auto b = Exec(*b_, Command({"python3", "-c",
                              std::string("import ctypes, errno\n"
                                          "libc = ctypes.CDLL(None, use_errno=True)\n"
                                          "def found(name, r):\n"
                                          "    print(name, 'found' if r >= 0 else "
                                          "errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))\n"
                                          "found('shm', libc.shmget(0x5ec1, 0, 0))\n"
                                          "found('sem', libc.semget(0x5ec2, 0, 0))\n"
                                          "found('msg', libc.msgget(0x5ec3, 0))\n") +
                                  kListSysV}));
  auto a = Release();
  EXPECT_EQ(a["shm"], "made");
  EXPECT_EQ(a["sem"], "made");
  EXPECT_EQ(a["msg"], "made");
  EXPECT_EQ(a["listed"], "1 1 1") << "A's objects are not in its own namespace";
  ASSERT_EQ(b.verdict(), v1::VERDICT_OK) << b.error() << "\n" << b.stderr();
  auto res = ParseResults(b.stdout());
  ASSERT_EQ(res.size(), 4u) << b.stdout();
  // No object under those keys: ENOENT, as for a key never used.
  EXPECT_EQ(res["shm"], "ENOENT") << "B sees A's shared memory segment";
  EXPECT_EQ(res["sem"], "ENOENT") << "B sees A's semaphore set";
  EXPECT_EQ(res["msg"], "ENOENT") << "B sees A's message queue";
  EXPECT_EQ(res["listed"], "0 0 0") << "B's ipc namespace has System V objects";
}

TEST_P(SandboxIsolation, AbstractUnixSocketsAreNotShared) {
  // A listens on an abstract unix socket named by the token, and connects
  // to it itself, so the name is known to answer in A's net namespace.
  ASSERT_NO_FATAL_FAILURE(Hold("s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                               "s.bind('\\0' + token)\n"
                               "s.listen(4)\n"
                               "c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                               "try:\n"
                               "    c.connect('\\0' + token)\n"
                               "    print('self connected', flush=True)\n"
                               "except OSError as e:\n"
                               "    print('self', errno.errorcode.get(e.errno, e.errno), flush=True)\n"
                               "c.close()\n"));
  auto b = Exec(*b_, Command({"python3", "-c", kAbstractConnectProbe, token_}));
  auto a = Release();
  EXPECT_EQ(a["self"], "connected") << "A's socket did not answer in A";
  // Every kind gives each sandbox a net namespace of its own (fncall each
  // run, the container each sandbox), and abstract names are looked up in
  // the caller's alone: the name is unknown in B, which the kernel refuses
  // at once with ECONNREFUSED, whether B's loopback is up or not
  // (SandboxNetwork.CannotConnectToAHostAbstractUnixSocket gets the same).
  EXPECT_EQ(b.verdict(), v1::VERDICT_OK) << b.error() << "\n" << b.stderr();
  EXPECT_EQ(b.stdout(), "ECONNREFUSED\n") << "B reaches A's abstract unix socket";
}

INSTANTIATE_TEST_SUITE_P(Kinds, SandboxIsolation, ::testing::ValuesIn(RegisteredKinds(OnTheHostKernel)),
                         KindParamName);

}  // namespace
}  // namespace dsec::testing
