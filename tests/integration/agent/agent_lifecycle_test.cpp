// dsec-agent end to end: reaping orphans, malformed frames, clients that go
// away or read slowly, serving one connected fd, and PID 1 duty.
#include "tests/integration/agent/agent_fixture.hpp"

#include "drivers/agent/channel_sync.hpp"

namespace dsec::testing {
namespace {

TEST_F(AgentTest, OrphansAreReaped) {
  auto r = Run(Sh("sleep 1000 >/dev/null 2>&1 & echo $!"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_code(), 0);
  pid_t orphan = static_cast<pid_t>(std::atoi(r->stdout().c_str()));
  ASSERT_GT(orphan, 0);
  // Its shell is gone, so it is the agent's child now, and its only one.
  EXPECT_EQ(ProcField(orphan, "PPid"), std::to_string(pid_));
  EXPECT_EQ(ChildrenOf(pid_), std::vector<pid_t>{orphan});
  ::kill(orphan, SIGKILL);
  ASSERT_TRUE(WaitExited(orphan));
  ASSERT_TRUE(client_->PingSync(kWait).ok());  // barrier: the agent reaps before serving
  EXPECT_FALSE(Alive(orphan)) << "orphan " << orphan << " is a zombie: state " << ProcState(orphan);
  EXPECT_TRUE(ChildrenOf(pid_).empty()) << "the agent keeps a child it should have reaped";
}

TEST_F(AgentTest, MalformedFramesGetAnErrorAndTheAgentServesOthers) {
  UniqueFd raw = RawConnect();
  bool eof = false;
  // Not a Request at all (an over-long varint).
  ASSERT_EQ(WriteFrame(raw.get(), std::string(16, '\xff')), 0);
  auto ev = ReadEvent(raw.get(), &eof);
  ASSERT_TRUE(ev) << "eof=" << eof;
  EXPECT_EQ(ev->id(), 0u);
  ASSERT_TRUE(ev->has_error());
  EXPECT_EQ(ev->error().errno_value(), EBADMSG);
  // An empty frame: no id, no body.
  ASSERT_EQ(WriteFrame(raw.get(), ""), 0);
  ev = ReadEvent(raw.get(), &eof);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->id(), 0u);
  EXPECT_TRUE(ev->has_error());
  // A valid frame with an id and no body.
  agent::Request req;
  req.set_id(7);
  ASSERT_EQ(WriteFrame(raw.get(), req.SerializeAsString()), 0);
  ev = ReadEvent(raw.get(), &eof);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->id(), 7u);
  EXPECT_TRUE(ev->has_error());
  // The connection still works after all that.
  req.mutable_ping();
  ASSERT_EQ(WriteFrame(raw.get(), req.SerializeAsString()), 0);
  ev = ReadEvent(raw.get(), &eof);
  ASSERT_TRUE(ev);
  EXPECT_TRUE(ev->has_pong());

  // An oversized length prefix: the stream is unusable, the agent hangs up.
  const char huge[4] = {'\xf0', '\xff', '\xff', '\xff'};
  ASSERT_EQ(WriteFull(raw.get(), huge, 4), 0);
  for (int i = 0; i < 3 && !eof; ++i) {
    ev = ReadEvent(raw.get(), &eof);
    if (ev) EXPECT_TRUE(ev->has_error());
    else EXPECT_TRUE(eof) << "no EOF after an oversized frame";
  }
  EXPECT_TRUE(eof);
  // Plain garbage (an HTTP request reads as a 542 MB length).
  UniqueFd raw2 = RawConnect();
  std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(WriteFull(raw2.get(), http.data(), http.size()), 0);
  eof = false;
  for (int i = 0; i < 3 && !eof; ++i)
    if (!ReadEvent(raw2.get(), &eof)) break;
  EXPECT_TRUE(eof);

  auto p = client_->PingSync(kWait);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto r = Run(Cmd({"echo", "still here"}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), "still here\n");
}

TEST_F(AgentTest, ClientDisconnectMidExecLeavesItRunning) {
  auto other = Connect();
  ASSERT_NE(other, nullptr);
  auto e = Sh("echo $$; exec sleep 1000");
  e.set_stream(true);
  std::promise<std::string> first;
  std::atomic<bool> once{false};
  std::promise<Status> done;
  other->Exec(
      e,
      [&](const agent::Output& o) {
        if (!once.exchange(true)) first.set_value(o.data());
      },
      [&](Result<run::Outcome> r) { done.set_value(r.status()); });
  auto ff = first.get_future();
  ASSERT_EQ(ff.wait_for(kWait), std::future_status::ready);
  pid_t pid = static_cast<pid_t>(std::atoi(ff.get().c_str()));
  ASSERT_GT(pid, 0);
  other.reset();  // hang up mid-exec
  auto df = done.get_future();
  ASSERT_EQ(df.wait_for(kWait), std::future_status::ready);
  EXPECT_EQ(df.get().code(), Status::Code::kUnavailable);

  auto p = client_->PingSync(kWait);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->execs_running(), 1u);
  EXPECT_TRUE(Alive(pid));
  ::kill(pid, SIGKILL);
  ASSERT_TRUE(WaitExited(pid));
  p = client_->PingSync(kWait);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->execs_running(), 0u);  // finished, its events dropped
}

TEST_F(AgentTest, ASlowReaderHoldsBackOutputNotAgentMemory) {
  UniqueFd raw = RawConnect();
  agent::Request req;
  req.set_id(1);
  auto* e = req.mutable_exec();
  *e = Cmd({"head", "-c", "64000000", "/dev/zero"});
  e->set_stream(true);
  e->mutable_limits()->set_output_bytes(1ull << 30);
  ASSERT_EQ(WriteFrame(raw.get(), req.SerializeAsString()), 0);
  // Nobody reads `raw`: once the agent stops draining the program's pipe,
  // `head` blocks writing to it, with 64 MB not yet written. Whatever the
  // agent buffers meanwhile, it holds by then.
  std::string wchan;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (wchan.find("pipe_write") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    for (pid_t child : ChildrenOf(pid_)) {
      std::ifstream comm("/proc/" + std::to_string(child) + "/comm"), in("/proc/" + std::to_string(child) + "/wchan");
      std::string name;
      if (std::getline(comm, name) && name == "head") std::getline(in, wchan);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the kernel, bounded
  }
  ASSERT_NE(wchan.find("pipe_write"), std::string::npos) << "head never blocked on its full pipe (wchan '" << wchan
                                                         << "'): the agent kept reading what nobody took";
  std::string hwm = ProcField(pid_, "VmHWM");  // kB
  ASSERT_FALSE(hwm.empty());
  EXPECT_LT(std::stoull(hwm), 24u * 1024) << "agent peak RSS " << hwm << " kB";
  uint64_t got = 0;
  bool eof = false, done = false;
  while (!done) {
    auto ev = ReadEvent(raw.get(), &eof);
    ASSERT_TRUE(ev) << "eof=" << eof << " after " << got << " bytes";
    if (ev->has_output()) got += ev->output().data().size();
    else if (ev->has_exec_done()) {
      done = true;
      EXPECT_EQ(ev->exec_done().exit_code(), 0);
    }
  }
  EXPECT_EQ(got, 64000000u);
  EXPECT_LT(std::stoull(ProcField(pid_, "VmHWM")), 24u * 1024);
}


TEST(AgentFdTest, ServesOneConnectedFdAndLeavesWhenItCloses) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = SpawnAgent({BinDir() + "/dsec-agent", "--fd", "3"}, false, sv[1]);
  ::close(sv[1]);
  ASSERT_GT(pid, 0);
  auto c = AgentClient::FromFd(UniqueFd(sv[0]));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto p = (*c)->PingSync(kWait);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(static_cast<pid_t>(p->pid()), pid);
  auto r = (*c)->ExecSync(Cmd({"echo", "over fd"}), kWait);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "over fd\n");
  c->reset();
  ASSERT_TRUE(WaitExited(pid));
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// As PID 1 of a pid namespace (as in a container): SIGTERM and SIGINT are
// ignored, orphans are reaped, only SIGKILL from outside stops it.
TEST(AgentPid1Test, IgnoresTermAndReapsAsInit) {
  if (::geteuid() != 0) GTEST_SKIP() << "a new pid namespace needs root";
  char tmpl[] = "/tmp/dsec-test-agent-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, sock = dir + "/agent.sock";
  pid_t unshare = SpawnAgent({"/usr/bin/unshare", "--pid", "--fork", "--kill-child", BinDir() + "/dsec-agent",
                              "--listen", sock, "--ready-fd", "3"},
                             true);
  ASSERT_GT(unshare, 0);
  std::vector<pid_t> kids = ChildrenOf(unshare);
  ASSERT_EQ(kids.size(), 1u);
  pid_t agent = kids[0];  // its pid out here
  {
    auto c = AgentClient::Connect(sock);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto p = (*c)->PingSync(kWait);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->pid(), 1u);
    auto r = (*c)->ExecSync(Sh("sleep 1000 >/dev/null 2>&1 & echo started"), kWait);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->stdout(), "started\n");
    // Its shell is gone: the sleep is an orphan, PID 1's child now.
    std::vector<pid_t> orphans = ChildrenOf(agent);
    ASSERT_EQ(orphans.size(), 1u) << "the orphaned sleep is not the agent's child";
    ::kill(orphans[0], SIGKILL);
    ASSERT_TRUE(WaitExited(orphans[0]));
    ::kill(agent, SIGTERM);
    ::kill(agent, SIGINT);
    p = (*c)->PingSync(kWait);  // still there; and a barrier for the reaping
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_TRUE(ChildrenOf(agent).empty()) << "orphan " << orphans[0] << " not reaped: " << ProcState(orphans[0]);
  }
  ::kill(unshare, SIGKILL);  // --kill-child: the agent gets SIGKILL too
  ::waitpid(unshare, nullptr, 0);
  EXPECT_TRUE(WaitExited(agent));
  RunProcess({"/bin/rm", "-rf", dir});
}

}  // namespace
}  // namespace dsec::testing

namespace dsec::testing {
namespace {

// --vport: the fd is a VM's virtio-serial port, which outlives its host
// side. Each host starts with a sync (drivers/agent/channel_sync.hpp); what
// came before it is skipped, and a sync where a frame would start, or a
// length no frame can have, starts over.
std::string SyncMsg(const char (&marker)[8], const std::string& nonce) { return std::string(marker, 8) + nonce; }

// Reads from `fd` until `want` has been seen; false after 20 s or EOF.
bool ReadUntil(int fd, const std::string& want) {
  std::string got;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.find(want) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
  }
  return got.find(want) != std::string::npos;
}

void PingRaw(int fd, uint64_t id) {
  agent::Request req;
  req.set_id(id);
  req.mutable_ping();
  ASSERT_EQ(WriteFrame(fd, req.SerializeAsString()), 0);
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 20000), 1) << "no answer to ping " << id;
  std::string frame;
  ASSERT_EQ(ReadFrame(fd, &frame), 0) << "no answer to ping " << id;
  agent::Event ev;
  ASSERT_TRUE(ev.ParseFromString(frame));
  EXPECT_EQ(ev.id(), id);
  EXPECT_TRUE(ev.has_pong());
}

TEST(AgentVportTest, EachHostStartsWithASyncAndWhatCameBeforeIsSkipped) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = SpawnAgent({BinDir() + "/dsec-agent", "--fd", "3", "--vport"}, false, sv[1]);
  ::close(sv[1]);
  ASSERT_GT(pid, 0);
  UniqueFd host(sv[0]);
  // The tail of a dead host's frame, then a new host's sync.
  std::string stale("\x10\x00\x00\x00half a frame", 16);
  ASSERT_EQ(WriteFull(host.get(), stale.data(), stale.size()), 0);
  ASSERT_EQ(WriteFull(host.get(), SyncMsg(agent::kSyncAsk, "nonce001").data(), 16), 0);
  ASSERT_TRUE(ReadUntil(host.get(), SyncMsg(agent::kSyncAnswer, "nonce001")));
  PingRaw(host.get(), 1);
  // A sync where a frame would start: a new conversation.
  ASSERT_EQ(WriteFull(host.get(), SyncMsg(agent::kSyncAsk, "nonce002").data(), 16), 0);
  ASSERT_TRUE(ReadUntil(host.get(), SyncMsg(agent::kSyncAnswer, "nonce002")));
  PingRaw(host.get(), 2);
  // A length no frame can have: skipped up to the next sync.
  std::string bad("\xff\xff\xff\x7fgarbage", 11);
  ASSERT_EQ(WriteFull(host.get(), bad.data(), bad.size()), 0);
  ASSERT_EQ(WriteFull(host.get(), SyncMsg(agent::kSyncAsk, "nonce003").data(), 16), 0);
  ASSERT_TRUE(ReadUntil(host.get(), SyncMsg(agent::kSyncAnswer, "nonce003")));
  PingRaw(host.get(), 3);
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// The host side: ConnectChannel skips what the channel holds from before
// (a frame the agent was sending to a dsecd that died) up to the answer to
// its own sync.
TEST(AgentVportTest, ConnectChannelSkipsStaleBytesUpToItsAnswer) {
  char tmpl[] = "/tmp/dsec-test-vport-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string path = std::string(tmpl) + "/ch";
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 1), 0);
  auto client = std::async(std::launch::async, [&] { return AgentClient::ConnectChannel(path, 20000); });
  UniqueFd vm(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(vm);
  std::string stale("\x20\x00\x00\x00stale output of an exec", 27);
  ASSERT_EQ(WriteFull(vm.get(), stale.data(), stale.size()), 0);
  pid_t pid = SpawnAgent({BinDir() + "/dsec-agent", "--fd", "3", "--vport"}, false, vm.get());
  vm.Reset();
  ASSERT_GT(pid, 0);
  auto c = client.get();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto r = (*c)->ExecSync(Cmd({"echo", "synced"}), kWait);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "synced\n");
  c->reset();
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::unlink(path.c_str());
  ::rmdir(tmpl);
}

}  // namespace
}  // namespace dsec::testing

namespace dsec::testing {
namespace {

// A host that went away mid-frame without the agent seeing a hang-up: the
// new host's repeated asks land in that frame's body, and two in a row at
// its end start a new conversation.
TEST(AgentVportTest, AsksRepeatedInsideAFrameCutShortStartANewConversation) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = SpawnAgent({BinDir() + "/dsec-agent", "--fd", "3", "--vport"}, false, sv[1]);
  ::close(sv[1]);
  ASSERT_GT(pid, 0);
  UniqueFd host(sv[0]);
  ASSERT_EQ(WriteFull(host.get(), SyncMsg(agent::kSyncAsk, "nonce001").data(), 16), 0);
  ASSERT_TRUE(ReadUntil(host.get(), SyncMsg(agent::kSyncAnswer, "nonce001")));
  // The old host's last frame: a length of 1 MiB, then only 10 bytes.
  std::string cut("\x00\x00\x10\x00" "0123456789", 14);
  ASSERT_EQ(WriteFull(host.get(), cut.data(), cut.size()), 0);
  ASSERT_EQ(WriteFull(host.get(), SyncMsg(agent::kSyncAsk, "nonce002").data(), 16), 0);
  ASSERT_EQ(WriteFull(host.get(), SyncMsg(agent::kSyncAsk, "nonce003").data(), 16), 0);
  ASSERT_TRUE(ReadUntil(host.get(), SyncMsg(agent::kSyncAnswer, "nonce003")));
  PingRaw(host.get(), 7);
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
}

}  // namespace
}  // namespace dsec::testing
