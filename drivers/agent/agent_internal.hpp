// Internal to dsec-agent: the Agent class and its records. agent.cpp holds
// the event loop, connections, framing and signals; agent_exec.cpp the life
// of an exec (fork/exec, pipes, limits, reaping); agent_files.cpp the file
// requests. All of it runs on one thread.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "drivers/agent/agent.hpp"
#include "drivers/agent/agent.pb.h"
#include "drivers/agent/passwd.hpp"
#include "runtime/frame.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::agent::internal {

int64_t NowNs();

// Tunables. Output buffered for one connection is bounded: above kHighWater
// the agent stops reading that connection's requests and the pipes of its
// streaming execs (their programs block on a full pipe), and resumes below
// kLowWater.
constexpr size_t kHighWater = 1 << 20;
constexpr size_t kLowWater = 256 << 10;
constexpr size_t kReadChunk = 64 << 10;          // one read; one Output event at most
constexpr uint64_t kDefaultOutputCap = 1 << 20;  // Limits.output_bytes = 0
// Non-streamed output travels whole in the exec's outcome, which must fit in a frame.
constexpr uint64_t kMaxBufferedOutput = 16 << 20;
// After the exec's own process ended, how long output pipes still held open
// by processes it left behind (`cmd &`) are read before the exec is reported.
constexpr int64_t kPipeGraceNs = 200'000'000;
// ReadFile default and hard maximum (the Event must fit in a frame).
constexpr uint64_t kDefaultReadMax = 64ull << 20;
constexpr uint64_t kMaxReadBytes = kMaxFrameBytes - (64 << 10);
constexpr size_t kMaxConnections = 1024;
// Results of keyed execs kept for a client that asks again (Exec.key).
constexpr size_t kKeptResults = 4;
constexpr size_t kKeptBytes = 8 << 20;  // beyond this, older kept results go

// epoll tags: (key << 3) | kind. Keys are unique for the agent's lifetime.
enum Kind : uint64_t {
  kListen = 0, kSignal = 1, kConn = 2, kExecOut = 3, kExecErr = 4, kExecIn = 5,
  kVport = 6,  // the virtio-serial port while no host has synced
  kInotify = 7  // the agent's inotify instance (every Watch)
};

struct Conn {
  uint64_t key = 0;
  UniqueFd fd;
  FrameDecoder dec;
  std::string out;     // encoded frames not yet written
  size_t out_off = 0;  // written prefix of `out`
  uint32_t interest = 0;  // current epoll events
  bool closing = false;
  bool in_paused = false;  // requests not read while our output backs up
  bool vport = false;      // fd is the agent's virtio-serial port: not ours to close
  std::unordered_map<uint64_t, uint64_t> execs;  // request id -> exec key
  std::set<uint64_t> paused;                     // exec keys waiting for us to drain
  std::unordered_map<uint64_t, uint64_t> watches;  // request id -> watch key
  size_t pending() const { return out.size() - out_off; }
};

struct Pipe {
  UniqueFd fd;
  uint64_t count = 0;  // bytes accepted (up to the cap)
  std::string buf;     // when not streaming
  bool truncated = false;
  bool eof = false;
};

struct ExecRun {
  uint64_t key = 0;
  uint64_t conn = 0;    // 0: the client went away; events are dropped
  uint64_t req_id = 0;
  pid_t pid = -1;       // also the process group
  bool stream = false;
  uint64_t cap = 0;
  Pipe out, err;
  UniqueFd in, status;  // stdin write end; CLOEXEC pipe the child reports setup errors on
  std::string stdin_data;
  size_t stdin_off = 0;
  bool interactive = false;  // stdin open for Proc input until close_stdin
  bool pty = false;          // in and out are a terminal's master end
  bool privileged = false;   // dsecd's own upkeep (Exec.privileged): not listed nor reached by Proc
  bool stdin_close = false;  // close stdin once stdin_data is written
  bool in_watched = false;   // `in` is in epoll for EPOLLOUT
  std::vector<std::string> argv;  // for Proc list
  bool reaped = false, paused = false, timed_out = false, output_exceeded = false;
  int wait_status = 0;
  int setup_stage = 0, setup_errno = 0;  // from the child, when it failed before or at execve
  rusage ru{};
  // Keyed (Exec.key): the key, what the command was (to refuse the key for
  // another one), and more requests waiting for this run: (conn, request id).
  std::string idem_key;
  size_t fingerprint = 0;
  std::vector<std::pair<uint64_t, uint64_t>> waiters;
  // Streamed: more clients that attached (Exec.attach_pid): (conn, request id).
  std::vector<std::pair<uint64_t, uint64_t>> attached;
  // For messages.
  std::string cwd;
  uint32_t uid = 0, gid = 0;
  int64_t start_ns = 0, deadline_ns = 0, grace_ns = 0;
  uint64_t oom_kills_at_start = 0;  // AgentOptions::oom_events' count
};

// A directory watch (Watch): its client, and the inotify watch descriptors
// it uses (Agent::wd_users_ says which directory each is, for whom).
struct WatchRun {
  uint64_t key = 0;
  uint64_t conn = 0;
  uint64_t req_id = 0;
  std::string root;
  bool recursive = false;
  std::set<int> wds;
  // Entries reported as found in a new directory's first listing (wd,
  // name): their own create event, if it comes too, is not told twice.
  std::set<std::pair<int, std::string>> listed;
  // New directories whose listing was stale (renamed while listed): listed
  // again when their move is read.
  std::set<int> unlisted;
};

// A pseudo-terminal of that size: its master and slave ends (CLOEXEC;
// the master non-blocking). 0, or the errno.
int OpenPty(uint32_t cols, uint32_t rows, UniqueFd* master, UniqueFd* slave);

// The system's CPUs, their busy time and its memory, from /proc (Ping.usage).
void SystemUsage(Pong* p);

class Agent {
 public:
  explicit Agent(const AgentOptions& o) : opts_(o) {}
  int Main();

 private:
  // agent.cpp: setup, loop, connections.
  std::string Init();
  void Loop();
  void Shutdown();
  void OnSignalFd();
  void OnListen();
  Conn* AddConn(int fd);
  bool FromOutside(int fd);  // a peer outside the sandbox's pid namespace
  void OnConnEvent(Conn& c, uint32_t events);
  void OnConnReadable(Conn& c);
  void ProcessFrames(Conn& c);
  void OnFrame(Conn& c, const std::string& frame);
  void Send(Conn& c, const Event& ev);
  void SendError(Conn& c, uint64_t id, int err, const std::string& message);
  void Flush(Conn& c);
  void UpdateInterest(Conn& c);
  void CloseConn(Conn& c);
  void CollectClosed();
  Conn* FindConn(uint64_t key);
  void OnPing(Conn& c, uint64_t id, bool usage);
  int NextTimeoutMs() const;
  void RunTimers();
  // The virtio-serial port (AgentOptions::vport): waiting for a host's sync,
  // the host gone (EOF or hang-up: wait for the next), a new sync.
  void OnVportEvent(uint32_t events);
  void VportScan(std::string bytes);
  void VportHangup();
  void VportWatch(uint64_t tag);

  // agent_exec.cpp: execs.
  void StartExec(Conn& c, uint64_t id, Exec& req);
  // A keyed exec already running or kept: answered from it; true if so.
  bool JoinKeyed(Conn& c, uint64_t id, const Exec& req, size_t fingerprint);
  void OnSignalRequest(Conn& c, uint64_t id, const Signal& req);
  void Reap();
  void OnExecEvent(uint64_t key, Kind kind, uint32_t events);
  void ReadPipe(ExecRun& x, bool is_err, int max_reads);
  // agent_procs.cpp: stdin, and execs by pid (Proc).
  void WriteStdin(ExecRun& x);
  void OnProc(Conn& c, uint64_t id, const Proc& req);
  // Exec.attach_pid: the running streamed exec's output to this request
  // too (until limits.timeout_ms, if set: then ETIMEDOUT, the process runs on).
  void Attach(Conn& c, uint64_t id, const Exec& req);
  void OnAttachTimer(uint64_t conn, uint64_t id);
  // Stops reaching `conn` (gone): its attached requests are forgotten.
  void Detach(ExecRun& x, uint64_t conn);

  // agent_watch.cpp: directory watches (one inotify instance for all).
  void OnWatch(Conn& c, uint64_t id, const Watch& req);
  void OnInotify();
  // Adds `dir` (rel to the watch's root) and, when recursive, what is under
  // it; false with *why past the limit or when the root cannot be watched.
  // With `found`, what is in those directories is passed to it (rel names):
  // a new directory's entries made before its watch was added.
  bool AddWatchDirs(WatchRun& w, const std::string& rel, std::string* why,
                    const std::function<void(const std::string&)>& found = nullptr);
  // Ends a watch: ok (err 0) or an error, to its client if still there.
  void EndWatch(uint64_t key, int err, const std::string& why);
  // A watch's client backs up: inotify is not read (its events wait in the
  // kernel's queue) until every watching connection drains.
  void ResumeInotify();
  // Forgets the directories of watch `w` at `rel` and under it (moved away).
  void DropWatchDirs(WatchRun& w, const std::string& rel);
  // They were renamed within the watched tree: `from` and under it are `to`
  // (false: `from` was not watched).
  bool RenameWatchDirs(WatchRun& w, const std::string& from, const std::string& to);
  // The names of w's unlisted directories at `rel` and under it, parents first.
  std::vector<std::string> UnlistedUnder(const WatchRun& w, const std::string& rel) const;
  void KillGroup(ExecRun& x);
  void Pause(ExecRun& x, Conn& c);
  void Resume(ExecRun& x);
  void ResumePaused(Conn& c);
  void MaybeFinish(ExecRun& x);
  void Finish(ExecRun& x, const std::string& forced_error);
  void OnExecTimer(uint64_t key, int64_t when);
  void WatchFd(int fd, uint64_t key, Kind kind, uint32_t events);
  // oom_kill in AgentOptions::oom_events (0 when there is none).
  uint64_t OomKills() const;

  // agent_files.cpp: file requests (blocking, on local files).
  void OnReadFile(Conn& c, uint64_t id, const ReadFile& req);
  void OnWriteFile(Conn& c, uint64_t id, const WriteFile& req);
  void OnStat(Conn& c, uint64_t id, const Stat& req);
  void OnListDir(Conn& c, uint64_t id, const ListDir& req);
  // A VM guest's changes: its upper layer against its lower ones, shown
  // read-only at kLayersDir by the guest's init (drivers/guard/upper_diff).
  void OnChanges(Conn& c, uint64_t id, const Changes& req);
  void OnPathOp(Conn& c, uint64_t id, const PathOp& req);
  // Answers with the lstat of `path` (FileInfo, owner names included).
  void SendStat(Conn& c, uint64_t id, const std::string& what, const std::string& path);

  AgentOptions opts_;
  std::string cgroup_procs_;  // <AgentOptions::cgroup>/cgroup.procs, or ""
  bool pid1_ = false;
  bool stop_ = false;
  int64_t start_ns_ = 0;
  rlimit nofile_{0, 0};  // RLIMIT_NOFILE we started with; commands get it back
  UniqueFd epoll_, sigfd_, listen_;
  uint64_t fd_conn_ = 0;  // the --fd connection, if any
  // --vport: the port (conversations borrow it), bytes scanned for a sync,
  // and while no host is there, when to look again (0: a host is there).
  UniqueFd vport_;
  std::string vport_scan_;
  int64_t vport_poll_ns_ = 0;
  uint64_t next_key_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<uint64_t, std::unique_ptr<ExecRun>> execs_;
  // Keyed execs: running ones by key, and the last kKeptResults results.
  std::unordered_map<std::string, uint64_t> keyed_running_;
  struct KeptResult {
    std::string key;
    size_t fingerprint = 0;
    run::Outcome done;
  };
  std::vector<KeptResult> kept_;
  std::unordered_map<pid_t, uint64_t> by_pid_;
  UniqueFd inotify_;
  bool inotify_paused_ = false;
  std::unordered_map<uint64_t, std::unique_ptr<WatchRun>> watches_;
  std::unordered_map<int, std::vector<std::pair<uint64_t, std::string>>> wd_users_;  // wd -> (watch, rel dir)
  // A directory moved from within recursive watches, (watch, its old name),
  // and the move's cookie: renamed when the next event is its IN_MOVED_TO,
  // else moved away. Kept across reads: the kernel queues the two apart.
  std::vector<std::pair<uint64_t, std::string>> moved_;
  uint32_t moved_cookie_ = 0;
  // (when, exec key): deadlines and pipe grace ends; stale entries are skipped.
  std::multimap<int64_t, uint64_t> timers_;
  std::multimap<int64_t, std::pair<uint64_t, uint64_t>> attach_timers_;  // (conn, request id)
  std::set<uint64_t> dirty_;  // connections with output to write
  std::vector<uint64_t> closed_;  // connections to forget at the end of the iteration
  ino_t listen_ino_ = 0;          // our socket file, removed at exit if still ours
  int64_t listen_resume_ns_ = 0;  // out of descriptors: accept again from then
};

}  // namespace dsec::agent::internal
