// dsecctl's shared parts (tools/dsecctl/): the flags every command takes,
// specs and execs built from flags, the SDK connection and the admin
// console, and results printed as a local program's with docker run's exit
// codes. main.cpp defines the commands; sandboxes.cpp lists sandboxes.
#pragma once

#include <CLI/CLI.hpp>
#include <google/protobuf/message.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsec/client.hpp"

namespace dsec::ctl {

// dsecctl's exit codes besides a program's own (README, "Exit codes"):
// the same cause gives the same code in every command.
inline constexpr int kLocal = 1;            // a local file could not be read or written
inline constexpr int kUsage = 2;            // the command was wrong (dsecctl's flags, or dsecd: InvalidArgument)
inline constexpr int kPlatformError = 125;  // dsec could not do it: unreachable, unknown id, wrong phase, ...

// $name, or `fallback` when it is unset or empty.
std::string Env(const char* name, const std::string& fallback);

struct Common {
  std::string addr = Env("DSEC_ADDR", "");    // empty: <data-dir>/dsecd.json, else 127.0.0.1:7400
  std::string admin = Env("DSEC_ADMIN", "");  // empty: <data-dir>/dsecd.json, else 127.0.0.1:7401
  std::string data_dir = Env("DSEC_DATA_DIR", "./dsec-data");
  std::string token = Env("DSEC_TOKEN", "");
  std::string token_file;
  std::string sdk_token_file;
  double connect_timeout_s = 5;
};

struct LimitFlags {
  std::string kind = "fncall";
  std::string image;
  double timeout_s = 0;
  double cpu_time_s = 0;
  std::string memory;
  std::string output_limit;
  std::string disk;
  uint32_t pids = 0;
  double cpus = 0;
  std::vector<std::string> env;
  std::string cwd;
  std::vector<std::string> labels;  // KEY=VALUE (create, session open)
  std::string network;              // none | allow | open ("": none, or allow with --allow)
  std::vector<std::string> allow;   // allow-list entries (drivers/net/policy.hpp)
  std::vector<uint32_t> expose;     // TCP ports reachable from the host through dsec
  std::string task_root;            // a task guard (spec.task): its root and globs
  std::vector<std::string> protect, hide;
};

struct LifetimeFlags {
  std::string ttl, idle_timeout, on_idle, on_ttl;
  bool resume_on_call = false;
};

// --kind/--image (unless `spec_only`: an exec's own limits) and the limits.
void AddLimitFlags(CLI::App* c, LimitFlags* l, bool spec_only = false);
void AddLifetimeFlags(CLI::App* c, LifetimeFlags* l);
// "64m", "1g", ... -> bytes; "90", "10m", "2h", "1d" -> seconds. False
// when the text is not one.
bool ParseSize(const std::string& s, uint64_t* out);
bool ParseDuration(const std::string& s, uint32_t* out);
// Each fills its part from flags; "" or what is wrong (for Fail(..., 2)).
std::string ApplyLifetime(const LifetimeFlags& l, v1::SandboxSpec* spec);
std::string ApplyLimits(const LimitFlags& l, v1::Limits* lim);
std::string BuildSpec(const LimitFlags& l, v1::SandboxSpec* spec);
std::string BuildExec(const LimitFlags& l, const std::vector<std::string>& cmd, v1::ExecRequest* exec);
// "KEY=VALUE" flags into a map; "" or which one is not one.
std::string ParseLabels(const std::vector<std::string>& kvs, const char* flag,
                        google::protobuf::Map<std::string, std::string>* out);

// Says "dsecctl: msg" on stderr; returns `code`.
int Fail(const std::string& msg, int code = kPlatformError);
// The same for a call dsec refused or failed: kUsage for InvalidArgument,
// else kPlatformError.
int Fail(const Status& s);
// Checks a flag is a non-negative number; says "'abc' is not <what>".
CLI::Validator Seconds(const std::string& what = "a number of seconds (e.g. 30 or 1.5)");
// A client for the SDK port, or null with *rc set (the reason said).
std::unique_ptr<Client> ConnectOrDie(const Common& c, int* rc);
std::string ReadAllStdin(size_t max);
// The one JSON shape (runtime/proto_json.hpp), pretty, with a newline.
std::string ToJson(const google::protobuf::Message& m);
// dsecctl's exit code for a result (as docker run's); `say` gets why, for
// the non-zero ones a human should read about.
int ExitCode(const v1::ExecResult& r, const std::function<void(const std::string&)>& say);
// Prints a result like a local program would and returns the exit code.
int Report(const v1::ExecResult& r, bool json);
// `dsecctl session show`: the record and its steps, one line each (or JSON).
int ShowSession(const Session& session, bool json);
// `session report`: every flag of its steps, a line each (or JSON lines).
int ReportSession(const Session& session, bool json);
// One admin console command; its reply printed (pretty JSON, or as is).
int Admin(const Common& c, const std::string& line, bool raw);
// The same, its reply line in *reply; or kPlatformError with why there.
int AdminReply(const Common& c, const std::string& line, std::string* reply);
// `dsecctl cp`.
// cp's flags for a copy into a sandbox.
struct CopyFlags {
  std::string user;
  bool parents = false;
  std::vector<std::string> xattrs;  // NAME=VALUE
};
int Copy(const Common& c, const std::string& src, const std::string& dst, const CopyFlags& flags);

// `dsecctl ls`: sandboxes as a table (or JSON), filtered, a page at a time.
struct LsFlags {
  std::vector<std::string> states, kinds, labels;
  std::string image, owner, session, node, since;
  uint32_t limit = 0;  // 0: every match
  std::string page_token;
  bool json = false;
};
void AddLsFlags(CLI::App* c, LsFlags* f);

// `dsecctl sessions`: the console's session rows as a table (or JSON);
// closed ones only with --all.
struct SessionsFlags {
  std::string prefix;
  std::vector<std::string> states;
  bool all = false, json = false;
};
void AddSessionsFlags(CLI::App* c, SessionsFlags* f);
int ListSessions(const Common& c, const SessionsFlags& f);
// `dsecctl session close`: the named sessions, or every open one whose
// name starts with `prefix`; prints each closed.
int CloseSessions(const Common& c, std::vector<std::string> names, const std::string& prefix);

// Before CLI11's message: when a word where a command belongs is none,
// says so with the nearest command and the list; true when it did (the
// caller then exits kUsage without CLI11's message).
bool ExplainBadCommandLine(CLI::App* app, int argc, char** argv);
// After CLI11's message: for a flag-like word CLI11 refused in run, exec or
// session step without --, shows where the command goes.
void HintAfterParseError(const CLI::ParseError& e, int argc, char** argv);
int ListSandboxes(const Common& c, const LsFlags& f);

// `dsecctl snapshot take|ls|inspect|rm` and `dsecctl fork` (snapshots.cpp).
struct SnapshotFlags {
  CLI::App *snapshot = nullptr, *take = nullptr, *ls = nullptr, *inspect = nullptr, *rm = nullptr, *fork = nullptr;
  std::string id, name;
  std::vector<std::string> names;
  uint32_t count = 0;
  bool json = false;
};
void AddSnapshotCommands(CLI::App* app, SnapshotFlags* f);
// Whichever of them was given.
int RunSnapshotCommand(const Common& c, const SnapshotFlags& f);

// `dsecctl exec`, `ps`, `usage`, `signal`, `attach`, `watch` (exec.cpp).
struct ExecFlags {
  CLI::App *exec = nullptr, *ps = nullptr, *usage = nullptr, *signal = nullptr, *attach = nullptr, *watch = nullptr;
  LimitFlags limits;
  std::string id, user, path;
  std::vector<std::string> cmd;
  bool json = false, interactive = false, tty = false, recursive = false;
  uint32_t pid = 0;
  int sig = 15;
  double timeout_s = 0;  // attach, watch: how long (0: until it ends)
};
void AddExecCommands(CLI::App* app, ExecFlags* f);
int RunExecCommand(const Common& c, const ExecFlags& f);

// `dsecctl fs ls|mkdir|mv|rm` (fs.cpp).
struct FsFlags {
  CLI::App *fs = nullptr, *ls = nullptr, *mkdir = nullptr, *mv = nullptr, *rm = nullptr;
  std::string id, path, destination, user;
};
void AddFsCommands(CLI::App* app, FsFlags* f);
int RunFsCommand(const Common& c, const FsFlags& f);

}  // namespace dsec::ctl
