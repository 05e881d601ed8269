// The fake kind's shell: every construct and tool the fake promises
// (drivers/fake/fake_shell.hpp), with real-shell results, and the ways a
// run ends (limits, kills) as the verdicts need them. Runs in a FakeBox,
// no driver.
#include <signal.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "drivers/fake/fake_shell.hpp"

namespace dsec::drivers {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Ending = FakeResult::Ending;

class FakeShellTest : public ::testing::Test {
 protected:
  // A run that does not end in 5 s is stopped (and so fails its test)
  // instead of hanging the suite.
  FakeResult Run(FakeExec e, const std::shared_ptr<FakeRunControl>& ctl = std::make_shared<FakeRunControl>()) {
    if (e.env.empty()) e.env = {{"HOME", "/root"}, {"PATH", "/usr/bin:/bin"}};
    std::promise<void> ended;
    std::thread watchdog([&, f = ended.get_future()] {
      if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready)
        ctl->Stop(FakeStop::kKilled, "the test's watchdog: the run did not end");
    });
    std::string why;
    EXPECT_TRUE(box_.Enter(ctl, &why)) << why;
    auto r = RunFakeExec(box_, e, ctl);
    box_.Leave(ctl);
    ended.set_value();
    watchdog.join();
    return r;
  }
  FakeResult Sh(const std::string& script, FakeExec e = {}) {
    e.argv = {"sh", "-c", script};
    return Run(std::move(e));
  }
  std::string Out(const std::string& script) { return Sh(script).out; }
  std::string File(const std::string& path) {
    auto lk = box_.Lock();
    int err = 0;
    auto n = box_.fs().Find(path, &err);
    return n ? n->data : "<" + std::string(std::strerror(err)) + ">";
  }

  FakeBox box_{"sb-shell", [] { return int64_t{1700000000000}; }};
};

TEST_F(FakeShellTest, OutputStderrAndExitCodeOfAScript) {
  auto r = Sh("echo out; echo err >&2; exit 3");
  EXPECT_EQ(r.ending, Ending::kExited);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(Sh("exit 300").exit_code, 300 & 0xff);
  EXPECT_EQ(Sh("false").exit_code, 1);
  EXPECT_EQ(Sh("").exit_code, 0);
}

TEST_F(FakeShellTest, ListsAndAndOr) {
  EXPECT_EQ(Out("true && echo a || echo b; false && echo c || echo d"), "a\nd\n");
  EXPECT_EQ(Out("false; echo $?; true; echo $?"), "1\n0\n");
  EXPECT_EQ(Out("echo one\n# a comment\necho two # trailing\n\necho three"), "one\ntwo\nthree\n");
  EXPECT_EQ(Out("! false && echo negated; ! true || echo again"), "negated\nagain\n");
  EXPECT_EQ(Out("echo a; exit 5; echo never"), "a\n");
  EXPECT_EQ(Out("{ echo in; echo group; } > /work/g; cat /work/g"), "in\ngroup\n");
}

TEST_F(FakeShellTest, PipesConnectStagesAndEndEarlyReaders) {
  EXPECT_EQ(Out("echo hello | tr a-z A-Z"), "HELLO\n");
  EXPECT_EQ(Out("printf 'a\\nb\\nc\\n' | wc -l"), "3\n");
  EXPECT_EQ(Out("yes | head -n 3"), "y\ny\ny\n");  // yes dies of SIGPIPE when head has had enough
  EXPECT_EQ(Out("yes | head -c 5; echo \" $?\""), "y\ny\ny 0\n");
  EXPECT_EQ(Out("echo abc | cat | cat | tr b X"), "aXc\n");
  EXPECT_EQ(Out("false | true; echo $?; true | false; echo $?"), "0\n1\n");
  FakeExec e;
  e.stdin_data = "from stdin\n";
  EXPECT_EQ(Sh("cat | tr a-z A-Z", e).out, "FROM STDIN\n");
  EXPECT_EQ(Out("x=1; echo 2 | x=3; echo $x"), "1\n");  // a stage is a subshell
}

TEST_F(FakeShellTest, SubshellsKeepTheirVariablesAndExit) {
  EXPECT_EQ(Out("x=1; (x=2; echo $x); echo $x"), "2\n1\n");
  EXPECT_EQ(Out("(exit 4); echo $?"), "4\n");
  EXPECT_EQ(Out("(cd /tmp; pwd); pwd"), "/tmp\n/work\n");
}

TEST_F(FakeShellTest, LoopsAndConditionals) {
  EXPECT_EQ(Out("for i in 1 2 3; do echo $i; done"), "1\n2\n3\n");
  EXPECT_EQ(Out("n=0; while [ $n -lt 3 ]; do n=$((n+1)); done; echo $n"), "3\n");
  EXPECT_EQ(Out("n=5; until [ $n -le 2 ]; do n=$((n-1)); done; echo $n"), "2\n");
  EXPECT_EQ(Out("if false; then echo a; elif true; then echo b; else echo c; fi"), "b\n");
  EXPECT_EQ(Out("if false; then echo a; else echo c; fi; if false; then :; fi; echo $?"), "c\n0\n");
  EXPECT_EQ(Out("for i in 1 2 3 4; do [ $i = 2 ] && continue; [ $i = 4 ] && break; echo $i; done"), "1\n3\n");
  EXPECT_EQ(Out("for i in a b; do for j in 1 2; do [ $j = 2 ] && continue 2; echo $i$j; done; done"), "a1\nb1\n");
  EXPECT_EQ(Out("for i in 1 2\ndo\n  echo $i\ndone"), "1\n2\n");
  EXPECT_EQ(Out("while read -r a b; do echo \"$b-$a\"; done < /dev/null; echo end"), "end\n");
}

TEST_F(FakeShellTest, QuotingAndFieldSplitting) {
  EXPECT_EQ(Out("X=x; echo 'a  $X' \"c  $X\" d\\ e"), "a  $X c  x d e\n");
  EXPECT_EQ(Out("echo \"a\\\"b\" 'it'\\''s'"), "a\"b it's\n");
  EXPECT_EQ(Out("X='1  2'; for i in $X; do echo \"[$i]\"; done; for i in \"$X\"; do echo \"[$i]\"; done"),
            "[1]\n[2]\n[1  2]\n");
  EXPECT_EQ(Out("E=; for i in $E; do echo no; done; for i in \"$E\"; do echo [$i]; done"), "[]\n");
  EXPECT_EQ(Out("echo ~ ~/x"), "/root /root/x\n");
  EXPECT_EQ(Out("echo a\\\nb"), "ab\n");
}

TEST_F(FakeShellTest, ParametersAndArguments) {
  FakeExec e;
  e.argv = {"sh", "-c", "echo $0 $1 ${2} $# \"$@\"", "zero", "one", "two"};
  EXPECT_EQ(Run(e).out, "zero one two 2 one two\n");
  EXPECT_EQ(Out("echo ${U:-def} ${U-d2} [${U}]; U=set; echo ${U:-def} ${#U}"), "def d2 []\nset 3\n");
  EXPECT_EQ(Out("sleep 0 & echo $!"), "100\n");
  EXPECT_EQ(Out("set_x=1; echo $set_x$set_x"), "11\n");
  EXPECT_EQ(Out("A=1 B=2; echo $A$B"), "12\n");
  EXPECT_EQ(Out("X=outer; X=inner env | grep ^X=; echo $X"), "X=inner\nouter\n");
  EXPECT_EQ(Out("echo $(echo a; echo b) \"$(printf 'x\\n\\n')\""), "a b x\n");
  EXPECT_EQ(Out("x=$(false); echo $?; echo `echo back`"), "1\nback\n");
}

TEST_F(FakeShellTest, ShellBuiltinsChangeTheShell) {
  FakeExec e;
  e.argv = {"sh", "-c", "echo $#: $1; shift; echo $#: $1; shift 5; echo $?", "name", "a", "b"};
  auto r = Run(e);
  EXPECT_EQ(r.out, "2: a\n1: b\n2\n");
  EXPECT_EQ(r.err, "sh: shift: can't shift that many\n");
  EXPECT_EQ(Out("X=1; unset X; echo [$X]; eval 'Y=2; echo $Y' ; eval exit 4; echo never"), "[]\n2\n");
  EXPECT_EQ(Sh("eval exit 4").exit_code, 4);
  EXPECT_EQ(Out("cd /tmp; sh -c pwd; X=v; sh -c 'echo [$X]'; export X; sh -c 'echo [$X]'"), "/tmp\n[]\n[v]\n");
  EXPECT_EQ(Out("exec echo replaced; echo never"), "replaced\n") << "exec takes the shell's place";
  EXPECT_EQ(Sh("exec sh -c 'exit 7'; echo never").exit_code, 7);
}

TEST_F(FakeShellTest, Arithmetic) {
  EXPECT_EQ(Out("echo $(( 7 * 6 )) $((10 / 3)) $((10 % 3)) $((2 - 5)) $((1 < 2)) $((2 <= 1)) $(((1 + 2) * 3))"),
            "42 3 1 -3 1 0 9\n");
  EXPECT_EQ(Out("n=4; echo $((n+1)) $(($n*2)) $((n == 4 && 1)) $((n != 4 || 0)) $((-n)) $((!n))"), "5 8 1 0 -4 0\n");
  auto r = Sh("echo $((1/0)); echo after");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("division by zero"));
}

TEST_F(FakeShellTest, Redirections) {
  EXPECT_EQ(Out("echo a > /work/f; echo b >> /work/f; cat < /work/f"), "a\nb\n");
  EXPECT_EQ(File("/work/f"), "a\nb\n");
  auto r = Sh("echo x 1>&2; echo y >&2; ls /nope 2>&1; cat /nope 2>/dev/null; echo gone >/dev/null");
  EXPECT_EQ(r.err, "x\ny\n");
  EXPECT_EQ(r.out, "ls: cannot access '/nope': No such file or directory\n");
  EXPECT_EQ(Out("(echo o; echo e >&2) > /work/both 2>&1; cat /work/both"), "o\ne\n");
  EXPECT_EQ(Out("head -c 4 /dev/zero | wc -c; cat /dev/null | wc -c"), "4\n0\n");
  r = Sh("echo x > /nope/f");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "sh: cannot create /nope/f: Directory nonexistent\n");
  r = Sh("cat < /nope");
  EXPECT_EQ(r.err, "sh: cannot open /nope: No such file\n");
  EXPECT_EQ(Out("echo z > rel; cat /work/rel"), "z\n");
}

TEST_F(FakeShellTest, NotFoundIsExit127LikeARealShell) {
  auto r = Sh("nosuch arg; echo $?");
  EXPECT_EQ(r.err, "sh: nosuch: not found\n");
  EXPECT_EQ(r.out, "127\n");
  FakeExec e;
  e.argv = {"no-such-program"};
  EXPECT_EQ(Run(e).ending, Ending::kNotFound);
  e.argv = {"/work/none"};
  EXPECT_EQ(Run(e).ending, Ending::kNotFound);
  Sh("echo 'echo from script $1' > /work/s.sh; printf '#!/bin/sh\\necho run $1\\n' > /work/x.sh");
  e.argv = {"/work/s.sh"};
  EXPECT_EQ(Run(e).ending, Ending::kNotExecutable);
  EXPECT_EQ(Out("chmod 755 /work/x.sh; /work/x.sh arg; sh /work/s.sh one; echo 'echo piped' | sh"),
            "run arg\nfrom script one\npiped\n");
  e.argv = {"/work/x.sh", "direct"};
  EXPECT_EQ(Run(e).out, "run direct\n");
  e.argv = {"/bin/echo", "abs"};
  EXPECT_EQ(Run(e).out, "abs\n");
  EXPECT_THAT(Sh("if true; then echo").err, HasSubstr("syntax error"));
  EXPECT_EQ(Sh("if true; then echo ran").out, "");  // parsed whole before anything runs
  EXPECT_EQ(Sh("echo 'open").exit_code, 2);
}

TEST_F(FakeShellTest, WorkingDirectoryAndEnvironment) {
  FakeExec e;
  e.env = {{"GREETING", "hi"}, {"HOME", "/root"}};
  e.cwd = "/tmp";
  EXPECT_EQ(Sh("echo $GREETING; pwd; cd; pwd; cd /work && pwd; cd /nope", e).out, "hi\n/tmp\n/root\n/work\n");
  EXPECT_EQ(Sh("env", e).out, "GREETING=hi\nHOME=/root\n");
  EXPECT_EQ(Sh("A=1; export B=2; env | grep -c =", e).out, "3\n");
  e.cwd = "/missing";
  auto r = Sh("pwd", e);
  EXPECT_EQ(r.ending, Ending::kBadCwd);
  EXPECT_THAT(r.detail, HasSubstr("'/missing': No such file or directory"));
}

TEST_F(FakeShellTest, FileTools) {
  EXPECT_EQ(Out("mkdir -p /work/a/b; touch /work/a/b/f /work/a/z; ls /work/a; ls /work/a/b/f"), "b\nz\n/work/a/b/f\n");
  EXPECT_EQ(Sh("mkdir /work/a").err, "mkdir: cannot create directory '/work/a': File exists\n");
  EXPECT_EQ(Sh("rm /work/a").err, "rm: cannot remove '/work/a': Is a directory\n");
  EXPECT_EQ(Out("rm -f /work/none; echo $?; rm /work/none; echo $?"), "0\n1\n");
  EXPECT_EQ(Out("rm -r /work/a; ls /work/a 2>/dev/null || echo gone"), "gone\n");
  EXPECT_EQ(Out("printf 12345 > /work/n; chmod 640 /work/n; stat -c '%a %s %n %F' /work/n /tmp"),
            "640 5 /work/n regular file\n1777 4096 /tmp directory\n");
  EXPECT_EQ(Out("cp /work/n /work/m; mv /work/m /tmp; cat /tmp/m; ls /work"), "12345n\n");
  EXPECT_EQ(Out("ls /work | tr '\\n' ' '"), "n ");
  EXPECT_EQ(Out("[ -e /work/n ] && [ -f /work/n ] && [ -s /work/n ] && [ ! -d /work/n ] && [ -d /tmp ] && echo ok"),
            "ok\n");
  EXPECT_EQ(Out("rmdir /tmp 2>&1; mkdir /work/e; rmdir /work/e && echo removed"),
            "rmdir: failed to remove '/tmp': Directory not empty\nremoved\n");
  EXPECT_EQ(Out("ls /dev; basename /a/b.txt .txt; dirname /a/b.txt"), "null\nzero\nb\n/a\n");
}

TEST_F(FakeShellTest, TextTools) {
  Sh("printf 'l1\\nl2\\nl3\\nl4\\nl5\\nl6\\nl7\\nl8\\nl9\\nl10\\nl11\\nl12\\n' > /work/t");
  EXPECT_EQ(Out("head -n 2 /work/t; head -3 /work/t | tail -n 1; head -c 4 /work/t"), "l1\nl2\nl3\nl1\nl");
  EXPECT_EQ(Out("tail /work/t | head -n 1; tail -n 2 /work/t; tail -n +12 /work/t; tail -c 3 /work/t"),
            "l3\nl11\nl12\nl12\n12\n");
  EXPECT_EQ(Out("wc -l < /work/t; wc -c /work/t; echo 'a b  c' | wc -w; printf 'x\\ny' | wc -l"),
            "12\n39 /work/t\n3\n1\n");
  EXPECT_EQ(Out("echo hello | wc"), "      1       1       6\n");
  EXPECT_EQ(Out("echo 'a-b c' | tr -d ' -'; echo abc | tr 'a-c' 'A'; printf 'a\\tb\\n' | tr '\\t' ,"),
            "abc\nAAA\na,b\n");
  EXPECT_EQ(Out("printf '%s=%d|%5s|%-3s|%%\\n' x 42 r l; printf '%s\\n' a b c"), "x=42|    r|l  |%\na\nb\nc\n");
  EXPECT_EQ(Out("echo -n no; echo 'a\\tb'; echo x\\\\y"), "noa\tb\nx\\y\n");
  EXPECT_EQ(Out("seq 3; seq 2 2 6 | sort -rn; printf 'b\\na\\nb\\n' | sort -u"), "1\n2\n3\n6\n4\n2\na\nb\n");
  EXPECT_EQ(Out("grep l1 /work/t; grep -c '^l1' /work/t; grep -q nope /work/t || echo none; grep -v l /work/t"),
            "l1\nl10\nl11\nl12\n4\nnone\n");
  EXPECT_EQ(Out("yes abc | head -n 2; printenv HOME"), "abc\nabc\n/root\n");
  EXPECT_EQ(Out("echo a b | { read x y; echo $y$x; }; printf 'l\\n' | while read -r l; do echo got $l; done"),
            "ba\ngot l\n");
}

TEST_F(FakeShellTest, TestOperators) {
  EXPECT_EQ(Out("[ 1 -eq 1 ] && [ 1 -ne 2 ] && [ 1 -lt 2 ] && [ 2 -le 2 ] && [ 3 -gt 2 ] && [ 3 -ge 3 ] && echo nums"),
            "nums\n");
  EXPECT_EQ(Out("[ a = a ] && [ a != b ] && [ -z '' ] && [ -n x ] && [ x ] && ! [ '' ] && echo strs"), "strs\n");
  EXPECT_EQ(Out("test 1 -eq 2 -o a = a && echo or; test 1 -eq 1 -a a = b || echo and; [ ! -e /nope ] && echo not"),
            "or\nand\nnot\n");
  auto r = Sh("[ x -eq 1 ]; echo $?; [ 1 = 1; echo $?");
  EXPECT_EQ(r.out, "2\n2\n");
  EXPECT_EQ(r.err, "sh: [: Illegal number: x\nsh: [: missing ]\n");
}

TEST_F(FakeShellTest, BackgroundJobsOutliveTheExecAndWaitWaits) {
  auto start = std::chrono::steady_clock::now();
  auto r = Sh("(sleep 0.05; echo late > /work/late) & echo started");
  EXPECT_EQ(r.out, "started\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40)) << "the exec waited for its job";
  EXPECT_EQ(box_.jobs(), 1u);
  for (int i = 0; i < 200 && File("/work/late") != "late\n"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(File("/work/late"), "late\n");
  EXPECT_EQ(Out("(sleep 0.02; echo job) & sleep 0.01 & wait; echo after"), "job\nafter\n");
  EXPECT_EQ(Out("sh -c 'exit 7' & wait $!; echo $?"), "7\n");
}

TEST_F(FakeShellTest, TimeLimitKillsTheRun) {
  FakeExec e;
  e.timeout_ms = 30;
  auto r = Sh("echo before; sleep 30", e);
  EXPECT_EQ(r.ending, Ending::kTimedOut);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_EQ(r.out, "before\n");
  EXPECT_GE(r.wall_us, 30000u);
  EXPECT_LT(r.wall_us, 500000u);
  EXPECT_EQ(Sh("while :; do :; done", e).ending, Ending::kTimedOut);
  EXPECT_EQ(Sh("yes > /dev/null", e).ending, Ending::kTimedOut);
}

TEST_F(FakeShellTest, OutputLimitKillsAndTruncates) {
  FakeExec e;
  e.output_bytes = 1000;
  auto r = Sh("head -c 100000 /dev/zero", e);
  EXPECT_EQ(r.ending, Ending::kOutputLimit);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_TRUE(r.out_truncated);
  EXPECT_FALSE(r.err_truncated);
  EXPECT_EQ(r.out.size(), 1000u);
  r = Sh("yes >&2", e);
  EXPECT_EQ(r.ending, Ending::kOutputLimit);
  EXPECT_TRUE(r.err_truncated);
  EXPECT_EQ(r.err.size(), 1000u);
  e.output_bytes = 6;
  EXPECT_EQ(Sh("echo 12345", e).ending, Ending::kExited) << "exactly the cap is not past it";
}

TEST_F(FakeShellTest, MemoryLimitCountsWhatTheRunBuffers) {
  FakeExec e;
  e.memory_bytes = 1 << 20;
  auto r = Sh("x=$(head -c 2000000 /dev/zero); echo never", e);
  EXPECT_EQ(r.ending, Ending::kMemoryLimit);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_EQ(r.out, "");
  EXPECT_GT(r.peak_memory_bytes, 1u << 20);
  EXPECT_EQ(Sh("yes | tail -n 1", e).ending, Ending::kMemoryLimit);
  EXPECT_EQ(Sh("exec tail < /dev/zero", e).ending, Ending::kMemoryLimit) << "the contract suite's hog";
  r = Sh("x=$(head -c 500000 /dev/zero); y=$(head -c 100 /dev/zero); echo fits", e);
  EXPECT_EQ(r.out, "fits\n");
  EXPECT_GE(r.peak_memory_bytes, 500000u);
  EXPECT_LT(r.peak_memory_bytes, 1u << 20);
  EXPECT_EQ(Sh("head -c 2000000 /dev/zero | wc -c", e).out, "2000000\n") << "streaming buffers nothing";
}

TEST_F(FakeShellTest, StreamedOutputArrivesInOrderPieceByPiece) {
  std::mutex mu;
  std::vector<std::pair<bool, std::string>> pieces;
  FakeExec e;
  e.on_output = [&](bool is_err, const std::string& data) {
    std::lock_guard<std::mutex> lk(mu);
    pieces.emplace_back(is_err, data);
  };
  auto r = Sh("for i in 1 2 3; do echo line$i; echo e$i >&2; done", e);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
  std::vector<std::pair<bool, std::string>> want = {{false, "line1\n"}, {true, "e1\n"},     {false, "line2\n"},
                                                    {true, "e2\n"},     {false, "line3\n"}, {true, "e3\n"}};
  EXPECT_EQ(pieces, want);
}

TEST_F(FakeShellTest, AStopFromOutsideEndsTheRunWithinMilliseconds) {
  auto ctl = std::make_shared<FakeRunControl>();
  FakeExec e;
  e.argv = {"sh", "-c", "sleep 10 & while :; do sleep 10; done"};
  auto done = std::async(std::launch::async, [&] { return Run(e, ctl); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ctl->Stop(FakeStop::kKilled, "enough");
  ASSERT_EQ(done.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  auto r = done.get();
  EXPECT_EQ(r.ending, Ending::kKilled);
  EXPECT_EQ(r.detail, "enough");
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_LT(r.wall_us, 200000u);
  // The job was in its process group: it died too.
  for (int i = 0; i < 100 && box_.jobs() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(box_.jobs(), 0u);
}

TEST_F(FakeShellTest, RunsAreDeterministic) {
  const std::string script =
      "mkdir -p /work/d; for i in 3 1 2; do echo $i >> /work/d/f; done; sort /work/d/f | tr '\\n' ,; "
      "x=$(wc -l < /work/d/f); echo \" $((x * 7))\"; ls /work /work/d; stat -c %s /work/d/f; "
      "(echo sub; exit 3); echo $?; yes | head -n 2; nosuch; echo $? >&2";
  auto first = Sh(script);
  for (int i = 0; i < 3; ++i) {
    FakeBox other("sb-other", [] { return int64_t{1700000000000}; });
    FakeExec e;
    e.argv = {"sh", "-c", script};
    e.env = {{"HOME", "/root"}};
    auto ctl = std::make_shared<FakeRunControl>();
    std::string why;
    ASSERT_TRUE(other.Enter(ctl, &why));
    auto again = RunFakeExec(other, e, ctl);
    other.Leave(ctl);
    EXPECT_EQ(again.out, first.out);
    EXPECT_EQ(again.err, first.err);
    EXPECT_EQ(again.exit_code, first.exit_code);
    EXPECT_EQ(other.fs().Serialize(), box_.fs().Serialize());
  }
  EXPECT_EQ(first.out, "1,2,3, 21\n/work:\nd\n\n/work/d:\nf\n6\nsub\n3\ny\ny\n");
}

TEST_F(FakeShellTest, CpuAndWallArePlausible) {
  auto r = Sh("sleep 0.02");
  EXPECT_GE(r.wall_us, 20000u);
  EXPECT_LT(r.cpu_us, r.wall_us) << "sleeping is not CPU";
  r = Sh("n=0; while [ $n -lt 2000 ]; do n=$((n+1)); done");
  EXPECT_GT(r.cpu_us, 0u);
}

}  // namespace
}  // namespace dsec::drivers
