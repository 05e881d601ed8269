// System calls a sandboxed program must not get: mounts, ptrace, namespaces,
// kernel modules and kexec, bpf and perf, keyrings. Each group is called
// directly (python3 ctypes, libc.syscall) and must fail with the errno of the
// seccomp filter, not merely for lack of a capability where one would do.
// The program runs without capabilities, so each group holds a probe that
// the kernel alone answers otherwise (a bad argument it checks first, a call
// anyone may make); where the kernel checks the capability first, the
// filter the program runs under is read from the kernel and tried by root
// with every capability (ExpectOnlyTheFilterDenies).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>

#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/fncall_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

std::vector<std::string> ProbeArgv(const Probes& probes) {
  std::string script = kPrelude;
  for (const auto& [name, call] : probes) script += "report('" + name + "', " + call + ")\n";
  return {"python3", "-c", script};
}

class Syscalls : public FncallTest {
 protected:
  // `calls` are refused by the seccomp filter of a sandboxed program, even
  // to root with every capability (ExpectOnlyTheFilterDenies): read from a
  // program that waits in a sandbox, found on the host by a marker argument.
  static void ExpectOnlyTheSandboxFilterDenies(const std::vector<RawCall>& calls) {
    const std::string marker = "dsec-filter-probe-" + std::to_string(::getpid());
    v1::Limits limits;
    limits.set_timeout_ms(60000);
    auto waiting = RunAsync({"python3", "-c", "import time; time.sleep(60)", marker}, limits);
    std::vector<pid_t> found;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while ((found = HostProcessesWithArg(marker)).empty() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling /proc, bounded
    ASSERT_EQ(found.size(), 1u) << "the sandboxed program never showed on the host";
    ExpectOnlyTheFilterDenies(found[0], calls);
    ::kill(found[0], SIGKILL);
    auto r = waiting.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->signal(), SIGKILL) << r->error();
  }
};

TEST_F(Syscalls, MountingIsDenied) {
  Probes p = {
      {"mount", "sc(" + N(SYS_mount) + ", b'none', b'/tmp', b'tmpfs', 0, None)"},
      {"mount_bind", "sc(" + N(SYS_mount) + ", b'/usr', b'/work', None, 4096, None)"},  // MS_BIND
      // EFAULT without the filter: the kernel reads the strings before any privilege check.
      {"mount_bad_pointer", "sc(" + N(SYS_mount) + ", 1, 1, 1, 0, 1)"},
      {"umount2", "sc(" + N(SYS_umount2) + ", b'/tmp', 2)"},                            // MNT_DETACH
      {"umount2_proc", "sc(" + N(SYS_umount2) + ", b'/proc', 0)"},
      {"umount2_bad_flags", "sc(" + N(SYS_umount2) + ", b'/tmp', 256)"},  // EINVAL without the filter
      {"pivot_root", "sc(" + N(SYS_pivot_root) + ", b'/tmp', b'/tmp')"},
      {"chroot", "sc(" + N(SYS_chroot) + ", b'/tmp')"},
      {"chroot_missing", "sc(" + N(SYS_chroot) + ", b'/nonexistent-dsec')"},  // ENOENT without the filter
#ifdef SYS_fsopen
      {"fsopen", "sc(" + N(SYS_fsopen) + ", b'tmpfs', 0)"},
#endif
#ifdef SYS_open_tree
      {"open_tree", "sc(" + N(SYS_open_tree) + ", -100, b'/usr', 1)"},  // OPEN_TREE_CLONE
      // A plain O_PATH handle: anyone may have one; only the filter refuses it.
      {"open_tree_plain", "sc(" + N(SYS_open_tree) + ", -100, b'/usr', 0)"},
#endif
#ifdef SYS_mount_setattr
      // A flag it does not know: EINVAL without the filter.
      {"mount_setattr_bad_flags", "sc(" + N(SYS_mount_setattr) + ", -100, b'/tmp', 1, zeros(32), 32)"},
#endif
  };
  ExpectAllFail(Run(ProbeArgv(p)), p, "EPERM");
  // The kernel asks for CAP_SYS_ADMIN before it looks at these arguments:
  // tried by root, they would fail otherwise (EFAULT, EINVAL).
  ExpectOnlyTheSandboxFilterDenies(CapFirstMountCalls());
}

TEST_F(Syscalls, PtraceIsDenied) {
  Probes p = {
      {"ptrace_traceme", "sc(" + N(SYS_ptrace) + ", 0, 0, 0, 0)"},
      {"ptrace_attach_pid1", "sc(" + N(SYS_ptrace) + ", 16, 1, 0, 0)"},
      {"ptrace_seize_pid1", "sc(" + N(SYS_ptrace) + ", 0x4206, 1, 0, 0)"},
      {"process_vm_readv_pid1", "sc(" + N(SYS_process_vm_readv) + ", 1, zeros(16), 1, zeros(16), 1, 0)"},
  };
  ExpectAllFail(Run(ProbeArgv(p)), p, "EPERM");
}

TEST_F(Syscalls, UnshareAndSetnsAreDenied) {
  Probes p = {
      {"unshare_newuser", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWUSER) + ")"},
      {"unshare_newuser_newns", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWUSER | CLONE_NEWNS) + ")"},
      {"unshare_newns", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWNS) + ")"},
      {"unshare_newnet", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWNET) + ")"},
      {"unshare_newpid", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWPID) + ")"},
      // Needs no privilege at all: only the filter refuses it.
      {"unshare_files", "sc(" + N(SYS_unshare) + ", " + N(CLONE_FILES) + ")"},
      {"setns_own_net", "sc(" + N(SYS_setns) + ", os.open('/proc/self/ns/net', os.O_RDONLY), " +
                            N(CLONE_NEWNET) + ")"},
      {"setns_own_mnt", "sc(" + N(SYS_setns) + ", os.open('/proc/self/ns/mnt', os.O_RDONLY), 0)"},
      {"setns_bad_fd", "sc(" + N(SYS_setns) + ", -1, 0)"},  // EBADF without the filter
  };
  ExpectAllFail(Run(ProbeArgv(p)), p, "EPERM");
}

TEST_F(Syscalls, UtilLinuxUnshareFails) {
  auto r = Sh("unshare -U true; echo rc=$?; unshare -m true; echo rc=$?; unshare -U -r id; echo rc=$?");
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "rc=1\nrc=1\nrc=1\n") << r.stderr();
  EXPECT_NE(r.stderr().find("Operation not permitted"), std::string::npos) << r.stderr();
}

TEST_F(Syscalls, CloneIntoNewNamespacesIsDenied) {
  const std::string clone = "sc_fork(" + N(SYS_clone) + ", ";
  const std::string tail = " | " + N(SIGCHLD) + ", 0, 0, 0, 0)";
  Probes p = {
      {"clone_newuser", clone + N(CLONE_NEWUSER) + tail},
      {"clone_newns", clone + N(CLONE_NEWNS) + tail},
      {"clone_newpid", clone + N(CLONE_NEWPID) + tail},
      {"clone_newnet", clone + N(CLONE_NEWNET) + tail},
      {"clone_newuser_newpid", clone + N(CLONE_NEWUSER | CLONE_NEWPID) + tail},
  };
  ExpectAllFail(Run(ProbeArgv(p)), p, "EPERM");
}

#ifdef SYS_clone3
TEST_F(Syscalls, Clone3IsUnavailable) {
  // struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, ...
  // (88 bytes in version 2). The filter answers ENOSYS so libcs fall back to
  // clone, whose flags it can inspect.
  auto args = [](unsigned long flags) {
    return "(lambda a: (a.__setitem__(0, " + std::to_string(flags) + "), a.__setitem__(4, " +
           N(SIGCHLD) + "), sc_fork(" + N(SYS_clone3) + ", a, 88))[2])((ctypes.c_uint64 * 11)())";
  };
  Probes p = {
      {"clone3_newuser", args(CLONE_NEWUSER)},
      {"clone3_newns", args(CLONE_NEWNS)},
      {"clone3_plain", args(0)},
  };
  ExpectAllFail(Run(ProbeArgv(p)), p, "ENOSYS");
}
#endif

TEST_F(Syscalls, PlainCloneStillWorks) {
  // The probes can tell an allowed call from a denied one.
  auto r = Run(ProbeArgv({{"clone_plain", "sc_fork(" + N(SYS_clone) + ", " + N(SIGCHLD) + ", 0, 0, 0, 0)"}}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  std::istringstream in(r.stdout());
  std::string name, errno_name;
  long pid = -1;
  in >> name >> pid >> errno_name;
  EXPECT_EQ(name, "clone_plain");
  EXPECT_GT(pid, 0) << r.stdout();
  EXPECT_EQ(errno_name, "-");
}

TEST_F(Syscalls, ModulesKexecAndRebootAreDenied) {
  Probes p = {
      {"init_module", "sc(" + N(SYS_init_module) + ", zeros(64), 64, b'')"},
      {"finit_module", "sc(" + N(SYS_finit_module) + ", os.open('/dev/null', os.O_RDONLY), b'', 0)"},
      {"delete_module", "sc(" + N(SYS_delete_module) + ", b'dsec_no_such_module', 0)"},
      {"kexec_load", "sc(" + N(SYS_kexec_load) + ", 0, 0, None, 0)"},
#ifdef SYS_kexec_file_load
      {"kexec_file_load", "sc(" + N(SYS_kexec_file_load) + ", -1, -1, 0, b'', 0)"},
#endif
      // LINUX_REBOOT_CMD_CAD_OFF: harmless even if it were allowed.
      {"reboot", "sc(" + N(SYS_reboot) + ", 0xfee1dead, 672274793, 0, None)"},
  };
  ExpectAllFail(Run(ProbeArgv(p)), p, "EPERM");
  // Each checks CAP_SYS_MODULE or CAP_SYS_BOOT first, so the program's EPERM
  // proves nothing of the filter. Root with the capability, under the
  // program's filter, must get EPERM too; without it, these arguments fail
  // otherwise (ENOEXEC, EBADF, ENOENT, EINVAL; ENOSYS without modules or
  // kexec) and change nothing.
  auto calls = CapFirstModuleCalls();
#ifdef SYS_kexec_file_load
  calls.push_back({"kexec_file_load", SYS_kexec_file_load, {-1, -1, 0, Ptr(""), 0x100}});  // a bad flag (not UNLOAD)
#endif
  calls.push_back({"reboot", SYS_reboot, {0, 0, 0, 0}});  // wrong magic numbers
  ExpectOnlyTheSandboxFilterDenies(calls);
}

TEST_F(Syscalls, BpfPerfAndFriendsAreDenied) {
  Probes p = {
      {"bpf_map_create", "sc(" + N(SYS_bpf) + ", 0, zeros(128), 128)"},
      {"bpf_prog_load", "sc(" + N(SYS_bpf) + ", 5, zeros(128), 128)"},
      // EINVAL without the filter (recent kernels; older ones refuse every bpf call
      // to the unprivileged first where unprivileged bpf is off).
      {"bpf_bad_cmd", "sc(" + N(SYS_bpf) + ", 9999, zeros(128), 128)"},
      {"perf_event_open", "sc(" + N(SYS_perf_event_open) + ", zeros(128), 0, -1, -1, 0)"},
      {"userfaultfd", "sc(" + N(SYS_userfaultfd) + ", 0)"},
      {"syslog_read_all", "sc(" + N(SYS_syslog) + ", 3, zeros(256), 256)"},
#ifdef SYS_io_uring_setup
      {"io_uring_setup", "sc(" + N(SYS_io_uring_setup) + ", 1, zeros(120))"},
#endif
  };
  ExpectAllFail(Run(ProbeArgv(p)), p, "EPERM");
}

TEST_F(Syscalls, KeyringsAreDenied) {
  Probes p = {
      // KEYCTL_GET_KEYRING_ID of KEY_SPEC_SESSION_KEYRING: normally allowed to anyone.
      {"keyctl_get_session", "sc(" + N(SYS_keyctl) + ", 0, -3, 0)"},
      {"keyctl_join_session", "sc(" + N(SYS_keyctl) + ", 1, None)"},
      {"add_key", "sc(" + N(SYS_add_key) + ", b'user', b'dsec', b'x', 1, -3)"},
      {"request_key", "sc(" + N(SYS_request_key) + ", b'user', b'dsec', None, 0)"},
  };
  ExpectAllFail(Run(ProbeArgv(p)), p, "EPERM");
}

}  // namespace
}  // namespace dsec::testing
