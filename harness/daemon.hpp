// A real dsecd for integration and fault tests: started on ephemeral
// loopback ports with a fresh data dir, stopped by PID (SIGTERM, or kill -9
// for fault tests), restartable on the same data dir and ports. Also runs
// dsecctl and talks to the admin console.
#pragma once

#include <sys/types.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsec/status.hpp"
#include "runtime/line_client.hpp"

namespace dsec::testing {

// Where the built binaries are (DSEC_BIN_DIR, set by ctest; else next to the test).
std::string BinDir();

// The VM guest (kernel and initramfs) every test dsecd boots microVMs and
// VMs with (--guest-dir): $DSEC_GUEST_DIR, else <bin>/../guest.
std::string TestGuestDir();
// Prepares TestGuestDir() once (dsec-image guest; apt-get download of
// Debian's kernel package), under a lock, for every test process. Both
// empty when it is ready. `skip`: the host cannot have it, as probed apart
// from dsec (apt knows no such package, or the mirror does not give it);
// `failure`: dsec-image guest failed on a host that can.
struct GuestPrep {
  std::string skip, failure;
};
GuestPrep EnsureTestGuest();

// Every cgroup hierarchy's root on this host, as /proc/mounts has them: each
// v1 controller's mount (memory, pids, cpu, ...) and each cgroup2 mount. A
// check of what a test left looks in all of them, whichever version dsecd
// uses here.
std::vector<std::string> CgroupRoots();

struct ProcResult {
  int exit_code = -1;  // 128+N when killed by signal N
  std::string out, err;
};
// Runs `argv` (argv[0] a path) with `stdin_data`, waits, captures output.
ProcResult RunProcess(const std::vector<std::string>& argv, const std::string& stdin_data = {},
                      int timeout_s = 120);

// A child process whose stdout is read line by line as it comes (stderr
// goes to the test's stderr). Killed with SIGKILL and reaped by the
// destructor if still running.
class Child {
 public:
  static Result<std::unique_ptr<Child>> Start(const std::vector<std::string>& argv);
  ~Child();
  // The next stdout line (without '\n'); false at EOF or after timeout_s.
  bool ReadLine(std::string* line, int timeout_s = 120);
  void Kill9();
  // Waits for the exit: the exit code, 128+N when killed by signal N.
  int Wait();
  pid_t pid() const { return pid_; }

 private:
  Child() = default;
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
};

struct TestDaemonOptions {
  std::vector<std::string> extra_args;  // more dsecd flags
  // A command dsecd is started through (it must exec dsecd in its own
  // process, as `unshare --mount --propagation shared --` does).
  std::vector<std::string> wrapper;
  // A command Ctl runs dsecctl through (`ip netns exec NS`: a dsecd in a
  // network namespace of the test's is reached from there).
  std::vector<std::string> ctl_wrapper;
  // Sandbox networking on (an nftables table and forwarding in dsecd's
  // network namespace): only for a dsecd in a namespace of the test's
  // (`wrapper`); off, the host's own network is never touched.
  bool network = false;
  std::string cgroup_parent = "dsec-test";
  bool test_hooks = true;
  // "controller": dsecd --role controller with its cluster port on an
  // ephemeral loopback port (cluster_addr()). A node gets --role node,
  // --join and --cluster-secret through extra_args.
  std::string role = "all";
  // The address its SDK, console and HTTP ports listen on (ephemeral
  // ports); a node in a network namespace listens on its veth's.
  std::string host = "127.0.0.1";
  // A controller's --cluster-listen at its first start (later starts keep its port).
  std::string cluster_listen = "127.0.0.1:0";
  // dsecd leads a process group of its own, as a shell's foreground job
  // does (Interrupt() sends its group a terminal's Ctrl-C).
  bool own_process_group = false;
  // The data dir's name after /tmp/ (a unique suffix is added): a long one
  // shows what paths of the data dir pass kernel limits.
  std::string data_dir_name = "dsec-test";
};

class TestDaemon {
 public:
  using Options = TestDaemonOptions;
  // Starts dsecd (fresh data dir under /tmp, removed by the destructor).
  static Result<std::unique_ptr<TestDaemon>> Start(Options options = Options());
  TestDaemon(const TestDaemon&) = delete;  // one owner stops and cleans up
  TestDaemon& operator=(const TestDaemon&) = delete;
  ~TestDaemon();

  // kill -9 the daemon and wait until its spawner has cleaned up and gone.
  void Kill9();
  // SIGTERM and wait (clean stop). Returns dsecd's exit code.
  int Stop();
  // Ctrl-C in a terminal: SIGINT to dsecd's process group (with
  // own_process_group; else to dsecd), and wait. Returns its exit code.
  int Interrupt();
  // Starts again on the same data dir and the same ports; `more_args`:
  // dsecd flags for this start only (e.g. --test-fault).
  Status Restart(const std::vector<std::string>& more_args = {});
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  const std::string& sdk_addr() const { return sdk_addr_; }
  const std::string& admin_addr() const { return admin_addr_; }
  // Metrics and the status page (dsecd --http; an ephemeral port, kept
  // across restarts).
  const std::string& http_addr() const { return http_addr_; }
  // The E2B door (dsecd --e2b; an ephemeral port, kept across restarts).
  const std::string& e2b_addr() const { return e2b_addr_; }
  // A controller's cluster port (where nodes join), kept across restarts.
  const std::string& cluster_addr() const { return cluster_addr_; }
  const std::string& data_dir() const { return data_dir_; }
  const std::string& log_path() const { return log_path_; }
  std::string Token() const;     // the admin token
  std::string SdkToken() const;  // the SDK token

  // dsecctl with --addr/--admin/--data-dir of this daemon.
  ProcResult Ctl(std::vector<std::string> args, const std::string& stdin_data = {}) const;
  // One admin console command after AUTH; the parsed reply.
  nlohmann::json Admin(const std::string& line) const;

 private:
  TestDaemon() = default;
  Status Launch(const std::string& listen, const std::string& admin, const std::vector<std::string>& more_args = {});
  // Sends `sig` to `target` (dsecd, or -its group) and waits for dsecd.
  int StopWith(int sig, pid_t target);

  Options options_;
  pid_t pid_ = -1;
  std::string data_dir_, log_path_, sdk_addr_, admin_addr_, http_addr_, e2b_addr_, cluster_addr_;
};

// Raw admin console connection for bad-input tests.
class ConsoleConn {
 public:
  // From `source` (e.g. 127.0.0.2: another host, as the console's
  // per-address slow-down of wrong tokens sees it) when given.
  // A failed connect shows as !ok() and as the reads' and writes' errors.
  explicit ConsoleConn(const std::string& addr, const std::string& source = "") { (void)c_.Connect(addr, source); }
  bool ok() const { return c_.connected(); }
  bool Send(const std::string& bytes) { return c_.Send(bytes).ok(); }
  // The next reply line, "" on EOF/timeout (then closed() tells which).
  std::string ReadLine(int timeout_ms = 10000) {
    auto l = c_.ReadLine(timeout_ms);
    return l.ok() ? *l : std::string();
  }
  bool closed() const { return c_.closed(); }

 private:
  LineClient c_;
};

// Children of `pid` (all its threads').
std::vector<pid_t> ChildrenOf(pid_t pid);

// Detaches every mount below `dir` (/proc/self/mountinfo), the deepest
// first; the mount points it detached.
std::vector<std::string> UnmountAllUnder(const std::string& dir);

// Processes whose command line contains `needle` (for leak checks).
std::vector<pid_t> ProcessesMatching(const std::string& needle);
// /proc/<pid>/cmdline as is ('\0' after each argument); "" when the process
// is gone (it may exit while it is read).
std::string ProcCmdline(const std::string& pid);

}  // namespace dsec::testing
