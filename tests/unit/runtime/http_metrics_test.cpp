// The HTTP gate's judgement of a first request head, byte by byte as it arrives,
// and the metrics' text format (histogram buckets, label escaping).
#include <gmock/gmock.h>

#include <string>

#include "runtime/http_gate.hpp"
#include "runtime/metrics.hpp"

namespace dsec {
namespace {

using ::testing::HasSubstr;

HttpGate Gate() { return HttpGate([](UniqueFd, std::string, const std::string&) {}); }

// Feeds `input` to a new connection's judge one byte at a time, as a slow
// peer would send it; the step after the last byte (or the first that is
// not kMore).
Handshake::Step ByteByByte(const std::string& input, bool eof = false, size_t* steps_before = nullptr) {
  auto conn = Gate().Begin("peer", nullptr);
  for (size_t n = 1; n <= input.size(); ++n) {
    auto s = conn->OnInput(input.substr(0, n), eof && n == input.size());
    if (s.kind != Handshake::Step::kMore || n == input.size()) {
      if (steps_before) *steps_before = n;
      return s;
    }
  }
  return conn->OnInput(input, eof);
}

TEST(HttpGate, AWellFormedHeadIsAdmittedOnlyOnceCompleteAndKeptWholeForTheServer) {
  const std::string req = "POST /anything?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n";
  size_t at = 0;
  auto s = ByteByByte(req + "abc", false, &at);
  EXPECT_EQ(s.kind, Handshake::Step::kAdmit);
  EXPECT_EQ(at, req.size()) << "admitted before its head was complete";
  EXPECT_EQ(s.consumed, 0u) << "the server parses the head again: the door must hand all of it over";
  // Methods and paths are the server's to judge; HTTP/1.0 is welcome.
  EXPECT_EQ(ByteByByte("DELETE /x HTTP/1.0\r\n\r\n").kind, Handshake::Step::kAdmit);
}

TEST(HttpGate, WhatIsWrongIsAnsweredAtOnceWithItsStatus) {
  struct Case {
    std::string input;
    bool eof;
    int code;
  };
  const Case cases[] = {
      {"GET / HTTP/2.0\r\n\r\n", false, 505},   {"GET / SPDY/1\r\n\r\n", false, 400},
      {"\x16\x03\x01\x02\x01\r\n", false, 400},   {"GET / HTTP/1.1\r\n\tfolded\r\n\r\n", false, 400},
      {"GET / HTTP/1.1\r\nno colon\r\n\r\n", false, 400},
      {std::string(HttpGate::kMaxHead, 'G'), false, 431},
      {"GET / HTTP/1.1\r\nX: " + std::string(HttpGate::kMaxHead, 'h'), false, 431},
      {"GET / HT", true, 400},                       {"GET / HTTP/1.1\r\nA: b\r\n", true, 400},
  };
  for (const auto& c : cases) {
    auto s = ByteByByte(c.input, c.eof);
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
