// dsec-agent end to end: exec (output, stdin, env, streaming, limits,
// signals, concurrency). Files: agent_files_test.cpp; the agent as init
// and under hostile clients: agent_lifecycle_test.cpp.
#include "tests/integration/agent/agent_fixture.hpp"

namespace dsec::testing {
namespace {

TEST_F(AgentTest, HelpSaysWhatItIs) {
  auto r = RunProcess({BinDir() + "/dsec-agent", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("usage: dsec-agent"), std::string::npos) << r.out;
  EXPECT_NE(RunProcess({BinDir() + "/dsec-agent", "--bogus"}).exit_code, 0);
}

TEST_F(AgentTest, Ping) {
  auto p = client_->PingSync(kWait);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(static_cast<pid_t>(p->pid()), pid_);
  EXPECT_FALSE(p->version().empty());
  EXPECT_EQ(p->execs_running(), 0u);
}

TEST_F(AgentTest, ExecReportsOutputAndExitCode) {
  auto r = Run(Sh("echo hello; echo oops >&2; exit 3"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->exited());
  EXPECT_EQ(r->exit_code(), 3);
  EXPECT_EQ(r->stdout(), "hello\n");
  EXPECT_EQ(r->stderr(), "oops\n");
  EXPECT_FALSE(r->timed_out());
  EXPECT_EQ(r->exec_errno(), 0);
  EXPECT_TRUE(r->user_error().empty()) << r->user_error();
  EXPECT_GT(r->wall_us(), 0u);
  EXPECT_GT(r->peak_memory_bytes(), 0u);
}

TEST_F(AgentTest, StdinIsFedThenClosed) {
  auto e = Cmd({"tr", "a-z", "A-Z"});
  e.set_stdin("hello agent\n");
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "HELLO AGENT\n");
  // More than any pipe holds: written as the program reads.
  auto big = Cmd({"wc", "-c"});
  big.set_stdin(std::string(3 << 20, 'x'));
  r = Run(big);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), std::to_string(3 << 20) + "\n");
}

TEST_F(AgentTest, EnvCwdAndPathFromTheRequest) {
  auto e = Sh("echo $FOO; pwd");
  e.add_env("FOO=bar");
  e.set_cwd(dir_);
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "bar\n" + dir_ + "\n");
  // The whole environment is the request's.
  r = Run(Cmd({"env"}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), "PATH=/usr/local/bin:/usr/bin:/bin\n");
  // argv[0] is looked up in the request's PATH; a script without #! runs with sh.
  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/bin/mytool", "#!/bin/sh\necho mytool \"$1\"\n", 0755, true), kWait).ok());
  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/bin/noshebang", "echo plain \"$1\"\n", 0755), kWait).ok());
  agent::Exec t;
  t.add_argv("mytool");
  t.add_argv("x");
  t.add_env("PATH=/nonexistent:" + dir_ + "/bin");
  r = Run(t);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "mytool x\n");
  t.set_argv(0, "noshebang");
  r = Run(t);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "plain x\n");
}

TEST_F(AgentTest, CommandNotFoundAndNotExecutable) {
  auto r = Run(Cmd({"dsec-no-such-command"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exec_errno(), ENOENT);
  EXPECT_EQ(r->exit_code(), 127);
  EXPECT_TRUE(r->user_error().empty()) << r->user_error();

  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/plain.txt", "not a program\n", 0644), kWait).ok());
  r = Run(Cmd({dir_ + "/plain.txt"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exec_errno(), EACCES);
  EXPECT_EQ(r->exit_code(), 126);

  auto e = Cmd({"true"});
  e.set_cwd(dir_ + "/no-such-dir");
  r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->user_error().find(dir_ + "/no-such-dir"), std::string::npos) << r->user_error();
  EXPECT_NE(r->user_error().find("No such file"), std::string::npos) << r->user_error();

  agent::Exec empty;
  auto bad = client_->ExecSync(empty, kWait);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument) << bad.status().ToString();
}

TEST_F(AgentTest, StreamedOutputArrivesWhileItRuns) {
  // The command prints, then holds until a file exists that the test makes
  // only once it has that first line: it can end only if its output was
  // streamed while it ran.
  std::string go = dir_ + "/go";
  auto e = Sh("echo line1; while [ ! -e " + go + " ]; do sleep 0.01; done; echo line2; echo bye >&2");
  e.set_stream(true);
  e.mutable_limits()->set_timeout_ms(20000);
  std::mutex mu;
  std::vector<agent::Output> outs;
  std::string streamed;
  std::atomic<bool> done_seen{false};
  bool output_after_done = false;
  auto r = client_->ExecSync(e, kWait, [&](const agent::Output& o) {
    std::lock_guard<std::mutex> lk(mu);
    if (done_seen) output_after_done = true;
    outs.push_back(o);
    if (o.stream() != 1) return;
    streamed += o.data();
    if (streamed == "line1\n") std::ofstream(go) << "";
  });
  done_seen = true;
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->timed_out()) << "the first line was not streamed while the command ran";
  EXPECT_EQ(r->exit_code(), 0);
  EXPECT_TRUE(r->stdout().empty());
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_FALSE(output_after_done);
  std::string out, err;
  for (const auto& o : outs) {
    if (o.stream() == 1) {
      out += o.data();
    } else {
      EXPECT_EQ(o.stream(), 2);
      err += o.data();
    }
  }
  EXPECT_EQ(out, "line1\nline2\n");
  EXPECT_EQ(err, "bye\n");
}

TEST_F(AgentTest, TimeoutKillsTheWholeProcessGroup) {
  auto e = Sh("sleep 1000 & echo $!; wait");
  e.mutable_limits()->set_timeout_ms(300);
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->timed_out());
  EXPECT_FALSE(r->exited());
  EXPECT_EQ(r->signal(), SIGKILL);
  EXPECT_GE(r->wall_us(), 300'000u);
  EXPECT_LT(r->wall_us(), 10'000'000u);
  pid_t bg = static_cast<pid_t>(std::atoi(r->stdout().c_str()));
  ASSERT_GT(bg, 0) << r->stdout();
  EXPECT_TRUE(WaitExited(bg)) << "the background sleep survived the timeout";
  ASSERT_TRUE(client_->PingSync(kWait).ok());  // barrier: reaped by now
  EXPECT_FALSE(Alive(bg));
}

TEST_F(AgentTest, OutputCapTruncatesAndKills) {
  auto e = Cmd({"yes"});
  e.mutable_limits()->set_output_bytes(1000);
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout().size(), 1000u);
  EXPECT_TRUE(r->stdout_truncated());
  EXPECT_FALSE(r->stderr_truncated());
  EXPECT_TRUE(r->output_exceeded());
  EXPECT_EQ(r->signal(), SIGKILL);

  // Streamed: the cap counts what was sent.
  e.set_stream(true);
  std::atomic<size_t> sent{0};
  r = client_->ExecSync(e, kWait, [&](const agent::Output& o) { sent += o.data().size(); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(sent.load(), 1000u);
  EXPECT_TRUE(r->stdout_truncated());
  EXPECT_TRUE(r->output_exceeded());
}

TEST_F(AgentTest, SignalReachesARunningExec) {
  auto e = Sh("echo ready; exec sleep 1000");
  e.set_stream(true);
  std::promise<void> ready;
  std::atomic<bool> once{false};
  std::promise<Result<run::Outcome>> done;
  uint64_t id = client_->Exec(
      e,
      [&](const agent::Output&) {
        if (!once.exchange(true)) ready.set_value();
      },
      [&](Result<run::Outcome> r) { done.set_value(std::move(r)); });
  ASSERT_NE(id, 0u);
  ASSERT_EQ(ready.get_future().wait_for(kWait), std::future_status::ready);
  EXPECT_TRUE(client_->SignalSync(id, SIGTERM, kWait).ok());
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
  auto r = f.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->signal(), SIGTERM);
  EXPECT_FALSE(r->timed_out());

  Status st = client_->SignalSync(id, SIGTERM, kWait);  // finished: unknown now
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.ToString();
  st = client_->SignalSync(987654, SIGTERM, kWait);
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find("987654"), std::string::npos) << st.message();
}

TEST_F(AgentTest, TwentyConcurrentExecs) {
  constexpr int kN = 20;
  // Each holds until `go` exists, made once the agent runs all twenty at once.
  std::string go = dir_ + "/go";
  std::vector<std::promise<Result<run::Outcome>>> done(kN);
  for (int i = 0; i < kN; ++i)
    client_->Exec(
        Cmd({"/bin/sh", "-c", "while [ ! -e \"$1\" ]; do sleep 0.01; done; echo $0", "n" + std::to_string(i), go}), {},
        [&done, i](Result<run::Outcome> r) { done[i].set_value(std::move(r)); });
  auto running = [&] {
    auto ping = client_->PingSync(kWait);
    return ping.ok() ? ping->execs_running() : 0u;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (running() < kN && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the agent, bounded
  ASSERT_EQ(running(), static_cast<uint32_t>(kN)) << "the execs did not all run at once";
  std::ofstream(go) << "";
  for (int i = 0; i < kN; ++i) {
    auto f = done[i].get_future();
    ASSERT_EQ(f.wait_for(kWait), std::future_status::ready) << i;
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->exit_code(), 0);
    EXPECT_EQ(r->stdout(), "n" + std::to_string(i) + "\n");
  }
  EXPECT_EQ(client_->PingSync(kWait)->execs_running(), 0u);
}


TEST_F(AgentTest, LimitsAndUserDrop) {
  auto e = Sh("ulimit -n; ulimit -t");
  e.mutable_limits()->set_open_files(17);
  e.mutable_limits()->set_cpu_time_ms(2500);
  auto r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "17\n3\n");
  // Without a limit, commands get the agent's original soft limit back (it
  // raised its own); it inherited ours.
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  r = Run(Sh("ulimit -n"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), std::to_string(nofile.rlim_cur) + "\n");
  if (::geteuid() != 0) GTEST_SKIP() << "dropping to another uid needs root";
  e = Sh("id -u; id -g; id -G");
  e.set_uid(65534);
  e.set_gid(65534);
  r = Run(e);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "65534\n65534\n65534\n") << r->user_error();
}

TEST_F(AgentTest, CpuTimeIsReported) {
  auto r = Run(Sh("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_code(), 0);
  EXPECT_GT(r->cpu_us(), 0u);
}


// --fd: one already-connected stream (how a VM's virtio-serial port is
// served); without a listening socket, and not PID 1, the agent leaves when
// that stream closes.

}  // namespace
}  // namespace dsec::testing
