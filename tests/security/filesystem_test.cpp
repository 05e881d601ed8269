// The sandbox's file system: a read-only image with private, writable /work
// and /tmp; the host's files are neither visible nor writable, and secrets
// of the host's /etc and /root are not there at all.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/fncall_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using Filesystem = FncallTest;

// Creates a file in each directory, or writes to each file, and prints
// "path ok" or "path ERRNO".
constexpr const char* kWriteProbe =
    "import errno, os, sys\n"
    "for p in sys.argv[1:]:\n"
    "    target = p if not os.path.isdir(p) else os.path.join(p, 'dsec-probe')\n"
    "    try:\n"
    "        with open(target, 'w') as f:\n"
    "            f.write('pwned')\n"
    "        print(p, 'ok')\n"
    "    except OSError as e:\n"
    "        print(p, errno.errorcode[e.errno])\n";

TEST_F(Filesystem, TheImageIsNotWritable) {
  const std::vector<std::string> image = {"/", "/usr", "/usr/bin", "/etc", "/bin", "/lib", "/root", "/dev"};
  std::vector<std::string> argv = {"python3", "-c", kWriteProbe};
  argv.insert(argv.end(), image.begin(), image.end());
  argv.push_back("/etc/passwd");
  argv.push_back("/proc/sys/kernel/hostname");
  auto r = Run(argv);
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  // Read-only mounts: refused whatever the permissions say.
  for (const auto& p : image) EXPECT_EQ(res[p], "EROFS") << "writing into " << p;
  EXPECT_EQ(res["/etc/passwd"], "EROFS");
  // procfs is the sandbox's own, but its sysctls belong to root (0644):
  // refused by their mode, not by a read-only mount.
  EXPECT_EQ(res["/proc/sys/kernel/hostname"], "EACCES");
}

TEST_F(Filesystem, WorkAndTmpAreWritable) {
  auto r = Sh("echo work-data > /work/f && echo tmp-data > /tmp/f && mkdir /work/d /tmp/d && "
              "cat /work/f /tmp/f && ls -d /work/d && ls -d /tmp/d");
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "work-data\ntmp-data\n/work/d\n/tmp/d\n");
}

TEST_F(Filesystem, HostFilesAreInvisibleAndUnchanged) {
  char path[] = "/tmp/dsec-security-host-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string content = "host secret\n";
  ASSERT_EQ(::write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
  ::close(fd);
  // This test's own sources are on the host too.
  const std::string host_dir = "/work/main";
  ASSERT_EQ(::access(host_dir.c_str(), F_OK), 0);

  auto r = Run({"python3", "-c",
                "import os, sys\n"
                "path, host_dir = sys.argv[1], sys.argv[2]\n"
                "print(os.path.exists(path), os.path.exists(host_dir))\n"
                "with open(path, 'w') as f:\n"  // lands in the sandbox's own /tmp
                "    f.write('pwned\\n')\n"
                "print(open(path).read().strip())\n",
                path, host_dir});
  std::string host_after;
  {
    std::ifstream in(path);
    host_after.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ::unlink(path);
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "False False\npwned\n");
  EXPECT_EQ(host_after, content) << "the sandbox changed the host's " << path;
}

TEST_F(Filesystem, HostSecretsAreAbsent) {
  auto r = Run({"python3", "-c",
                "import os, sys\n"
                "for p in sys.argv[1:]:\n"
                "    print(p, 'present' if os.path.lexists(p) else 'absent')\n",
                "/etc/shadow", "/etc/gshadow", "/etc/ssh", "/etc/sudoers", "/root/.ssh",
                "/root/.bash_history"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 6u) << r.stdout();
  for (const auto& [p, state] : res) EXPECT_EQ(state, "absent") << p;
}

TEST_F(Filesystem, RootAndUsrAreMountedReadOnly) {
  auto r = Run({"mount"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  // "<source> on <target> type <fs> (<options>)"
  std::map<std::string, std::string> opts;
  std::istringstream in(r.stdout());
  for (std::string line; std::getline(in, line);) {
    size_t on = line.find(" on "), type = line.find(" type "), paren = line.find(" (");
    if (on == std::string::npos || type == std::string::npos || paren == std::string::npos) continue;
    opts[line.substr(on + 4, type - on - 4)] = line.substr(paren + 2);
  }
  for (const char* target : {"/", "/usr"}) {
    ASSERT_EQ(opts.count(target), 1u) << target << " is not a mount inside:\n" << r.stdout();
    EXPECT_EQ(opts[target].rfind("ro,", 0), 0u) << target << ": " << opts[target];
    EXPECT_NE(opts[target].find("nosuid"), std::string::npos) << target << ": " << opts[target];
  }
  for (const char* target : {"/work", "/tmp"}) {
    ASSERT_EQ(opts.count(target), 1u) << target << " is not a mount inside:\n" << r.stdout();
    EXPECT_EQ(opts[target].rfind("rw,", 0), 0u) << target << ": " << opts[target];
  }
}

TEST_F(Filesystem, FifosCanBeMadeButDeviceNodesCannot) {
  // The filter allows mknod (FIFOs need it): a device node is refused for
  // want of CAP_MKNOD, with EPERM, in a directory the program may write.
  auto r = Run({"python3", "-c",
                std::string(kAttempt) +
                    "import os, stat\n"
                    "attempt('fifo', lambda: os.mkfifo('/work/pipe'))\n"
                    "print('is_fifo', stat.S_ISFIFO(os.stat('/work/pipe').st_mode))\n"
                    "attempt('device', lambda: os.mknod('/work/mem', stat.S_IFCHR | 0o600, os.makedev(1, 1)))\n"
                    "print('device_exists', os.path.lexists('/work/mem'))\n"});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "fifo done\nis_fifo True\ndevice EPERM\ndevice_exists False\n");
}

}  // namespace
}  // namespace dsec::testing
