// dsecd + dsecctl end to end: `dsecctl run` behaves like `docker run`, and the
// admin commands answer.
#include <gmock/gmock.h>

#include <sstream>

#include "runtime/files.hpp"
#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
using DsecctlRun = DaemonTest;

TEST_F(DsecctlRun, PythonPrints42AndExitsZero) {
  auto r = daemon_->Ctl({"run", "--kind", "fncall", "--", "python3", "-c", "print(6*7)"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "42\n");
}

TEST_F(DsecctlRun, CpuLoopPastTimeoutExits124AndSaysTimeLimit) {
  auto r = daemon_->Ctl({"run", "--kind", "fncall", "--timeout", "1", "--", "sh", "-c", "while :; do :; done"});
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_THAT(r.err, HasSubstr("time limit"));
}

TEST_F(DsecctlRun, ProgramExitCodeIsPassedThrough) {
  auto r = daemon_->Ctl({"run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"});
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_THAT(r.err, HasSubstr("err\n"));
}

TEST_F(DsecctlRun, KilledBySignalIs128PlusN) {
  auto r = daemon_->Ctl({"run", "--", "sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(r.exit_code, 128 + 15) << r.err;
}

TEST_F(DsecctlRun, CommandNotFoundIs127) {
  auto r = daemon_->Ctl({"run", "--", "no-such-program-anywhere"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_THAT(r.err, HasSubstr("command not found"));
}

TEST_F(DsecctlRun, NotExecutableIs126) {
  auto r = daemon_->Ctl({"run", "--", "/etc/hostname"});
  EXPECT_EQ(r.exit_code, 126) << r.err;
}

TEST_F(DsecctlRun, MemoryLimitKillsAndSaysSo) {
  auto r = daemon_->Ctl({"run", "--memory", "32m", "--", "python3", "-c", "x = bytearray(200 << 20)"});
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_THAT(r.err, HasSubstr("memory limit"));
}

TEST_F(DsecctlRun, OutputFloodIsCutAndFlagged) {
  auto r = daemon_->Ctl({"run", "--output-limit", "1k", "--", "yes"});
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_EQ(r.out.size(), 1024u);
  EXPECT_THAT(r.err, HasSubstr("truncated"));
  EXPECT_THAT(r.err, HasSubstr("output limit"));
}

TEST_F(DsecctlRun, StdinIsPassedThrough) {
  auto r = daemon_->Ctl({"run", "--", "sh", "-c", "tr a-z A-Z; echo done"}, "abc\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "ABC\ndone\n");
}

TEST_F(DsecctlRun, JsonPrintsTheWholeResultInTheOneShape) {
  auto r = daemon_->Ctl({"run", "--json", "--", "sh", "-c", "echo hi; echo oops >&2"});
  EXPECT_EQ(r.exit_code, 0);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  // docs/console.md, "JSON shape": lower-case enums, plain text output,
  // numbers as numbers, a zero exit code present.
  EXPECT_EQ(j.value("verdict", ""), "ok");
  EXPECT_EQ(j.value("stdout", ""), "hi\n");
  EXPECT_EQ(j.value("stderr", ""), "oops\n");
  ASSERT_TRUE(j.contains("exit_code"));
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_TRUE(j["wall_us"].is_number());
  EXPECT_TRUE(j["cpu_us"].is_number());
  // The console's records have it too.
  auto sb = daemon_->Ctl({"create"});
  ASSERT_EQ(sb.exit_code, 0) << sb.err;
  std::string id = sb.out.substr(0, sb.out.find('\n'));
  auto inspected = daemon_->Admin("inspect " + id);
  EXPECT_EQ(inspected["sandbox"].value("phase", ""), "running") << inspected.dump();
  EXPECT_EQ(inspected["sandbox"]["spec"].value("kind", ""), "fncall");
  EXPECT_TRUE(inspected["sandbox"]["created_ms"].is_number());
  EXPECT_EQ(daemon_->Ctl({"rm", id}).exit_code, 0);
}

// A kind this host cannot run (a dsecd of its own, told of a QEMU that does
// not exist): a platform error naming the fix.
TEST(DsecctlRunOwnDaemon, AKindThisHostCannotRunIsPlatformError125) {
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> c;
  TestDaemonOptions o;
  o.extra_args = {"--microvm-qemu", "/nonexistent/qemu-system-x86_64"};
  if (auto why = StartOwnDaemon(o, &d, &c); !why.empty()) GTEST_SKIP() << why;
  auto r = d->Ctl({"run", "--kind", "microvm", "--", "true"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_THAT(r.err, HasSubstr("apt-get install qemu-system-x86"));
}

TEST_F(DsecctlRun, BadFlagIsUsageError2) {
  auto r = daemon_->Ctl({"run", "--memory", "lots", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--memory"));
}

// A network policy: a bad entry is a usage error naming it (nothing runs);
// a good one on a kind that cannot enforce it is refused naming the kind
// and the capability, never run with a network it did not ask for.
TEST_F(DsecctlRun, ANetworkPolicyIsCheckedAndRefusedWhereTheKindCannotEnforceIt) {
  auto bad = daemon_->Ctl({"run", "--allow", "10.1.2.3:70000", "--", "true"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("network entry '10.1.2.3:70000': '70000' is not a port (1-65535)"));
  auto wild = daemon_->Ctl({"run", "--allow", "a.*.example.com", "--", "true"});
  EXPECT_EQ(wild.exit_code, 2) << wild.err;
  EXPECT_THAT(wild.err, HasSubstr("wildcard goes only at the front"));
  auto empty = daemon_->Ctl({"run", "--network", "allow", "--", "true"});
  EXPECT_EQ(empty.exit_code, 2) << empty.err;
  EXPECT_THAT(empty.err, HasSubstr("empty list allows nothing"));
  auto good = daemon_->Ctl({"run", "--allow", "pypi.org:443", "--", "true"});
  EXPECT_EQ(good.exit_code, 125) << good.err;
  EXPECT_THAT(good.err, HasSubstr("sandbox kind 'fncall' cannot enforce a network policy other than none"));
  auto none = daemon_->Ctl({"run", "--network", "none", "--", "true"});
  EXPECT_EQ(none.exit_code, 0) << none.err;
}

// A wrong command line is answered before anything is sent: the unknown
// word with the nearest command, where a sandbox's command goes, and the
// expected form of a value.
TEST(DsecctlUsage, AMistypedCommandIsNamedWithTheNearestOne) {
  auto ctl = [](std::vector<std::string> args) {
    args.insert(args.begin(), BinDir() + "/dsecctl");
    return RunProcess(args);
  };
  auto exce = ctl({"exce", "sb-1", "--", "true"});
  EXPECT_EQ(exce.exit_code, 2);
  EXPECT_THAT(exce.err, HasSubstr("'exce' is not a command of dsecctl; did you mean 'exec'?"));
  auto stauts = ctl({"--addr", "127.0.0.1:1", "stauts"});
  EXPECT_EQ(stauts.exit_code, 2);
  EXPECT_THAT(stauts.err, HasSubstr("did you mean 'status'?"));
  auto close = ctl({"session", "clsoe", "job/a/s0"});
  EXPECT_EQ(close.exit_code, 2);
  EXPECT_THAT(close.err, HasSubstr("'clsoe' is not a command of dsecctl session; did you mean 'close'?"));
  auto none = ctl({"frobnicate"});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err, AllOf(HasSubstr("'frobnicate' is not a command"), Not(HasSubstr("did you mean"))));
  auto dashes = ctl({"run", "python3", "-c", "1"});
  EXPECT_EQ(dashes.exit_code, 2);
  EXPECT_THAT(dashes.err, HasSubstr("-c"));
  EXPECT_THAT(dashes.err, HasSubstr("put the command after --, e.g. dsecctl run -- python3"));
  auto timeout = ctl({"run", "--timeout", "abc", "--", "true"});
  EXPECT_EQ(timeout.exit_code, 2);
  EXPECT_THAT(timeout.err, HasSubstr("'abc' is not a number of seconds (e.g. 30 or 1.5)"));
}

// One cause, one exit code, whichever command meets it.
TEST_F(DsecctlRun, AnUnknownSandboxIs125InEveryCommand) {
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"exec", "no-such-box", "--", "true"},
           {"rm", "no-such-box"},
           {"pause", "no-such-box"},
           {"resume", "no-such-box"},
           {"timeout", "no-such-box", "10m"},
           {"cp", "no-such-box:/work/f", "-"},
           {"session", "show", "no/such/session"},
           {"session", "close", "no/such/session"},
           {"inspect", "no-such-box"}}) {
    auto r = daemon_->Ctl(args);
    EXPECT_EQ(r.exit_code, 125) << args[0] << ": " << r.err;
    EXPECT_THAT(r.err, AnyOf(HasSubstr("no-such-box"), HasSubstr("no/such/session"))) << args[0];
  }
}

// Ctrl-C in the terminal of `scripts/dev run` reaches dsecd's whole
// process group: dsecd stops cleanly, and its spawners, which leave when
// dsecd closes their sockets, are neither stopped by it first nor
// restarted during the shutdown.
TEST(DsecdStop, ACtrlCStopsItCleanlyWithoutRestartingASpawner) {
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> c;
  TestDaemonOptions o;
  o.own_process_group = true;
  if (auto why = StartOwnDaemon(o, &d, &c); !why.empty()) GTEST_SKIP() << why;
  auto r = c->Run(FncallSpec(), Command({"true"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  c.reset();
  EXPECT_EQ(d->Interrupt(), 0);
  auto log = ReadFileToString(d->log_path());
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_THAT(*log, HasSubstr("stopped"));
  EXPECT_THAT(*log, Not(HasSubstr("restarting it")));
  EXPECT_THAT(*log, Not(HasSubstr("error")));
}

TEST(DsecctlNoDaemon, UnreachableDaemonIs125WithAHint) {
  auto r = RunProcess({BinDir() + "/dsecctl", "--addr", "127.0.0.1:1", "--connect-timeout", "0.5", "run", "--", "true"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(r.err, HasSubstr("dsecd"));
}

using DsecctlAdmin = DaemonTest;

TEST_F(DsecctlAdmin, StatusLsStatsAnswer) {
  for (const char* cmd : {"status", "stats"}) {
    auto r = daemon_->Ctl({cmd, "--raw"});
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_TRUE(j.value("ok", false)) << r.out;
  }
  auto ls = daemon_->Ctl({"ls", "--json"});
  EXPECT_EQ(ls.exit_code, 0) << ls.err;
  auto j = nlohmann::json::parse(ls.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << ls.out;
  EXPECT_TRUE(j["sandboxes"].is_array()) << ls.out;
  auto status = daemon_->Admin("status");
  EXPECT_EQ(status.value("role", ""), "all");
  EXPECT_EQ(status.value("sdk", ""), daemon_->sdk_addr());
}

TEST_F(DsecctlAdmin, InspectAndKillARunInFlight) {
  auto fut = client_->RunAsync(FncallSpec(), Command({"sleep", "120"}));
  // The run shows up in `ls` once the node has it; find its id.
  std::string run_id;
  for (int i = 0; i < 500 && run_id.empty(); ++i) {
    auto ls = daemon_->Admin("ls");
    for (const auto& r : ls.value("runs", nlohmann::json::array()))
      if (r.value("argv0", "") == "sleep") run_id = r.value("id", "");
  }
  ASSERT_FALSE(run_id.empty()) << "the run never appeared in ls";
  auto inspect = daemon_->Admin("inspect " + run_id);
  EXPECT_TRUE(inspect.value("ok", false)) << inspect.dump();
  auto r = daemon_->Ctl({"kill", run_id});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  auto result = fut.get();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_THAT(result->error(), HasSubstr("killed"));
  EXPECT_LT(result->wall_us(), 60'000'000u);
}

TEST_F(DsecctlAdmin, WrongTokenIsRefused) {
  auto r = daemon_->Ctl({"--token", "not-the-token", "status"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_THAT(r.err, HasSubstr("token"));
}

}  // namespace
}  // namespace dsec::testing

namespace dsec::testing {
namespace {

// Every binary answers --help, and every positional it lists says what it is.
TEST(Help, EveryBinaryAndSubcommandDescribesItsPositionals) {
  std::vector<std::vector<std::string>> commands = {
      {"dsecd"}, {"dsec-replay"}, {"dsec-example-trainer"}, {"dsec-rollout-trainer"},
      {"dsec-image"}, {"dsec-image", "build"}, {"dsec-image", "ls"}, {"dsec-image", "rm"}, {"dsec-image", "inspect"},
      {"dsecctl"}};
  for (const char* sub : {"run", "create", "exec", "rm", "pause", "resume", "cp", "status", "nodes", "ls", "sessions",
                          "stats", "inspect", "kill"})
    commands.push_back({"dsecctl", sub});
  for (const char* sub : {"open", "step", "show", "close"}) commands.push_back({"dsecctl", "session", sub});
  for (auto& c : commands) {
    std::vector<std::string> argv{BinDir() + "/" + c[0]};
    argv.insert(argv.end(), c.begin() + 1, c.end());
    argv.push_back("--help");
    auto r = RunProcess(argv);
    std::string what;
    for (const auto& a : c) what += a + " ";
    EXPECT_EQ(r.exit_code, 0) << what << r.err;
    EXPECT_FALSE(r.out.empty()) << what;
    auto pos = r.out.find("Positionals:");
    if (pos == std::string::npos) continue;
    std::istringstream lines(r.out.substr(pos));
    std::string line;
    std::getline(lines, line);  // the heading
    while (std::getline(lines, line) && !line.empty()) {
      // "  name TEXT REQUIRED          what it is"
      std::istringstream words(line);
      std::vector<std::string> w;
      for (std::string x; words >> x;) w.push_back(x);
      size_t meta = 1;
      while (meta < w.size() && (w[meta] == "TEXT" || w[meta] == "UINT" || w[meta] == "INT" ||
                                 w[meta] == "..." || w[meta] == "REQUIRED" || w[meta] == "FLOAT"))
        ++meta;
      EXPECT_LT(meta, w.size()) << what << "describes no positional '" << (w.empty() ? "" : w[0]) << "': " << line;
    }
  }
  auto kinds = RunProcess({BinDir() + "/dsecctl", "run", "--help"});
  EXPECT_NE(kinds.out.find("fncall | container | microvm | vm | auto"), std::string::npos)
      << "--kind's help names every kind: " << kinds.out;
}

}  // namespace
}  // namespace dsec::testing
