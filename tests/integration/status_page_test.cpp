// The status page in a real browser: headless Chromium (Debian's chromium
// package) loads dsecd's / and runs its script, which reads /status.json;
// the DOM it ends with shows the node and the sandboxes on it, and a
// screenshot of it is written where the test's output says (the build
// tree's tests/ dir when ctest runs it).
#include <gmock/gmock.h>
#include <unistd.h>

#include <string>

#include "runtime/files.hpp"
#include "tests/support/chromium.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/host_probes.hpp"
#include "tests/support/http_probe.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

class StatusPage : public ContainerTest {
 protected:
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (auto why = chromium_.Open(); !why.empty()) GTEST_SKIP() << why;
  }
  HeadlessChromium chromium_;
};

TEST_F(StatusPage, ChromiumShowsTheNodeAndItsSandboxesAndTakesAScreenshot) {
  auto a = Make(), b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  ASSERT_TRUE(b->Pause().ok());
  // E2B calls: one without a key (401), one for a sandbox there is not (404).
  int e2b = HttpPort(daemon_->e2b_addr());
  auto key = ReadFileToString(daemon_->data_dir() + "/e2b.key");
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(HttpExchange(e2b, "POST /sandboxes HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n\r\n{}").code, 401);
  EXPECT_EQ(HttpExchange(e2b, "GET /sandboxes/enothere HTTP/1.1\r\nHost: d\r\nX-API-Key: " +
                                  key->substr(0, key->find('\n')) + "\r\n\r\n").code, 404);
  const std::string url = "http://" + daemon_->http_addr() + "/";
  auto dom = chromium_.Dom(url);
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_THAT(dom.out, HasSubstr("data-ready=\"1\"")) << "the page's script did not draw /status.json";
  std::string node = daemon_->Admin("status").value("node", "");
  EXPECT_THAT(dom.out, HasSubstr("data-node=\"" + node + "\""));
  EXPECT_THAT(dom.out, HasSubstr("data-sandbox=\"" + a->id() + "\""));
  EXPECT_THAT(dom.out, HasSubstr("data-sandbox=\"" + b->id() + "\""));
  EXPECT_THAT(dom.out, HasSubstr("phase phase-paused\">paused<"));
  EXPECT_THAT(dom.out, HasSubstr("1 node(s)"));
  EXPECT_THAT(dom.out, HasSubstr("<tr data-e2b-call=\"create\"><td>create</td><td>1</td><td class=\"warn\">1</td><td>0</td>"));
  EXPECT_THAT(dom.out, HasSubstr("<tr data-e2b-call=\"get\"><td>get</td><td>1</td><td class=\"warn\">1</td><td>0</td>"));

  std::string shot;
  EXPECT_EQ(chromium_.Screenshot(url, "status-page-screenshot.png", &shot), "");
  std::printf("# status page screenshot: %s\n", shot.c_str());
  ::testing::Test::RecordProperty("screenshot", shot);
  Destroy(*a);
  Destroy(*b);
}

}  // namespace
}  // namespace dsec::testing
