// The unmodified `e2b` SDK from the npm registry (docs/e2b.md), installed
// once into a cache, and node scripts of tests/integration/e2b run with it
// pointed at a dsecd's E2B door, as a user sets E2B_API_URL and the rest.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness/daemon.hpp"
#include "runtime/files.hpp"

namespace dsec::testing {

// The SDK version the door is checked against (docs/e2b.md), pinned with
// its dependencies by tests/integration/e2b/sdk/package-lock.json.
inline constexpr const char* kE2bSdk = "e2b@2.45.0";
inline constexpr const char* kE2bSdkCache = "/var/cache/dsec/npm/e2b-2.45.0";

// The SDK's module path, installed from the registry with `npm ci` (the
// lockfile's versions, checked against its integrity hashes) when missing
// or when the lockfile changed; "" and *skip saying why where the host has
// no node or npm, or the registry cannot be reached.
inline std::string E2bSdkModule(std::string* skip) {
  const std::string src = std::string(DSEC_SOURCE_DIR) + "/tests/integration/e2b/sdk/";
  const std::string module = std::string(kE2bSdkCache) + "/node_modules/e2b/dist/index.js";
  auto lock = ReadFileToString(src + "package-lock.json");
  if (!lock.ok()) {
    *skip = "no " + src + "package-lock.json: " + lock.status().ToString();
    return "";
  }
  auto installed = ReadFileToString(std::string(kE2bSdkCache) + "/node_modules/.dsec-lock");
  struct stat st;
  if (installed.ok() && *lock == *installed && ::stat(module.c_str(), &st) == 0) return module;
  if (::access("/usr/bin/node", X_OK) != 0 || ::access("/usr/bin/npm", X_OK) != 0) {
    *skip = "no node or npm on this host (Debian's nodejs and npm; scripts/dev installs them)";
    return "";
  }
  (void)MakeDirs(kE2bSdkCache, 0755);
  for (const char* f : {"package.json", "package-lock.json"}) {
    auto text = ReadFileToString(src + f);
    if (!text.ok() || !WriteFileAtomic(std::string(kE2bSdkCache) + "/" + f, *text).ok()) {
      *skip = src + f + " could not be copied to " + kE2bSdkCache;
      return "";
    }
  }
  auto r = RunProcess({"/usr/bin/npm", "ci", "--prefix", kE2bSdkCache, "--no-audit", "--no-fund"}, {}, 300);
  if (r.exit_code == 0 && ::stat(module.c_str(), &st) == 0 &&
      WriteFileAtomic(std::string(kE2bSdkCache) + "/node_modules/.dsec-lock", *lock).ok())
    return module;
  *skip = std::string("npm could not install ") + kE2bSdk + " (is the npm registry reachable?): " + r.err.substr(0, 400);
  return "";
}

// Runs tests/integration/e2b/`script` with the SDK (`module`) pointed at
// `daemon`'s door and its first key, `env` added, under `wrapper` (an
// nsenter into the daemon's network namespace, or none).
inline ProcResult RunE2bScript(const TestDaemon& daemon, const std::string& module, const std::string& script,
                               const std::vector<std::string>& env, const std::vector<std::string>& wrapper = {}) {
  auto key = ReadFileToString(daemon.data_dir() + "/e2b.key");
  std::vector<std::string> argv = wrapper;
  for (const std::string& a : {std::string("/usr/bin/env"), "E2B_MODULE=" + module,
                               "E2B_API_URL=http://" + daemon.e2b_addr(), "E2B_SANDBOX_URL=http://" + daemon.e2b_addr(),
                               "E2B_API_KEY=" + (key.ok() ? key->substr(0, key->find('\n')) : ""),
                               std::string("E2B_DOMAIN=dsec.invalid")})
    argv.push_back(a);
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back("/usr/bin/node");
  argv.push_back(std::string(DSEC_SOURCE_DIR) + "/tests/integration/e2b/" + script);
  return RunProcess(argv, {}, 180);
}

}  // namespace dsec::testing
