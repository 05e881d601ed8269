// dsecd --tls: every trainer's and node's connection is a TLS session of
// CAF's OpenSSL module after the door's handshake. A recording proxy sits
// between the peers and shows what crosses the wire: the door's bytes, then
// TLS records, and none of what was sent (a command's text, a node's id).
// A node without --tls cannot join a controller with it (and says why);
// with certificates, a client without one of the same CA is refused.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "harness/daemon.hpp"
#include "runtime/files.hpp"
#include "tests/support/cluster_probes.hpp"
#include "tests/support/daemon_fixture.hpp"
#include "tests/support/host_probes.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A TCP proxy on an ephemeral loopback port to `target` that keeps every
// byte it relays, each direction apart, per connection. Stopped (its
// sockets closed, its threads joined) by its destructor.
class RecordingProxy {
 public:
  explicit RecordingProxy(const std::string& target) {
    auto colon = target.rfind(':');
    target_port_ = static_cast<uint16_t>(std::stoi(target.substr(colon + 1)));
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listener_, 16);
    socklen_t len = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (::pipe2(stop_, O_CLOEXEC) != 0) stop_[0] = stop_[1] = -1;
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~RecordingProxy() {
    if (stop_[1] >= 0) (void)!::write(stop_[1], "x", 1);
    acceptor_.join();
    for (auto& t : relays_) t.join();
    ::close(listener_);
    for (int fd : stop_) ::close(fd);
  }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

  struct Stream {
    std::string up, down;  // client to server, server to client
  };
  std::vector<Stream> streams() {
    std::lock_guard<std::mutex> lk(mu_);
    return streams_;
  }
  std::string everything() {
    std::string all;
    for (const auto& s : streams()) all += s.up + s.down;
    return all;
  }

 private:
  void Accept() {
    for (;;) {
      pollfd p[2] = {{listener_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(p, 2, -1) < 0 && errno == EINTR) continue;
      if (p[1].revents) return;
      int c = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(target_port_);
      if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(c);
        ::close(s);
        continue;
      }
      size_t index;
      {
        std::lock_guard<std::mutex> lk(mu_);
        index = streams_.size();
        streams_.emplace_back();
      }
      relays_.emplace_back([this, c, s, index] { Relay(c, s, index); });
    }
  }
  // Both directions until either side closes or the proxy stops.
  void Relay(int c, int s, size_t index) {
    char buf[65536];
    for (;;) {
      pollfd p[3] = {{c, POLLIN, 0}, {s, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(p, 3, -1) < 0 && errno == EINTR) continue;
      if (p[2].revents) break;
      int from = p[0].revents ? c : s, to = from == c ? s : c;
      ssize_t n = ::read(from, buf, sizeof buf);
      if (n <= 0) break;
      {
        std::lock_guard<std::mutex> lk(mu_);
        (from == c ? streams_[index].up : streams_[index].down).append(buf, static_cast<size_t>(n));
      }
      for (ssize_t off = 0; off < n;) {
        ssize_t w = ::write(to, buf + off, static_cast<size_t>(n - off));
        if (w <= 0) break;
        off += w;
      }
    }
    ::close(c);
    ::close(s);
  }

  int listener_ = -1, stop_[2] = {-1, -1};
  uint16_t port_ = 0, target_port_ = 0;
  std::thread acceptor_;
  std::vector<std::thread> relays_;
  std::mutex mu_;
  std::vector<Stream> streams_;
};

// The door's bytes (door_auth.hpp): challenge 40, response 72, verdict 8 + 32.
constexpr size_t kChallenge = 40, kResponse = 72, kVerdict = 8 + 32;

bool IsTlsHandshakeRecord(const std::string& bytes, size_t at) {
  return bytes.size() > at + 2 && static_cast<uint8_t>(bytes[at]) == 0x16 && bytes[at + 1] == 0x03;
}

class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto gap = FncallHostGap(); !gap.empty()) GTEST_SKIP() << gap;
  }
  // A dsecd (role all unless `o` says otherwise) with `flags` added.
  std::unique_ptr<TestDaemon> Start(std::vector<std::string> flags, TestDaemonOptions o = {}) {
    o.extra_args.insert(o.extra_args.end(), flags.begin(), flags.end());
    auto d = TestDaemon::Start(o);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(*d) : nullptr;
  }
  // The tests' certificates: a CA, and a certificate of it for dsecd, nodes
  // and clients alike (they are checked against the CA, not by name).
  std::string MakeCertificates() {
    if (HostTool("openssl").empty()) return "no openssl command (apt-get install openssl; scripts/dev does)";
    char tmpl[] = "/tmp/dsec-test-tls-XXXXXX";
    if (!::mkdtemp(tmpl)) return "mkdtemp";
    certs_ = tmpl;
    auto run = [&](std::vector<std::string> argv) {
      argv.insert(argv.begin(), HostTool("openssl"));
      auto r = RunProcess(argv);
      return r.exit_code == 0 ? std::string() : "openssl " + argv[1] + ": " + r.err;
    };
    for (const std::string& ca : {std::string("ca"), std::string("other-ca")}) {
      if (auto e = run({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=dsec test " + ca,
                        "-keyout", certs_ + "/" + ca + ".key", "-out", certs_ + "/" + ca + ".pem"});
          !e.empty())
        return e;
    }
    for (const std::string& who : {std::string("peer"), std::string("stranger")}) {
      std::string ca = who == "peer" ? "ca" : "other-ca";
      if (auto e = run({"req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=dsec test " + who, "-keyout",
                        certs_ + "/" + who + ".key", "-out", certs_ + "/" + who + ".csr"});
          !e.empty())
        return e;
      if (auto e = run({"x509", "-req", "-days", "2", "-in", certs_ + "/" + who + ".csr", "-CA", certs_ + "/" + ca + ".pem",
                        "-CAkey", certs_ + "/" + ca + ".key", "-CAcreateserial", "-out", certs_ + "/" + who + ".pem"});
          !e.empty())
        return e;
    }
    return "";
  }
  // A trainer of `d` connected through `proxy` runs `echo marker`, and is gone.
  void EchoThrough(RecordingProxy& proxy, const TestDaemon& d, const std::string& marker) {
    ClientOptions co = ClientOptionsFor(d);
    co.address = proxy.addr();
    auto client = Client::Connect(co);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto r = (*client)->Run(FncallSpec(), Command({"/bin/echo", marker}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->stdout(), marker + "\n");
  }
  void TearDown() override {
    if (!certs_.empty()) RunProcess({"/bin/rm", "-rf", certs_});
  }
  std::string certs_;
};

// A trainer's connection to a dsecd with --tls, through the proxy: the
// door's handshake in the clear (its challenge says TLS), then TLS records
// from both ends, and the command and its output nowhere in the bytes.
TEST_F(Tls, ATrainersConnectionIsTlsAfterTheDoor) {
  auto d = Start({"--tls"});
  ASSERT_TRUE(d);
  RecordingProxy proxy(d->sdk_addr());
  const std::string marker = "tls-marker-" + std::to_string(::getpid());
  ASSERT_NO_FATAL_FAILURE(EchoThrough(proxy, *d, marker));
  auto streams = proxy.streams();
  ASSERT_FALSE(streams.empty());
  const auto& s = streams[0];
  ASSERT_GT(s.down.size(), kChallenge + kVerdict);
  ASSERT_GT(s.up.size(), kResponse);
  EXPECT_EQ(s.down.substr(0, 4), "dsec");
  EXPECT_EQ(static_cast<uint8_t>(s.down[6]), 1) << "the challenge says TLS (kFlagTls)";
  EXPECT_TRUE(IsTlsHandshakeRecord(s.up, kResponse)) << "the client's first bytes after the door: a ClientHello";
  EXPECT_TRUE(IsTlsHandshakeRecord(s.down, kChallenge + kVerdict)) << "dsecd's first bytes after the door";
  EXPECT_EQ(proxy.everything().find(marker), std::string::npos) << "the command crossed the wire in the clear";
  EXPECT_EQ(proxy.everything().find("dsec.v1."), std::string::npos) << "BASP's type names crossed in the clear";
}

// Trainers that leave without a TLS goodbye (CAF closes the socket under
// the session) leave OpenSSL errors on dsecd's I/O thread: the other
// trainers' connections go on as before, none dropped.
TEST_F(Tls, ATrainerThatLeavesDoesNotDropTheOthers) {
  auto d = Start({"--tls"});
  ASSERT_TRUE(d);
  std::unique_ptr<Client> stays;
  ASSERT_EQ(ConnectClient(*d, &stays), "");
  ASSERT_TRUE(stays->Run(FncallSpec(), Command({"/bin/true"})).ok());
  for (int i = 0; i < 5; ++i) {
    std::unique_ptr<Client> leaves;
    ASSERT_EQ(ConnectClient(*d, &leaves), "");
    ASSERT_TRUE(leaves->Run(FncallSpec(), Command({"/bin/true"})).ok());
    leaves.reset();
    for (int k = 0; k < 3; ++k) {
      auto r = stays->Run(FncallSpec(), Command({"/bin/echo", std::to_string(k)}));
      ASSERT_TRUE(r.ok()) << "after trainer " << i << " left: " << r.status().ToString();
      EXPECT_EQ(r->stdout(), std::to_string(k) + "\n");
    }
  }
  EXPECT_EQ(stays->connections(), 1u) << "the staying trainer's connection was dropped and made again";
}

// Without --tls the same bytes are plain BASP: the proxy sees the command
// (the test above would notice a TLS that is not there).
TEST_F(Tls, WithoutTlsTheProxySeesTheCommand) {
  auto d = Start({});
  ASSERT_TRUE(d);
  RecordingProxy proxy(d->sdk_addr());
  const std::string marker = "plain-marker-" + std::to_string(::getpid());
  ASSERT_NO_FATAL_FAILURE(EchoThrough(proxy, *d, marker));
  auto streams = proxy.streams();
  ASSERT_FALSE(streams.empty());
  EXPECT_EQ(static_cast<uint8_t>(streams[0].down[6]), 0);
  EXPECT_NE(proxy.everything().find(marker), std::string::npos);
}

// A controller and a node with --tls: the node joins through the proxy
// (its join, with its id, encrypted); sandboxes placed through the
// controller answer. A node without --tls is not let in, and its log says
// what to do.
TEST_F(Tls, NodesJoinOverTlsAndANodeWithoutItIsToldWhy) {
  TestDaemonOptions co;
  co.role = "controller";
  auto controller = Start({"--tls"}, co);
  ASSERT_TRUE(controller);
  RecordingProxy proxy(controller->cluster_addr());
  TestDaemonOptions no;
  no.extra_args = {"--role", "node", "--join", proxy.addr(), "--cluster-secret", controller->data_dir() + "/cluster.secret"};
  auto node = Start({"--tls"}, no);
  ASSERT_TRUE(node);
  std::string id = node->Admin("status").value("node", "");
  ASSERT_TRUE(WaitUntil([&] { return StateOf(*controller, id) == "up"; }, std::chrono::seconds(20)))
      << controller->Admin("nodes").dump();
  std::unique_ptr<Client> client;
  ASSERT_EQ(ConnectClient(*controller, &client), "");
  const std::string marker = "tls-node-marker-" + std::to_string(::getpid());
  auto r = client->Run(FncallSpec(), Command({"/bin/echo", marker}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), marker + "\n");
  auto streams = proxy.streams();
  ASSERT_FALSE(streams.empty());
  EXPECT_EQ(static_cast<uint8_t>(streams[0].down[6]), 1);
  EXPECT_TRUE(IsTlsHandshakeRecord(streams[0].up, kResponse));
  EXPECT_EQ(proxy.everything().find(id), std::string::npos) << "the node's join crossed the wire in the clear";

  no.extra_args[3] = controller->cluster_addr();
  auto plain = Start({}, no);
  ASSERT_TRUE(plain);
  std::string plain_id = plain->Admin("status").value("node", "");
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto log = ReadFileToString(plain->log_path());
        return log.ok() && log->find("the controller speaks TLS (dsecd --tls): start this node with --tls") !=
                               std::string::npos;
      },
      std::chrono::seconds(20)));
  EXPECT_EQ(StateOf(*controller, plain_id), "") << "a node without TLS joined a controller with it";
}

// Certificates: a client with one of the CA works; one of another CA, or
// none, is refused (the connection fails, saying TLS may be why). dsecd
// refuses to start on a key that is not the certificate's.
TEST_F(Tls, WithCertificatesOnlyPeersOfTheCaGetIn) {
  if (auto why = MakeCertificates(); !why.empty()) {
    if (why.rfind("no openssl", 0) == 0) GTEST_SKIP() << why;
    FAIL() << why;
  }
  auto d = Start({"--tls", "--tls-cert", certs_ + "/peer.pem", "--tls-key", certs_ + "/peer.key", "--tls-ca",
                  certs_ + "/ca.pem"});
  ASSERT_TRUE(d);
  ClientOptions good = ClientOptionsFor(*d);
  good.tls_cert = certs_ + "/peer.pem";
  good.tls_key = certs_ + "/peer.key";
  good.tls_ca = certs_ + "/ca.pem";
  auto client = Client::Connect(good);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto r = (*client)->Run(FncallSpec(), Command({"/bin/echo", "with a certificate"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "with a certificate\n");

  ClientOptions stranger = ClientOptionsFor(*d);
  stranger.connect_timeout = std::chrono::milliseconds(3000);
  stranger.tls_cert = certs_ + "/stranger.pem";
  stranger.tls_key = certs_ + "/stranger.key";
  stranger.tls_ca = certs_ + "/other-ca.pem";
  auto refused = Client::Connect(stranger);
  ASSERT_FALSE(refused.ok()) << "a client of another CA got in";
  EXPECT_THAT(refused.status().message(), HasSubstr("TLS"));
  ClientOptions none = ClientOptionsFor(*d);
  none.connect_timeout = std::chrono::milliseconds(3000);
  auto anonymous = Client::Connect(none);
  ASSERT_FALSE(anonymous.ok()) << "a client without a certificate got in";
  EXPECT_THAT(anonymous.status().message(), HasSubstr("TLS"));
  // The refusals left the good client's connection alone.
  auto after = (*client)->Run(FncallSpec(), Command({"/bin/echo", "still here"}));
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->stdout(), "still here\n");
  EXPECT_EQ((*client)->connections(), 1u);

  ClientOptions bad = ClientOptionsFor(*d);
  bad.tls_cert = certs_ + "/peer.pem";
  bad.tls_key = certs_ + "/stranger.key";
  bad.tls_ca = certs_ + "/ca.pem";
  auto mismatched = Client::Connect(bad);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_THAT(mismatched.status().message(), HasSubstr("does not belong to the certificate"));

  auto wrong = RunProcess({BinDir() + "/dsecd", "--tls", "--tls-cert", certs_ + "/peer.pem", "--tls-key",
                           certs_ + "/stranger.key", "--tls-ca", certs_ + "/ca.pem", "--data-dir", certs_ + "/data"});
  EXPECT_EQ(wrong.exit_code, 2);
  EXPECT_THAT(wrong.out + wrong.err, HasSubstr("does not belong to the certificate"));
}

}  // namespace
}  // namespace dsec::testing
