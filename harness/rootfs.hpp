// Small root filesystems for container tests, made from the host's own
// binaries: each program and the shared libraries ldd names for it, plus
// python3 and its standard library when asked, a passwd/group and the usual
// top-level directories. Tens of MiB at most, so an image builds in seconds.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::testing {

struct RootfsOptions {
  // Host programs found on PATH, installed as /bin/<name> (sh is dash here).
  std::vector<std::string> programs = {"sh",   "bash", "cat",  "echo", "ls",    "mkdir", "rm",    "sleep", "true",
                                       "false", "id",  "ps",   "head", "tail",  "yes",   "wc",    "touch", "ln",
                                       "stat",  "kill", "env", "seq",  "dd",    "sha256sum", "hostname", "chmod",
                                       "chown", "cp",   "mv",  "grep", "mount", "tr",    "timeout", "dirname", "mkfifo"};
  bool python = true;  // /usr/bin/python3 and /usr/lib/python3.<minor> (tests and caches left out)
  // More host files, each to its path in the rootfs, with the libraries ldd
  // names for it: {host path, path in the rootfs}. Debug info is left out
  // (strip --strip-debug, where binutils is installed).
  std::vector<std::pair<std::string, std::string>> files;
};

// Fills `dir` (created when missing). FailedPrecondition naming what the
// host lacks (a program, ldd).
Status MakeRootfs(const std::string& dir, const RootfsOptions& options = RootfsOptions());

}  // namespace dsec::testing
