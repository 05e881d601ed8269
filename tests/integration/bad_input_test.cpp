// Bad input gets a clear error and changes nothing else: malformed and unknown
// console commands, wrong tokens, unknown ids, oversized requests, garbage on
// the SDK port. The daemon keeps serving throughout.
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "wire/wire.hpp"
#include "sdk/src/client_agent.hpp"
#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

class BadInput : public DaemonTest {
 protected:
  void TearDown() override {
    if (!client_) return;
    // Whatever the test threw at it, the daemon still serves both doors.
    auto status = daemon_->Admin("status");
    EXPECT_TRUE(status.value("ok", false)) << status.dump();
    auto r = client_->Run(FncallSpec(), Command({"echo", "still here"}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->stdout(), "still here\n");
  }
  static json Parse(const std::string& line) { return json::parse(line, nullptr, false); }
};

TEST_F(BadInput, ConsoleCommandsBeforeAuthAreRefused) {
  ConsoleConn c(daemon_->admin_addr());
  ASSERT_TRUE(c.ok());
  c.Send("status\n");
  auto j = Parse(c.ReadLine());
  EXPECT_FALSE(j.value("ok", true));
  EXPECT_THAT(j.value("error", ""), HasSubstr("AUTH"));
}

TEST_F(BadInput, ConsoleWrongTokenThreeTimesClosesTheConnection) {
  // From another loopback address: the wrong tokens slow that one down.
  ConsoleConn c(daemon_->admin_addr(), "127.0.0.2");
  for (int i = 0; i < 3; ++i) {
    c.Send("AUTH wrong-token-" + std::to_string(i) + "\n");
    auto j = Parse(c.ReadLine());
    EXPECT_FALSE(j.value("ok", true));
    EXPECT_THAT(j.value("error", ""), HasSubstr("wrong token"));
  }
  EXPECT_EQ(c.ReadLine(2000), "");
  EXPECT_TRUE(c.closed());
}

// Wrong tokens slow their address down, over any number of connections:
// after three, every AUTH from it is refused unchecked (the right token
// too) for a second, then two, ...; another address is not held up, and
// once the wait is over the right token gets in and clears it.
TEST_F(BadInput, RepeatedWrongTokensSlowTheirAddressDownAndNoOther) {
  const std::string guesser = "127.0.0.3";
  auto auth = [&](const std::string& from, const std::string& token) {
    ConsoleConn c(daemon_->admin_addr(), from);
    EXPECT_TRUE(c.ok()) << "cannot connect from " << from;
    c.Send("AUTH " + token + "\n");
    return Parse(c.ReadLine());
  };
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    auto j = auth(guesser, "guess-" + std::to_string(i));  // a connection each
    EXPECT_THAT(j.value("error", ""), HasSubstr("wrong token")) << j.dump();
  }
  auto held = auth(guesser, daemon_->Token());
  EXPECT_FALSE(held.value("ok", true)) << "the right token got in during the wait: " << held.dump();
  EXPECT_THAT(held.value("error", ""), HasSubstr("too many wrong tokens from " + guesser));
  EXPECT_THAT(held.value("error", ""), HasSubstr("refused for another 1 s"));
  EXPECT_TRUE(auth("127.0.0.1", daemon_->Token()).value("ok", false)) << "another address was held up";
  // The wait (1 s) ends; the right token then gets in.
  nlohmann::json in;
  while (!(in = auth(guesser, daemon_->Token())).value("ok", false) &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the wait under test is a time
  EXPECT_TRUE(in.value("ok", false)) << in.dump();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900)) << "no wait at all";
  // Cleared: a wrong token again starts from the free ones.
  EXPECT_THAT(auth(guesser, "guess-again").value("error", ""), HasSubstr("wrong token"));
  EXPECT_TRUE(auth(guesser, daemon_->Token()).value("ok", false));
}

TEST_F(BadInput, ConsoleUnknownAndMalformedCommandsGetErrors) {
  ConsoleConn c(daemon_->admin_addr());
  c.Send("AUTH " + daemon_->Token() + "\n");
  ASSERT_TRUE(Parse(c.ReadLine()).value("ok", false));
  c.Send("frobnicate now\n");
  auto j = Parse(c.ReadLine());
  EXPECT_FALSE(j.value("ok", true));
  EXPECT_THAT(j.value("error", ""), HasSubstr("unknown command"));
  // Binary garbage, invalid UTF-8 included, is an unknown command too.
  const char raw[] = "\xff\xfe\x01\x02\x80zz\x00q\n";
  c.Send(std::string(raw, sizeof raw - 1));
  j = Parse(c.ReadLine());
  ASSERT_FALSE(j.is_discarded());
  EXPECT_FALSE(j.value("ok", true));
  c.Send("inspect\n");
  EXPECT_THAT(Parse(c.ReadLine()).value("error", ""), HasSubstr("usage"));
  c.Send("inspect \xff\xfe\n");
  j = Parse(c.ReadLine());
  ASSERT_FALSE(j.is_discarded());
  EXPECT_FALSE(j.value("ok", true));
}

TEST_F(BadInput, ConsoleUnknownIdsGetErrors) {
  for (const char* cmd : {"inspect sb-nope", "kill sb-nope", "kill run-0-0"}) {
    auto j = daemon_->Admin(cmd);
    EXPECT_FALSE(j.value("ok", true)) << cmd;
    EXPECT_THAT(j.value("error", ""), HasSubstr("no sandbox, session or run")) << cmd;
  }
}

TEST_F(BadInput, ConsoleOverlongLineIsRefusedAndClosed) {
  ConsoleConn c(daemon_->admin_addr());
  c.Send(std::string(100000, 'x') + "\n");
  auto j = Parse(c.ReadLine());
  EXPECT_THAT(j.value("error", ""), HasSubstr("line too long"));
  EXPECT_EQ(c.ReadLine(2000), "");
  EXPECT_TRUE(c.closed());
}

TEST_F(BadInput, ConsolePipelinedCommandsAnswerInOrder) {
  ConsoleConn c(daemon_->admin_addr());
  c.Send("AUTH " + daemon_->Token() + "\nstatus\nnope\nstats\n");
  EXPECT_EQ(Parse(c.ReadLine()).value("auth", ""), "ok");
  EXPECT_EQ(Parse(c.ReadLine()).value("role", ""), "all");
  EXPECT_THAT(Parse(c.ReadLine()).value("error", ""), HasSubstr("unknown command"));
  EXPECT_TRUE(Parse(c.ReadLine()).contains("runs"));
}

TEST_F(BadInput, OversizedStdinIsRefusedWithTheLimit) {
  v1::ExecRequest req = Command({"cat"});
  req.set_stdin(std::string(17 << 20, 'x'));
  auto r = client_->Run(FncallSpec(), req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("stdin"));
  EXPECT_THAT(r.status().message(), HasSubstr("maximum"));
}

TEST_F(BadInput, EmptyArgvIsRefused) {
  auto r = client_->Run(FncallSpec(), v1::ExecRequest());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("argv is empty"));
}

TEST_F(BadInput, LimitsOutOfRangeAreRefusedNamingTheField) {
  v1::ExecRequest req = Command({"true"});
  req.mutable_limits()->set_memory_bytes(1024);
  auto r = client_->Run(FncallSpec(), req);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("memory_bytes"));
  req.mutable_limits()->set_memory_bytes(0);
  req.mutable_limits()->set_pids(10'000'000);
  r = client_->Run(FncallSpec(), req);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("pids"));
}

TEST_F(BadInput, UnknownImageIsRefused) {
  v1::SandboxSpec spec = FncallSpec();
  spec.set_image("py311");
  auto r = client_->Run(spec, Command({"true"}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("py311"));
}

TEST_F(BadInput, BadSessionNamesAreRefused) {
  // Spaces, quotes and the like: the console could neither inspect nor
  // kill such a session (it splits its lines on spaces).
  for (std::string name : {std::string(), std::string("tab\there"), std::string(600, 'n'), std::string("bad name"),
                           std::string("quote'd"), std::string("-dash/first"), std::string("/abs/name")}) {
    auto s = client_->OpenSession(name, FncallSpec());
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_EQ(s.status().code(), Status::Code::kInvalidArgument);
  }
}

TEST_F(BadInput, UnknownSandboxIdsAreNotFound) {
  v1::ExecRequest req = Command({"true"});
  req.set_sandbox_id("sb-000000000000");
  auto sb = client_->Attach("sb-000000000000");
  EXPECT_EQ(sb.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(sb.status().message(), HasSubstr("sb-000000000000"));
}

TEST_F(BadInput, GarbageOnTheSdkPortDoesNotHurt) {
  auto colon = daemon_->sdk_addr().rfind(':');
  int port = std::stoi(daemon_->sdk_addr().substr(colon + 1));
  std::mt19937 rng(42);
  for (int round = 0; round < 5; ++round) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    std::string junk(4096 * (round + 1), '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    // The junk did reach the daemon (TearDown checks it still serves).
    EXPECT_GT(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), 0) << round << ": " << std::strerror(errno);
    ::close(fd);
  }
}

// A batch of annotations straight on the wire (as the SDK sends them): each
// call is answered under its own id, bad ones with their own error; a batch
// over the limit is refused call by call and changes nothing.
TEST_F(BadInput, AnnotateBatchesAnswerEachCallAndRefuseOversizedOnes) {
  auto s = client_->OpenSession("batch/p/0", FncallSpec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Step(0, Command({"true"})).ok());
  caf::actor_system_config cfg;
  ConfigureCaf(cfg, CafOptions{});
  caf::actor_system sys{cfg};
  auto colon = daemon_->sdk_addr().rfind(':');
  auto entry = sdk::ConnectEntry(sys, daemon_->sdk_addr().substr(0, colon),
                                 static_cast<uint16_t>(std::stoi(daemon_->sdk_addr().substr(colon + 1))),
                                 daemon_->SdkToken(), std::chrono::seconds(5));
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  caf::scoped_actor self{sys};
  // Collects the results for `want` calls (or fails after 30 s).
  auto collect = [&](size_t want) {
    std::map<uint64_t, v1::StepReply> got;
    bool timed_out = false;
    while (got.size() < want && !timed_out) {
      self->receive([&](v1::AnnotateResults& rs) {
                      for (auto& r : *rs.mutable_results()) got[r.call_id()] = std::move(*r.mutable_reply());
                    },
                    caf::after(std::chrono::seconds(30)) >> [&] { timed_out = true; });
    }
    EXPECT_FALSE(timed_out) << got.size() << " of " << want << " results";
    return got;
  };
  v1::AnnotateBatch mixed;
  auto add = [](v1::AnnotateBatch* b, uint64_t id, const std::string& session, uint64_t index) {
    auto* c = b->add_calls();
    c->set_call_id(id);
    c->mutable_request()->set_session(session);
    c->mutable_request()->set_index(index);
    c->mutable_request()->mutable_meta()->set_reward(1.5);
  };
  add(&mixed, 11, "batch/p/0", 0);
  add(&mixed, 12, "batch/p/0", 9);
  add(&mixed, 13, "batch/nobody/0", 0);
  self->send(*entry, mixed);
  auto got = collect(3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[11].status().code(), v1::Status::OK) << got[11].status().message();
  EXPECT_DOUBLE_EQ(got[11].step().meta().reward(), 1.5);
  EXPECT_EQ(got[12].status().code(), v1::Status::NOT_FOUND);
  EXPECT_THAT(got[12].status().message(), HasSubstr("not in the log"));
  EXPECT_EQ(got[13].status().code(), v1::Status::NOT_FOUND);
  EXPECT_THAT(got[13].status().message(), HasSubstr("batch/nobody/0"));

  v1::AnnotateBatch huge;
  for (uint64_t i = 0; i < 4097; ++i) add(&huge, 100 + i, "batch/p/0", 0);
  huge.mutable_calls(0)->mutable_request()->mutable_meta()->set_reward(99);
  self->send(*entry, huge);
  got = collect(4097);
  ASSERT_EQ(got.size(), 4097u);
  for (const auto& [id, reply] : got) {
    ASSERT_EQ(reply.status().code(), v1::Status::INVALID_ARGUMENT) << id;
    ASSERT_THAT(reply.status().message(), HasSubstr("over the limit of 4096"));
  }
  auto logged = s->Steps();
  ASSERT_TRUE(logged.ok()) << logged.status().ToString();
  EXPECT_DOUBLE_EQ(logged->steps(0).meta().reward(), 1.5) << "the refused batch changed nothing";
  EXPECT_TRUE(s->Close().ok());
}

}  // namespace
}  // namespace dsec::testing
