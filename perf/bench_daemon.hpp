// What the benchmarks that start their own dsecd share: the daemon (in
// cgroup dsec-bench, without test hooks) and a scratch rootfs of host
// programs to build an image from.
#pragma once

#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"

namespace dsec::bench {

inline Result<std::unique_ptr<testing::TestDaemon>> StartBenchDaemon(std::vector<std::string> extra_args = {}) {
  testing::TestDaemonOptions o;
  o.cgroup_parent = "dsec-bench";
  o.test_hooks = false;
  o.extra_args = std::move(extra_args);
  return testing::TestDaemon::Start(o);
}

// A new dir /tmp/<prefix>-XXXXXX holding the host's `programs` (no python);
// the caller removes it.
inline Result<std::string> ScratchRootfs(const std::string& prefix, std::vector<std::string> programs) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) return Status::FromErrno(errno, "mkdtemp " + tmpl);
  testing::RootfsOptions ro;
  ro.programs = std::move(programs);
  ro.python = false;
  if (Status made = testing::MakeRootfs(tmpl, ro); !made.ok()) return made;
  return tmpl;
}

}  // namespace dsec::bench
