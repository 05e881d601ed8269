// The HTTP gate's judgement of a request head, byte by byte as it arrives,
// and the metrics' text format (histogram buckets, label escaping).
#include <gmock/gmock.h>

#include <string>

#include "runtime/http_gate.hpp"
#include "runtime/metrics.hpp"

namespace dsec {
namespace {

using ::testing::HasSubstr;

HttpGate Gate() { return HttpGate({"/", "/metrics"}, [](UniqueFd, HttpRequest) {}); }

TEST(HttpGate, AWellFormedGetIsAdmittedOnlyOnceItsHeadIsComplete) {
  HttpGate gate = Gate();
  const std::string req = "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n";
  for (size_t n = 0; n < req.size(); ++n) {
    HttpRequest r;
    EXPECT_EQ(gate.Judge(req.substr(0, n), false, &r).kind, Handshake::Step::kMore) << n << " bytes";
  }
  HttpRequest r;
  auto s = gate.Judge(req, false, &r);
  EXPECT_EQ(s.kind, Handshake::Step::kAdmit);
  EXPECT_EQ(s.consumed, req.size());
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.path, "/metrics");
  HttpRequest h;
  EXPECT_EQ(gate.Judge("HEAD / HTTP/1.0\n\n", false, &h).kind, Handshake::Step::kAdmit);
  EXPECT_EQ(h.method, "HEAD");
}

TEST(HttpGate, WhatIsWrongIsAnsweredAtOnceWithItsStatus) {
  HttpGate gate = Gate();
  struct Case {
    std::string input;
    bool eof;
    int code;
  };
  const Case cases[] = {
      {"PUT / HTTP/1.1\r\n", false, 405},        {"GET /x HTTP/1.1\r\n", false, 404},
      {"GET / HTTP/3\r\n", false, 505},          {"GET / SPDY/1\r\n", false, 400},
      {"get / HTTP/1.1\r\n", false, 400},        {"\x16\x03\x01\x02\x01\r\n", false, 400},
      {"GET / HTTP/1.1\r\n\tfolded\r\n\r\n", false, 400},
      {std::string(HttpGate::kMaxHead, 'G'), false, 431},
      {"GET / HTTP/1.1\r\n" + std::string(HttpGate::kMaxHead, 'h'), false, 431},
      {"GET / HT", true, 400},                   {"GET / HTTP/1.1\r\nA: b\r\n", true, 400},
  };
  for (const auto& c : cases) {
    HttpRequest r;
    auto s = gate.Judge(c.input, c.eof, &r);
    EXPECT_EQ(s.kind, Handshake::Step::kReject) << c.input.substr(0, 40);
    EXPECT_EQ(s.reply.rfind("HTTP/1.1 " + std::to_string(c.code) + " ", 0), 0u) << c.input.substr(0, 40) << " -> "
                                                                                  << s.reply.substr(0, 40);
    EXPECT_THAT(s.reply, HasSubstr("Connection: close"));
  }
  // The gate never asks for more than a head's worth.
  EXPECT_EQ(Gate().Begin("peer", nullptr)->Wants(std::string(HttpGate::kMaxHead, 'x')), 0u);
}

TEST(Metrics, HistogramBucketsAreCumulativeAndLabelsEscaped) {
  metrics::Histogram h;
  for (double s : {0.0005, 0.003, 0.003, 2.0, 100.0}) h.Observe(s);
  std::string out;
  h.Render("t_seconds", metrics::Labels({{"kind", "a\"b\\c"}}), &out);
  EXPECT_THAT(out, HasSubstr("t_seconds_bucket{kind=\"a\\\"b\\\\c\",le=\"0.001\"} 1\n"));
  EXPECT_THAT(out, HasSubstr("le=\"0.005\"} 3\n"));
  EXPECT_THAT(out, HasSubstr("le=\"2.5\"} 4\n"));
  EXPECT_THAT(out, HasSubstr("le=\"60\"} 4\n"));
  EXPECT_THAT(out, HasSubstr("le=\"+Inf\"} 5\n"));
  EXPECT_THAT(out, HasSubstr("t_seconds_count{kind=\"a\\\"b\\\\c\"} 5\n"));
  EXPECT_THAT(out, HasSubstr("t_seconds_sum{kind=\"a\\\"b\\\\c\"} 102.00"));
}

TEST(Metrics, APhaseGaugeCountsItsSandboxOnceWhereItIsAndNowhereOnceGone) {
  auto at = [](const char* phase) {
    return metrics::Sandboxes().At(metrics::Labels({{"kind", "unit"}, {"phase", phase}})).value.load();
  };
  {
    metrics::PhaseGauge g;
    g.Set("unit", "starting");
    EXPECT_EQ(at("starting"), 1);
    g.Set("unit", "running");
    g.Set("unit", "running");
    EXPECT_EQ(at("starting"), 0);
    EXPECT_EQ(at("running"), 1);
  }
  EXPECT_EQ(at("running"), 0);
}

}  // namespace
}  // namespace dsec
