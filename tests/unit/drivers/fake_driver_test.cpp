// The fake kind's driver: the Driver contract as the actors rely on it
// (answers later, on a thread of the driver's own; verdicts; kills; limits;
// streaming; pause; files; destroy with a run in flight; re-adoption after
// a restart, in memory and from a state dir), and the contract suite's
// own commands (tests/integration/contract) run through it.
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "drivers/fake/fake_driver.hpp"
#include "drivers/limits.hpp"
#include "drivers/fake/fake_shell.hpp"

namespace dsec::drivers {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// One call's answer: waited for with a bound, and checked to come on a
// thread other than the caller's (the actors rely on it).
template <class T>
class Answer {
 public:
  Answer() : f_(p_->get_future()) {}
  auto Callback() {
    return [p = p_, caller = caller_, seen = on_caller_](T v) {
      if (std::this_thread::get_id() == caller) *seen = true;
      p->set_value(std::move(v));
    };
  }
  bool Ready(std::chrono::milliseconds wait = 0ms) { return f_.wait_for(wait) == std::future_status::ready; }
  T Get() {
    if (!Ready(5s)) return T(Status::DeadlineExceeded("the driver never answered"));
    EXPECT_FALSE(*on_caller_) << "answered on the caller's thread";
    return f_.get();
  }

 private:
  std::shared_ptr<std::promise<T>> p_ = std::make_shared<std::promise<T>>();
  std::future<T> f_;
  std::thread::id caller_ = std::this_thread::get_id();
  std::shared_ptr<std::atomic<bool>> on_caller_ = std::make_shared<std::atomic<bool>>(false);
};

using ExecAnswer = Answer<Result<v1::ExecResult>>;

v1::SandboxRecord Record(const std::string& id, uint64_t memory_bytes = 0) {
  v1::SandboxRecord r;
  r.set_id(id);
  r.set_phase(v1::SANDBOX_PHASE_RUNNING);
  r.mutable_spec()->set_kind(v1::KIND_FAKE);
  r.mutable_spec()->mutable_limits()->set_memory_bytes(memory_bytes);
  return r;
}

v1::ExecRequest Command(std::vector<std::string> argv, uint32_t timeout_ms = 5000) {
  v1::ExecRequest req;
  for (auto& a : argv) req.add_argv(a);
  req.mutable_limits()->set_timeout_ms(timeout_ms);
  req.mutable_limits()->set_output_bytes(1 << 20);
  return req;
}
// As the contract suite's fixture asks (tests/support/container_fixture.cpp).
v1::ExecRequest Sh(const std::string& script, uint32_t timeout_ms = 5000) {
  return Command({"/bin/sh", "-c", script}, timeout_ms);
}

class FakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override { driver_ = std::make_unique<FakeDriver>(Options()); }
  FakeOptions Options() {
    FakeOptions o;
    o.clock = [] { return int64_t{1700000000000}; };
    return o;
  }
  std::string TempDir() {
    char tmpl[] = "/tmp/fake_driver_test.XXXXXX";
    std::string dir = ::mkdtemp(tmpl);
    dirs_.push_back(dir);
    return dir;
  }
  void TearDown() override {
    driver_.reset();
    for (const auto& d : dirs_) std::filesystem::remove_all(d);
  }

  Result<std::string> Create(FakeDriver& d, const v1::SandboxRecord& sb) {
    Answer<Result<std::string>> a;
    d.Create(sb, a.Callback());
    return a.Get();
  }
  v1::SandboxRecord Made(const std::string& id, uint64_t memory_bytes = 0) {
    auto sb = Record(id, memory_bytes);
    auto st = Create(*driver_, sb);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (st.ok()) state_ = *st;
    return sb;
  }
  void Exec(FakeDriver& d, const v1::SandboxRecord& sb, const v1::ExecRequest& req, ExecAnswer& a,
            const std::string& run_id = "") {
    d.Exec(sb, run_id.empty() ? "run-" + std::to_string(++runs_) : run_id, req, a.Callback());
  }
  v1::ExecResult Run(FakeDriver& d, const v1::SandboxRecord& sb, const v1::ExecRequest& req) {
    ExecAnswer a;
    Exec(d, sb, req, a);
    auto r = a.Get();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : v1::ExecResult();
  }
  v1::ExecResult Run(const v1::SandboxRecord& sb, const v1::ExecRequest& req) { return Run(*driver_, sb, req); }
  std::string Out(const v1::SandboxRecord& sb, const std::string& script) { return Run(sb, Sh(script)).stdout(); }
  Status Destroy(FakeDriver& d, const v1::SandboxRecord& sb) {
    Answer<Status> a;
    d.Destroy(sb, FakeDriver::StateFor(sb.id()), a.Callback());
    return a.Get();
  }
  Status Pause(const v1::SandboxRecord& sb, bool paused) {
    Answer<Status> a;
    driver_->Pause(sb, paused, a.Callback());
    return a.Get();
  }
  Status Readopt(FakeDriver& d, const v1::SandboxRecord& sb) {
    Answer<Status> a;
    d.Readopt(sb, FakeDriver::StateFor(sb.id()), a.Callback());
    return a.Get();
  }
  Result<v1::FileReply> Write(const v1::SandboxRecord& sb, const std::string& path, const std::string& content,
                              uint32_t mode = 0, bool parents = false) {
    v1::WriteFileRequest req;
    req.set_path(path);
    req.set_content(content);
    req.set_mode(mode);
    req.set_make_parents(parents);
    Answer<Result<v1::FileReply>> a;
    driver_->WriteFile(sb, req, a.Callback());
    return a.Get();
  }
  Result<v1::FileReply> Read(FakeDriver& d, const v1::SandboxRecord& sb, const std::string& path, uint64_t max = 0) {
    v1::ReadFileRequest req;
    req.set_path(path);
    req.set_max_bytes(max);
    Answer<Result<v1::FileReply>> a;
    d.ReadFile(sb, req, a.Callback());
    return a.Get();
  }
  Result<v1::FileReply> List(const v1::SandboxRecord& sb, const std::string& path) {
    v1::ListFilesRequest req;
    req.set_path(path);
    Answer<Result<v1::FileReply>> a;
    driver_->ListFiles(sb, req, a.Callback());
    return a.Get();
  }
  // Polls (bounded) until `cond`: for what happens on the driver's threads.
  static bool Eventually(const std::function<bool()>& cond) {
    for (int i = 0; i < 1000; ++i) {
      if (cond()) return true;
      std::this_thread::sleep_for(2ms);
    }
    return cond();
  }
  size_t Lines(const std::string& id, const std::string& path) {
    auto box = driver_->world()->Find(id);
    if (!box) return 0;
    auto lk = box->Lock();
    int err = 0;
    auto n = box->fs().Find(path, &err);
    return n ? static_cast<size_t>(std::count(n->data.begin(), n->data.end(), '\n')) : 0;
  }

  std::unique_ptr<FakeDriver> driver_;
  std::string state_;
  int runs_ = 0;
  std::vector<std::string> dirs_;
};

TEST_F(FakeDriverTest, KindAndTraits) {
  EXPECT_EQ(driver_->kind(), v1::KIND_FAKE);
  EXPECT_STREQ(driver_->name(), "fake");
  const auto& t = driver_->traits();
  EXPECT_EQ(t.isolation, v1::ISOLATION_PROCESS);
  EXPECT_TRUE(t.host_image && t.stateful && t.files && t.pause && t.streaming && t.readoptable);
  EXPECT_FALSE(t.own_loopback);
  EXPECT_TRUE(driver_->Available().ok());
  v1::SandboxSpec spec;
  spec.set_image("py311");  // no image to check: any name does
  EXPECT_TRUE(driver_->CanHandle(spec).ok());
  // A network policy beyond none needs the capability, which it lacks.
  spec.mutable_network()->set_mode(v1::NETWORK_MODE_ALLOW);
  spec.mutable_network()->add_allow("10.1.2.3:80");
  Status st = Admissible(LimitPolicy::Default(), *driver_, spec);
  EXPECT_EQ(st.code(), Status::Code::kUnimplemented) << st.ToString();
  EXPECT_NE(st.message().find("'fake'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'network' capability"), std::string::npos) << st.message();
  // A bad policy is refused as such first, naming the entry.
  spec.mutable_network()->add_allow("10.1.2.3:0");
  st = Admissible(LimitPolicy::Default(), *driver_, spec);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("network entry '10.1.2.3:0'"), std::string::npos) << st.message();
}

TEST_F(FakeDriverTest, CreateExecDescribeAndDestroy) {
  auto sb = Made("sb-1");
  EXPECT_EQ(state_, FakeDriver::StateFor("sb-1"));
  auto r = Run(sb, Sh("echo out; echo err >&2; exit 3"));
  EXPECT_EQ(r.verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.stdout(), "out\n");
  EXPECT_EQ(r.stderr(), "err\n");
  EXPECT_EQ(r.run_id(), "run-1");
  EXPECT_EQ(Create(*driver_, sb).status().code(), Status::Code::kAlreadyExists);
  auto desc = nlohmann::json::parse(driver_->DescribeState(state_));
  EXPECT_EQ(desc["box"], "sb-1");
  EXPECT_EQ(desc["paused"], false);
  EXPECT_EQ(desc["running"], nlohmann::json::array());
  EXPECT_GT(desc["files"].get<int>(), 5);
  EXPECT_EQ(driver_->DescribeState("not a state"), "");
  ExecAnswer odd;
  Exec(*driver_, sb, Command({"/bin/sh", "-c", "sleep 0.05", "\xff\xfe"}), odd);
  ASSERT_TRUE(Eventually([&] { return !driver_->world()->Running("sb-1").empty(); }));
  EXPECT_THAT(driver_->DescribeState(state_), HasSubstr("sleep 0.05")) << "a command that is not UTF-8 is shown";
  ASSERT_TRUE(odd.Get().ok());
  EXPECT_EQ(driver_->world()->ArgvLog("sb-1"),
            (std::vector<std::vector<std::string>>{{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"},
                                                   {"/bin/sh", "-c", "sleep 0.05", "\xff\xfe"}}));
  ASSERT_TRUE(Destroy(*driver_, sb).ok());
  EXPECT_EQ(driver_->world()->Find("sb-1"), nullptr);
  EXPECT_TRUE(Destroy(*driver_, sb).ok()) << "destroying what is gone is a no-op";
  ExecAnswer a;
  Exec(*driver_, sb, Sh("true"), a);
  auto gone = a.Get();
  EXPECT_EQ(gone.status().code(), Status::Code::kUnavailable);
  EXPECT_THAT(gone.status().message(), HasSubstr("sb-1"));
  auto stats = nlohmann::json::parse(driver_->StatsJson());
  EXPECT_EQ(stats["boxes"], 0);
  EXPECT_EQ(stats["runs"], 0);
  EXPECT_EQ(stats["execs"], 3);
  EXPECT_EQ(stats["created"], 1);
  EXPECT_EQ(stats["destroyed"], 2);
}

TEST_F(FakeDriverTest, EnvironmentAndWorkdirComeFromTheSpecAndTheExec) {
  auto sb = Record("sb-1");
  (*sb.mutable_spec()->mutable_env())["A"] = "spec";
  (*sb.mutable_spec()->mutable_env())["B"] = "spec";
  sb.mutable_spec()->set_workdir("/srv/app");
  ASSERT_TRUE(Create(*driver_, sb).ok());
  auto req = Sh("env; pwd");
  (*req.mutable_env())["B"] = "exec";
  EXPECT_EQ(Run(sb, req).stdout(), "A=spec\nB=exec\nHOME=/root\nPATH=/usr/bin:/bin\n/srv/app\n");
  auto pwd = Command({"pwd"});
  EXPECT_EQ(Run(sb, pwd).stdout(), "/srv/app\n");
  pwd.set_cwd("/tmp");
  EXPECT_EQ(Run(sb, pwd).stdout(), "/tmp\n");
}

TEST_F(FakeDriverTest, VerdictsAreThoseOfEveryKind) {
  auto sb = Made("sb-1", 16 << 20);
  auto missing = Run(sb, Command({"no-such-program"}));
  EXPECT_EQ(missing.exit_code(), 127);
  EXPECT_TRUE(missing.exec_failed());
  EXPECT_EQ(missing.error(), "no-such-program: command not found");
  auto slow = Run(sb, Sh("sleep 30", 50));
  EXPECT_EQ(slow.verdict(), v1::VERDICT_TIME_LIMIT);
  EXPECT_EQ(slow.error(), "time limit: wall-clock limit of 50 ms exceeded");
  EXPECT_EQ(slow.signal(), SIGKILL);
  auto loud_req = Sh("head -c 100000 /dev/zero");
  loud_req.mutable_limits()->set_output_bytes(1000);
  auto loud = Run(sb, loud_req);
  EXPECT_EQ(loud.verdict(), v1::VERDICT_OUTPUT_LIMIT);
  EXPECT_TRUE(loud.stdout_truncated());
  EXPECT_LE(loud.stdout().size(), 1000u);
  EXPECT_EQ(loud.signal(), SIGKILL);
  auto hog = Run(sb, Sh("x=$(head -c 20000000 /dev/zero); echo never"));
  EXPECT_EQ(hog.verdict(), v1::VERDICT_MEMORY_LIMIT) << hog.error();
  EXPECT_EQ(hog.signal(), SIGKILL);
  EXPECT_EQ(hog.error(), "memory limit: the run used more than 16 MiB and was killed");
  EXPECT_GT(hog.peak_memory_bytes(), 16u << 20);
  auto bad_cwd_req = Sh("pwd");
  bad_cwd_req.set_cwd("/nope");
  auto bad_cwd = Run(sb, bad_cwd_req);
  EXPECT_EQ(bad_cwd.exit_code(), 126);
  EXPECT_TRUE(bad_cwd.exec_failed());
  EXPECT_THAT(bad_cwd.error(), HasSubstr("'/nope'"));
  auto ok = Run(sb, Command({"true"}));
  EXPECT_EQ(ok.verdict(), v1::VERDICT_OK);
  EXPECT_GT(ok.wall_us(), 0u);
  EXPECT_EQ(Out(sb, "echo survived"), "survived\n");
}

TEST_F(FakeDriverTest, ExecLimitsOfTheWholeSandboxAreRefusedAsForContainers) {
  auto sb = Record("sb-1", 64ull << 20);
  v1::Limits asked;
  asked.set_memory_bytes(32ull << 20);
  Status st = driver_->CheckExecLimits(sb, asked);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("create"));
  EXPECT_THAT(st.message(), HasSubstr("memory limit of fake sb-1"));
  asked.set_memory_bytes(64ull << 20);
  asked.set_timeout_ms(10);
  EXPECT_TRUE(driver_->CheckExecLimits(sb, asked).ok());
  asked.set_pids(7);
  EXPECT_THAT(driver_->CheckExecLimits(sb, asked).message(), HasSubstr("--pids"));
}

TEST_F(FakeDriverTest, KillEndsARunWithItsReason) {
  auto sb = Made("sb-1");
  ExecAnswer a;
  Exec(*driver_, sb, Command({"sleep", "10"}), a, "r1");
  ASSERT_TRUE(driver_->Kill("r1", "enough").ok()) << "a run is killable as soon as Exec returns";
  auto r = a.Get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_EQ(r->error(), "killed: enough");
  EXPECT_EQ(r->signal(), SIGKILL);
  EXPECT_LT(r->wall_us(), 1000000u);
  EXPECT_EQ(driver_->Kill("r1", "again").code(), Status::Code::kNotFound);
  EXPECT_EQ(driver_->Kill("never", "x").code(), Status::Code::kNotFound);
  EXPECT_EQ(driver_->RunsInFlight(), 0u);
}

TEST_F(FakeDriverTest, DestroyWithAnExecInFlightAnswersTheExecFirst) {
  auto sb = Made("sb-1");
  ASSERT_EQ(Run(sb, Sh("(while :; do sleep 0.01; done) &")).verdict(), v1::VERDICT_OK);
  auto box = driver_->world()->Find("sb-1");
  EXPECT_EQ(box->jobs(), 1u);
  std::atomic<int> order{0};
  int exec_order = 0, destroy_order = 0;
  ExecAnswer a;
  driver_->Exec(sb, "r1", Command({"sleep", "60.42"}), [&, cb = a.Callback()](Result<v1::ExecResult> r) {
    exec_order = ++order;
    cb(std::move(r));
  });
  ASSERT_TRUE(Eventually([&] {
    auto running = driver_->world()->Running("sb-1");
    return std::find(running.begin(), running.end(), "sleep 60.42") != running.end();
  }));
  auto desc = nlohmann::json::parse(driver_->DescribeState(state_));
  EXPECT_THAT(desc["running"].dump(), HasSubstr("sleep 60.42"));
  EXPECT_THAT(desc["running"].dump(), HasSubstr("/bin/sh -c (while :; do sleep 0.01; done) &")) << "the job's shell";
  Answer<Status> d;
  driver_->Destroy(sb, state_, [&, cb = d.Callback()](const Status& st) {
    destroy_order = ++order;
    cb(st);
  });
  EXPECT_TRUE(d.Get().ok());
  auto r = a.Get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_THAT(r->error(), HasSubstr("sandbox sb-1 was destroyed"));
  EXPECT_EQ(exec_order, 1);
  EXPECT_EQ(destroy_order, 2);
  EXPECT_EQ(box->jobs(), 0u) << "the background job outlived its sandbox";
  EXPECT_TRUE(box->Running().empty());
}

TEST_F(FakeDriverTest, PauseHoldsEveryRunAndJobUntilResumed) {
  auto sb = Made("sb-1");
  ASSERT_EQ(Run(sb, Sh("(while :; do echo t >> /work/ticks; sleep 0.01; done) > /dev/null 2>&1 &")).verdict(),
            v1::VERDICT_OK);
  EXPECT_EQ(Out(sb, "until [ \"$(wc -l < /work/ticks)\" -ge 3 ]; do sleep 0.01; done; echo ticking"), "ticking\n");
  ASSERT_TRUE(Pause(sb, true).ok());
  EXPECT_EQ(nlohmann::json::parse(driver_->DescribeState(state_))["paused"], true);
  size_t before = Lines("sb-1", "/work/ticks");
  ExecAnswer held;
  Exec(*driver_, sb, Sh("echo held"), held);
  std::this_thread::sleep_for(100ms);  // the time in which nothing may happen
  EXPECT_EQ(Lines("sb-1", "/work/ticks"), before) << "the job ran while the sandbox was paused";
  EXPECT_FALSE(held.Ready()) << "an exec ran in a paused sandbox";
  EXPECT_TRUE(Pause(sb, true).ok()) << "pausing a paused sandbox is a no-op";
  ASSERT_TRUE(Pause(sb, false).ok());
  auto r = held.Get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), "held\n");
  EXPECT_EQ(Out(sb,
                "n=$(wc -l < /work/ticks); while [ $(wc -l < /work/ticks) -le $n ]; do sleep 0.01; done; "
                "echo ticking"),
            "ticking\n");
  EXPECT_TRUE(Pause(sb, false).ok()) << "resuming a running sandbox is a no-op";
}

TEST_F(FakeDriverTest, StreamedOutputArrivesInOrderWhileTheCommandRuns) {
  auto sb = Made("sb-1");
  std::mutex mu;
  std::string out, err;
  std::promise<void> first;
  std::once_flag once;
  auto on_output = [&](const v1::ExecOutput& o) {
    std::lock_guard<std::mutex> lk(mu);
    out += o.stdout();
    err += o.stderr();
    if (out.find("started\n") != std::string::npos) std::call_once(once, [&] { first.set_value(); });
  };
  ExecAnswer a;
  driver_->ExecStreaming(sb, "s1", Sh("for i in 1 2 3 4 5; do echo line$i; echo e$i >&2; done"), on_output,
                         a.Callback());
  auto r = a.Get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict(), v1::VERDICT_OK);
  EXPECT_EQ(r->stdout(), "");
  EXPECT_EQ(r->stderr(), "");
  EXPECT_EQ(out, "line1\nline2\nline3\nline4\nline5\n");
  EXPECT_EQ(err, "e1\ne2\ne3\ne4\ne5\n");
  out.clear();
  ExecAnswer b;
  driver_->ExecStreaming(sb, "s2", Sh("echo started; while [ ! -e /work/go ]; do sleep 0.01; done; echo finished"),
                         on_output, b.Callback());
  ASSERT_EQ(first.get_future().wait_for(5s), std::future_status::ready) << "no output streamed while it ran";
  EXPECT_FALSE(b.Ready());
  EXPECT_EQ(Run(sb, Sh("touch /work/go")).verdict(), v1::VERDICT_OK);
  r = b.Get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict(), v1::VERDICT_OK);
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(out, "started\nfinished\n");
}

TEST_F(FakeDriverTest, FilesRoundTripWithTheAgentsSemantics) {
  auto sb = Made("sb-1");
  std::string binary(300000, '\0');
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(Write(sb, "/work/blob", binary, 0640).ok());
  ASSERT_TRUE(Write(sb, "/work/deep/er/note.txt", "hello\n", 0644, true).ok());
  EXPECT_EQ(Out(sb, "stat -c '%a %s' /work/blob; cat /work/deep/er/note.txt"), "640 300000\nhello\n");
  ASSERT_EQ(Run(sb, Sh("echo made by exec > /work/out.txt")).verdict(), v1::VERDICT_OK);
  auto back = Read(*driver_, sb, "/work/out.txt");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->content(), "made by exec\n");
  auto blob = Read(*driver_, sb, "/work/blob");
  ASSERT_TRUE(blob.ok());
  EXPECT_TRUE(blob->content() == binary) << "binary content changed on the way";
  auto list = List(sb, "/work");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->info().name(), "work");
  EXPECT_EQ(list->info().mode(), S_IFDIR | 0755);
  ASSERT_EQ(list->entries_size(), 3);
  EXPECT_EQ(list->entries(0).name(), "blob");
  EXPECT_EQ(list->entries(0).mode(), S_IFREG | 0640);
  EXPECT_EQ(list->entries(0).size(), 300000u);
  EXPECT_EQ(list->entries(0).mtime_ms(), 1700000000000);
  EXPECT_EQ(list->entries(1).name(), "deep");
  EXPECT_TRUE(S_ISDIR(list->entries(1).mode()));
  EXPECT_EQ(list->entries(2).name(), "out.txt");
  auto one = List(sb, "/work/out.txt");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->info().size(), 13u);
  EXPECT_EQ(one->entries_size(), 0);
  EXPECT_EQ(Out(sb, "ls /work | tr '\\n' ' '"), "blob deep out.txt ");
  auto usage = driver_->DiskUsage(sb);
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(*usage, 300000u + 6 + 13);
  // Errors name the path, are coded as the agent's, and change nothing.
  auto missing = Read(*driver_, sb, "/work/none");
  EXPECT_EQ(missing.status().code(), Status::Code::kNotFound);
  EXPECT_EQ(missing.status().message(), "fake sb-1: read_file /work/none: No such file or directory");
  EXPECT_EQ(Write(sb, "work/x", "x").status().code(), Status::Code::kInvalidArgument);
  auto too_big = Read(*driver_, sb, "/work/blob", 1000);
  EXPECT_EQ(too_big.status().code(), Status::Code::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(), HasSubstr("above the limit of 1000"));
  EXPECT_EQ(Read(*driver_, sb, "/work").status().code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(Write(sb, "/work/a/b", "x").status().code(), Status::Code::kNotFound);
  EXPECT_EQ(Write(sb, "/work/deep", "x").status().code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(List(sb, "/work/none").status().code(), Status::Code::kNotFound);
  ASSERT_TRUE(Write(sb, "/work/blob", "short").ok());
  EXPECT_EQ(Out(sb, "stat -c '%a %s' /work/blob"), "640 5\n") << "an existing file keeps its mode";
}

TEST_F(FakeDriverTest, AStateDirBringsBoxesBackAfterTheDriverDies) {
  FakeOptions o = Options();
  o.state_dir = TempDir() + "/fake";
  driver_ = std::make_unique<FakeDriver>(o);
  auto sb = Made("sb-1");
  auto other = Made("sb-2");
  ASSERT_EQ(Run(sb, Sh("echo kept > /work/state; mkdir /work/d")).verdict(), v1::VERDICT_OK);
  ASSERT_TRUE(Write(sb, "/work/d/bin", std::string("\0\1\2", 3), 0600).ok());
  // Written as it changed: what a kill -9 now would leave is complete.
  auto on_disk = FakeBox::Load("sb-1", o.state_dir + "/sb-1.box", o.clock);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status().ToString();
  {
    auto lk = (*on_disk)->Lock();
    int err = 0;
    ASSERT_NE((*on_disk)->fs().Find("/work/state", &err), nullptr);
    EXPECT_EQ((*on_disk)->fs().Find("/work/state", &err)->data, "kept\n");
  }
  driver_.reset();
  driver_ = std::make_unique<FakeDriver>(o);  // another dsecd, another world, the same dir
  ASSERT_TRUE(Readopt(*driver_, sb).ok());
  EXPECT_EQ(Out(sb, "cat /work/state 2>/dev/null || echo fresh"), "kept\n");
  auto bin = Read(*driver_, sb, "/work/d/bin");
  ASSERT_TRUE(bin.ok());
  EXPECT_EQ(bin->content(), std::string("\0\1\2", 3));
  auto gone = Readopt(*driver_, Record("sb-3"));
  EXPECT_EQ(gone.code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(gone.message(), HasSubstr("fake sb-3 is gone"));
  driver_->Restored();  // sb-2 no record claimed: a leftover
  EXPECT_TRUE(Eventually([&] { return ::access((o.state_dir + "/sb-2.box").c_str(), F_OK) != 0; }));
  EXPECT_EQ(::access((o.state_dir + "/sb-1.box").c_str(), F_OK), 0);
  ExecAnswer a;
  Exec(*driver_, other, Sh("true"), a);
  EXPECT_EQ(a.Get().status().code(), Status::Code::kUnavailable);
  ASSERT_TRUE(Destroy(*driver_, sb).ok());
  EXPECT_NE(::access((o.state_dir + "/sb-1.box").c_str(), F_OK), 0) << "destroy leaves nothing behind";
}

TEST_F(FakeDriverTest, ASharedWorldIsARestartInProcess) {
  FakeOptions o = Options();
  o.world = std::make_shared<FakeWorld>();
  driver_ = std::make_unique<FakeDriver>(o);
  auto sb = Made("sb-1");
  Made("sb-2");
  ASSERT_EQ(Run(sb, Sh("echo kept > /work/state")).verdict(), v1::VERDICT_OK);
  ASSERT_TRUE(Pause(sb, true).ok());
  driver_ = std::make_unique<FakeDriver>(o);
  ExecAnswer before;
  Exec(*driver_, sb, Sh("true"), before);
  EXPECT_EQ(before.Get().status().code(), Status::Code::kUnavailable) << "not re-adopted yet";
  ASSERT_TRUE(Readopt(*driver_, sb).ok());  // its record says running: thawed
  EXPECT_EQ(Out(sb, "cat /work/state"), "kept\n");
  driver_->Restored();
  EXPECT_TRUE(Eventually([&] { return o.world->Find("sb-2") == nullptr; }));
  EXPECT_NE(o.world->Find("sb-1"), nullptr);
}

TEST_F(FakeDriverTest, AVanishedBoxFailsItsRunsAndIsReported) {
  std::mutex mu;
  std::vector<std::string> lost;
  std::thread::id lost_thread;
  FakeOptions o = Options();
  o.lost = [&](const std::string& id, const std::string& why) {
    std::lock_guard<std::mutex> lk(mu);
    lost.push_back(id + ": " + why);
    lost_thread = std::this_thread::get_id();
  };
  driver_ = std::make_unique<FakeDriver>(o);
  auto sb = Made("sb-1");
  ExecAnswer a;
  Exec(*driver_, sb, Command({"sleep", "10"}), a);
  ASSERT_TRUE(Eventually([&] { return !driver_->world()->Running("sb-1").empty(); }));
  ASSERT_TRUE(driver_->world()->Vanish("sb-1", "its process was killed"));
  auto r = a.Get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_EQ(r->error(), "platform error: fake sb-1 is gone: its process was killed");
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lk(mu);
    return !lost.empty();
  }));
  {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_EQ(lost, std::vector<std::string>{"sb-1: its process was killed"});
    EXPECT_NE(lost_thread, std::this_thread::get_id());
  }
  auto next = Run(sb, Sh("true"));
  EXPECT_EQ(next.verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_THAT(next.error(), HasSubstr("is gone"));
  EXPECT_THAT(Readopt(*driver_, sb).message(), HasSubstr("fake sb-1 is gone"));
  EXPECT_TRUE(Destroy(*driver_, sb).ok());
  EXPECT_EQ(driver_->world()->Find("sb-1"), nullptr);
}

TEST_F(FakeDriverTest, TraitsTakenAwayAreRefusedNamingTheKind) {
  FakeOptions o = Options();
  o.traits.files = o.traits.pause = o.traits.streaming = o.traits.stateful = false;
  driver_ = std::make_unique<FakeDriver>(o);
  EXPECT_FALSE(driver_->traits().files);
  auto sb = Made("sb-1");
  auto read = Read(*driver_, sb, "/work/a");
  EXPECT_EQ(read.status().code(), Status::Code::kUnimplemented);
  EXPECT_THAT(read.status().message(), HasSubstr("sandbox kind 'fake' cannot read or write files"));
  // Capabilities no kind has yet: refused naming the kind and the capability.
  for (auto c : {Capability::kSnapshot, Capability::kFork}) {
    Status st = Require(*driver_, c);
    EXPECT_EQ(st.code(), Status::Code::kUnimplemented);
    EXPECT_THAT(st.message(), HasSubstr("'fake' cannot " + std::string(CapabilityName(c))));
  }
  o.traits.snapshot = true;
  EXPECT_TRUE(Require(FakeDriver(o), Capability::kSnapshot).ok()) << "declared in its traits, the call goes on";
  auto paused = Pause(sb, true);
  EXPECT_EQ(paused.code(), Status::Code::kUnimplemented);
  EXPECT_THAT(paused.message(), HasSubstr("fake"));
  ExecAnswer a;
  driver_->ExecStreaming(
      sb, "s1", Sh("echo ran"), [](const v1::ExecOutput&) {}, a.Callback());
  EXPECT_THAT(a.Get().status().message(), HasSubstr("fake sandboxes cannot stream"));
  ASSERT_EQ(Run(sb, Sh("echo kept > /work/state")).verdict(), v1::VERDICT_OK);
  EXPECT_EQ(Out(sb, "cat /work/state 2>/dev/null || echo fresh"), "fresh\n") << "every exec starts fresh";
  v1::Limits asked;
  asked.set_memory_bytes(32ull << 20);
  EXPECT_TRUE(driver_->CheckExecLimits(sb, asked).ok()) << "a fresh run's limits are its own";
}

TEST_F(FakeDriverTest, StopEndsRunsAndJoins) {
  auto sb = Made("sb-1");
  ExecAnswer a;
  Exec(*driver_, sb, Command({"sleep", "10"}), a);
  ASSERT_TRUE(Eventually([&] { return !driver_->world()->Running("sb-1").empty(); }));
  auto start = std::chrono::steady_clock::now();
  driver_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  ASSERT_TRUE(a.Ready());
  auto r = a.Get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_THAT(r->error(), HasSubstr("dsecd is shutting down"));
  EXPECT_NE(driver_->world()->Find("sb-1"), nullptr) << "the box stays for the next dsecd";
  driver_->Stop();  // idempotent
}

// Every command of tests/integration/contract/sandbox_contract_test.cpp
// that a stateful kind runs, with the suite's expectations (shortened
// waits; the host-side probes are the contract suite's own business).
TEST_F(FakeDriverTest, TheContractSuitesCommandsBehaveAsOnARealShell) {
  auto sb = Made("sb-1");
  auto req = Command({"cat"});
  req.set_stdin("from stdin");
  EXPECT_EQ(Run(sb, req).stdout(), "from stdin");
  auto env = Command({"sh", "-c", "echo $GREETING; pwd"});
  (*env.mutable_env())["GREETING"] = "hi";
  env.set_cwd("/tmp");
  EXPECT_EQ(Run(sb, env).stdout(), "hi\n/tmp\n");
  EXPECT_EQ(Run(sb, Sh("echo kept > /work/state")).verdict(), v1::VERDICT_OK);
  EXPECT_EQ(Out(sb, "cat /work/state 2>/dev/null || echo fresh"), "kept\n");
  EXPECT_EQ(Run(sb, Sh("sleep 30", 30)).verdict(), v1::VERDICT_TIME_LIMIT);
  EXPECT_EQ(Out(sb, "echo alive"), "alive\n");
  EXPECT_EQ(Run(sb, Command({"sleep", "0.01"})).verdict(), v1::VERDICT_OK);
  EXPECT_EQ(Run(sb, Command({"true"})).verdict(), v1::VERDICT_OK);
  // The VM kinds' process count, in case a fake stands in for one.
  EXPECT_EQ(Out(sb,
                "n=0; for f in a b; do echo x | tr '\\0' ' ' 2>/dev/null | grep -q -- 'x *$' && n=$((n+1)); done; "
                "echo $n"),
            "2\n");
}

}  // namespace
}  // namespace dsec::drivers
