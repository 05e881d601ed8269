// Runs after every test that creates sandboxes or daemons (ctest fixture
// cleanup) and fails if anything they created is left: processes, cgroups,
// mounts, data dirs. Test daemons and drivers use the cgroup parent
// "dsec-test" and data dirs /tmp/dsec-test-*, so this never mistakes a
// developer's own dsecd for a leak.
#include <dirent.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>

#include "tests/support/daemon.hpp"

namespace {

std::string Cmdline(const std::string& pid) {
  std::string cmd = dsec::testing::ProcCmdline(pid);
  for (auto& c : cmd)
    if (c == '\0') c = ' ';
  return cmd;
}

// The groups below `dir` and the processes in each, with their command lines.
void DescribeGroup(const std::string& dir, int depth = 0) {
  if (depth > 4) return;
  std::ifstream procs(dir + "/cgroup.procs");
  for (std::string pid; std::getline(procs, pid);)
    std::printf("      in %s: process %s: %s\n", dir.c_str(), pid.c_str(), Cmdline(pid).c_str());
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_type == DT_DIR && e->d_name[0] != '.') {
        std::printf("      group %s/%s\n", dir.c_str(), e->d_name);
        DescribeGroup(dir + "/" + e->d_name, depth + 1);
      }
    ::closedir(d);
  }
}

void PrintTail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  std::printf("      last %zu lines of %s:\n", tail.size(), path.c_str());
  for (const auto& l : tail) std::printf("      | %s\n", l.c_str());
}

}  // namespace

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
  // dsec-test and the dsec-test-* parents some tests use for themselves;
  // what is still in them (a container that outlived its test names the
  // test's daemon through its sandbox id).
  for (const char* ctrl : {"memory", "pids", "cpu", "cpuacct", "freezer"}) {
    std::string root = std::string("/sys/fs/cgroup/") + ctrl;
    if (DIR* d = ::opendir(root.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::strncmp(e->d_name, "dsec-test", 9) == 0) {
          report("cgroup " + root + "/" + e->d_name);
          if (std::strcmp(ctrl, "memory") == 0) DescribeGroup(root + "/" + e->d_name);
        }
      ::closedir(d);
    }
  }
  std::ifstream mi("/proc/self/mountinfo");
  for (std::string line; std::getline(mi, line);)
    if (line.find("dsec") != std::string::npos) report("mount: " + line);
  if (DIR* d = ::opendir("/tmp")) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, "dsec-test-", 10) == 0) {
        std::string path = std::string("/tmp/") + e->d_name;
        report("data dir " + path);
        // A test daemon's log says what its test did last.
        if (path.size() > 4 && path.compare(path.size() - 4, 4, ".log") == 0) PrintTail(path, 40);
      }
    ::closedir(d);
  }
  if (leaks == 0) std::printf("leak_check: nothing left behind\n");
  return leaks == 0 ? 0 : 1;
}
