// dsecd --role all (the default) is a controller with one node in its own
// process: the same placement, directory, join and heartbeats as a
// cluster's, with no port between them. Trainers reach the controller; it
// delegates calls for the node (the trainer stays their sender), and keeps
// the log's copy of a restartable session as it does in a cluster. Killed
// with -9 and restarted, the node rejoins its controller with what it holds.
#include <gmock/gmock.h>

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "dsec/report.hpp"
#include "harness/daemon.hpp"
#include "runtime/files.hpp"
#include "state/store.hpp"
#include "tests/support/cluster_probes.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

class RoleAll : public ContainerTest {
 protected:
  // What dsecd's log says (since its first start).
  static std::string Log() {
    auto text = ReadFileToString(daemon_->log_path());
    return text.ok() ? *text : std::string();
  }
  // The controller's copy of session `name`'s log, from its store opened
  // read-only: "INDEX:STDOUT|" per step.
  static std::string ControllerCopy(const std::string& name) {
    state::RocksOptions ro;
    ro.create_if_missing = false;
    ro.read_only = true;
    auto db = state::OpenRocksStore(daemon_->data_dir() + "/controller", ro);
    if (!db.ok()) return "cannot open: " + db.status().ToString();
    std::string copy;
    Status scanned = (*db)->Scan(state::Table::kSteps, state::StepPrefix(name),
                                 [&](const std::string& key, const std::string& value) {
                                   std::string session;
                                   uint64_t index = 0;
                                   v1::StepRecord step;
                                   if (!state::ParseStepKey(key, &session, &index) || !step.ParseFromString(value))
                                     copy += "bad row|";
                                   else
                                     copy += std::to_string(index) + ":" + step.result().stdout() + "|";
                                   return true;
                                 });
    return scanned.ok() ? copy : scanned.ToString();
  }
  // Whether dsecd's log (written by another process, flushed in its own
  // time) comes to say `line` within 10 s.
  static bool Logs(const std::string& line) {
    return WaitUntil([&] { return Log().find(line) != std::string::npos; }, std::chrono::seconds(10));
  }
};

v1::ExecRequest Line(uint64_t i) {
  return Command({"/bin/sh", "-c", "echo step $0 >> /tmp/log; cat /tmp/log", std::to_string(i)});
}

TEST_F(RoleAll, IsAControllerWithOneInProcessNodeThatRejoinsAfterAKill9) {
  const std::string node = daemon_->Admin("status").value("node", "");
  ASSERT_FALSE(node.empty());
  // The node joined the controller in this process before dsecd was ready.
  EXPECT_TRUE(Logs("node " + node + " joined in this process")) << Log();
  EXPECT_TRUE(Logs("cluster: joined controller " + node + " in this process")) << Log();
  struct stat st {};
  EXPECT_EQ(::stat((daemon_->data_dir() + "/controller").c_str(), &st), 0) << "the controller's own store";

  // A plain sandbox: placed on the node, its calls delegated to it.
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto hi = sb->Exec(Command({"/bin/sh", "-c", "echo hi > /tmp/f; cat /tmp/f"}));
  ASSERT_TRUE(hi.ok()) << hi.status().ToString();
  EXPECT_EQ(hi->stdout(), "hi\n");

  // A restartable session: the controller's word is on its record (only
  // a controller sets these), and it keeps the log's copy.
  std::string name = "role-all-" + std::to_string(::getpid());
  SessionOptions so;
  so.restartable = true;
  auto s = client_->OpenSession(name, ContainerSpec(kImage), so);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->record().restartable());
  EXPECT_EQ(s->record().node_id(), node);
  for (uint64_t i = 0; i < 2; ++i) {
    auto step = s->Step(i, Line(i));
    ASSERT_TRUE(step.ok()) << step.status().ToString();
  }
  // The copy, in the controller's own store (read beside the running
  // dsecd): both steps, as the trainer was answered, before each answer.
  EXPECT_EQ(ControllerCopy(name), "0:step 0\n|1:step 0\nstep 1\n|");

  // kill -9 and a restart on the same data dir: the node rejoins its
  // controller with the sandbox and the session it holds.
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart().ok());
  EXPECT_TRUE(Logs("node " + node + " rejoined in this process")) << Log();
  auto again = sb->Exec(Command({"cat", "/tmp/f"}));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->stdout(), "hi\n");
  auto next = s->Step(2, Line(2));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "step 0\nstep 1\nstep 2\n");
  auto steps = s->Steps();
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  EXPECT_EQ(steps->steps_size(), 3);
  auto closed = s->Close();
  EXPECT_TRUE(closed.ok()) << closed.ToString();
  Destroy(*sb);
}

// A session opened plain cannot be re-opened restartable: the controller
// has no copy of the log it has (it delegated its steps), and says so.
TEST_F(RoleAll, APlainSessionIsNotMadeRestartableByAReopen) {
  std::string name = "role-all-plain-" + std::to_string(::getpid());
  auto s = client_->OpenSession(name, ContainerSpec(kImage));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(s->record().restartable());
  ASSERT_TRUE(s->Step(0, Line(0)).ok());
  SessionOptions so;
  so.restartable = true;
  auto again = client_->OpenSession(name, ContainerSpec(kImage), so);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("not opened restartable"));
  auto next = s->Step(1, Line(1));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "step 0\nstep 1\n") << "the session goes on as it was";
  EXPECT_TRUE(s->Close().ok());
}

// A kind the node cannot run: the node's own reason reaches the trainer,
// not a list of nodes (the controller leaves the node's kinds to it).
TEST_F(RoleAll, AKindTheNodeLacksIsRefusedWithTheNodesReason) {
  auto status = daemon_->Admin("status");
  std::vector<std::string> kinds;
  for (const auto& k : status.value("kinds", nlohmann::json::array())) kinds.push_back(k.get<std::string>());
  v1::SandboxSpec spec = ContainerSpec(kImage);
  spec.set_kind(v1::KIND_VM);
  if (std::find(kinds.begin(), kinds.end(), "vm") != kinds.end()) spec.set_image("no-such-image");
  auto sb = client_->Create(spec);
  ASSERT_FALSE(sb.ok());
  EXPECT_THAT(sb.status().message(), ::testing::Not(HasSubstr("no node can take")));
  EXPECT_THAT(sb.status().message(),
              ::testing::AnyOf(HasSubstr("not available on this host"), HasSubstr("no-such-image")));
}

// A restartable session is graded: the grade is logged on its node and
// copied to the controller like a step before the trainer hears of it,
// and answered from that copy when asked again (a fast-forward); a grade
// at a step's index is refused, naming what is logged there.
TEST_F(RoleAll, ARestartableSessionsGradeIsInTheControllersCopy) {
  std::string name = "role-all-grade-" + std::to_string(::getpid());
  SessionOptions so;
  so.restartable = true;
  for (const char* a : {"/bin/sh", "-c", "cat /work/answer 2>/dev/null || echo 0"}) so.grade.add_command(a);
  v1::SandboxSpec spec = ContainerSpec(kImage);
  spec.mutable_task()->set_root("/work");
  auto s = client_->OpenSession(name, spec, so);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Step(0, Command({"/bin/sh", "-c", "echo 1 > /work/answer"})).ok());
  auto g = Grade(*s, 1);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->step().meta().reward(), 1.0) << g->step().result().stdout();
  EXPECT_EQ(ControllerCopy(name), "0:|1:1\n|") << "the grade, copied as the trainer was answered";
  auto again = Grade(*s, 1);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->fast_forwarded());
  EXPECT_EQ(again->step().meta().reward(), 1.0);
  auto not_a_grade = Grade(*s, 0);
  ASSERT_FALSE(not_a_grade.ok());
  EXPECT_THAT(not_a_grade.status().message(), HasSubstr("logged as a step, not a grade"));
  auto next = s->Step(2, Command({"cat", "/work/answer"}));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "1\n") << "the agent's sandbox goes on after its grade";
  EXPECT_TRUE(s->Close().ok());
}

}  // namespace
}  // namespace dsec::testing
