// The fake kind's programs: a small deterministic POSIX-sh subset and a
// set of builtin tools, interpreted in-process over a FakeBox's files. One
// call runs one exec to its end, as the agent would run a process tree.
//
// The language: lists (; newline && || & |), ( ... ) and { ...; }, if /
// while / until / for, quoting ('...', "...", \), $VAR ${VAR} ${VAR:-w}
// $? $# $$ $! $0..$9 $@ $*, $(...) and `...`, $((...)) with C integer
// operators, NAME=V (alone and before a command), redirections (< > >>
// N>&M, /dev/null, /dev/zero), ~, and #! scripts in the box's files.
// The tools (dash's echo, coreutils' messages): : true false echo printf
// exit pwd cd export unset read wait break continue shift eval test [ env
// printenv sleep sh (fake_builtins.cpp); cat head tail wc tr sort grep seq
// yes (fake_tools.cpp); ls stat touch rm mkdir rmdir cp mv chmod basename
// dirname (fake_file_tools.cpp). What is not there fails as a real shell
// fails on a missing program (case, kill, python3: exit 127) or a syntax
// error (functions, here-documents); a glob stays as written, as an
// unmatched one does.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "drivers/fake/fake_box.hpp"

namespace dsec::drivers {

// One exec, as the driver resolved it (environment merged, cwd chosen).
struct FakeExec {
  std::vector<std::string> argv;  // ["sh", "-c", SCRIPT, ...] or one tool
  std::map<std::string, std::string> env;
  std::string cwd = "/work";
  std::string stdin_data;
  uint64_t timeout_ms = 0;       // wall clock; 0: none
  uint64_t memory_bytes = 0;     // what the run may buffer; 0: none
  uint64_t output_bytes = 0;     // per stream; 0: 1 MiB, as the agent
  uint64_t file_size_bytes = 0;  // largest file it may write; 0: none
  // Streamed: each write of the run's stdout or stderr, as it happens, and
  // nothing kept for the result.
  std::function<void(bool is_stderr, const std::string& data)> on_output;
};

// How the exec ended, in the terms run::Outcome gives the verdict in.
struct FakeResult {
  enum class Ending {
    kExited,         // exit_code
    kTimedOut,       // its wall limit: SIGKILL
    kOutputLimit,    // a stream passed its cap: SIGKILL, truncated
    kMemoryLimit,    // buffered past its limit: SIGKILL (an OOM kill)
    kKilled,         // on request (detail: the reason): SIGKILL
    kPlatform,       // the box went away under it (detail says how)
    kNotFound,       // argv[0] is no tool and no file: 127
    kNotExecutable,  // argv[0] is a file without x or #!: 126
    kBadCwd,         // detail: why the working directory cannot be entered
  };
  Ending ending = Ending::kExited;
  int exit_code = 0;
  int signal = 0;  // SIGKILL for the kills
  std::string detail;
  std::string out, err;
  bool out_truncated = false;
  bool err_truncated = false;
  uint64_t cpu_us = 0;  // CPU of the interpreter's threads (sleep is free)
  uint64_t wall_us = 0;
  uint64_t peak_memory_bytes = 0;  // largest sum of buffers at once
};

// Runs `exec` in `box` on the calling thread until it ends (its background
// jobs live on in the box). `ctl` stops it from outside (Kill, Destroy);
// the run's deadline and memory limit are set on it here.
FakeResult RunFakeExec(FakeBox& box, const FakeExec& exec, const std::shared_ptr<FakeRunControl>& ctl);

// Whether `name` (a bare name or /bin/, /usr/bin/ path) is a builtin tool
// of the fake shell.
bool IsFakeTool(const std::string& name);

}  // namespace dsec::drivers
