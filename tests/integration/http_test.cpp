// dsecd's HTTP endpoint (--http): /metrics counts what happened on the node
// (creations, live sandboxes by kind and phase, exec and step latencies,
// its memory and CPU) in Prometheus' text format; /status.json lists the
// node and its sandboxes; / is the status page, self-contained; anything
// else gets a clear error and changes nothing.
#include <gmock/gmock.h>

#include <string>

#include "tests/support/container_fixture.hpp"
#include "tests/support/http_probe.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class HttpEndpoint : public ContainerTest {
 protected:
  std::map<std::string, double> Scrape() {
    auto r = HttpGet(daemon_->http_addr(), "/metrics");
    EXPECT_EQ(r.code, 200) << r.raw;
    EXPECT_THAT(r.headers["content-type"], HasSubstr("text/plain; version=0.0.4"));
    std::string bad;
    auto m = ParseMetrics(r.body, &bad);
    EXPECT_TRUE(bad.empty()) << "lines that are not samples:\n" << bad;
    // Every family is described.
    std::istringstream in(r.body);
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      std::string family = line.substr(0, line.find_first_of("{ "));
      for (const char* suffix : {"_bucket", "_sum", "_count"})
        if (r.body.find("# TYPE " + family + " ") == std::string::npos && family.size() > std::strlen(suffix) &&
            family.compare(family.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
          family.resize(family.size() - std::strlen(suffix));
      EXPECT_NE(r.body.find("# TYPE " + family + " "), std::string::npos) << "no TYPE line for " << family;
    }
    return m;
  }
  static double Get(const std::map<std::string, double>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? 0 : it->second;
  }
};

TEST_F(HttpEndpoint, MetricsCountCreationsLiveSandboxesLatenciesAndTheHost) {
  auto before = Scrape();
  auto a = Make(), b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  ASSERT_TRUE(b->Pause().ok());
  for (int i = 0; i < 3; ++i) ASSERT_EQ(ShIn(*a, "true").verdict(), v1::VERDICT_OK);
  for (int i = 0; i < 2; ++i) {
    auto run = client_->Run(FncallSpec(), Command({"true"}));
    ASSERT_TRUE(run.ok()) << run.status().ToString();
  }
  auto session = client_->OpenSession("metrics-" + std::to_string(::getpid()), ContainerSpec(kImage));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  ASSERT_TRUE(session->Step(0, Command({"true"})).ok());
  auto after = Scrape();

  auto delta = [&](const std::string& key) { return Get(after, key) - Get(before, key); };
  // The session's agent sandbox is a container too.
  EXPECT_EQ(delta("dsec_sandboxes_created_total{kind=\"container\"}"), 3);
  EXPECT_EQ(delta("dsec_sandboxes{kind=\"container\",phase=\"running\"}"), 2);
  EXPECT_EQ(delta("dsec_sandboxes{kind=\"container\",phase=\"paused\"}"), 1);
  EXPECT_EQ(delta("dsec_exec_seconds_count{kind=\"container\"}"), 4) << "3 execs and the step's";
  EXPECT_EQ(delta("dsec_exec_seconds_count{kind=\"fncall\"}"), 2);
  EXPECT_EQ(delta("dsec_step_seconds_count"), 1);
  EXPECT_EQ(delta("dsec_placement_seconds_count"), 3);
  // Buckets are cumulative: +Inf holds them all.
  EXPECT_EQ(Get(after, "dsec_exec_seconds_bucket{kind=\"container\",le=\"+Inf\"}"),
            Get(after, "dsec_exec_seconds_count{kind=\"container\"}"));
  EXPECT_LE(Get(after, "dsec_exec_seconds_bucket{kind=\"container\",le=\"0.001\"}"),
            Get(after, "dsec_exec_seconds_bucket{kind=\"container\",le=\"60\"}"));
  EXPECT_GT(Get(after, "dsec_node_memory_bytes{state=\"total\"}"), 0);
  EXPECT_GT(Get(after, "dsec_node_cpus"), 0);
  EXPECT_GT(Get(after, "dsec_process_resident_memory_bytes"), 0);
  std::string node = daemon_->Admin("status").value("node", "");
  EXPECT_EQ(Get(after, "dsec_node_info{node=\"" + node + "\",role=\"all\",version=\"" DSEC_VERSION "\"}"), 1);

  // Destroyed: no longer live; still created.
  Destroy(*a);
  Destroy(*b);
  auto gone = Scrape();
  EXPECT_EQ(Get(gone, "dsec_sandboxes{kind=\"container\",phase=\"running\"}") -
                Get(before, "dsec_sandboxes{kind=\"container\",phase=\"running\"}"),
            1)
      << "the session's sandbox is still running";
  EXPECT_EQ(Get(gone, "dsec_sandboxes{kind=\"container\",phase=\"paused\"}"),
            Get(before, "dsec_sandboxes{kind=\"container\",phase=\"paused\"}"));
  EXPECT_EQ(Get(gone, "dsec_sandboxes_created_total{kind=\"container\"}"),
            Get(after, "dsec_sandboxes_created_total{kind=\"container\"}"));
  ASSERT_TRUE(session->Close().ok());
}

TEST_F(HttpEndpoint, StatusJsonListsTheNodeItsLoadAndItsSandboxes) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = HttpGet(daemon_->http_addr(), "/status.json");
  ASSERT_EQ(r.code, 200) << r.raw;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.body;
  ASSERT_EQ(j["nodes"].size(), 1u);
  const auto& n = j["nodes"][0];
  EXPECT_EQ(n.value("node", ""), daemon_->Admin("status").value("node", ""));
  EXPECT_EQ(n.value("http", ""), daemon_->http_addr());
  EXPECT_GT(n["memory"].value("total", 0ull), 0ull);
  bool listed = false;
  for (const auto& s : n["sandbox_list"])
    if (s.value("id", "") == sb->id()) {
      listed = true;
      EXPECT_EQ(s.value("kind", ""), "container");
      EXPECT_EQ(s.value("phase", ""), "running");
    }
  EXPECT_TRUE(listed) << sb->id() << " is not in " << r.body;
  Destroy(*sb);
}

TEST_F(HttpEndpoint, TheStatusPageIsOneDocumentWithNothingFetchedFromElsewhere) {
  auto r = HttpGet(daemon_->http_addr(), "/");
  ASSERT_EQ(r.code, 200) << r.raw;
  EXPECT_EQ(r.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_THAT(r.body, HasSubstr("<script>"));
  EXPECT_THAT(r.body, HasSubstr("/status.json"));
  for (const char* external : {"src=", "href=", "http://", "https://", "@import", "url("})
    EXPECT_THAT(r.body, Not(HasSubstr(external))) << "the page loads something from elsewhere";
  auto head = HttpGet(daemon_->http_addr(), "/", "HEAD");
  EXPECT_EQ(head.code, 200);
  EXPECT_EQ(head.body, "") << "HEAD has no body";
  EXPECT_EQ(head.headers["content-length"], std::to_string(r.body.size()));
}

TEST_F(HttpEndpoint, BadRequestsGetAClearErrorAndChangeNothing) {
  int port = HttpPort(daemon_->http_addr());
  auto before = daemon_->Admin("ls");
  struct Case {
    std::string request;
    int code;
    std::string says;
  };
  const Case cases[] = {
      {"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405, "it takes GET, HEAD"},
      {"GET /nope HTTP/1.1\r\n\r\n", 404, "/metrics"},
      {"GET /metrics HTTP/2.0\r\n\r\n", 505, "HTTP/1.0 and HTTP/1.1"},
      {"hello there\r\n\r\n", 400, "not a well-formed HTTP request"},
      {"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400, "not a well-formed HTTP request"},
      {"GET /metrics HTTP/1.1\r\nX-Big: " + std::string(9000, 'a') + "\r\n\r\n", 431, "8 KiB"},
      {"GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n", 431, "8 KiB"},
      {"GET /metrics HTTP/1.1\r\nHost: x", 400, "ended before its head did"},
  };
  for (const auto& c : cases) {
    // The last one: the client closes its side with the head unfinished.
    bool half = c.request.find("\r\n\r\n") == std::string::npos;
    HttpReply r;
    if (half) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
      ASSERT_EQ(::send(fd, c.request.data(), c.request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(c.request.size()));
      ::shutdown(fd, SHUT_WR);
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) r.raw.append(buf, static_cast<size_t>(n));
      ::close(fd);
      r.code = r.raw.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(r.raw.c_str() + 9) : 0;
      r.body = r.raw.substr(r.raw.find("\r\n\r\n") + 4);
    } else {
      r = HttpExchange(port, c.request);
    }
    EXPECT_EQ(r.code, c.code) << c.request.substr(0, 60) << " -> " << r.raw.substr(0, 200);
    EXPECT_THAT(r.body, HasSubstr(c.says)) << c.request.substr(0, 60);
  }
  auto allow = HttpExchange(port, "DELETE / HTTP/1.1\r\n\r\n");
  EXPECT_EQ(allow.headers["allow"], "GET, HEAD");
  // Nothing changed, and the endpoint still answers.
  auto after = daemon_->Admin("ls");
  EXPECT_EQ(after["sandboxes"], before["sandboxes"]);
  auto metrics = HttpGet(daemon_->http_addr(), "/metrics");
  EXPECT_EQ(metrics.code, 200);
  // What the door refused (a head it could not parse), and what the server
  // answered with an error (unknown path, wrong method).
  auto stats = daemon_->Admin("stats");
  EXPECT_GE(stats["http_door"].value("rejected", 0), 6) << stats.dump();
  EXPECT_THAT(metrics.body, HasSubstr("dsec_http_bad_requests_total 3\n"));
}

}  // namespace
}  // namespace dsec::testing
