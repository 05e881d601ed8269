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

  std::string shot;
  EXPECT_EQ(chromium_.Screenshot(url, "status-page-screenshot.png", &shot), "");
  std::printf("# status page screenshot: %s\n", shot.c_str());
  ::testing::Test::RecordProperty("screenshot", shot);
  Destroy(*a);
  Destroy(*b);
}

}  // namespace
}  // namespace dsec::testing
