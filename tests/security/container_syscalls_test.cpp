// The container's own syscall test: its mount program cannot mount; what
// every kind on the host's kernel must deny (mounts, ptrace, namespaces,
// modules, bpf, keyrings) is sandbox_syscalls_test.cpp, run once per such
// kind.
#include <string>

#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

class ContainerSyscalls : public ContainerTest {};

TEST_F(ContainerSyscalls, MountProgramCannotMountATmpfs) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = ShIn(*sb,
                "mkdir -p /mnt && mount -t tmpfs none /mnt; echo rc=$?; grep -c ' /mnt ' /proc/self/mountinfo || true");
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  // mount says it failed, and /mnt is still a plain directory of the overlay.
  EXPECT_EQ(r.stdout(), "rc=32\n0\n") << r.stderr();  // 32: "mount failure"
  EXPECT_NE(r.stderr().find("mount: /mnt"), std::string::npos) << r.stderr();
  Destroy(*sb);
}

}  // namespace
}  // namespace dsec::testing
