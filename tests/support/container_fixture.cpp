#include "tests/support/container_fixture.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {

namespace {

bool Exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

bool HaveMkfsErofs() {
  for (const char* tool : {"/usr/bin/mkfs.erofs", "/sbin/mkfs.erofs", "/usr/sbin/mkfs.erofs"})
    if (Exists(tool)) return true;
  return false;
}

}  // namespace

std::string ContainerTest::StartContainerDaemon(TestDaemonOptions o, std::unique_ptr<TestDaemon>* daemon,
                                                std::unique_ptr<Client>* client) {
  if (::geteuid() != 0) return "container tests need root (namespaces, cgroups, mounts)";
  if (!HaveMkfsErofs()) return "mkfs.erofs is missing (apt-get install erofs-utils)";
  auto d = TestDaemon::Start(std::move(o));
  if (!d.ok()) {
    // Not a missing capability of the host: a daemon that cannot start fails the test.
    ADD_FAILURE() << "dsecd did not start: " << d.status().ToString();
    return "dsecd did not start";
  }
  *daemon = std::move(*d);
  auto status = (*daemon)->Admin("status");
  bool container = false;
  for (const auto& k : status.value("kinds", nlohmann::json::array())) container = container || k == "container";
  if (!container) return "container sandboxes unavailable on this host: " + status.dump();

  char tmpl[] = "/tmp/dsec-test-rootfs-XXXXXX";
  if (!::mkdtemp(tmpl)) return "mkdtemp failed";
  std::string rootfs = tmpl;
  Status made = MakeRootfs(rootfs);
  ProcResult built;
  if (made.ok())
    built = RunProcess({BinDir() + "/dsec-image", "--data-dir", (*daemon)->data_dir(), "build", rootfs, kImage});
  RunProcess({"/bin/rm", "-rf", rootfs});
  if (!made.ok()) return "cannot make the test rootfs: " + made.ToString();
  if (built.exit_code != 0) {
    ADD_FAILURE() << "dsec-image build failed: " << built.err;
    return "dsec-image build failed";
  }
  return ConnectClient(**daemon, client);
}

Result<Sandbox> ContainerTest::NewContainer(v1::Limits limits) {
  auto spec = ContainerSpec(kImage);
  *spec.mutable_limits() = limits;
  return client_->Create(spec);
}

v1::ExecRequest ContainerTest::Sh(const std::string& script, v1::Limits limits) {
  auto req = Command({"/bin/sh", "-c", script});
  *req.mutable_limits() = limits;
  return req;
}

v1::ExecResult ContainerTest::Exec(const Sandbox& sb, v1::ExecRequest req) {
  auto r = sb.Exec(std::move(req));
  EXPECT_TRUE(r.ok()) << "exec in " << sb.id() << ": " << r.status().ToString();
  return r.ok() ? *r : v1::ExecResult{};
}

void ContainerTest::TearDown() {
  for (const auto& sb : made_) (void)sb.Destroy();
  made_.clear();
}

Result<Sandbox> ContainerTest::Make(v1::Limits limits) {
  auto sb = NewContainer(limits);
  if (sb.ok()) made_.push_back(*sb);
  return sb;
}

void ContainerTest::Destroy(const Sandbox& sb) {
  EXPECT_TRUE(sb.Destroy().ok()) << sb.id();
  EXPECT_EQ(Remains(sb.id()), "") << sb.id();
  made_.erase(std::remove_if(made_.begin(), made_.end(), [&](const Sandbox& s) { return s.id() == sb.id(); }),
              made_.end());
}

std::string ContainerTest::FreezerState(const std::string& id) {
  std::ifstream in("/sys/fs/cgroup/freezer/dsec-test/c/" + id + "/freezer.state");
  std::string s;
  in >> s;
  return s;
}

int ContainerTest::InitPid(const Sandbox& sb) {
  auto rec = sb.Get();
  if (!rec.ok()) {
    ADD_FAILURE() << sb.id() << ": " << rec.status().ToString();
    return 0;
  }
  auto state = nlohmann::json::parse(rec->driver_state(), nullptr, false);
  int pid = state.is_object() ? state.value("init_pid", 0) : 0;
  if (pid <= 0) ADD_FAILURE() << sb.id() << ": no init pid in the driver state " << rec->driver_state();
  return pid;
}

std::string ContainerTest::Remains(const std::string& id) {
  std::string out;
  std::string dir = daemon_->data_dir() + "/sandboxes/" + id;
  if (Exists(dir)) out += " dir " + dir;
  for (const char* ctrl : {"memory", "pids", "cpu", "cpuacct", "freezer"}) {
    std::string cg = std::string("/sys/fs/cgroup/") + ctrl + "/dsec-test/c/" + id;
    if (Exists(cg)) out += " cgroup " + cg;
  }
  return out;
}

}  // namespace dsec::testing
