// Runs after every test that creates sandboxes or daemons (ctest fixture
// cleanup) and fails if anything they created is left: processes, cgroups,
// mounts, data dirs. A microVM's QEMU is such a process (its command line
// names its dir in the test data dir; it sits in <parent>/vm/<id>), so a VM
// that outlives its test is reported, and swept; so is a vm sandbox's
// libvirt domain (its metadata names its dir in the test data dir), and a
// network test's namespaces (/run/netns/dsn*, dsc*). Test daemons and drivers use the cgroup parent
// "dsec-test" and data dirs /tmp/dsec-test-*, so this never mistakes a
// developer's own dsecd for a leak.
//
// `leak_check --sweep` runs before all of them (ctest fixture setup): it
// removes what an earlier run that was killed midway left on the machine
// (a run's processes killed with SIGKILL run no clean-up: containers, their
// cgroups and mounts, data dirs stay), says what it removed, and never fails,
// so that the check at the end judges this run alone. It leaves alone every
// data dir whose dsecd is alive, and all cgroups while any test dsecd is.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>

#include "runtime/files.hpp"
#include "harness/daemon.hpp"

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

// The output of a command (a shell line), "" when it cannot run.
std::string Output(const std::string& command) {
  std::string out;
  if (FILE* f = ::popen(command.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    ::pclose(f);
  }
  return out;
}

// libvirt domains of test daemons (vm sandboxes): dsec-* whose metadata
// names a dir in a test data dir. None when libvirt is not there.
std::vector<std::string> TestDomains() {
  std::vector<std::string> out;
  if (::access("/usr/bin/virsh", X_OK) != 0) return out;
  std::string names = Output("virsh -q -c qemu:///system list --all --name 2>/dev/null");
  size_t start = 0;
  while (start < names.size()) {
    size_t end = names.find('\n', start);
    if (end == std::string::npos) end = names.size();
    std::string name = names.substr(start, end - start);
    start = end + 1;
    if (name.rfind("dsec-", 0) != 0 || name.find_first_of("'\\ ") != std::string::npos) continue;
    if (Output("virsh -c qemu:///system dumpxml '" + name + "' 2>/dev/null").find("dir='/tmp/dsec-test-") !=
        std::string::npos)
      out.push_back(name);
  }
  return out;
}

// The network namespaces of network tests (/run/netns/dsn* and dsc*).
std::vector<std::string> TestNetns() {
  std::vector<std::string> out;
  for (const auto& e : dsec::ListEntries("/run/netns"))
    if (e.rfind("dsn", 0) == 0 || e.rfind("dsc", 0) == 0) out.push_back(e);
  return out;
}

bool Alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// The test dsecds alive on this machine (their command line names a test data dir).
std::vector<pid_t> LiveTestDaemons() {
  std::vector<pid_t> out;
  for (pid_t p : dsec::testing::ProcessesMatching("/tmp/dsec-test-"))
    if (Cmdline(std::to_string(p)).find("dsecd ") != std::string::npos) out.push_back(p);
  return out;
}

// Every process in `dir` and the groups below it gets SIGKILL (a
// container's init takes its pid namespace with it); the groups go
// bottom-up once empty. What cannot be removed within 10 s is reported.
void SweepGroup(const std::string& dir) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    std::vector<std::string> groups = {dir};
    for (size_t i = 0; i < groups.size(); ++i)
      for (const auto& e : dsec::ListSubdirs(groups[i])) groups.push_back(groups[i] + "/" + e);
    // A frozen group's processes die only once thawed.
    for (const auto& g : groups) {
      std::ofstream thaw(g + "/freezer.state");
      if (thaw) thaw << "THAWED";
    }
    for (const auto& g : groups) {
      std::ifstream procs(g + "/cgroup.procs");
      for (pid_t pid; procs >> pid;) ::kill(pid, SIGKILL);
    }
    for (auto it = groups.rbegin(); it != groups.rend(); ++it) ::rmdir(it->c_str());
    if (::access(dir.c_str(), F_OK) != 0) return;
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("leak_check --sweep: cannot remove %s\n", dir.c_str());
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // killed processes take a moment to exit
  }
}

int Sweep() {
  int swept = 0;
  auto said = [&](const std::string& what) {
    std::printf("leak_check --sweep: removed %s, left by an earlier run\n", what.c_str());
    ++swept;
  };
  auto daemons = LiveTestDaemons();
  // Containers first: they hold the mounts.
  if (daemons.empty()) {
    for (const auto& root : dsec::testing::CgroupRoots()) {
      for (const auto& e : dsec::ListEntries(root))
        if (e.rfind("dsec-test", 0) == 0) {
          SweepGroup(root + "/" + e);
          said("cgroup " + root + "/" + e);
        }
    }
  } else {
    std::printf("leak_check --sweep: %zu test dsecd(s) of another run alive: cgroups left as they are\n",
                daemons.size());
  }
  if (daemons.empty())
    for (const auto& name : TestDomains()) {
      Output("virsh -c qemu:///system destroy '" + name + "' >/dev/null 2>&1; virsh -c qemu:///system undefine '" +
             name + "' >/dev/null 2>&1");
      said("libvirt domain " + name);
    }
  // Network namespaces the network tests make (tests/support/netns.hpp's
  // users name theirs dsn<pid>* and dsc<pid>*).
  if (daemons.empty())
    for (const auto& ns : TestNetns()) {
      dsec::testing::RunProcess({"/bin/sh", "-c", "ip netns del '" + ns + "' 2>/dev/null"});
      said("network namespace " + ns);
    }
  for (const auto& e : dsec::ListEntries("/tmp")) {
    if (e.rfind("dsec-test-", 0) != 0) continue;
    std::string path = "/tmp/" + e;
    bool log = path.size() > 4 && path.compare(path.size() - 4, 4, ".log") == 0;
    std::string data = log ? path.substr(0, path.size() - 4) : path;
    // A data dir whose dsecd runs belongs to a run that is going on.
    auto ep = dsec::ReadFileToString(data + "/dsecd.json");
    if (ep.ok()) {
      auto j = nlohmann::json::parse(*ep, nullptr, false);
      if (!j.is_discarded() && Alive(j.value("pid", 0))) continue;
    }
    if (!log)
      for (const auto& point : dsec::testing::UnmountAllUnder(path)) said("mount " + point);
    dsec::testing::RunProcess({"/bin/rm", "-rf", "--one-file-system", path});
    said(path);
  }
  std::printf("leak_check --sweep: %d item(s) of earlier runs removed\n", swept);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--sweep") == 0) return Sweep();
  int leaks = 0;
  auto report = [&](const std::string& what) {
    std::printf("LEAK: %s\n", what.c_str());
    ++leaks;
  };
  // "dsec-test" also matches every /tmp/dsec-test-* data dir: each process once.
  for (pid_t p : dsec::testing::ProcessesMatching("dsec-test"))
    report("process " + std::to_string(p) + ": " + Cmdline(std::to_string(p)));
  // dsec-test and the dsec-test-* parents some tests use for themselves;
  // what is still in them (a container that outlived its test names the
  // test's daemon through its sandbox id).
  // Every hierarchy, v1 and v2 (a v2 host, or the v2 guest, has one).
  bool described = false;
  for (const auto& root : dsec::testing::CgroupRoots()) {
    if (DIR* d = ::opendir(root.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::strncmp(e->d_name, "dsec-test", 9) == 0) {
          report("cgroup " + root + "/" + e->d_name);
          if (!described) DescribeGroup(root + "/" + e->d_name);
          described = true;
        }
      ::closedir(d);
    }
  }
  for (const auto& name : TestDomains()) report("libvirt domain " + name);
  for (const auto& ns : TestNetns()) report("network namespace " + ns);
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
