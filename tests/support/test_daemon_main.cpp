// dsec-test-daemon: a TestDaemon (harness/daemon.hpp) driven over a pipe,
// for tests written in another language (the Python SDK's pytest suite).
// It starts dsecd on free loopback ports with a fresh data dir, optionally
// with an image made from the host's tools, and prints one JSON line:
//   {"sdk": ..., "admin": ..., "data_dir": ..., "pid": ..., "image": ..., "kinds": [...]}
// or {"skip": "why this host cannot"} / {"error": "..."}. Then it reads
// commands, one per line, and answers each with one JSON line:
//   kill9    kill -9 dsecd (its spawners clean up and exit)
//   restart  start it again on the same ports and data dir
//   stop     SIGTERM and wait
//   pid      dsecd's pid now
// At EOF on stdin (the test ended, or died) it stops dsecd and removes
// everything, as the C++ tests' fixtures do.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "tests/support/host_probes.hpp"

using dsec::testing::BinDir;
using dsec::testing::RunProcess;
using dsec::testing::TestDaemon;
using nlohmann::json;

static int Usage() {
  std::cerr << "usage: dsec-test-daemon [--image NAME] [--cgroup-parent P] [-- dsecd flags...]\n"
               "Starts a test dsecd and prints its endpoints as JSON; then reads kill9, restart, stop,\n"
               "pid on stdin; EOF stops it and removes its data.\n";
  return 2;
}

int main(int argc, char** argv) {
  std::string image;
  dsec::testing::TestDaemonOptions o;
  o.cgroup_parent = "dsec-test";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") return Usage(), 0;
    if (a == "--image" && i + 1 < argc) image = argv[++i];
    else if (a == "--cgroup-parent" && i + 1 < argc) o.cgroup_parent = argv[++i];
    else if (a == "--") {
      for (++i; i < argc; ++i) o.extra_args.push_back(argv[i]);
    } else {
      return Usage();
    }
  }
  auto say = [](const json& j) { std::cout << j.dump() << std::endl; };
  if (::geteuid() != 0) return say({{"skip", "needs root (namespaces, cgroups)"}}), 0;
  if (auto gap = dsec::testing::FncallHostGap(); !gap.empty()) return say({{"skip", gap}}), 0;
  if (!image.empty())
    if (auto gap = dsec::testing::ContainerHostGap(); !gap.empty())
      return say({{"skip", "container sandboxes unavailable on this host: " + gap}}), 0;
  auto d = TestDaemon::Start(o);
  if (!d.ok()) return say({{"error", "dsecd did not start: " + d.status().ToString()}}), 1;
  auto& daemon = *d;
  auto status = daemon->Admin("status");
  if (!image.empty()) {
    char tmpl[] = "/tmp/dsec-test-rootfs-XXXXXX";
    if (!::mkdtemp(tmpl)) return say({{"error", "mkdtemp failed"}}), 1;
    std::string rootfs = tmpl;
    auto made = dsec::testing::MakeRootfs(rootfs);
    dsec::testing::ProcResult built;
    if (made.ok())
      built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon->data_dir(), "build", rootfs, image});
    RunProcess({"/bin/rm", "-rf", rootfs});
    if (made.code() == dsec::Status::Code::kFailedPrecondition)
      return say({{"skip", "cannot make the test rootfs on this host: " + made.ToString()}}), 0;
    if (!made.ok()) return say({{"error", "cannot make the test rootfs: " + made.ToString()}}), 1;
    if (built.exit_code != 0) return say({{"error", "dsec-image build failed: " + built.err}}), 1;
  }
  say({{"sdk", daemon->sdk_addr()},
       {"admin", daemon->admin_addr()},
       {"data_dir", daemon->data_dir()},
       {"log", daemon->log_path()},
       {"pid", daemon->pid()},
       {"image", image},
       {"kinds", status.value("kinds", json::array())}});
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "kill9") {
      daemon->Kill9();
      say({{"ok", true}});
    } else if (line == "restart") {
      auto st = daemon->Restart();
      if (st.ok()) say({{"ok", true}, {"pid", daemon->pid()}});
      else say({{"error", st.ToString()}});
    } else if (line == "stop") {
      say({{"ok", true}, {"exit_code", daemon->Stop()}});
    } else if (line == "pid") {
      say({{"ok", true}, {"pid", daemon->pid()}});
    } else {
      say({{"error", "unknown command '" + line + "' (kill9, restart, stop, pid)"}});
    }
  }
  return 0;
}
