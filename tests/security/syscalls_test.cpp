// fncall's own syscall tests; what every kind on the host's kernel must
// deny (mounts, ptrace, namespaces, modules, bpf, keyrings) is
// sandbox_syscalls_test.cpp, run once per such kind.
#include <string>

#include "tests/support/fncall_fixture.hpp"

namespace dsec::testing {
namespace {

using Syscalls = FncallTest;

// util-linux's unshare (a program of the host image) fails as the filter
// says, whatever it asks for.
TEST_F(Syscalls, UtilLinuxUnshareFails) {
  auto r = Sh("unshare -U true; echo rc=$?; unshare -m true; echo rc=$?; unshare -U -r id; echo rc=$?");
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "rc=1\nrc=1\nrc=1\n") << r.stderr();
  EXPECT_NE(r.stderr().find("Operation not permitted"), std::string::npos) << r.stderr();
}

}  // namespace
}  // namespace dsec::testing
