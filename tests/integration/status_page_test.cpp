// The status page in a real browser: headless Chromium (Debian's chromium
// package) loads dsecd's / and runs its script, which reads /status.json;
// the DOM it ends with shows the node and the sandboxes on it, and a
// screenshot of it is written where the test's output says (the build
// tree's tests/ dir when ctest runs it).
#include <gmock/gmock.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "runtime/files.hpp"
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
    chromium_ = HostTool("chromium");
    if (chromium_.empty()) GTEST_SKIP() << "no chromium on this host (apt-get install chromium; scripts/dev does)";
    char tmpl[] = "/tmp/dsec-test-chromium-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    profile_ = tmpl;
  }
  void TearDown() override {
    if (!profile_.empty()) RunProcess({"/bin/rm", "-rf", profile_});
    ContainerTest::TearDown();
  }
  // Chromium, headless, with a profile of its own (root needs --no-sandbox;
  // the virtual time budget lets the page's fetch finish before the DOM is
  // dumped or the picture taken).
  ProcResult Chromium(std::vector<std::string> more) {
    std::vector<std::string> argv = {chromium_,
                                     "--headless",
                                     "--no-sandbox",
                                     "--disable-gpu",
                                     "--no-first-run",
                                     "--disable-extensions",
                                     "--user-data-dir=" + profile_,
                                     "--virtual-time-budget=10000",
                                     "--window-size=1280,900"};
    argv.insert(argv.end(), more.begin(), more.end());
    return RunProcess(argv, {}, 120);
  }
  std::string chromium_, profile_;
};

TEST_F(StatusPage, ChromiumShowsTheNodeAndItsSandboxesAndTakesAScreenshot) {
  auto a = Make(), b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  ASSERT_TRUE(b->Pause().ok());
  const std::string url = "http://" + daemon_->http_addr() + "/";
  auto dom = Chromium({"--dump-dom", url});
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_THAT(dom.out, HasSubstr("data-ready=\"1\"")) << "the page's script did not draw /status.json";
  std::string node = daemon_->Admin("status").value("node", "");
  EXPECT_THAT(dom.out, HasSubstr("data-node=\"" + node + "\""));
  EXPECT_THAT(dom.out, HasSubstr("data-sandbox=\"" + a->id() + "\""));
  EXPECT_THAT(dom.out, HasSubstr("data-sandbox=\"" + b->id() + "\""));
  EXPECT_THAT(dom.out, HasSubstr("phase phase-paused\">paused<"));
  EXPECT_THAT(dom.out, HasSubstr("1 node(s)"));

  // Next to the test (ctest runs it in the build tree), kept for a look.
  char cwd[4096];
  std::string shot = std::string(::getcwd(cwd, sizeof cwd) ? cwd : "/tmp") + "/status-page-screenshot.png";
  auto pic = Chromium({"--screenshot=" + shot, url});
  ASSERT_EQ(pic.exit_code, 0) << pic.err;
  std::ifstream png(shot, std::ios::binary);
  std::string magic(8, '\0');
  png.read(magic.data(), 8);
  EXPECT_EQ(magic, std::string("\x89PNG\r\n\x1a\n", 8)) << "not a PNG: " << shot;
  png.seekg(0, std::ios::end);
  EXPECT_GT(png.tellg(), 10'000) << "an empty picture";
  std::printf("# status page screenshot: %s\n", shot.c_str());
  ::testing::Test::RecordProperty("screenshot", shot);
  Destroy(*a);
  Destroy(*b);
}

}  // namespace
}  // namespace dsec::testing
