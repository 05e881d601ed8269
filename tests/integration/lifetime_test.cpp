// Sandboxes end: at their ttl, after their idle timeout (paused or
// destroyed), and once the SDK client that made them has been gone for the
// lease, unless they were made detached. Each within a second of its time,
// across a kill -9 of dsecd too.
#include <gmock/gmock.h>
#include <signal.h>

#include <chrono>
#include <set>
#include <thread>

#include "runtime/clock.hpp"
#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

// Polls until sandbox `id` is gone (NotFound): the time it was first seen
// gone (epoch ms), or 0 when it is still there at `deadline_ms`.
int64_t WhenGone(Client& c, const std::string& id, int64_t deadline_ms, std::string* why = nullptr) {
  while (WallClockMs() < deadline_ms) {
    auto sb = c.Attach(id);
    if (!sb.ok() && sb.status().code() == Status::Code::kNotFound) {
      if (why) *why = sb.status().message();
      return WallClockMs();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling for the sandbox to go
  }
  return 0;
}

// Polls until the sandbox's phase is `phase`: when, or 0 at the deadline.
int64_t WhenPhase(const Sandbox& sb, v1::SandboxPhase phase, int64_t deadline_ms) {
  while (WallClockMs() < deadline_ms) {
    auto r = sb.Get();
    if (r.ok() && r->phase() == phase) return WallClockMs();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling for the phase
  }
  return 0;
}

v1::SandboxSpec WithTtl(v1::SandboxSpec spec, uint32_t ttl) {
  spec.set_ttl_s(ttl);
  return spec;
}

v1::SandboxSpec WithIdle(v1::SandboxSpec spec, uint32_t idle, v1::IdleAction action) {
  spec.set_idle_timeout_s(idle);
  spec.set_on_idle(action);
  return spec;
}

class Lifetime : public ContainerTest {};

TEST_F(Lifetime, ASandboxPastItsTtlIsDestroyedWithinASecondAndSaysWhy) {
  auto sb = client_->Create(WithTtl(ContainerSpec(kImage), 2));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->spec().ttl_s(), 2u);
  EXPECT_EQ(rec->expires_because(), "ttl");
  EXPECT_EQ(rec->expiry_action(), "destroy");
  int64_t deadline = rec->ttl_deadline_ms();
  EXPECT_EQ(rec->expires_ms(), deadline);
  EXPECT_NEAR(deadline - rec->created_ms(), 2000, 1);
  std::string why;
  int64_t gone = WhenGone(*client_, sb->id(), deadline + 5000, &why);
  ASSERT_GT(gone, 0) << "still there 5 s after its ttl";
  EXPECT_GE(gone, deadline - 50);
  EXPECT_LE(gone - deadline, 1000) << "ms after its ttl";
  EXPECT_THAT(why, HasSubstr("ttl of 2 s ran out"));
  EXPECT_EQ(Remains(sb->id()), "");
}

TEST_F(Lifetime, AnIdleContainerIsPausedAfterItsTimeoutAndWorksAgainWhenResumed) {
  auto sb = client_->Create(WithIdle(ContainerSpec(kImage), 2, v1::IDLE_ACTION_PAUSE));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made_.push_back(*sb);
  // An exec that runs longer than the idle timeout is not idleness.
  auto busy = ShIn(*sb, "sleep 3; echo done");
  EXPECT_EQ(busy.stdout(), "done\n");
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  ASSERT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING);
  EXPECT_EQ(rec->expires_because(), "idle timeout");
  EXPECT_EQ(rec->expiry_action(), "pause");
  int64_t idle_end = rec->expires_ms();
  int64_t paused = WhenPhase(*sb, v1::SANDBOX_PHASE_PAUSED, idle_end + 5000);
  ASSERT_GT(paused, 0);
  EXPECT_LE(paused - idle_end, 1000) << "ms after its idle timeout";
  auto refused = sb->Exec(Sh("true"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("idle for 2 s"));
  EXPECT_THAT(refused.status().message(), HasSubstr("resume it"));
  ASSERT_TRUE(sb->Resume().ok());
  EXPECT_EQ(ShIn(*sb, "echo back").stdout(), "back\n");
}

TEST_F(Lifetime, AnIdleContainerAskedToBeDestroyedIsDestroyed) {
  auto sb = client_->Create(WithIdle(ContainerSpec(kImage), 1, v1::IDLE_ACTION_DESTROY));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  int64_t gone = WhenGone(*client_, sb->id(), rec->expires_ms() + 5000);
  ASSERT_GT(gone, 0);
  EXPECT_LE(gone - rec->expires_ms(), 1000);
  EXPECT_EQ(Remains(sb->id()), "");
}

TEST_F(Lifetime, LimitsOfTheNodeAndOfSessionsAreEnforced) {
  auto too_long = client_->Create(WithTtl(ContainerSpec(kImage), 30 * 24 * 3600));
  ASSERT_FALSE(too_long.ok());
  EXPECT_THAT(too_long.status().message(), HasSubstr("--sandbox-max-ttl"));
  auto forever = client_->Create(WithTtl(ContainerSpec(kImage), 0));
  ASSERT_FALSE(forever.ok()) << "no ttl at all needs a node without a maximum";
  auto fncall_pause = client_->Create(WithIdle(FncallSpec(), 5, v1::IDLE_ACTION_PAUSE));
  ASSERT_FALSE(fncall_pause.ok());
  EXPECT_THAT(fncall_pause.status().message(), HasSubstr("cannot be paused"));
  // A session's sandboxes end with the session: no lifetime of their own.
  auto bad = client_->OpenSession("life/bad/0", WithTtl(ContainerSpec(kImage), 60));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("end with the session"));
  auto s = client_->OpenSession("life/ok/0", ContainerSpec(kImage));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto agent = s->sandbox("agent");
  ASSERT_TRUE(agent.ok());
  auto rec = agent->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->session(), "life/ok/0");
  EXPECT_EQ(rec->expires_ms(), 0) << rec->expires_because();
  EXPECT_TRUE(rec->owner().empty());
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(Lifetime, TheListingShowsTheTimeLeft) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok());
  auto ls = daemon_->Admin("ls");
  bool found = false;
  for (const auto& j : ls["sandboxes"]) {
    if (j.value("id", "") != sb->id()) continue;
    found = true;
    EXPECT_EQ(j.value("expires_because", ""), "ttl") << j.dump();
    EXPECT_GT(j.value("expires_in_s", 0), 23 * 3600) << "the node's default ttl is a day";
    EXPECT_EQ(j.value("owner", ""), client_->client_id()) << j.dump();
  }
  EXPECT_TRUE(found) << ls.dump();
}

// A client killed with SIGKILL: the 200 sandboxes it owned go once the
// lease is over (the containers with everything they hold), the detached
// ones stay.
TEST_F(Lifetime, TheSandboxesOfAKilledClientGoAfterTheLeaseAndDetachedOnesStay) {
  auto child = Child::Start({BinDir() + "/dsec-test-sdk-child", "--addr", daemon_->sdk_addr(), "--data-dir",
                             daemon_->data_dir(), "--owned", "200", "--detached", "5", "--containers", "2",
                             "--image", kImage, "--lease", "2"});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  std::vector<std::string> owned, detached;
  for (std::string line; (*child)->ReadLine(&line, 120) && line != "ready";) {
    auto space = line.find(' ');
    ASSERT_NE(space, std::string::npos) << line;
    (line.substr(0, space) == "owned" ? owned : detached).push_back(line.substr(space + 1));
  }
  ASSERT_EQ(owned.size(), 202u);
  ASSERT_EQ(detached.size(), 5u);
  // While the client lives, nothing ends.
  for (const auto& id : {owned.front(), owned.back()}) {
    auto rec = client_->Attach(id);
    ASSERT_TRUE(rec.ok()) << id;
    auto r = rec->Get();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->owner_gone_ms(), 0);
    EXPECT_EQ(r->expires_because(), "ttl");
  }
  (*child)->Kill9();
  int64_t killed = WallClockMs();
  for (const auto& id : owned) {
    int64_t gone = WhenGone(*client_, id, killed + 10000);
    ASSERT_GT(gone, 0) << id << " still there 10 s after its owner died (lease 2 s)";
    EXPECT_GE(gone - killed, 1900) << id << " went before the lease was over";
  }
  EXPECT_LE(WallClockMs() - killed, 2000 + 1000 + 1500) << "the last went more than a second after the lease (+ polling)";
  for (const auto& id : owned) EXPECT_EQ(Remains(id), "") << id;
  for (const auto& id : detached) {
    auto sb = client_->Attach(id);
    ASSERT_TRUE(sb.ok()) << id << " was detached: " << sb.status().ToString();
    EXPECT_TRUE(sb->Destroy().ok());
  }
}

// Across kill -9 of dsecd: a ttl that passed while it was down is acted on
// at the restart; one that passes after the restart, at its time; an owner
// that reconnects keeps its sandboxes.
class LifetimeRestart : public ContainerTest {
 protected:
  static void SetUpTestSuite() {
    TestDaemonOptions o;
    o.extra_args = {"--sandbox-lease", "3"};
    start_ = TryStartContainerDaemon(o, &daemon_, &client_);
  }
};

TEST_F(LifetimeRestart, EndsHoldAcrossAKill9AndAReconnectingOwnerKeepsItsSandboxes) {
  auto& d = daemon_;
  auto& c = client_;
  auto spec = ContainerSpec(kImage);
  auto past = c->Create(WithTtl(spec, 2));         // ends while dsecd is down
  auto later = c->Create(WithTtl(spec, 6));        // ends after the restart
  auto idle = c->Create(WithIdle(spec, 5, v1::IDLE_ACTION_DESTROY));
  auto mine = c->Create(spec);                      // owned, lease 3 s: the client comes back
  ASSERT_TRUE(past.ok() && later.ok() && idle.ok() && mine.ok());
  auto later_rec = later->Get();
  auto idle_rec = idle->Get();
  ASSERT_TRUE(later_rec.ok() && idle_rec.ok());
  d->Kill9();
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // dsecd stays down past `past`'s ttl
  ASSERT_TRUE(d->Restart().ok());
  int64_t restarted = WallClockMs();
  int64_t gone = WhenGone(*c, past->id(), restarted + 5000);
  ASSERT_GT(gone, 0) << "a ttl that passed while dsecd was down";
  EXPECT_LE(gone - restarted, 1000) << "ms after the restart";
  gone = WhenGone(*c, later->id(), later_rec->ttl_deadline_ms() + 5000);
  ASSERT_GT(gone, 0);
  EXPECT_LE(gone - later_rec->ttl_deadline_ms(), 1000) << "ms after its ttl, across the restart";
  // The idle one: never early, at most a second (the rounding of its last
  // activity) and the check late.
  gone = WhenGone(*c, idle->id(), idle_rec->expires_ms() + 5000);
  ASSERT_GT(gone, 0);
  EXPECT_GE(gone, idle_rec->expires_ms() - 50);
  EXPECT_LE(gone - idle_rec->expires_ms(), 2000);
  // The client reconnected by itself and said who it is: its sandbox is
  // still there well past the lease.
  std::this_thread::sleep_for(std::chrono::seconds(4));  // longer than the 3 s lease
  auto still = mine->Get();
  ASSERT_TRUE(still.ok()) << still.status().ToString();
  EXPECT_EQ(still->owner_gone_ms(), 0);
  EXPECT_TRUE(mine->Destroy().ok());
  for (const auto& id : {past->id(), later->id(), idle->id(), mine->id()}) EXPECT_EQ(Remains(id), "") << id;
}

}  // namespace
}  // namespace dsec::testing
