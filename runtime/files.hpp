// Small file helpers for the data dir: atomic writes, secret files, the
// daemon's endpoint file.
#pragma once

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

#include "dsec/status.hpp"

namespace dsec {

Result<std::string> ReadFileToString(const std::string& path);
// Writes via a temporary file + rename, so readers never see half a file.
Status WriteFileAtomic(const std::string& path, const std::string& content, mode_t mode = 0644);
// mkdir -p.
Status MakeDirs(const std::string& path, mode_t mode = 0755);
// The admin token at `path`, created (32 random hex chars, mode 0600) when absent.
Result<std::string> LoadOrCreateToken(const std::string& path);
// Random lowercase hex of `chars` characters from /dev/urandom.
std::string RandomHex(size_t chars);
// `n` bytes as lower-case hex (two digits each).
std::string HexOf(const void* data, size_t n);
// Names of the subdirectories of `dir` (not . or ..); empty when it cannot
// be read.
std::vector<std::string> ListSubdirs(const std::string& dir);
// Every name in `dir` but . and .., sorted (empty when it cannot be read).
std::vector<std::string> ListEntries(const std::string& dir);
// A helper binary: $env_var when set, else `name` next to this executable.
std::string SiblingExecutable(const char* env_var, const std::string& name);
// rm -rf `path`: never follows a symlink, never crosses into another
// filesystem. Ok when nothing is left (or nothing was there).
Status RemoveTree(const std::string& path);
// Absolute form of `path` (need not exist).
std::string AbsolutePath(const std::string& path);

// The mount ids of the mount namespace process `pid` is in (its
// mountinfo's first field: what statx's STATX_MNT_ID gives); empty when
// it is gone.
std::set<uint64_t> MountIds(int pid);
// Runs argv (argv[0] a path; no shell) with stdout and stderr to `output`
// ("/dev/null" to drop them) and waits: its exit status, -1 when it could
// not run or was killed.
int RunToFile(const std::vector<std::string>& argv, const std::string& output);

}  // namespace dsec
