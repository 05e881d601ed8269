// What the macro benchmarks share: timing, percentiles, a thread pool loop.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dsec::bench {

using Clock = std::chrono::steady_clock;

inline double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Pct {
  double p50 = 0, p99 = 0;
};

inline Pct Percentiles(std::vector<double> v) {
  Pct p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.p50 = v[v.size() / 2];
  p.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  return p;
}

// "1,16,64" -> {1, 16, 64}.
inline std::vector<int> SplitInts(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, ',');)
    if (!part.empty()) out.push_back(std::stoi(part));
  return out;
}

// CPU seconds (user + system, all threads) process `pid` has used so far;
// -1 when it cannot be read.
inline double CpuSeconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  // Fields after the command name, which is in parentheses and may hold spaces.
  auto close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; rest >> field && i <= 15; ++i)
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// CPU seconds the whole machine has been busy so far (user, nice, system,
// irq and softirq of every CPU, /proc/stat; idle, iowait and time stolen by
// the hypervisor left out); -1 when it cannot be read. The difference over a
// phase, divided by its operations, is a cost per operation that does not
// depend on how long the phase had to wait.
inline double HostBusySeconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  double user, nice, system, idle, iowait, irq, softirq;
  if (!(in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq) || cpu != "cpu") return -1;
  return (user + nice + system + irq + softirq) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Runs `fn(i)` for i in [0, n) on `conc` threads; the seconds it took.
template <class F>
double Parallel(int n, int conc, F fn) {
  std::atomic<int> next{0};
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < conc; ++t)
    threads.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Pss and Rss (KiB) of `pid`, from smaps_rollup.
inline std::pair<long, long> PssRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  long pss = 0, rss = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Pss:", 0) == 0) pss = std::atol(line.c_str() + 4);
    if (line.rfind("Rss:", 0) == 0) rss = std::atol(line.c_str() + 4);
  }
  return {pss, rss};
}

// PSS (KiB) of `pid`'s TCG translation buffer: QEMU's one anonymous
// mapping that is writable and executable (code it generated). A VM under
// KVM has none; the figure lets a TCG run be set against one.
inline long TcgBufferPss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  long pss = 0;
  bool in_buffer = false;
  std::string line;
  while (std::getline(in, line)) {
    // "7f..-7f.. rwxp 00000000 00:00 0" (a mapping's header: no name)
    std::istringstream h(line);
    std::string range, perms, offset, dev, inode, name;
    if (line.find('-') != std::string::npos && line.find(':') != std::string::npos && std::isxdigit(line[0]) &&
        (h >> range >> perms >> offset >> dev >> inode) && range.find('-') != std::string::npos) {
      h >> name;
      in_buffer = perms == "rwxp" && name.empty() && inode == "0";
      continue;
    }
    if (in_buffer && line.rfind("Pss:", 0) == 0) pss += std::atol(line.c_str() + 4);
  }
  return pss;
}

}  // namespace dsec::bench
