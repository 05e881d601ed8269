// System calls root in a container must not get: mounts, ptrace of its
// neighbours, new namespaces, kernel modules, bpf, keyrings. Each group is
// called directly (python3 ctypes, libc.syscall) and must fail with EPERM
// from the seccomp filter; a probe that needs no privilege at all in each
// group tells the filter from a missing capability. Where the kernel checks
// the capability before anything else (modules, pivot_root, the new mount
// API), the filter the container runs under is read from the kernel and
// tried by root with every capability (ExpectOnlyTheFilterDenies). And the
// mount program cannot mount either.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/syscall.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

class ContainerSyscalls : public ContainerTest {};

// `setup` runs before the probes (it may start a `child`), `teardown` after.
v1::ExecRequest Probe(const Probes& probes, const std::string& setup = "", const std::string& teardown = "") {
  std::string script = std::string(kPrelude) + setup;
  for (const auto& [name, call] : probes) script += "report('" + name + "', " + call + ")\n";
  script += teardown;
  return Command({"python3", "-c", script});
}

// A `sleep 300` of the probe's own, in the same container, as `child`.
constexpr const char* kSibling = "child = subprocess.Popen(['sleep', '300'])\n";
constexpr const char* kSiblingGone = "child.kill()\nchild.wait()\n";

TEST_F(ContainerSyscalls, MountingIsDenied) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  Probes p = {
      {"mount_tmpfs", "sc(" + N(SYS_mount) + ", b'none', b'/tmp', b'tmpfs', 0, None)"},
      {"mount_bind", "sc(" + N(SYS_mount) + ", b'/usr', b'/work', None, " + N(MS_BIND) + ", None)"},
      // Making the agent's read-only /run/dsec writable again.
      {"remount_run_rw", "sc(" + N(SYS_mount) + ", None, b'/run/dsec', None, " + N(MS_REMOUNT | MS_BIND) + ", None)"},
      {"mount_proc", "sc(" + N(SYS_mount) + ", b'proc', b'/tmp', b'proc', 0, None)"},
      // EFAULT without the filter: a bad pointer is read before any privilege check.
      {"mount_bad_pointer", "sc(" + N(SYS_mount) + ", 1, 1, 1, 0, 1)"},
      {"umount2_proc", "sc(" + N(SYS_umount2) + ", b'/proc', " + N(MNT_DETACH) + ")"},
      {"umount2_agent", "sc(" + N(SYS_umount2) + ", b'/run/dsec/agent', " + N(MNT_DETACH) + ")"},
      {"umount2_bad_flags", "sc(" + N(SYS_umount2) + ", b'/tmp', 256)"},  // EINVAL without the filter
      {"pivot_root", "sc(" + N(SYS_pivot_root) + ", b'/tmp', b'/tmp')"},
#ifdef SYS_fsopen
      {"fsopen", "sc(" + N(SYS_fsopen) + ", b'tmpfs', 0)"},
#endif
#ifdef SYS_open_tree
      {"open_tree", "sc(" + N(SYS_open_tree) + ", -100, b'/usr', 1)"},  // OPEN_TREE_CLONE
      {"open_tree_plain", "sc(" + N(SYS_open_tree) + ", -100, b'/usr', 0)"},  // anyone's, without the filter
#endif
#ifdef SYS_move_mount
      {"move_mount", "sc(" + N(SYS_move_mount) + ", -100, b'/tmp', -100, b'/work', 0)"},
#endif
  };
  ExpectAllFail(Exec(*sb, Probe(p)), p, "EPERM");
  // CAP_SYS_ADMIN comes first for these: root with it, under the
  // container's filter, must be refused too (without it: EFAULT, EINVAL).
  ExpectOnlyTheFilterDenies(InitPid(*sb), CapFirstMountCalls());
  Destroy(*sb);
}

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

TEST_F(ContainerSyscalls, PtraceOfAProcessInTheSameContainerIsDenied) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // Root tracing its own sleep needs no capability (same uid): only the
  // filter stands in the way, here and for the agent (PID 1).
  Probes p = {
      {"ptrace_attach_sibling", "sc(" + N(SYS_ptrace) + ", 16, child.pid, 0, 0)"},      // PTRACE_ATTACH
      {"ptrace_seize_sibling", "sc(" + N(SYS_ptrace) + ", 0x4206, child.pid, 0, 0)"},   // PTRACE_SEIZE
      {"ptrace_attach_agent", "sc(" + N(SYS_ptrace) + ", 16, 1, 0, 0)"},
      {"ptrace_traceme", "sc(" + N(SYS_ptrace) + ", 0, 0, 0, 0)"},
      {"process_vm_readv_sibling",
       "sc(" + N(SYS_process_vm_readv) + ", child.pid, zeros(16), 1, zeros(16), 1, 0)"},
      {"process_vm_writev_agent", "sc(" + N(SYS_process_vm_writev) + ", 1, zeros(16), 1, zeros(16), 1, 0)"},
  };
  ExpectAllFail(Exec(*sb, Probe(p, kSibling, kSiblingGone)), p, "EPERM");
  Destroy(*sb);
}

TEST_F(ContainerSyscalls, UnshareAndSetnsAreDenied) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  Probes p = {
      {"unshare_newuser", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWUSER) + ")"},
      {"unshare_newns", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWNS) + ")"},
      {"unshare_newnet", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWNET) + ")"},
      {"unshare_newpid", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWPID) + ")"},
      {"unshare_newuts", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWUTS) + ")"},
      {"unshare_newipc", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWIPC) + ")"},
      {"unshare_newcgroup", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWCGROUP) + ")"},
      // Needs no privilege at all: only the filter refuses it.
      {"unshare_files", "sc(" + N(SYS_unshare) + ", " + N(CLONE_FILES) + ")"},
      // The container's own namespaces (the agent's, which the container
      // may not open through /proc/1: it is not dumpable): harmless to join,
      // refused all the same.
      {"setns_own_mnt", "sc(" + N(SYS_setns) + ", os.open('/proc/self/ns/mnt', os.O_RDONLY), 0)"},
      {"setns_own_net", "sc(" + N(SYS_setns) + ", os.open('/proc/self/ns/net', os.O_RDONLY), " + N(CLONE_NEWNET) + ")"},
      {"setns_bad_fd", "sc(" + N(SYS_setns) + ", -1, 0)"},  // EBADF without the filter
  };
  ExpectAllFail(Exec(*sb, Probe(p)), p, "EPERM");
  Destroy(*sb);
}

TEST_F(ContainerSyscalls, CloneIntoNewNamespacesIsDenied) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  const std::string clone = "sc_fork(" + N(SYS_clone) + ", ";
  const std::string tail = " | " + N(SIGCHLD) + ", 0, 0, 0, 0)";
  Probes p = {
      {"clone_newuser", clone + N(CLONE_NEWUSER) + tail},
      {"clone_newns", clone + N(CLONE_NEWNS) + tail},
      {"clone_newpid", clone + N(CLONE_NEWPID) + tail},
      {"clone_newnet", clone + N(CLONE_NEWNET) + tail},
      {"clone_newuts", clone + N(CLONE_NEWUTS) + tail},
      {"clone_newcgroup", clone + N(CLONE_NEWCGROUP) + tail},
  };
  ExpectAllFail(Exec(*sb, Probe(p)), p, "EPERM");
#ifdef SYS_clone3
  // clone3 hides its flags from the filter in memory: it is not available
  // at all (ENOSYS, so libcs fall back to clone).
  auto args = [](unsigned long flags) {
    return "(lambda a: (a.__setitem__(0, " + std::to_string(flags) + "), a.__setitem__(4, " + N(SIGCHLD) +
           "), sc_fork(" + N(SYS_clone3) + ", a, 88))[2])((ctypes.c_uint64 * 11)())";
  };
  Probes p3 = {{"clone3_newuser", args(CLONE_NEWUSER)}, {"clone3_newns", args(CLONE_NEWNS)}};
  ExpectAllFail(Exec(*sb, Probe(p3)), p3, "ENOSYS");
#endif
  // A plain clone works: the probes tell allowed from denied.
  auto plain = Exec(*sb, Probe({{"clone_plain", "sc_fork(" + N(SYS_clone) + ", " + N(SIGCHLD) + ", 0, 0, 0, 0)"}}));
  std::istringstream in(plain.stdout());
  std::string name, err;
  long pid = -1;
  in >> name >> pid >> err;
  EXPECT_GT(pid, 0) << plain.stdout() << plain.stderr();
  EXPECT_EQ(err, "-");
  Destroy(*sb);
}

TEST_F(ContainerSyscalls, KernelModulesAreDenied) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  Probes p = {
      {"init_module", "sc(" + N(SYS_init_module) + ", zeros(64), 64, b'')"},
      {"finit_module", "sc(" + N(SYS_finit_module) + ", os.open('/dev/null', os.O_RDONLY), b'', 0)"},
      {"finit_module_bad_fd", "sc(" + N(SYS_finit_module) + ", -1, b'', 0)"},
      {"delete_module", "sc(" + N(SYS_delete_module) + ", b'dsec_no_such_module', 0)"},
      {"kexec_load", "sc(" + N(SYS_kexec_load) + ", 0, 0, None, 0)"},
  };
  ExpectAllFail(Exec(*sb, Probe(p)), p, "EPERM");
  // Each asks for CAP_SYS_MODULE or CAP_SYS_BOOT before it looks at its
  // arguments (even finit_module's fd), and root in the container has
  // neither: its EPERM proves nothing of the filter. Root with them, under
  // the container's filter, must get EPERM too; without it these arguments
  // fail otherwise (ENOEXEC, EBADF, ENOENT, EINVAL; ENOSYS without modules
  // or kexec) and change nothing.
  ExpectOnlyTheFilterDenies(InitPid(*sb), CapFirstModuleCalls());
  Destroy(*sb);
}

TEST_F(ContainerSyscalls, BpfIsDenied) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  Probes p = {
      {"bpf_map_create", "sc(" + N(SYS_bpf) + ", 0, zeros(128), 128)"},
      {"bpf_prog_load", "sc(" + N(SYS_bpf) + ", 5, zeros(128), 128)"},
      {"bpf_bad_cmd", "sc(" + N(SYS_bpf) + ", 9999, zeros(128), 128)"},  // EINVAL without the filter
      {"perf_event_open", "sc(" + N(SYS_perf_event_open) + ", zeros(128), 0, -1, -1, 0)"},
  };
  ExpectAllFail(Exec(*sb, Probe(p)), p, "EPERM");
  Destroy(*sb);
}

TEST_F(ContainerSyscalls, KeyringsAreDenied) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  Probes p = {
      // KEYCTL_GET_KEYRING_ID of KEY_SPEC_SESSION_KEYRING: allowed to anyone
      // without the filter. Keyrings are not namespaced: the host's root
      // keys are a keyctl away from root in the container.
      {"keyctl_get_session", "sc(" + N(SYS_keyctl) + ", 0, -3, 0)"},
      {"keyctl_join_session", "sc(" + N(SYS_keyctl) + ", 1, None)"},
      {"keyctl_read_user", "sc(" + N(SYS_keyctl) + ", 11, -4, zeros(256), 256)"},  // KEYCTL_READ of the user keyring
      {"add_key", "sc(" + N(SYS_add_key) + ", b'user', b'dsec', b'x', 1, -3)"},
      {"request_key", "sc(" + N(SYS_request_key) + ", b'user', b'dsec', None, 0)"},
  };
  ExpectAllFail(Exec(*sb, Probe(p)), p, "EPERM");
  Destroy(*sb);
}

}  // namespace
}  // namespace dsec::testing
