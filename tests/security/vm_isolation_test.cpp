// What a guest of a VM kind (microvm, vm) cannot do to the host, to dsecd or
// to another guest, root in the guest included (programs in a VM run as
// root: the guest's kernel is the sandbox's own). The suites shaped by the
// host's kernel (sandbox_*_test.cpp: seccomp, capabilities, the host's
// /proc) are for the kinds on the host's kernel; this one is for the others.
#include <gmock/gmock.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "harness/rootfs.hpp"
#include "runtime/files.hpp"
#include "tests/support/host_probes.hpp"
#include "tests/support/kind_sandbox_fixture.hpp"
#include "tests/support/vm_probes.hpp"

namespace dsec::testing {
namespace {

bool OwnKernel(const drivers::KindTraits& t) { return !OnTheHostKernel(t); }

// The tests share two guests of the kind (a boot is seconds of emulation):
// A, sb_ (SharedSandbox slot 0), and B, the other guest (slot 1), made
// after A's own layer was changed (RootInTheGuest..., first to use it,
// checks that a guest made then does not see the change). What a test does
// to them (root's writes in A, a listener in B, a flood it stops) leaves
// each as good a subject for the next test, whose claim is about the host,
// dsecd or the other guest. The two tests that kill a guest take one each,
// last: the panic B (its console never flooded), kill -9 A.
class VmIsolation : public KindSandboxTest {
 protected:
  bool SharesItsSandbox() const override { return true; }
  std::string VmDir(const std::string& id) const { return VmRoot(*daemon_, GetParam().kind) + "/" + id; }
  // What the host holds of VM `id`: its QEMU, its dir, its cgroups, its
  // libvirt domain.
  std::vector<std::string> HostLeftovers(const std::string& id) const {
    std::vector<std::string> out;
    for (pid_t p : VmProcessesOf(*daemon_, GetParam().kind, id)) out.push_back("process " + std::to_string(p));
    if (::access(VmDir(id).c_str(), F_OK) == 0) out.push_back("dir " + VmDir(id));
    for (const std::string root : {"/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu,cpuacct",
                                   "/sys/fs/cgroup/pids", "/sys/fs/cgroup/freezer"}) {
      std::string g = root + "/dsec-test/vm/" + id;
      if (::access(g.c_str(), F_OK) == 0) out.push_back("cgroup " + g);
    }
    if (GetParam().kind == v1::KIND_VM)
      for (const auto& d : VmDomains(*daemon_))
        if (d.size() > id.size() && d.compare(d.size() - id.size(), id.size(), id) == 0) out.push_back("domain " + d);
    return out;
  }
  // Waits (bounded) until the sandbox's record is failed; the record.
  v1::SandboxRecord AwaitFailed(const Sandbox& sb, int seconds = 60) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    v1::SandboxRecord rec;
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = sb.Get();
      if (r.ok()) rec = *r;
      if (r.ok() && r->phase() == v1::SANDBOX_PHASE_FAILED) return rec;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling the record, bounded
    }
    ADD_FAILURE() << "sandbox " << sb.id() << " was not failed within " << seconds << " s; phase "
                  << v1::SandboxPhase_Name(rec.phase());
    return rec;
  }
  // Waits (bounded) until the host holds nothing of VM `id`.
  void ExpectFreed(const std::string& id) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::vector<std::string> left;
    while (!(left = HostLeftovers(id)).empty() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the destroy runs on a driver thread
    std::string all;
    for (const auto& l : left) all += l + "; ";
    EXPECT_TRUE(left.empty()) << "left on the host: " << all;
  }
  std::map<std::string, std::string> ImageFiles() const {
    std::map<std::string, std::string> out;
    for (const auto& name : ListEntries(daemon_->data_dir() + "/images"))
      if (auto c = ReadFileToString(daemon_->data_dir() + "/images/" + name); c.ok()) out[name] = *c;
    return out;
  }
};

TEST_P(VmIsolation, TheGuestHasNoNetworkDeviceButItsLoopback) {
  EXPECT_EQ(ShIn(*sb_, "ls /sys/class/net | tr '\\n' ' '").stdout(), "lo ");
}

TEST_P(VmIsolation, RootInTheGuestSeesOnlyItsImageAndChangesOnlyItsOwnLayer) {
  auto before = ImageFiles();
  ASSERT_FALSE(before.empty());
  EXPECT_EQ(ShIn(*sb_, "id -u").stdout(), "0\n");
  // No filesystem of the host's: no 9p, virtiofs, NFS or FUSE; one disk.
  auto types = ShIn(*sb_, "python3 -c \"print(' '.join(sorted({l.split()[2] for l in open('/proc/mounts')})))\"").stdout();
  for (const char* shared : {"9p", "virtiofs", "nfs", "nfs4", "fuse", "cifs"})
    EXPECT_EQ((" " + types + " ").find(std::string(" ") + shared + " "), std::string::npos) << types;
  EXPECT_NE(types.find("overlay"), std::string::npos) << types;
  // The image: a virtio-blk disk (microvm), or virtio-pmem mapped from the
  // host's page cache (vm).
  const std::string disk = GetParam().kind == v1::KIND_VM ? "pmem0" : "vda";
  // Besides it, only loop devices that nothing backs (the guest loads the
  // loop module for containers inside it): they hold no data of anyone's.
  EXPECT_EQ(ShIn(*sb_, "cd /sys/block && for d in *; do case $d in loop*) "
                       "[ -e $d/loop/backing_file ] && echo -n \"$d(backed) \";; *) echo -n \"$d \";; esac; done")
                .stdout(),
            disk + " ");
  // Writes to it do not reach the host: the disk refuses them; the pmem
  // device's memory is mapped read-only by QEMU (what the guest writes there
  // is dropped). The image files are compared below.
  auto dd = ShIn(*sb_, "dd if=/dev/zero of=/dev/" + disk + " bs=4096 count=16 oflag=direct conv=notrunc 2>/dev/null; "
                       "echo rc=$?");
  if (disk == "vda") {
    EXPECT_NE(dd.stdout(), "rc=0\n") << "a write to the image's disk succeeded";
  }
  // Root changes its own layer only.
  ASSERT_EQ(ShIn(*sb_, "echo 'intruder:x:0:0::/:/bin/sh' >> /etc/passwd && rm -f /bin/env && echo done").stdout(),
            "done\n");
  // B: made now (the first test to want it), after A's change.
  auto other = SharedSandbox(1);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(ShIn(*other, "grep -c intruder /etc/passwd; test -e /bin/env && echo env").stdout(), "0\nenv\n");
  EXPECT_TRUE(ImageFiles() == before) << "an image file changed";
}

TEST_P(VmIsolation, NeitherTheHostsLoopbackNorAnotherGuestIsReachable) {
  // A listener in guest B and one on the host's loopback, on one port.
  int host = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(host, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(host, 8), 0);
  socklen_t len = sizeof a;
  ::getsockname(host, reinterpret_cast<sockaddr*>(&a), &len);
  std::string port = std::to_string(ntohs(a.sin_port));
  auto b = SharedSandbox(1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(ShIn(*b, "python3 -c 'import socket,time\ns=socket.socket(); s.bind((\"0.0.0.0\", " + port +
                         ")); s.listen(); open(\"/tmp/up\",\"w\").close(); time.sleep(600)' >/dev/null 2>&1 &\n"
                         "until [ -e /tmp/up ]; do sleep 0.05; done; echo up")
                .stdout(),
            "up\n");
  // From A: its own loopback refuses; nothing else is there to try.
  auto r = ShIn(*sb_, "python3 -c 'import socket\ntry:\n socket.create_connection((\"127.0.0.1\", " + port +
                          "), timeout=5); print(\"connected\")\nexcept Exception as e: print(type(e).__name__)'");
  EXPECT_EQ(r.stdout(), "ConnectionRefusedError\n") << r.stderr();
  auto out = ShIn(*sb_, "python3 -c 'import socket\ntry:\n socket.create_connection((\"10.0.2.2\", " + port +
                            "), timeout=5); print(\"connected\")\nexcept Exception as e: print(type(e).__name__)'");
  EXPECT_EQ(out.stdout(), "OSError\n") << out.stderr();  // no route: no device but lo
  pollfd p{host, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "the host's listener was reached";
  ::close(host);
}

// A guarded task in a guest (spec.task): its hidden paths are not there and
// its protected ones are read-only for root in the guest too, whose
// programs lack the capabilities to unmount or remount them, to make a
// device node, or to read the image's disk (gone from /dev); a change no
// mount can stop (a new file at a protected glob) is flagged from the
// guest's writable layer, which its agent reads.
class VmGuard : public VmIsolation {
 protected:
  // No sandbox of the suite's (a boot this test would not use).
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (auto gap = KindHostGap(GetParam()); !gap.empty()) GTEST_SKIP() << gap;
  }
};

TEST_P(VmGuard, AGuardedTasksPathsHoldAgainstRootInTheGuest) {
  char tmpl[] = "/tmp/dsec-vm-guard-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string rootfs = tmpl;
  RootfsOptions o;
  for (const char* p : {"umount", "mknod"}) o.programs.push_back(p);
  ASSERT_TRUE(MakeRootfs(rootfs, o).ok());
  ASSERT_EQ(RunProcess({"/bin/sh", "-c",
                        "cd " + rootfs + " && mkdir -p work/repo/tests work/repo/grader && echo 'the test' > "
                        "work/repo/tests/test_x.py && echo 'the grader' > work/repo/grader/grade.sh"})
                .exit_code,
            0);
  std::string image = "vm-guarded-" + GetParam().name;
  auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "build", rootfs, image});
  RunProcess({"/bin/rm", "-rf", rootfs});
  ASSERT_EQ(built.exit_code, 0) << built.err;
  v1::SandboxSpec spec = ContainerSpec(image);
  spec.set_kind(GetParam().kind);
  auto* task = spec.mutable_task();
  task->set_root("/work/repo");
  for (const char* g : {"tests/**", "**/conftest.py"}) task->add_protected_paths(g);
  task->add_hidden_paths("grader/**");
  auto s = client_->OpenSession("vm-guard/" + GetParam().name + std::to_string(::getpid()), spec);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto step = [&](uint64_t k, const std::string& sh) {
    auto r = s->Step(k, Sh("cd /work/repo && " + sh));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->step() : v1::StepRecord();
  };
  auto look = step(0, "ls; cat tests/test_x.py; cat grader/grade.sh 2>/dev/null || echo hidden");
  EXPECT_EQ(look.result().stdout(), "tests\nthe test\nhidden\n") << look.result().stderr();
  const std::string disk = GetParam().kind == v1::KIND_VM ? "/dev/pmem0" : "/dev/vda";
  auto cheat = step(1, "echo x > tests/test_x.py; echo w=$?; rm tests/test_x.py; echo rm=$?; umount tests && "
                       "echo unmounted; mount -o remount,rw tests && echo remounted; test -e " + disk +
                       " && echo disk; mknod /tmp/disk b 254 0 || echo no-mknod; cat tests/test_x.py");
  EXPECT_EQ(cheat.result().stdout(), "w=2\nrm=1\nno-mknod\nthe test\n") << cheat.result().stderr();
  EXPECT_THAT(cheat.result().stderr(), ::testing::HasSubstr("Read-only file system"));
  auto conftest = step(2, "echo 'import pytest' > conftest.py && echo made");
  EXPECT_EQ(conftest.result().stdout(), "made\n");
  ASSERT_EQ(conftest.flags_size(), 1) << conftest.DebugString();
  EXPECT_EQ(conftest.flags(0).what(), "protected_write");
  EXPECT_EQ(conftest.flags(0).evidence(), "created conftest.py") << "read from the guest's writable layer";
  EXPECT_TRUE(s->Close().ok());
}

TEST_P(VmIsolation, FloodingTheConsoleAndTheAgentChannelDoesNotStallDsecd) {
  auto b = SharedSandbox(1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  // The console: as fast as the guest can write (until the end of the test).
  ASSERT_EQ(
      ShIn(*sb_, "cat /dev/urandom > /dev/ttyS0 2>/dev/null & echo $! > /tmp/console-flood; echo started").stdout(),
      "started\n");
  // The agent channel: a stream of 16 MiB (the output cap's maximum).
  std::atomic<uint64_t> streamed{0};
  v1::ExecRequest flood = Command({"sh", "-c", "yes flood | head -c 16000000"});
  flood.mutable_limits()->set_output_bytes(16ull << 20);
  auto streaming = std::async(std::launch::async, [&] {
    return sb_->ExecStream(flood, [&](const v1::ExecOutput& o) { streamed += o.stdout().size(); });
  });
  // Meanwhile dsecd answers another guest and the record of this one.
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ShIn(*b, "echo " + std::to_string(i)).stdout(), std::to_string(i) + "\n");
    EXPECT_TRUE(sb_->Get().ok());
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(ms, 10000) << "an exec in another guest took " << ms << " ms during the flood";
  }
  auto r = streaming.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(streamed.load(), 1000000u);
  EXPECT_EQ(ShIn(*sb_, "echo alive").stdout(), "alive\n");
  (void)ShIn(*sb_, "kill $(cat /tmp/console-flood)");  // A goes on quiet for the next test
}

TEST_P(VmIsolation, AGuestKernelPanicFailsTheSandboxSayingWhyAndFreesIt) {
  auto b = TakeSharedSandbox(1);  // B, this test's now
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const Sandbox& victim = *b;
  std::string id = victim.id();
  auto panic = victim.ExecAsync(Command({"sh", "-c", "echo c > /proc/sysrq-trigger"}));
  auto rec = AwaitFailed(victim);
  EXPECT_NE(rec.error().find("panicked"), std::string::npos) << rec.error();
  ExpectFreed(id);
  ASSERT_EQ(panic.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "the exec was never answered";
  auto r = panic.get();
  EXPECT_FALSE(r.ok() && r->verdict() == v1::VERDICT_OK);
  EXPECT_TRUE(victim.Destroy().ok());
}

TEST_P(VmIsolation, Kill9OfItsQemuFailsTheSandboxSayingWhyAndFreesIt) {
  auto a = TakeSharedSandbox(0);  // A, sb_: this test's now
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->id(), sb_->id());
  std::string id = sb_->id();
  auto qemu = VmProcessesOf(*daemon_, GetParam().kind, id);
  ASSERT_EQ(qemu.size(), 1u);
  ASSERT_EQ(::kill(qemu[0], SIGKILL), 0);
  auto rec = AwaitFailed(*sb_);
  EXPECT_NE(rec.error().find("QEMU"), std::string::npos) << rec.error();
  EXPECT_NE(rec.error().find("exited"), std::string::npos) << rec.error();
  ExpectFreed(id);
  auto exec = sb_->Exec(Command({"true"}));
  EXPECT_FALSE(exec.ok() && exec->verdict() == v1::VERDICT_OK) << "an exec ran in a failed sandbox";
  EXPECT_TRUE(sb_->Destroy().ok());
}

INSTANTIATE_TEST_SUITE_P(Kinds, VmIsolation, ::testing::ValuesIn(RegisteredKinds(OwnKernel)), KindParamName);
INSTANTIATE_TEST_SUITE_P(Kinds, VmGuard, ::testing::ValuesIn(RegisteredKinds(OwnKernel)), KindParamName);

}  // namespace
}  // namespace dsec::testing
