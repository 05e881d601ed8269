// What the node does when a driver fails or takes long: faults injected
// into the real container driver (drivers/fault_driver.hpp, armed through
// the admin console's `fault` command or dsecd --test-fault), against a
// real dsecd with real containers. Each test has a daemon of its own.
#include <chrono>
#include <future>
#include <string>

#include <gmock/gmock.h>

#include "tests/support/cluster_probes.hpp"
#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using DriverFault = OwnContainerDaemonTest;

// The console's answer to `fault ...`: ok, or the test fails saying why.
void Arm(TestDaemon& d, const std::string& command) {
  auto r = d.Admin("fault " + command);
  ASSERT_TRUE(r.value("ok", false)) << command << ": " << r.dump();
}

TEST_F(DriverFault, ACreationTheDriverFailsIsAnsweredWithItsErrorAndLeavesNothing) {
  Arm(*daemon_, "container create fail 1");
  auto failed = NewContainer();
  ASSERT_FALSE(failed.ok()) << "the creation should have failed";
  EXPECT_THAT(failed.status().message(), HasSubstr("injected driver fault"));
  auto ls = daemon_->Admin("ls");
  ASSERT_TRUE(ls.value("ok", false)) << ls.dump();
  EXPECT_EQ(ls["sandboxes"].size(), 0u) << "a failed creation leaves no record: " << ls.dump();
  auto next = NewContainer();
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(ShIn(*next, "echo ok").stdout(), "ok\n");
  EXPECT_TRUE(next->Destroy().ok());
}

TEST_F(DriverFault, AnExecTheDriverFailsSaysSoAndTheSandboxServesTheNextOne) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made_.push_back(*sb);
  Arm(*daemon_, "container exec fail 1");
  auto r = sb->Exec(Sh("echo never"));
  if (r.ok()) {
    EXPECT_EQ(r->verdict(), v1::VERDICT_PLATFORM_ERROR);
    EXPECT_THAT(r->error(), HasSubstr("injected driver fault"));
    EXPECT_EQ(r->stdout(), "");
  } else {
    EXPECT_THAT(r.status().message(), HasSubstr("injected driver fault"));
  }
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING) << "one failed exec does not fail the sandbox";
  EXPECT_EQ(ShIn(*sb, "echo next").stdout(), "next\n");
}

// A destroy the driver cannot carry out leaves the container in place: its
// record stays (failed, saying so), so nothing runs on unaccounted for,
// and a destroy again removes it.
TEST_F(DriverFault, ADestroyTheDriverFailsKeepsTheSandboxUntilADestroyAgainRemovesIt) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made_.push_back(*sb);
  Arm(*daemon_, "container destroy fail 1");
  Status first = sb->Destroy();
  ASSERT_FALSE(first.ok()) << "the destroy should have failed";
  EXPECT_THAT(first.message(), HasSubstr("injected driver fault"));
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok()) << "the record must stay: " << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_FAILED);
  EXPECT_THAT(rec->error(), HasSubstr("destroy failed"));
  EXPECT_THAT(rec->error(), HasSubstr("destroy it again"));
  EXPECT_EQ(rec->expires_because(), "destroy retry") << "dsecd tries again by itself";
  EXPECT_EQ(rec->expiry_action(), "destroy");
  EXPECT_GT(rec->expires_ms(), 0);
  EXPECT_NE(Remains(sb->id()), "") << "the driver never removed it, so it is still there";
  EXPECT_EQ(daemon_->Admin("status").value("sandboxes", -1), 1);
  ASSERT_TRUE(sb->Destroy().ok());
  made_.clear();
  EXPECT_EQ(Remains(sb->id()), "");
  EXPECT_FALSE(sb->Get().ok()) << "gone after the second destroy";
}

// After a restart a sandbox's requests wait for its re-adoption (here held
// by the driver until the test releases it), then run: none fails because
// it came early, and the node answers meanwhile.
TEST_F(DriverFault, RequestsWaitWhileTheirSandboxIsReadoptedAndRunOnceItIs) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made_.push_back(*sb);
  ASSERT_EQ(ShIn(*sb, "echo kept > /work/state").verdict(), v1::VERDICT_OK);
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart({"--test-fault", "container:readopt:hold"}).ok());
  auto status = daemon_->Admin("status");
  EXPECT_EQ(status.value("readopting", -1), 1) << status.dump();
  auto pending = std::async(std::launch::async, [&] { return sb->Exec(Sh("cat /work/state")); });
  // It reaches its sandbox and waits there: it cannot have run, its sandbox
  // is not re-adopted yet.
  auto waiting = [&] { return daemon_->Admin("status").value("waiting_for_readopt", -1); };
  ASSERT_TRUE(WaitUntil([&] { return waiting() == 1; }, std::chrono::seconds(30))) << daemon_->Admin("status").dump();
  EXPECT_EQ(pending.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "ran before its re-adoption";
  EXPECT_EQ(daemon_->Admin("status").value("readopting", -1), 1) << "the node answers meanwhile";
  auto released = daemon_->Admin("fault container readopt release");
  ASSERT_TRUE(released.value("ok", false)) << released.dump();
  EXPECT_THAT(released.value("fault", ""), HasSubstr("1 held call(s) released"));
  auto r = pending.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "kept\n") << r->stderr() << r->error();
  EXPECT_EQ(daemon_->Admin("status").value("readopting", -1), 0);
  EXPECT_EQ(waiting(), 0);
}

// A sandbox its driver cannot take back after a restart is failed, says
// why, and is removed by a destroy like any other.
TEST_F(DriverFault, ASandboxItsDriverCannotReadoptIsFailedAndSaysWhy) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made_.push_back(*sb);
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart({"--test-fault", "container:readopt:fail:1"}).ok());
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_FAILED);
  EXPECT_THAT(rec->error(), HasSubstr("not re-adopted after restart"));
  EXPECT_THAT(rec->error(), HasSubstr("injected driver fault"));
  auto dead = sb->Exec(Command({"true"}));
  ASSERT_FALSE(dead.ok() && dead->verdict() == v1::VERDICT_OK) << "a failed sandbox runs nothing";
  EXPECT_TRUE(sb->Destroy().ok());
  made_.clear();
  EXPECT_EQ(Remains(sb->id()), "");
}

TEST_F(DriverFault, TheConsoleSaysHowToUseFaultAndRefusesWhatItDoesNotKnow) {
  auto bare = daemon_->Admin("fault");
  EXPECT_FALSE(bare.value("ok", true));
  EXPECT_THAT(bare.value("error", ""), HasSubstr("usage: fault KIND OP"));
  auto kind = daemon_->Admin("fault nosuchkind create fail 1");
  EXPECT_FALSE(kind.value("ok", true));
  EXPECT_THAT(kind.value("error", ""), HasSubstr("nosuchkind"));
  auto op = daemon_->Admin("fault container reboot fail 1");
  EXPECT_FALSE(op.value("ok", true));
  EXPECT_THAT(op.value("error", ""), HasSubstr("unknown driver call 'reboot'"));
  auto n = daemon_->Admin("fault container create fail lots");
  EXPECT_FALSE(n.value("ok", true));
  EXPECT_THAT(n.value("error", ""), HasSubstr("N must be"));
  // Nothing was armed by the refused commands: a creation works.
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_TRUE(sb->Destroy().ok());
}

}  // namespace
}  // namespace dsec::testing
