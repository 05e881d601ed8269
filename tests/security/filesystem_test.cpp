// An fncall sandbox's file system: the host's own image (/usr, /bin, /lib
// ...) mounted read-only, with private, writable /work and /tmp. That the
// host's other files are neither visible nor changed, its secrets absent
// and device nodes impossible to make is checked for every kind
// (sandbox_host_view_test.cpp).
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

}  // namespace
}  // namespace dsec::testing
