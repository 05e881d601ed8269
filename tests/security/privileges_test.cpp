// Who a sandboxed program is: uid 65534 with no capabilities, no new
// privileges and a seccomp filter; setuid binaries do not make it root; the
// hostname is "sandbox" and stays so.
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/fncall_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using Privileges = FncallTest;

TEST_F(Privileges, StatusShowsAnUnprivilegedSandboxedProcess) {
  auto r = Run({"cat", "/proc/self/status"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto s = ParseStatus(r.stdout());
  EXPECT_EQ(s["Uid"], "65534 65534 65534 65534");
  EXPECT_EQ(s["Gid"], "65534 65534 65534 65534");
  EXPECT_EQ(s["Groups"], "");
  for (const char* cap : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"})
    EXPECT_EQ(s[cap], "0000000000000000") << cap;
  EXPECT_EQ(s["NoNewPrivs"], "1");
  EXPECT_EQ(s["Seccomp"], "2");  // SECCOMP_MODE_FILTER
}

TEST_F(Privileges, CannotBecomeRoot) {
  auto r = Run({"python3", "-c",
                "import errno, os\n"
                "for name, call in [('setuid', lambda: os.setuid(0)), ('setgid', lambda: os.setgid(0)),\n"
                "                   ('seteuid', lambda: os.seteuid(0)),\n"
                "                   ('setresuid', lambda: os.setresuid(0, 0, 0)),\n"
                "                   ('setgroups', lambda: os.setgroups([0]))]:\n"
                "    try:\n"
                "        call()\n"
                "        print(name, 'ok')\n"
                "    except OSError as e:\n"
                "        print(name, errno.errorcode[e.errno])\n"
                "print('uid', os.getuid(), os.geteuid())\n"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(),
            "setuid EPERM\nsetgid EPERM\nseteuid EPERM\nsetresuid EPERM\nsetgroups EPERM\n"
            "uid 65534 65534\n");
}

// Starts `path` with stdin a pipe held open (so a password prompt waits),
// waits until it has exec'd, then samples its credentials from /proc for a
// while and prints every distinct value seen, joined by " | ". A zombie keeps
// its credentials, so a binary that exits at once is still read; sampling
// covers the moment between the new name and the new credentials of execve.
constexpr const char* kSetuidProbe =
    "import os, subprocess, sys, time\n"
    "path = sys.argv[1]\n"
    "p = subprocess.Popen([path] + sys.argv[2:], stdin=subprocess.PIPE,\n"
    "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "proc = '/proc/%d/' % p.pid\n"
    "want = os.path.basename(path)[:15]\n"
    "deadline = time.monotonic() + 10\n"
    "while open(proc + 'comm').read().strip() != want:\n"
    "    if time.monotonic() > deadline:\n"
    "        print('never-exec', open(proc + 'comm').read().strip())\n"
    "        sys.exit(1)\n"
    "    time.sleep(0.001)\n"
    "keys = ('Uid', 'Gid', 'CapEff', 'CapPrm')\n"
    "seen = {k: set() for k in keys}\n"
    "end = time.monotonic() + 0.3\n"
    "while True:\n"
    "    state = ''\n"
    "    for line in open(proc + 'status'):\n"
    "        k, _, v = line.partition(':')\n"
    "        if k in seen:\n"
    "            seen[k].add(' '.join(v.split()))\n"
    "        if k == 'State':\n"
    "            state = v.split()[0]\n"
    "    if state == 'Z' or time.monotonic() > end:\n"
    "        break\n"
    "for k in keys:\n"
    "    print(k + ':', ' | '.join(sorted(seen[k])))\n"
    "p.kill()\n"
    "p.wait()\n";

TEST_F(Privileges, SetuidBinariesDoNotGrantRoot) {
  std::vector<std::string> found;
  // Not newgrp: it execs a shell at once, so the probe cannot catch it by name.
  for (const char* path : {"/usr/bin/su", "/usr/bin/passwd", "/usr/bin/mount", "/usr/bin/chsh",
                           "/usr/bin/gpasswd", "/usr/bin/sudo"}) {
    struct stat st;
    if (::stat(path, &st) == 0 && (st.st_mode & S_ISUID) && st.st_uid == 0) found.push_back(path);
  }
  if (found.empty()) GTEST_SKIP() << "no setuid-root binary in /usr/bin on this host to try";
  for (const auto& path : found) {
    SCOPED_TRACE(path);
    auto r = Run({"python3", "-c", kSetuidProbe, path});
    ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stdout() << r.stderr();
    auto s = ParseStatus(r.stdout());
    EXPECT_EQ(s["Uid"], "65534 65534 65534 65534") << r.stdout();
    EXPECT_EQ(s["Gid"], "65534 65534 65534 65534") << r.stdout();
    EXPECT_EQ(s["CapEff"], "0000000000000000");
    EXPECT_EQ(s["CapPrm"], "0000000000000000");
  }
  // And the obvious attempt: su to root does not run anything as root.
  if (std::find(found.begin(), found.end(), "/usr/bin/su") != found.end()) {
    auto su = Sh("su -c id root </dev/null; echo rc=$?");
    EXPECT_EQ(su.verdict(), v1::VERDICT_OK) << su.error();
    EXPECT_EQ(su.stdout().find("uid=0"), std::string::npos) << su.stdout();
    EXPECT_EQ(su.stdout().find("rc=0"), std::string::npos) << su.stdout() << su.stderr();
  }
}

TEST_F(Privileges, HostnameIsSandboxAndCannotBeChanged) {
  auto r = Sh("hostname; cat /proc/sys/kernel/hostname; hostname evil; echo rc=$?; hostname");
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "sandbox\nsandbox\nrc=1\nsandbox\n") << r.stderr();
}

}  // namespace
}  // namespace dsec::testing
