#include "tests/support/container_fixture.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "drivers/container/container_state.pb.h"
#include "runtime/files.hpp"
#include "tests/support/daemon_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {

namespace {

bool Exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

// The tools image's tree, made once per process (MakeRootfs copies the
// host's programs, their libraries and python's standard library: seconds
// a daemon), or a tree made so elsewhere ($DSEC_TEST_ROOTFS). What this
// process made goes when it exits (not in a child it forked).
class ToolsRootfs {
 public:
  ToolsRootfs() {
    if (const char* given = std::getenv("DSEC_TEST_ROOTFS"); given && *given) {
      dir_ = given;
      made_ = Exists(dir_ + "/bin/sh") ? Status::Ok()
                                       : Status::Internal("$DSEC_TEST_ROOTFS " + dir_ + " has no bin/sh");
      return;
    }
    char tmpl[] = "/tmp/dsec-test-rootfs-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      made_ = Status::FromErrno(errno, "mkdtemp");
      return;
    }
    dir_ = tmpl;
    owner_ = ::getpid();
    made_ = MakeRootfs(dir_);
  }
  ~ToolsRootfs() {
    if (owner_ == ::getpid()) (void)RemoveTree(dir_);
  }
  ToolsRootfs(const ToolsRootfs&) = delete;
  ToolsRootfs& operator=(const ToolsRootfs&) = delete;
  const std::string& dir() const { return dir_; }
  const Status& made() const { return made_; }

 private:
  std::string dir_;
  Status made_;
  pid_t owner_ = 0;
};

const ToolsRootfs& Tools() {
  static ToolsRootfs tools;
  return tools;
}

// The shared daemon goes after the last suite, before static destruction.
class SharedDaemonEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { ContainerTest::ReleaseSharedDaemon(); }
};
[[maybe_unused]] ::testing::Environment* const kSharedDaemonEnvironment =
    ::testing::AddGlobalTestEnvironment(new SharedDaemonEnvironment);

}  // namespace

bool ContainerTest::SharedDaemonAsked() {
  const char* v = std::getenv("DSEC_TEST_SHARED_DAEMON");
  return v && std::strcmp(v, "1") == 0;
}

void ContainerTest::UseSharedDaemon() {
  if (shared_ && daemon_ && client_ && daemon_->pid() > 0) {
    start_ = {};
    return;
  }
  ReleaseSharedDaemon();
  client_.reset();
  daemon_.reset();
  start_ = TryStartContainerDaemon(TestDaemonOptions(), &daemon_, &client_);
  shared_ = start_.skip.empty() && start_.failure.empty() && client_ != nullptr;
}

void ContainerTest::ReleaseSharedDaemon() {
  if (!shared_) return;
  shared_ = false;
  client_.reset();
  daemon_.reset();
}

DaemonStart ContainerTest::TryStartContainerDaemon(TestDaemonOptions o, std::unique_ptr<TestDaemon>* daemon,
                                                   std::unique_ptr<Client>* client) {
  if (daemon == &daemon_) ReleaseSharedDaemon();
  if (auto gap = ContainerHostGap(); !gap.empty()) return {"container sandboxes unavailable on this host: " + gap, ""};
  auto d = TestDaemon::Start(std::move(o));
  if (!d.ok()) return {"", "dsecd did not start: " + d.status().ToString()};
  *daemon = std::move(*d);
  auto status = (*daemon)->Admin("status");
  bool container = false;
  for (const auto& k : status.value("kinds", nlohmann::json::array())) container = container || k == "container";
  if (!container) return {"", "dsecd offers no containers on a host that has all they need: " + status.dump()};

  DaemonStart built = BuildToolsImage(**daemon, kImage);
  if (!built.skip.empty() || !built.failure.empty()) return built;
  return {"", ConnectClient(**daemon, client)};
}

DaemonStart ContainerTest::BuildToolsImage(const TestDaemon& daemon, const std::string& name, std::string* dir) {
  const ToolsRootfs& tools = Tools();
  Status made = tools.made();
  ProcResult built;
  if (made.ok())
    built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon.data_dir(), "build", tools.dir(), name});
  // FailedPrecondition: the host lacks a program the image is made of.
  if (made.code() == Status::Code::kFailedPrecondition)
    return {"cannot make the test rootfs on this host: " + made.ToString(), ""};
  if (!made.ok()) return {"", "cannot make the test rootfs: " + made.ToString()};
  if (built.exit_code != 0) return {"", "dsec-image build failed: " + built.err};
  if (dir) *dir = tools.dir();
  return {};
}

std::string ContainerTest::StartContainerDaemon(TestDaemonOptions o, std::unique_ptr<TestDaemon>* daemon,
                                                std::unique_ptr<Client>* client) {
  auto s = TryStartContainerDaemon(std::move(o), daemon, client);
  if (!s.failure.empty()) ADD_FAILURE() << s.failure;
  return s.failure.empty() ? s.skip : s.failure;
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
  if (in >> s) return s;
  // cgroup v2: cgroup.events says "frozen 1" once every process is.
  std::ifstream events("/sys/fs/cgroup/dsec-test/c/" + id + "/cgroup.events");
  if (!events) return "";
  for (std::string key, value; events >> key >> value;)
    if (key == "frozen") return value == "1" ? "FROZEN" : "THAWED";
  return "";
}

int ContainerTest::InitPid(const Sandbox& sb) {
  // The console's inspect shows the driver's state, decoded.
  auto j = daemon_->Admin("inspect " + sb.id());
  int pid = j.value("ok", false) ? j["sandbox"]["driver_state"].value("init_pid", 0) : 0;
  if (pid <= 0) ADD_FAILURE() << sb.id() << ": no init pid in the console's inspect: " << j.dump();
  return pid;
}

std::string ContainerTest::Remains(const std::string& id) {
  std::string out;
  std::string dir = daemon_->data_dir() + "/sandboxes/" + id;
  if (Exists(dir)) out += " dir " + dir;
  for (const char* ctrl : {"memory/", "pids/", "cpu/", "cpuacct/", "freezer/", ""}) {  // v1's, v2's
    std::string cg = std::string("/sys/fs/cgroup/") + ctrl + "dsec-test/c/" + id;
    if (Exists(cg)) out += " cgroup " + cg;
  }
  return out;
}

}  // namespace dsec::testing
