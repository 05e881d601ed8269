// Session.Fork (issue 30, DESIGN.md section 14) through a real dsecd: n
// sessions go on from a session's step k, their logs sharing its steps
// 0..k-1 and their agents its sandbox's state; each goes on alone, is
// graded on all it changed (before the fork and after), and replays after
// its trainer is gone without running a step twice.
#include <gmock/gmock.h>

#include "dsec/report.hpp"
#include "dsec/snapshot.hpp"
#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

class SessionForks : public ContainerTest {
 protected:
  // Appends its line to /work/steps and prints the count: k+1 at step k
  // only if no step ran twice and none was lost.
  static v1::ExecRequest Line(const std::string& what) {
    return Sh("echo " + what + " >> /work/steps; wc -l < /work/steps");
  }
};

TEST_F(SessionForks, ForksAtStepKShareItsLogGoOnAloneAndReplayAfterTheirTrainerIsGone) {
  v1::SandboxSpec spec = ContainerSpec(kImage);
  spec.mutable_task()->set_root("/work");
  SessionOptions o;
  for (const char* a : {"/bin/sh", "-c", "wc -l < /work/steps"}) o.grade.add_command(a);
  o.grade.set_timeout_s(60);
  auto src = client_->OpenSession("fork/src", spec, o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  for (uint64_t k = 0; k < 3; ++k) ASSERT_EQ(src->Step(k, Line("s" + std::to_string(k)))->step().result().stdout(),
                                             std::to_string(k + 1) + "\n");

  std::unique_ptr<Client> trainer;
  ASSERT_EQ(ConnectClient(*daemon_, &trainer), "");
  auto held = trainer->AttachSession("fork/src");
  ASSERT_TRUE(held.ok());
  auto forks = ForkSession(*trainer, *held, 3);
  ASSERT_TRUE(forks.ok()) << forks.status().ToString();
  ASSERT_EQ(forks->size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const Session& f = (*forks)[i];
    EXPECT_EQ(f.name(), "fork/src/fork-" + std::to_string(i));
    EXPECT_EQ(f.record().step_count(), 3u);
    EXPECT_EQ(f.record().forked_from(), "fork/src");
    auto r = f.Step(3, Line("f" + std::to_string(i)));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->fast_forwarded());
    EXPECT_EQ(r->step().result().stdout(), "4\n") << "the source's three lines, then its own";
  }
  // The source goes on, alone.
  EXPECT_EQ(src->Step(3, Line("s3"))->step().result().stdout(), "4\n");
  EXPECT_EQ(src->sandbox()->ReadFile("/work/steps").value(), "s0\ns1\ns2\ns3\n");
  // Each log: steps 0..2 the source's, step 3 its own.
  auto source_log = src->Steps();
  ASSERT_TRUE(source_log.ok());
  for (int i = 0; i < 3; ++i) {
    auto log = (*forks)[i].Steps();
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    ASSERT_EQ(log->steps_size(), 4);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(log->steps(k).session(), (*forks)[i].name());
      EXPECT_EQ(log->steps(k).result().stdout(), source_log->steps(k).result().stdout());
    }
    EXPECT_EQ((*forks)[i].sandbox()->ReadFile("/work/steps").value(),
              "s0\ns1\ns2\nf" + std::to_string(i) + "\n");
  }
  // A fork's grade sees what its agent changed before the fork (in the
  // snapshot's layer) and after (in its own).
  auto g = Grade((*forks)[1], 4);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->step().meta().reward(), 4.0) << g->step().result().stdout();

  // The trainer is gone; a new one replays each fork from step 0: nothing
  // runs twice (the next step appends the fifth line).
  trainer.reset();
  std::unique_ptr<Client> again;
  ASSERT_EQ(ConnectClient(*daemon_, &again), "");
  for (int i = 0; i < 3; ++i) {
    auto f = again->AttachSession("fork/src/fork-" + std::to_string(i));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    for (uint64_t k = 0; k < 3; ++k) {
      auto r = f->Step(k, Line("s" + std::to_string(k)));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->fast_forwarded()) << "fork " << i << " step " << k;
    }
    auto own = f->Step(3, Line("f" + std::to_string(i)));
    ASSERT_TRUE(own.ok());
    EXPECT_TRUE(own->fast_forwarded());
    uint64_t next = i == 1 ? 5 : 4;  // fork 1 logged its grade as step 4
    auto r = f->Step(next, Line("after"));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->step().result().stdout(), "5\n") << "fork " << i << ": nothing ran twice";
    EXPECT_TRUE(f->Close().ok());
  }
  EXPECT_TRUE(src->Close().ok());
  auto left = ListSnapshots(*client_);
  ASSERT_TRUE(left.ok());
  EXPECT_THAT(*left, ::testing::IsEmpty()) << "the forks' snapshot went with their last sandbox";
}

// What the task guard leaves to the image stays the image's in a fork's
// grade, whichever layer holds the agent's version (before the fork: the
// snapshot's; after: its own).
TEST_F(SessionForks, AForksGradeLeavesProtectedPathsToTheImageInEveryLayer) {
  v1::SandboxSpec spec = ContainerSpec(kImage);
  spec.mutable_task()->set_root("/work");
  spec.mutable_task()->add_protected_paths("**/conftest.py");
  SessionOptions o;
  for (const char* a : {"/bin/sh", "-c", "cat /work/answer; test -e /work/conftest.py || test -e /work/d/conftest.py "
                                         "&& echo 0 || echo 1"})
    o.grade.add_command(a);
  o.grade.set_timeout_s(60);
  auto src = client_->OpenSession("fork/guarded", spec, o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_TRUE(src->Step(0, Sh("echo 42 > /work/answer; echo cheat > /work/conftest.py")).ok());
  auto forks = ForkSession(*client_, *src, 1);
  ASSERT_TRUE(forks.ok()) << forks.status().ToString();
  Session& f = (*forks)[0];
  ASSERT_TRUE(f.Step(1, Sh("mkdir -p /work/d && echo cheat > /work/d/conftest.py")).ok());
  auto g = Grade(f, 2);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->step().result().stdout(), "42\n1\n") << "the answer carried, neither conftest.py";
  EXPECT_EQ(g->step().meta().reward(), 1.0);
  EXPECT_TRUE(f.Close().ok());
  EXPECT_TRUE(src->Close().ok());
}

TEST_F(SessionForks, BadForksAreRefusedAndLeaveNoSession) {
  auto src = client_->OpenSession("fork/bad", ContainerSpec(kImage));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_THAT(ForkSession(*client_, *src, 0).status().message(), HasSubstr("1 to 100 sessions"));
  EXPECT_THAT(ForkSession(*client_, *src, 2, {"only-one"}).status().message(), HasSubstr("1 names for 2 forks"));
  // A log prefix longer than the source's, asked directly.
  SessionOptions o;
  o.fork_of.set_session("fork/bad");
  o.fork_of.set_steps(5);
  auto ahead = client_->OpenSession("fork/bad/ahead", ContainerSpec(kImage), o);
  EXPECT_EQ(ahead.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(ahead.status().message(), HasSubstr("at step 5: it has logged 0"));
  o.fork_of.set_session("fork/none");
  auto none = client_->OpenSession("fork/bad/none", ContainerSpec(kImage), o);
  EXPECT_EQ(none.status().code(), Status::Code::kNotFound);
  EXPECT_EQ(client_->AttachSession("fork/bad/ahead").status().code(), Status::Code::kNotFound);
  EXPECT_TRUE(src->Close().ok());
}

}  // namespace
}  // namespace dsec::testing
