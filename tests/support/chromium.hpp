// Headless Chromium (Debian's chromium package) for tests of dsecd's status
// page: the DOM a page ends with after its script ran, and a screenshot.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "harness/daemon.hpp"
#include "tests/support/host_probes.hpp"

namespace dsec::testing {

class HeadlessChromium {
 public:
  // "" when ready; else why not (for a skip message).
  std::string Open() {
    binary_ = HostTool("chromium");
    if (binary_.empty()) return "no chromium on this host (apt-get install chromium; scripts/dev does)";
    char tmpl[] = "/tmp/dsec-test-chromium-XXXXXX";
    if (!::mkdtemp(tmpl)) return "mkdtemp failed";
    profile_ = tmpl;
    return "";
  }
  ~HeadlessChromium() {
    if (!profile_.empty()) RunProcess({"/bin/rm", "-rf", profile_});
  }

  // Chromium with a profile of its own (root needs --no-sandbox; the
  // virtual time budget lets the page's fetch finish before the DOM is
  // dumped or the picture taken).
  ProcResult Run(const std::vector<std::string>& more) const {
    std::vector<std::string> argv = {binary_,
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
  ProcResult Dom(const std::string& url) const { return Run({"--dump-dom", url}); }

  // A screenshot of `url` in the working dir (the build tree's tests/ dir
  // when ctest runs the test), kept for a look: "" when it is a real
  // picture, else what is wrong. `*path` is where it is.
  std::string Screenshot(const std::string& url, const std::string& name, std::string* path) const {
    char cwd[4096];
    *path = std::string(::getcwd(cwd, sizeof cwd) ? cwd : "/tmp") + "/" + name;
    auto pic = Run({"--screenshot=" + *path, url});
    if (pic.exit_code != 0) return "chromium --screenshot exited with " + std::to_string(pic.exit_code) + ": " + pic.err;
    std::ifstream png(*path, std::ios::binary);
    std::string magic(8, '\0');
    png.read(magic.data(), 8);
    if (magic != std::string("\x89PNG\r\n\x1a\n", 8)) return "not a PNG: " + *path;
    png.seekg(0, std::ios::end);
    if (png.tellg() < 10'000) return "an empty picture: " + *path;
    return "";
  }

 private:
  std::string binary_, profile_;
};

}  // namespace dsec::testing
