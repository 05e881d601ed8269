// System calls no program in a sandbox that shares the host's kernel may
// get: mounts, ptrace, new namespaces, kernel modules and kexec, bpf and
// perf, keyrings. Run once per kind of the registry whose isolation is below
// a kernel of its own (fncall, container; a VM's guest has its own kernel),
// so a new kind of that sort is tested by being there. Each group is called
// directly (python3 ctypes, libc.syscall) and must fail with the errno of the
// seccomp filter, not merely for lack of a capability: each group holds a
// probe the kernel alone answers otherwise (a bad argument it checks first, a
// call anyone may make), and where the kernel checks the capability first,
// the filter a sandboxed program runs under is read from the kernel and tried
// by root with every capability (ExpectOnlyTheFilterDenies).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/syscall.h>

#include <chrono>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/kind_sandbox_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

// `setup` runs before the probes (it may start a `child`), `teardown` after.
v1::ExecRequest Probe(const Probes& probes, const std::string& setup = "", const std::string& teardown = "") {
  std::string script = std::string(kPrelude) + setup;
  for (const auto& [name, call] : probes) script += "report('" + name + "', " + call + ")\n";
  script += teardown;
  return Command({"python3", "-c", script});
}

// A `sleep 300` of the probe's own, in the same sandbox, as `child`.
constexpr const char* kSibling = "child = subprocess.Popen(['sleep', '300'])\n";
constexpr const char* kSiblingGone = "child.kill()\nchild.wait()\n";

class SandboxSyscalls : public KindSandboxTest {
 protected:
  // `calls` are refused by the seccomp filter a program in this sandbox
  // runs under, even to root with every capability: read from a program
  // that waits in the sandbox, found on the host by a marker argument.
  void ExpectOnlyTheSandboxFilterDenies(const std::vector<RawCall>& calls) {
    const std::string marker = "dsec-filter-probe-" + std::to_string(::getpid());
    v1::ExecRequest wait = Command({"python3", "-c", "import time; time.sleep(60)", marker});
    wait.mutable_limits()->set_timeout_ms(60000);
    auto waiting = sb_->ExecAsync(wait);
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

TEST_P(SandboxSyscalls, MountingIsDenied) {
  Probes p = {
      {"mount_tmpfs", "sc(" + N(SYS_mount) + ", b'none', b'/tmp', b'tmpfs', 0, None)"},
      {"mount_bind", "sc(" + N(SYS_mount) + ", b'/usr', b'/work', None, " + N(MS_BIND) + ", None)"},
      {"mount_proc", "sc(" + N(SYS_mount) + ", b'proc', b'/tmp', b'proc', 0, None)"},
      // A container's agent's read-only /run/dsec made writable again.
      {"remount_run_rw", "sc(" + N(SYS_mount) + ", None, b'/run/dsec', None, " + N(MS_REMOUNT | MS_BIND) + ", None)"},
      // EFAULT without the filter: the kernel reads the strings before any privilege check.
      {"mount_bad_pointer", "sc(" + N(SYS_mount) + ", 1, 1, 1, 0, 1)"},
      {"umount2_tmp", "sc(" + N(SYS_umount2) + ", b'/tmp', " + N(MNT_DETACH) + ")"},
      {"umount2_proc", "sc(" + N(SYS_umount2) + ", b'/proc', " + N(MNT_DETACH) + ")"},
      {"umount2_agent", "sc(" + N(SYS_umount2) + ", b'/run/dsec/agent', " + N(MNT_DETACH) + ")"},
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
#ifdef SYS_move_mount
      {"move_mount", "sc(" + N(SYS_move_mount) + ", -100, b'/tmp', -100, b'/work', 0)"},
#endif
#ifdef SYS_mount_setattr
      // A flag it does not know: EINVAL without the filter.
      {"mount_setattr_bad_flags", "sc(" + N(SYS_mount_setattr) + ", -100, b'/tmp', 1, zeros(32), 32)"},
#endif
  };
  ExpectAllFail(Run(Probe(p)), p, "EPERM");
  // The kernel asks for CAP_SYS_ADMIN before it looks at these arguments:
  // tried by root with it, they would fail otherwise (EFAULT, EINVAL).
  ExpectOnlyTheSandboxFilterDenies(CapFirstMountCalls());
}

TEST_P(SandboxSyscalls, PtraceIsDenied) {
  // Tracing one's own sleep needs no capability (same uid): only the filter
  // stands in the way, here and for PID 1 of the sandbox.
  Probes p = {
      {"ptrace_traceme", "sc(" + N(SYS_ptrace) + ", 0, 0, 0, 0)"},
      {"ptrace_attach_sibling", "sc(" + N(SYS_ptrace) + ", 16, child.pid, 0, 0)"},     // PTRACE_ATTACH
      {"ptrace_seize_sibling", "sc(" + N(SYS_ptrace) + ", 0x4206, child.pid, 0, 0)"},  // PTRACE_SEIZE
      {"ptrace_attach_pid1", "sc(" + N(SYS_ptrace) + ", 16, 1, 0, 0)"},
      {"ptrace_seize_pid1", "sc(" + N(SYS_ptrace) + ", 0x4206, 1, 0, 0)"},
      {"process_vm_readv_sibling", "sc(" + N(SYS_process_vm_readv) + ", child.pid, zeros(16), 1, zeros(16), 1, 0)"},
      {"process_vm_writev_pid1", "sc(" + N(SYS_process_vm_writev) + ", 1, zeros(16), 1, zeros(16), 1, 0)"},
  };
  ExpectAllFail(Run(Probe(p, kSibling, kSiblingGone)), p, "EPERM");
}

TEST_P(SandboxSyscalls, UnshareAndSetnsAreDenied) {
  Probes p = {
      {"unshare_newuser", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWUSER) + ")"},
      {"unshare_newuser_newns", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWUSER | CLONE_NEWNS) + ")"},
      {"unshare_newns", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWNS) + ")"},
      {"unshare_newnet", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWNET) + ")"},
      {"unshare_newpid", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWPID) + ")"},
      {"unshare_newuts", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWUTS) + ")"},
      {"unshare_newipc", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWIPC) + ")"},
      {"unshare_newcgroup", "sc(" + N(SYS_unshare) + ", " + N(CLONE_NEWCGROUP) + ")"},
      // Needs no privilege at all: only the filter refuses it.
      {"unshare_files", "sc(" + N(SYS_unshare) + ", " + N(CLONE_FILES) + ")"},
      // The sandbox's own namespaces: harmless to join, refused all the same.
      {"setns_own_mnt", "sc(" + N(SYS_setns) + ", os.open('/proc/self/ns/mnt', os.O_RDONLY), 0)"},
      {"setns_own_net", "sc(" + N(SYS_setns) + ", os.open('/proc/self/ns/net', os.O_RDONLY), " + N(CLONE_NEWNET) + ")"},
      {"setns_bad_fd", "sc(" + N(SYS_setns) + ", -1, 0)"},  // EBADF without the filter
  };
  ExpectAllFail(Run(Probe(p)), p, "EPERM");
}

TEST_P(SandboxSyscalls, CloneIntoNewNamespacesIsDeniedAndPlainCloneWorks) {
  const std::string clone = "sc_fork(" + N(SYS_clone) + ", ";
  const std::string tail = " | " + N(SIGCHLD) + ", 0, 0, 0, 0)";
  Probes p = {
      {"clone_newuser", clone + N(CLONE_NEWUSER) + tail},
      {"clone_newns", clone + N(CLONE_NEWNS) + tail},
      {"clone_newpid", clone + N(CLONE_NEWPID) + tail},
      {"clone_newnet", clone + N(CLONE_NEWNET) + tail},
      {"clone_newuts", clone + N(CLONE_NEWUTS) + tail},
      {"clone_newcgroup", clone + N(CLONE_NEWCGROUP) + tail},
      {"clone_newuser_newpid", clone + N(CLONE_NEWUSER | CLONE_NEWPID) + tail},
  };
  ExpectAllFail(Run(Probe(p)), p, "EPERM");
#ifdef SYS_clone3
  // struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, ...
  // (88 bytes in version 2). clone3 hides its flags from the filter in
  // memory: it is not available at all (ENOSYS, so libcs fall back to clone).
  auto args = [](unsigned long flags) {
    return "(lambda a: (a.__setitem__(0, " + std::to_string(flags) + "), a.__setitem__(4, " + N(SIGCHLD) +
           "), sc_fork(" + N(SYS_clone3) + ", a, 88))[2])((ctypes.c_uint64 * 11)())";
  };
  Probes p3 = {{"clone3_newuser", args(CLONE_NEWUSER)}, {"clone3_newns", args(CLONE_NEWNS)}, {"clone3_plain", args(0)}};
  ExpectAllFail(Run(Probe(p3)), p3, "ENOSYS");
#endif
  // A plain clone works: the probes tell allowed from denied.
  auto plain = Run(Probe({{"clone_plain", "sc_fork(" + N(SYS_clone) + ", " + N(SIGCHLD) + ", 0, 0, 0, 0)"}}));
  ASSERT_EQ(plain.verdict(), v1::VERDICT_OK) << plain.error() << "\n" << plain.stderr();
  std::istringstream in(plain.stdout());
  std::string name, err;
  long pid = -1;
  in >> name >> pid >> err;
  EXPECT_EQ(name, "clone_plain");
  EXPECT_GT(pid, 0) << plain.stdout() << plain.stderr();
  EXPECT_EQ(err, "-");
}

TEST_P(SandboxSyscalls, ModulesKexecAndRebootAreDenied) {
  Probes p = {
      {"init_module", "sc(" + N(SYS_init_module) + ", zeros(64), 64, b'')"},
      {"finit_module", "sc(" + N(SYS_finit_module) + ", os.open('/dev/null', os.O_RDONLY), b'', 0)"},
      {"finit_module_bad_fd", "sc(" + N(SYS_finit_module) + ", -1, b'', 0)"},
      {"delete_module", "sc(" + N(SYS_delete_module) + ", b'dsec_no_such_module', 0)"},
      {"kexec_load", "sc(" + N(SYS_kexec_load) + ", 0, 0, None, 0)"},
#ifdef SYS_kexec_file_load
      {"kexec_file_load", "sc(" + N(SYS_kexec_file_load) + ", -1, -1, 0, b'', 0)"},
#endif
      // LINUX_REBOOT_CMD_CAD_OFF: harmless even if it were allowed.
      {"reboot", "sc(" + N(SYS_reboot) + ", 0xfee1dead, 672274793, 0, None)"},
  };
  ExpectAllFail(Run(Probe(p)), p, "EPERM");
  // Each checks CAP_SYS_MODULE or CAP_SYS_BOOT first (even finit_module's
  // fd), so the program's EPERM proves nothing of the filter. Root with the
  // capability, under the program's filter, must get EPERM too; without it,
  // these arguments fail otherwise and change nothing.
  auto calls = CapFirstModuleCalls();
#ifdef SYS_kexec_file_load
  calls.push_back({"kexec_file_load", SYS_kexec_file_load, {-1, -1, 0, Ptr(""), 0x100}});  // a bad flag (not UNLOAD)
#endif
  calls.push_back({"reboot", SYS_reboot, {0, 0, 0, 0}});  // wrong magic numbers
  ExpectOnlyTheSandboxFilterDenies(calls);
}

TEST_P(SandboxSyscalls, BpfPerfAndFriendsAreDenied) {
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
  ExpectAllFail(Run(Probe(p)), p, "EPERM");
}

TEST_P(SandboxSyscalls, KeyringsAreDenied) {
  Probes p = {
      // KEYCTL_GET_KEYRING_ID of KEY_SPEC_SESSION_KEYRING: allowed to anyone
      // without the filter. Keyrings are not namespaced: the host's keys are a
      // keyctl away from a program that may call it.
      {"keyctl_get_session", "sc(" + N(SYS_keyctl) + ", 0, -3, 0)"},
      {"keyctl_join_session", "sc(" + N(SYS_keyctl) + ", 1, None)"},
      {"keyctl_read_user", "sc(" + N(SYS_keyctl) + ", 11, -4, zeros(256), 256)"},  // KEYCTL_READ of the user keyring
      {"add_key", "sc(" + N(SYS_add_key) + ", b'user', b'dsec', b'x', 1, -3)"},
      {"request_key", "sc(" + N(SYS_request_key) + ", b'user', b'dsec', None, 0)"},
  };
  ExpectAllFail(Run(Probe(p)), p, "EPERM");
}

INSTANTIATE_TEST_SUITE_P(Kinds, SandboxSyscalls, ::testing::ValuesIn(RegisteredKinds(OnTheHostKernel)), KindParamName);

}  // namespace
}  // namespace dsec::testing
