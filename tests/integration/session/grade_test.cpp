// Session.Grade (DESIGN.md section 13) on real containers: a fresh grade
// sandbox on the agent's image gets the agent's changes under the task
// root, with protected and hidden paths as the image has them and the
// grader image's files; the grade is a logged step with its reward; the
// agent goes on untouched; a grade runs and is logged once, across a
// dsecd kill -9; bad grades are clear errors.
#include <gmock/gmock.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <future>
#include <thread>

#include "dsec/report.hpp"
#include "harness/rootfs.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/http_probe.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

class Grades : public ContainerTest {
 protected:
  static void SetUpTestSuite() {
    // A data dir of 50 bytes (its agent sockets' paths stay within 107):
    // the grade's four lower layers are 360 bytes of paths, past what the
    // kernel takes in one overlay option (255).
    TestDaemonOptions o;
    o.data_dir_name = "dsec-test-grades-in-a-longer-data-dir";
    start_ = TryStartContainerDaemon(o, &daemon_, &client_);
    if (!client_) return;
    // The task: a repository whose test fails until calc.py adds; its
    // hidden grader and a grader image of its own.
    built_ = Build("graded",
                   "mkdir -p work/repo/tests work/repo/src work/repo/hidden && "
                   "printf 'grep -q \"a + b\" src/calc.py\\n' > work/repo/tests/test_calc.sh && "
                   "echo 'def add(a, b): return a - b' > work/repo/src/calc.py && "
                   "echo 'echo hidden-grader-ran' > work/repo/hidden/check.sh && chmod -R a+rwX work");
    if (built_.empty())
      built_ = Build("grader", "mkdir -p grader && "
                               "printf 'cd /work/repo; sh hidden/check.sh; ls; ls /usr/local/bin; "
                               "if sh tests/test_calc.sh; then echo 1; else echo 0; fi\\n' > grader/run.sh && "
                               "printf 'echo ran >> /tmp/runs; while [ ! -e /tmp/go ]; do sleep 0.05; done; "
                               "wc -l < /tmp/runs\\n' > grader/wait-for-go.sh && "
                               "printf 'sleep 30\\n' > grader/hang.sh",
                     /*tools=*/false);
  }

  // Builds image `name` from a tools rootfs (or an empty tree) changed by `sh`; "" or why not.
  static std::string Build(const std::string& name, const std::string& sh, bool tools = true) {
    char tmpl[] = "/tmp/dsec-grade-image-XXXXXX";
    if (!::mkdtemp(tmpl)) return "mkdtemp";
    std::string rootfs = tmpl;
    RootfsOptions o;
    o.python = false;
    if (tools && !MakeRootfs(rootfs, o).ok()) return "rootfs";
    auto made = RunProcess({"/bin/sh", "-c", "cd " + rootfs + " && " + sh});
    auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "build", rootfs, name});
    RunProcess({"/bin/rm", "-rf", rootfs});
    if (made.exit_code != 0) return made.err;
    return built.exit_code == 0 ? "" : built.err;
  }

  static v1::SandboxSpec Task() {
    v1::SandboxSpec spec = ContainerSpec("graded");
    auto* task = spec.mutable_task();
    task->set_root("/work/repo");
    task->add_protected_paths("tests/**");
    task->add_protected_paths("**/conftest.py");
    task->add_hidden_paths("hidden/**");
    return spec;
  }
  static SessionOptions Graded(const std::string& script, uint32_t timeout_s = 60) {
    SessionOptions o;
    o.grade.add_command("/bin/sh");
    o.grade.add_command("/grader/" + script);
    o.grade.set_timeout_s(timeout_s);
    o.grade.set_grader_image("grader");
    return o;
  }
  void SetUp() override {
    ContainerTest::SetUp();
    if (!IsSkipped()) ASSERT_EQ(built_, "") << "building the task's images";
  }
  // The session's sandboxes on the node now (ids), from the listing.
  static std::vector<std::string> SandboxesOf(const std::string& session) {
    std::vector<std::string> ids;
    v1::ListSandboxesRequest filter;
    filter.set_session(session);
    auto all = client_->ListSandboxes(filter);
    if (all.ok())
      for (const auto& r : all->sandboxes()) ids.push_back(r.id());
    return ids;
  }
  // The same, once only the agent's is left (a grade's sandbox goes right
  // after its step is logged), or after 5 s.
  static std::vector<std::string> SandboxesSettle(const std::string& session) {
    std::vector<std::string> left;
    for (int i = 0; i < 100; ++i) {
      left = SandboxesOf(session);
      if (left.size() == 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return left;
  }
  static inline std::string built_;
};

TEST_F(Grades, AGradeRunsTheOriginalTestsOnTheAgentsChangesAndTheAgentGoesOn) {
  auto s = client_->OpenSession("grade/changes/0", Task(), Graded("run.sh"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto step = [&](uint64_t k, const std::string& sh) {
    auto r = s->Step(k, Sh("cd /work/repo && " + sh));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->step().result().stdout() : std::string();
  };
  // Cheats the guard lets happen (and flags) or that lie outside the
  // task's root: none of them may reach the grade.
  EXPECT_EQ(step(0, "echo 'import pytest' > conftest.py; mkdir -p /usr/local/bin; echo x > /usr/local/bin/cheat; "
                    "mkdir -p hidden; echo 'echo forged' > hidden/check.sh; ls /grader 2>&1 | head -1; echo ok"),
            "ls: cannot access '/grader': No such file or directory\nok\n")
      << "the grader's files are not in the agent's sandbox";
  auto g1 = Grade(*s, 1);
  ASSERT_TRUE(g1.ok()) << g1.status().ToString();
  const auto& before = g1->step();
  EXPECT_EQ(before.sandbox(), "grade");
  EXPECT_EQ(before.result().stdout(), "hidden-grader-ran\nhidden\nsrc\ntests\n0\n")
      << "the image's hidden grader (not the agent's), no conftest.py, nothing outside the root; "
      << before.result().stderr();
  ASSERT_TRUE(before.meta().has_reward());
  EXPECT_EQ(before.meta().reward(), 0.0) << "the bug is not fixed";
  EXPECT_EQ(before.meta().notes().at("grade"), "passed, reward from its last line");
  // The agent goes on where it stood, and fixes the bug.
  EXPECT_EQ(step(2, "cat conftest.py; echo 'def add(a, b): return a + b' > src/calc.py && echo fixed"),
            "import pytest\nfixed\n");
  auto g3 = Grade(*s, 3);
  ASSERT_TRUE(g3.ok()) << g3.status().ToString();
  EXPECT_EQ(g3->step().result().stdout(), "hidden-grader-ran\nhidden\nsrc\ntests\n1\n") << g3->step().result().stderr();
  EXPECT_EQ(g3->step().meta().reward(), 1.0);
  // Logged once: asked again, the same grade from the log; a step that is
  // not a grade, or one ahead of the log, is refused by name.
  auto again = Grade(*s, 3);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->fast_forwarded());
  EXPECT_EQ(again->step().result().stdout(), g3->step().result().stdout());
  auto not_grade = Grade(*s, 2);
  ASSERT_FALSE(not_grade.ok());
  EXPECT_THAT(not_grade.status().message(), HasSubstr("step 2 is not a grade (it ran in 'agent')"));
  auto ahead = Grade(*s, 9);
  ASSERT_FALSE(ahead.ok());
  EXPECT_THAT(ahead.status().message(), HasSubstr("the next step is 4"));
  // Each grade's sandbox went once its step was logged.
  EXPECT_EQ(SandboxesSettle("grade/changes/0").size(), 1u) << "only the agent's sandbox is left";
  EXPECT_EQ(step(4, "ls /usr/local/bin; cat src/calc.py"), "cheat\ndef add(a, b): return a + b\n")
      << "the agent's sandbox is untouched by its grades";
  auto steps = s->Steps(0, 10);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(steps->steps(1).meta().reward(), 0.0);
  EXPECT_EQ(steps->steps(3).meta().reward(), 1.0);
  // The metrics, the console and dsecctl count what the guard flagged.
  std::string metrics = HttpGet(daemon_->http_addr(), "/metrics").body;
  EXPECT_THAT(metrics, ::testing::ContainsRegex("dsec_flags_total\\{what=\"protected_write\"\\} [1-9]"));
  EXPECT_THAT(metrics, ::testing::ContainsRegex("dsec_grades_total\\{outcome=\"passed\"\\} [2-9]"));
  ASSERT_TRUE(s->Get().ok());
  EXPECT_EQ(s->Get()->flags(), 1u) << "created conftest.py";
  auto rows = daemon_->Admin("sessions");
  bool counted = false;
  for (const auto& row : rows["sessions"])
    counted = counted || (row.value("name", "") == "grade/changes/0" && row.value("flags", 0) == 1);
  EXPECT_TRUE(counted) << rows.dump();
  EXPECT_TRUE(s->Close().ok());
  auto closed = Grade(*s, 5);
  ASSERT_FALSE(closed.ok());
  EXPECT_THAT(closed.status().message(), HasSubstr("is closed"));
}

TEST_F(Grades, AHangingGraderIsCutAtItsLimitAndBadGradeSpecsAreRefused) {
  auto s = client_->OpenSession("grade/bad/0", Task(), Graded("hang.sh", 1));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto hung = Grade(*s, 0);
  ASSERT_TRUE(hung.ok()) << hung.status().ToString();
  EXPECT_EQ(hung->step().result().verdict(), v1::VERDICT_TIME_LIMIT);
  EXPECT_EQ(hung->step().meta().reward(), 0.0);
  EXPECT_EQ(hung->step().meta().notes().at("grade"), "cut at its time limit");
  EXPECT_TRUE(s->Close().ok());

  auto ungraded = client_->OpenSession("grade/bad/1", Task());
  ASSERT_TRUE(ungraded.ok()) << ungraded.status().ToString();
  auto no_spec = Grade(*ungraded, 0);
  ASSERT_FALSE(no_spec.ok());
  EXPECT_THAT(no_spec.status().message(), HasSubstr("was opened without a grade spec"));
  EXPECT_TRUE(ungraded->Close().ok());

  SessionOptions missing = Graded("run.sh");
  missing.grade.set_grader_image("no-such-grader");
  auto m = client_->OpenSession("grade/bad/2", Task(), missing);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto no_image = Grade(*m, 0);
  ASSERT_FALSE(no_image.ok());
  EXPECT_THAT(no_image.status().message(), HasSubstr("no-such-grader"));
  EXPECT_THAT(no_image.status().message(), HasSubstr("grader image"));
  EXPECT_EQ(SandboxesOf("grade/bad/2").size(), 1u) << "nothing of the grade that could not start is left";
  EXPECT_TRUE(m->Close().ok());

  v1::SandboxSpec rootless = Task();
  rootless.clear_task();
  auto r = client_->OpenSession("grade/bad/3", rootless, Graded("run.sh"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("no task root"));
  v1::SandboxSpec fncall = FncallSpec();
  fncall.mutable_task()->set_root("/work");
  auto f = client_->OpenSession("grade/bad/6", fncall, Graded("run.sh"));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("which a fncall sandbox cannot give; grade a container session"));
  SessionOptions no_cmd = Graded("run.sh");
  no_cmd.grade.clear_command();
  no_cmd.grade.set_timeout_s(5);
  auto c = client_->OpenSession("grade/bad/4", Task(), no_cmd);
  EXPECT_TRUE(c.ok()) << "a grade spec without a command is no grade spec";
  if (c.ok()) EXPECT_TRUE(c->Close().ok());
  // dsecctl: --grade needs its command; a grade prints the output, and the reward on stderr.
  auto lone = daemon_->Ctl({"session", "open", "grade/bad/5", "--image", "graded", "--grader-image", "grader"});
  EXPECT_EQ(lone.exit_code, 2) << lone.err;
  EXPECT_THAT(lone.err, HasSubstr("go with --grade"));
  auto open = daemon_->Ctl({"session", "open", "grade/ctl/0", "--kind", "container", "--image", "graded", "--task-root", "/work/repo",
                            "--protect", "tests/**", "--grade", "sh /grader/run.sh | tail -1", "--grader-image",
                            "grader"});
  ASSERT_EQ(open.exit_code, 0) << open.err;
  auto graded = daemon_->Ctl({"session", "grade", "grade/ctl/0", "0"});
  EXPECT_EQ(graded.exit_code, 0) << graded.err;
  EXPECT_EQ(graded.out, "0\n");
  EXPECT_THAT(graded.err, HasSubstr("step 0 graded: reward 0 (passed, reward from its last line)"));
  EXPECT_EQ(daemon_->Ctl({"session", "close", "grade/ctl/0"}).exit_code, 0);
  // A client cannot make a sandbox carry another's files.
  v1::SandboxSpec carry = ContainerSpec("graded");
  carry.mutable_carry()->set_sandbox_id("ss-anything");
  auto made = client_->Create(carry);
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(made.status().message(), HasSubstr("spec.carry is set by a session's Grade only"));
}

// kill -9 of dsecd while the grade runs: the grade runs once (the same
// process finishes it: a second run would wait for a /tmp/go it never
// gets) and is logged once.
TEST_F(Grades, AGradeCutByKill9RunsOnceAndIsLoggedOnce) {
  auto s = client_->OpenSession("grade/kill9/0", Task(), Graded("wait-for-go.sh"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Step(0, Sh("echo 'def add(a, b): return a + b' > /work/repo/src/calc.py")).ok());
  auto pending = std::async(std::launch::async, [&] { return Grade(*s, 1); });
  // The grader's process, found by its command line.
  int pid = 0;
  for (int i = 0; i < 600 && !pid; ++i) {
    auto ps = RunProcess({"/usr/bin/pgrep", "-f", "grader/wait-for-go.sh"});
    if (ps.exit_code == 0) pid = std::atoi(ps.out.c_str());
    if (!pid) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(pid, 0) << "the grader did not start";
  auto meanwhile = s->Step(1, Sh("true"));
  ASSERT_FALSE(meanwhile.ok());
  EXPECT_THAT(meanwhile.status().message(), HasSubstr("step 1 is a grade in progress; send step 2 once it is logged"));
  daemon_->Kill9();
  auto cut = pending.get();
  EXPECT_FALSE(cut.ok()) << "its caller heard dsecd go";
  ASSERT_TRUE(daemon_->Restart().ok());
  std::ofstream(("/proc/" + std::to_string(pid) + "/root/tmp/go").c_str()) << "go\n";
  Result<v1::StepReply> r = Status::Unavailable("not yet");
  for (int attempt = 0; attempt < 200 && !r.ok(); ++attempt) {
    r = Grade(*s, 1);
    if (!r.ok() && r.status().code() != Status::Code::kUnavailable) break;
    if (!r.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step().result().stdout(), "1\n") << "run once, by the process started before the kill";
  auto steps = s->Steps(0, 10);
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->steps_size(), 2) << "logged once";
  EXPECT_EQ(steps->steps(1).sandbox(), "grade");
  EXPECT_EQ(SandboxesSettle("grade/kill9/0").size(), 1u) << "its sandbox went after the restart";
  EXPECT_TRUE(s->Close().ok());
}

}  // namespace
}  // namespace dsec::testing
