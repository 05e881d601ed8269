#include "drivers/cgroup/cgroup_v1.hpp"
#include "runtime/files.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

namespace dsec::cgroup {

namespace {

bool HasOption(const std::string& opts, const char* name) {
  std::stringstream ss(opts);
  std::string o;
  while (std::getline(ss, o, ','))
    if (o == name) return true;
  return false;
}

std::string ReadSmallFd(int fd) {
  char buf[512];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

uint64_t ParseU64(const std::string& s) { return std::strtoull(s.c_str(), nullptr, 10); }

Status WriteFd(int fd, const std::string& v, const char* what, const std::string& where) {
  if (::pwrite(fd, v.data(), v.size(), 0) < 0)
    return Status::FromErrno(errno, std::string("cgroup ") + where + ": write " + what + "=" + v);
  return Status::Ok();
}

UniqueFd OpenAt(const std::string& dir, const char* file, int flags) {
  return UniqueFd(::open((dir + "/" + file).c_str(), flags | O_CLOEXEC));
}

std::vector<pid_t> ReadProcs(const std::string& dir) {
  std::vector<pid_t> pids;
  std::ifstream in(dir + "/cgroup.procs");
  pid_t p;
  while (in >> p) pids.push_back(p);
  return pids;
}

// Kills everything in dir (and below), then removes the directories bottom-up.
void KillAndRemoveTree(const std::string& dir, int64_t start_ms) {
  for (const auto& sub : ListSubdirs(dir)) KillAndRemoveTree(dir + "/" + sub, start_ms);
  WaitForKilled(
      [&] {
        auto pids = ReadProcs(dir);
        for (pid_t p : pids) ::kill(p, SIGKILL);
        return pids.empty();
      },
      start_ms);
  ::rmdir(dir.c_str());
}

}  // namespace

std::vector<std::string> CgroupMounts::Hierarchies() const {
  std::vector<std::string> h;
  for (const auto* p : {&memory, &pids, &cpu, &cpuacct, &freezer})
    if (!p->empty() && std::find(h.begin(), h.end(), *p) == h.end()) h.push_back(*p);
  return h;
}

Result<CgroupMounts> DiscoverCgroupMounts() {
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return Status::FailedPrecondition("cannot read /proc/self/mountinfo");
  CgroupMounts m;
  bool saw_v2 = false;
  std::string line;
  while (std::getline(in, line)) {
    // <id> <parent> <maj:min> <root> <mountpoint> <opts> [optional...] - <fstype> <source> <superopts>
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::stringstream pre(line.substr(0, dash)), post(line.substr(dash + 3));
    std::string id, parent, dev, root, mnt, fstype, source, superopts;
    pre >> id >> parent >> dev >> root >> mnt;
    post >> fstype >> source >> superopts;
    if (fstype == "cgroup2") saw_v2 = true;
    if (fstype != "cgroup") continue;
    if (HasOption(superopts, "memory")) m.memory = mnt;
    if (HasOption(superopts, "pids")) m.pids = mnt;
    if (HasOption(superopts, "cpu")) m.cpu = mnt;
    if (HasOption(superopts, "cpuacct")) m.cpuacct = mnt;
    if (HasOption(superopts, "freezer")) m.freezer = mnt;
  }
  std::string missing;
  if (m.memory.empty()) missing += " memory";
  if (m.pids.empty()) missing += " pids";
  if (m.cpu.empty()) missing += " cpu";
  if (m.cpuacct.empty()) missing += " cpuacct";
  if (!missing.empty()) {
    std::string why = "cgroup v1 controllers not mounted:" + missing;
    if (saw_v2 && m.memory.empty()) why += " (this host uses the cgroup v2 unified hierarchy)";
    return Status::FailedPrecondition(why);
  }
  return m;
}

Status MakeDirsUnder(const std::string& root, const std::string& rel,
                     const std::function<void(const std::string&)>& before_each) {
  for (int attempt = 0;; ++attempt) {
    std::string path = root;
    std::stringstream ss(rel);
    std::string part;
    int err = 0;
    while (std::getline(ss, part, '/')) {
      if (part.empty()) continue;
      if (before_each) before_each(path);
      path += "/" + part;
      if (::mkdir(path.c_str(), 0755) < 0 && errno != EEXIST) {
        err = errno;
        break;
      }
    }
    if (err == 0) return Status::Ok();
    if (err != ENOENT || attempt >= 10) return Status::FromErrno(err, "cgroup mkdir " + path);
  }
}

Status MakeGroupDirs(const CgroupMounts& m, const std::string& rel) {
  for (const auto& h : m.Hierarchies()) {
    // Usually the parents exist: one mkdir.
    std::string full = h + "/" + rel;
    if (::mkdir(full.c_str(), 0755) == 0 || errno == EEXIST) continue;
    DSEC_RETURN_IF_ERROR(MakeDirsUnder(h, rel));
  }
  return Status::Ok();
}

bool WaitForKilled(const std::function<bool()>& empty, int64_t start_ms) {
  while (!empty()) {
    if (SteadyClockMs() - start_ms >= kKilledLeaveMs) return false;
    ::usleep(5000);  // killed processes leave the group asynchronously
  }
  return true;
}

void KillAndRemoveGroup(const CgroupMounts& m, const std::string& rel) {
  int64_t start = SteadyClockMs();
  if (!m.freezer.empty()) {
    std::string state = m.freezer + "/" + rel + "/freezer.state";
    int fd = ::open(state.c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
      (void)!::write(fd, "FROZEN", 6);
      for (pid_t p : ReadProcs(m.freezer + "/" + rel)) ::kill(p, SIGKILL);
      (void)!::pwrite(fd, "THAWED", 6, 0);
      ::close(fd);
    }
  }
  for (const auto& h : m.Hierarchies()) KillAndRemoveTree(h + "/" + rel, start);
}

bool EmptyGroup(const CgroupMounts& m, const std::string& rel) {
  std::string first = m.memory + "/" + rel;
  if (ReadProcs(first).empty()) return true;
  UniqueFd freezer;
  if (!m.freezer.empty()) freezer = OpenAt(m.freezer + "/" + rel, "freezer.state", O_RDWR);
  // Freezing only keeps what is killed from forking meanwhile; the kill and
  // the wait below decide, and report what is left.
  if (freezer) (void)WriteFd(freezer.get(), "FROZEN", "freezer.state", rel);
  for (const auto& h : m.Hierarchies())
    for (pid_t p : ReadProcs(h + "/" + rel)) ::kill(p, SIGKILL);
  if (freezer) (void)WriteFd(freezer.get(), "THAWED", "freezer.state", rel);
  return WaitForKilled(
      [&] {
        for (const auto& h : m.Hierarchies())
          if (!ReadProcs(h + "/" + rel).empty()) return false;
        return true;
      },
      SteadyClockMs());
}

namespace {

// Writes v to <dir>/<file>; absent files are fine when `optional`.
Status WritePath(const std::string& dir, const char* file, const std::string& v, const std::string& rel,
                 bool optional = false) {
  UniqueFd fd = OpenAt(dir, file, O_WRONLY);
  if (!fd) return optional && errno == ENOENT ? Status::Ok() : Status::FromErrno(errno, "cgroup " + rel + ": open " + file);
  return WriteFd(fd.get(), v, file, rel);
}

std::string LimitValue(int64_t v, const char* unlimited) { return v < 0 ? unlimited : std::to_string(v); }

}  // namespace

Status ApplyGroupLimits(const CgroupMounts& m, const std::string& rel, const GroupLimits& want, GroupLimits* have) {
  if (want.memory != have->memory) {
    std::string dir = m.memory + "/" + rel, v = LimitValue(want.memory, "-1");
    // memory+swap must never be below memory: raise it first, lower it last.
    // Unknown: lifted first, then both set.
    auto as_u64 = [](int64_t x) { return x < 0 ? UINT64_MAX : static_cast<uint64_t>(x); };
    bool unknown = have->memory == GroupLimits::kUnknown;
    bool raising = !unknown && as_u64(want.memory) > as_u64(have->memory);
    if (unknown) DSEC_RETURN_IF_ERROR(WritePath(dir, "memory.memsw.limit_in_bytes", "-1", rel, true));
    if (raising) DSEC_RETURN_IF_ERROR(WritePath(dir, "memory.memsw.limit_in_bytes", v, rel, true));
    have->memory = GroupLimits::kUnknown;  // until both are written
    DSEC_RETURN_IF_ERROR(WritePath(dir, "memory.limit_in_bytes", v, rel));
    if (!raising) DSEC_RETURN_IF_ERROR(WritePath(dir, "memory.memsw.limit_in_bytes", v, rel, true));
    have->memory = want.memory;
  }
  if (want.pids != have->pids) {
    have->pids = GroupLimits::kUnknown;
    DSEC_RETURN_IF_ERROR(WritePath(m.pids + "/" + rel, "pids.max", LimitValue(want.pids, "max"), rel));
    have->pids = want.pids;
  }
  if (want.cpu_quota != have->cpu_quota) {
    std::string dir = m.cpu + "/" + rel;
    bool unknown = have->cpu_quota == GroupLimits::kUnknown;
    have->cpu_quota = GroupLimits::kUnknown;
    if (unknown) DSEC_RETURN_IF_ERROR(WritePath(dir, "cpu.cfs_period_us", "100000", rel));
    DSEC_RETURN_IF_ERROR(WritePath(dir, "cpu.cfs_quota_us", LimitValue(want.cpu_quota, "-1"), rel));
    have->cpu_quota = want.cpu_quota;
  }
  return Status::Ok();
}

Status RenameGroup(const CgroupMounts& m, const std::string& rel, const std::string& to_rel) {
  auto hs = m.Hierarchies();
  for (size_t i = 0; i < hs.size(); ++i) {
    if (::rename((hs[i] + "/" + rel).c_str(), (hs[i] + "/" + to_rel).c_str()) == 0) continue;
    int err = errno;
    for (size_t j = 0; j < i; ++j) (void)::rename((hs[j] + "/" + to_rel).c_str(), (hs[j] + "/" + rel).c_str());
    return Status::FromErrno(err, "cgroup rename " + hs[i] + "/" + rel + " to " + to_rel);
  }
  return Status::Ok();
}

void RemoveGroupDirs(const CgroupMounts& m, const std::string& rel) {
  for (const auto& h : m.Hierarchies()) ::rmdir((h + "/" + rel).c_str());
}

int SweepStaleSpawnerGroups(const CgroupMounts& m, const std::string& parent) {
  int removed = 0;
  for (const auto& h : m.Hierarchies()) {
    std::string base = h + "/" + parent;
    std::vector<std::string> stale;
    for (const auto& name : ListSubdirs(base)) {
      if (name.compare(0, 2, "sp") != 0) continue;
      pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + 2));
      if (pid <= 0) continue;
      if (::kill(pid, 0) == 0 || errno == EPERM) continue;  // its spawner is alive
      stale.push_back(base + "/" + name);
    }
    for (const auto& dir : stale) {
      KillAndRemoveTree(dir, SteadyClockMs());
      ++removed;
    }
  }
  return removed;
}

CgroupSlot CgroupSlot::Paths(const CgroupMounts& m, const std::string& rel) {
  CgroupSlot s;
  s.rel_ = rel;
  for (const auto& h : m.Hierarchies()) {
    s.dirs_.push_back(h + "/" + rel);
    s.cpu_only_.push_back(h != m.memory && h != m.pids && (h == m.cpu || h == m.cpuacct));
    s.freezer_only_.push_back(h == m.freezer && h != m.memory && h != m.pids && h != m.cpu && h != m.cpuacct);
  }
  s.mem_dir_ = m.memory + "/" + rel;
  s.acct_dir_ = m.cpuacct + "/" + rel;
  if (!m.freezer.empty()) s.freezer_dir_ = m.freezer + "/" + rel;
  return s;
}

Result<CgroupSlot> CgroupSlot::Create(const CgroupMounts& m, const std::string& rel) {
  DSEC_RETURN_IF_ERROR(MakeGroupDirs(m, rel));
  CgroupSlot s = Paths(m, rel);
  for (const auto& dir : s.dirs_) {
    s.procs_.push_back(OpenAt(dir, "cgroup.procs", O_WRONLY));
    if (!s.procs_.back()) return Status::FromErrno(errno, "cgroup open " + dir + "/cgroup.procs");
  }
  std::string mem = m.memory + "/" + rel, pids = m.pids + "/" + rel, cpu = m.cpu + "/" + rel,
              acct = m.cpuacct + "/" + rel;
  s.mem_limit_ = OpenAt(mem, "memory.limit_in_bytes", O_RDWR);
  s.mem_peak_ = OpenAt(mem, "memory.max_usage_in_bytes", O_RDWR);
  s.mem_oom_ = OpenAt(mem, "memory.oom_control", O_RDONLY);
  s.pids_max_ = OpenAt(pids, "pids.max", O_RDWR);
  s.cpu_quota_ = OpenAt(cpu, "cpu.cfs_quota_us", O_RDWR);
  s.cpu_period_ = OpenAt(cpu, "cpu.cfs_period_us", O_RDWR);
  s.cpuacct_usage_ = OpenAt(acct, "cpuacct.usage", O_RDWR);
  s.memsw_limit_ = OpenAt(mem, "memory.memsw.limit_in_bytes", O_RDWR);  // optional
  if (!s.freezer_dir_.empty()) s.freezer_state_ = OpenAt(s.freezer_dir_, "freezer.state", O_RDWR);
  if (!s.mem_limit_ || !s.mem_peak_ || !s.mem_oom_ || !s.pids_max_ || !s.cpu_quota_ ||
      !s.cpu_period_ || !s.cpuacct_usage_)
    return Status::FromErrno(errno, "cgroup open the control files of " + rel);
  return s;
}

std::vector<int> CgroupSlot::JoinFds() const {
  std::vector<int> fds;
  for (size_t i = 0; i < procs_.size(); ++i)
    if (!cpu_only_[i] && !freezer_only_[i]) fds.push_back(procs_[i].get());
  return fds;
}

std::vector<std::string> CgroupSlot::ProcsPaths() const {
  std::vector<std::string> paths;
  for (const auto& d : dirs_) paths.push_back(d + "/cgroup.procs");
  return paths;
}

Status CgroupSlot::Freeze(bool frozen) {
  if (freezer_dir_.empty()) return Status::FailedPrecondition("cgroup " + rel_ + ": no freezer hierarchy on this host");
  UniqueFd opened;
  int fd = freezer_state_.get();
  if (fd < 0) {
    opened = OpenAt(freezer_dir_, "freezer.state", O_RDWR);
    if (!opened) return Status::FromErrno(errno, "cgroup " + rel_ + ": open freezer.state");
    fd = opened.get();
  }
  const char* v = frozen ? "FROZEN" : "THAWED";
  DSEC_RETURN_IF_ERROR(WriteFd(fd, v, "freezer.state", rel_));
  if (!frozen) return Status::Ok();
  // FREEZING settles asynchronously, and the v1 freezer can stay FREEZING
  // when a task was between fork and exec: writing FROZEN again retries.
  // Bounded (5 s; a loaded host needs more than 1); on failure it is thawed
  // again, so nothing is left half frozen.
  for (int i = 1; i <= 5000; ++i) {
    if (ReadSmallFd(fd).rfind("FROZEN", 0) == 0) return Status::Ok();
    ::usleep(1000);
    if (i % 100 == 0) (void)WriteFd(fd, "FROZEN", "freezer.state", rel_);  // the loop reads whether it took
  }
  (void)WriteFd(fd, "THAWED", "freezer.state", rel_);  // best effort; the error below says what failed
  return Status::Unavailable("cgroup " + rel_ + ": did not freeze within 5 s (left running)");
}

bool CgroupSlot::Frozen() {
  if (freezer_dir_.empty()) return false;
  if (freezer_state_) return ReadSmallFd(freezer_state_.get()).rfind("THAWED", 0) != 0;
  UniqueFd fd = OpenAt(freezer_dir_, "freezer.state", O_RDONLY);
  return fd && ReadSmallFd(fd.get()).rfind("THAWED", 0) != 0;
}

void CgroupSlot::CloseFiles() {
  procs_.clear();
  for (auto* f : {&mem_limit_, &mem_peak_, &mem_oom_, &pids_max_, &cpu_quota_, &cpu_period_, &cpuacct_usage_,
                  &memsw_limit_, &freezer_state_})
    f->Reset();
}

std::vector<pid_t> CgroupSlot::Pids() const { return dirs_.empty() ? std::vector<pid_t>{} : ReadProcs(dirs_[0]); }

std::vector<int> CgroupSlot::CpuJoinFds() const {
  std::vector<int> fds;
  for (size_t i = 0; i < procs_.size(); ++i)
    if (cpu_only_[i]) fds.push_back(procs_[i].get());
  return fds;
}

Status CgroupSlot::Attach(pid_t pid) {
  std::string v = std::to_string(pid);
  for (size_t i = 0; i < procs_.size(); ++i)
    DSEC_RETURN_IF_ERROR(WriteFd(procs_[i].get(), v, "cgroup.procs", dirs_[i]));
  return Status::Ok();
}

Status CgroupSlot::SetMemoryLimit(uint64_t bytes) {
  if (bytes == cur_mem_) return Status::Ok();
  std::string v = std::to_string(bytes);
  // With swap accounted, memory+swap gets the same limit, or a run could
  // swap past it. memsw must stay >= the memory limit at every step, so the
  // order depends on the direction.
  bool raising = bytes > cur_mem_;
  if (memsw_limit_ && raising)
    DSEC_RETURN_IF_ERROR(WriteFd(memsw_limit_.get(), v, "memory.memsw.limit_in_bytes", rel_));
  DSEC_RETURN_IF_ERROR(WriteFd(mem_limit_.get(), v, "memory.limit_in_bytes", rel_));
  if (memsw_limit_ && !raising)
    DSEC_RETURN_IF_ERROR(WriteFd(memsw_limit_.get(), v, "memory.memsw.limit_in_bytes", rel_));
  cur_mem_ = bytes;
  return Status::Ok();
}

Status CgroupSlot::SetPidsMax(uint32_t n) {
  if (static_cast<int64_t>(n) == cur_pids_) return Status::Ok();
  DSEC_RETURN_IF_ERROR(WriteFd(pids_max_.get(), n ? std::to_string(n) : std::string("max"), "pids.max", rel_));
  cur_pids_ = n;
  return Status::Ok();
}

Status CgroupSlot::SetCpuQuota(uint32_t millis) {
  int64_t quota = millis == 0 ? -1 : static_cast<int64_t>(millis) * 100;  // period 100 ms
  if (quota == cur_quota_) return Status::Ok();
  if (cur_quota_ == -2) DSEC_RETURN_IF_ERROR(WriteFd(cpu_period_.get(), "100000", "cpu.cfs_period_us", rel_));
  DSEC_RETURN_IF_ERROR(WriteFd(cpu_quota_.get(), std::to_string(quota), "cpu.cfs_quota_us", rel_));
  cur_quota_ = quota;
  return Status::Ok();
}

void CgroupSlot::ResetCounters(bool cpu) {
  (void)::pwrite(mem_peak_.get(), "0", 1, 0);
  if (cpu) (void)::pwrite(cpuacct_usage_.get(), "0", 1, 0);
}

uint64_t CgroupSlot::CpuUsageNs() { return ParseU64(ReadSmallFd(cpuacct_usage_.get())); }

uint64_t CgroupSlot::CpuUsageNsByPath() const {
  UniqueFd fd = OpenAt(acct_dir_, "cpuacct.usage", O_RDONLY);
  return fd ? ParseU64(ReadSmallFd(fd.get())) : 0;
}

uint64_t CgroupSlot::PeakBytes() { return ParseU64(ReadSmallFd(mem_peak_.get())); }

uint64_t CgroupSlot::OomKills() {
  UniqueFd opened;
  int fd = mem_oom_.get();
  if (fd < 0) {
    opened = OpenAt(mem_dir_, "memory.oom_control", O_RDONLY);
    fd = opened.get();
  }
  std::string s = fd < 0 ? std::string() : ReadSmallFd(fd);
  auto pos = s.find("oom_kill ");
  return pos == std::string::npos ? 0 : ParseU64(s.substr(pos + 9));
}

void CgroupSlot::Remove() {
  // Freeze first so nothing inside can fork while we kill it.
  if (!freezer_dir_.empty() && Freeze(true).ok()) {
    for (pid_t p : Pids()) ::kill(p, SIGKILL);
    (void)Freeze(false);  // killed tasks go whether thawed or not; the removal below reports what stays
  }
  CloseFiles();
  int64_t start = SteadyClockMs();
  for (const auto& d : dirs_) KillAndRemoveTree(d, start);
  dirs_.clear();
}

}  // namespace dsec::cgroup
