// Runs after every test that creates sandboxes or daemons (ctest fixture
// cleanup) and fails if anything they created is left: processes, cgroups,
// mounts, data dirs. Test daemons and drivers use the cgroup parent
// "dsec-test" and data dirs /tmp/dsec-test-*, so this never mistakes a
// developer's own dsecd for a leak.
#include <dirent.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "tests/support/daemon.hpp"

int main() {
  int leaks = 0;
  auto report = [&](const std::string& what) {
    std::printf("LEAK: %s\n", what.c_str());
    ++leaks;
  };
  for (const char* needle : {"dsec-test", "/tmp/dsec-test-"})
    for (pid_t p : dsec::testing::ProcessesMatching(needle)) {
      std::ifstream in("/proc/" + std::to_string(p) + "/cmdline");
      std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (auto& c : cmd)
        if (c == '\0') c = ' ';
      report("process " + std::to_string(p) + ": " + cmd);
    }
  // dsec-test and the dsec-test-* parents some tests use for themselves.
  for (const char* ctrl : {"memory", "pids", "cpu", "cpuacct", "freezer"}) {
    std::string root = std::string("/sys/fs/cgroup/") + ctrl;
    if (DIR* d = ::opendir(root.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::strncmp(e->d_name, "dsec-test", 9) == 0) report("cgroup " + root + "/" + e->d_name);
      ::closedir(d);
    }
  }
  std::ifstream mi("/proc/self/mountinfo");
  for (std::string line; std::getline(mi, line);)
    if (line.find("dsec") != std::string::npos) report("mount: " + line);
  if (DIR* d = ::opendir("/tmp")) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, "dsec-test-", 10) == 0) report(std::string("data dir /tmp/") + e->d_name);
    ::closedir(d);
  }
  if (leaks == 0) std::printf("leak_check: nothing left behind\n");
  return leaks == 0 ? 0 : 1;
}
