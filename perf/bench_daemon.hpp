// What the benchmarks that start their own dsecd share: the daemon (in
// cgroup dsec-bench, without test hooks) and a scratch rootfs of host
// programs to build an image from.
#pragma once

#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "dsec/client.hpp"
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

// Builds image `name` from `rootfs` into the daemon's data dir (dsec-image build).
inline Status BuildBenchImage(const testing::TestDaemon& d, const std::string& rootfs, const std::string& name) {
  auto built = testing::RunProcess({testing::BinDir() + "/dsec-image", "--data-dir", d.data_dir(), "build", rootfs, name});
  return built.exit_code == 0 ? Status::Ok() : Status::Internal("dsec-image build " + name + ": " + built.err);
}

// An SDK client of the daemon.
inline Result<std::unique_ptr<Client>> BenchClient(const testing::TestDaemon& d) {
  ClientOptions co;
  co.address = d.sdk_addr();
  co.data_dir = d.data_dir();
  return Client::Connect(co);
}

}  // namespace dsec::bench
