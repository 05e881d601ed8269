// The C++ SDK against a real dsecd: concurrency, sandboxes, errors as values.
#include <gmock/gmock.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/files.hpp"
#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using Sdk = DaemonTest;

TEST_F(Sdk, ThousandConcurrentRunsAllGetTheirOwnResult) {
  constexpr int kRuns = 1000;
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::string> got(kRuns);
  std::vector<int> verdicts(kRuns, -1);
  for (int i = 0; i < kRuns; ++i) {
    client_->RunAsync(FncallSpec(), Command({"echo", "run-" + std::to_string(i)}),
                      [&, i](Result<v1::ExecResult> r) {
                        std::lock_guard<std::mutex> lk(mu);
                        if (r.ok()) {
                          got[i] = r->stdout();
                          verdicts[i] = r->verdict();
                        } else {
                          got[i] = "error: " + r.status().ToString();
                        }
                        ++done;
                        cv.notify_all();
                      });
  }
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return done == kRuns; });
  for (int i = 0; i < kRuns; ++i) {
    EXPECT_EQ(verdicts[i], v1::VERDICT_OK) << "run " << i << ": " << got[i];
    EXPECT_EQ(got[i], "run-" + std::to_string(i) + "\n");
  }
}

TEST_F(Sdk, SandboxCreateExecGetDestroy) {
  auto sb = client_->Create(FncallSpec());
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_EQ(sb->id().rfind("sb-", 0), 0u);
  auto r = sb->Exec(Command({"sh", "-c", "echo hi; exit 2"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "hi\n");
  EXPECT_EQ(r->exit_code(), 2);
  EXPECT_EQ(r->sandbox_id(), sb->id());
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING);
  EXPECT_EQ(rec->spec().kind(), v1::KIND_FNCALL);
  EXPECT_EQ(rec->exec_count(), 1u);
  ASSERT_TRUE(sb->Destroy().ok());
  auto after = sb->Exec(Command({"true"}));
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(after.status().message(), HasSubstr(sb->id()));
}

TEST_F(Sdk, RequestsRightAfterADestroyAreNotFound) {
  // The node forgets a sandbox before its destroy is answered: a request
  // sent right after the reply never reaches an actor that is quitting.
  for (int i = 0; i < 100; ++i) {
    auto sb = client_->Create(FncallSpec());
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    ASSERT_TRUE(sb->Destroy().ok());
    auto get = sb->Get();
    ASSERT_EQ(get.status().code(), Status::Code::kNotFound) << "round " << i << ": " << get.status().ToString();
    auto again = sb->Destroy();
    ASSERT_EQ(again.code(), Status::Code::kNotFound) << "round " << i << ": " << again.ToString();
  }
}

TEST_F(Sdk, SandboxSpecLimitsApplyToItsExecs) {
  v1::SandboxSpec spec = FncallSpec();
  spec.mutable_limits()->set_timeout_ms(300);
  auto sb = client_->Create(spec);
  ASSERT_TRUE(sb.ok());
  auto r = sb->Exec(Command({"sleep", "10"}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict(), v1::VERDICT_TIME_LIMIT);
  EXPECT_TRUE(sb->Destroy().ok());
}

// A kind whose driver could not start here (a dsecd of its own, told of a
// QEMU that does not exist): its calls get an error value naming the fix.
TEST(SdkOwnDaemon, AKindThisHostCannotRunIsAnErrorValueNamingTheFix) {
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> c;
  TestDaemonOptions o;
  o.extra_args = {"--microvm-qemu", "/nonexistent/qemu-system-x86_64"};
  if (auto why = StartOwnDaemon(o, &d, &c); !why.empty()) GTEST_SKIP() << why;
  v1::SandboxSpec spec;
  spec.set_kind(v1::KIND_MICROVM);
  auto r = c->Run(spec, Command({"true"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kFailedPrecondition) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("apt-get install qemu-system-x86"));
}

TEST_F(Sdk, AttachToUnknownSandboxIsNotFound) {
  auto sb = client_->Attach("sb-doesnotexist");
  ASSERT_FALSE(sb.ok());
  EXPECT_EQ(sb.status().code(), Status::Code::kNotFound);
}

TEST(SdkNoDaemon, ConnectFailsWithAClearError) {
  ClientOptions o;
  o.address = "127.0.0.1:1";
  o.connect_timeout = std::chrono::milliseconds(500);
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("127.0.0.1:1"));
}

TEST(SdkNoDaemon, BadAddressIsInvalidArgument) {
  ClientOptions o;
  o.address = "nonsense";
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Status::Code::kInvalidArgument);
}

// The SDK keeps call deadlines itself (CAF 0.17 request timeouts are never
// cancelled, see client_agent.hpp): a call to a daemon that stopped answering
// fails with DeadlineExceeded at its deadline, the reply that comes after is
// dropped, and the client goes on.
// True once every thread of `pid` is in the stopped state ('T' in
// /proc/<pid>/task/<tid>/stat), within 10 s.
bool WaitAllThreadsStopped(pid_t pid) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (const auto& tid : ListSubdirs(dir)) {
      auto stat = ReadFileToString(dir + "/" + tid + "/stat");
      auto close = stat.ok() ? stat->rfind(')') : std::string::npos;
      all = all && close != std::string::npos && close + 2 < stat->size() && (*stat)[close + 2] == 'T';
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polling /proc, bounded
  }
  return false;
}

TEST(SdkDeadline, ACallToAStoppedDaemonFailsAtItsDeadlineAndTheLateReplyIsDropped) {
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> unused;
  if (auto why = StartOwnDaemon({}, &d, &unused); !why.empty()) {
    if (!::testing::Test::HasFailure()) GTEST_SKIP() << why;
    return;
  }
  ClientOptions o;
  o.address = d->sdk_addr();
  o.data_dir = d->data_dir();
  o.rpc_timeout = std::chrono::milliseconds(400);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto& client = **c;
  ASSERT_EQ(::kill(d->pid(), SIGSTOP), 0);
  struct Cont {
    pid_t pid;
    ~Cont() { ::kill(pid, SIGCONT); }
  } cont{d->pid()};
  // kill() only queues the stop: a thread on another CPU may still answer a
  // call for a moment. Wait until every thread of dsecd is stopped.
  ASSERT_TRUE(WaitAllThreadsStopped(d->pid())) << "dsecd did not stop";
  auto t0 = std::chrono::steady_clock::now();
  auto late = client.Attach("sb-nobody");
  auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), Status::Code::kDeadlineExceeded) << late.status().ToString();
  EXPECT_THAT(late.status().message(), HasSubstr("within 400 ms"));
  EXPECT_GE(waited, std::chrono::milliseconds(400));
  EXPECT_LT(waited, std::chrono::milliseconds(2400)) << "the deadline is checked every 50 ms";
  ASSERT_EQ(::kill(d->pid(), SIGCONT), 0);
  // The stopped daemon answers the old call now; the next call gets its own
  // answer, not that one.
  auto sb = client.Create(FncallSpec(), "after-the-stop");
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_EQ(sb->id(), "after-the-stop");
  auto again = client.Attach("sb-nobody");
  EXPECT_EQ(again.status().code(), Status::Code::kNotFound) << again.status().ToString();
  EXPECT_TRUE(client.connected());
  EXPECT_TRUE(sb->Destroy().ok());
}

}  // namespace
}  // namespace dsec::testing
