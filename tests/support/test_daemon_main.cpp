// dsec-test-daemon: a TestDaemon (harness/daemon.hpp) driven over a pipe,
// for tests written in another language (the Python SDK's pytest suite).
// It starts dsecd on free loopback ports with a fresh data dir, optionally
// with an image made from the host's tools, and prints one JSON line:
//   {"sdk": ..., "admin": ..., "data_dir": ..., "pid": ..., "image": ..., "kinds": [...]}
// or {"skip": "why this host cannot"} / {"error": "..."}. With --nodes N
// that dsecd is a controller (--role controller), the image is built into
// it (nodes fetch it), N nodes join it, and the line also has
//   "nodes": [{"id": ..., "pid": ..., "sdk": ...}, ...]
// Then it reads commands, one per line, and answers each with one JSON line:
//   kill9    kill -9 dsecd (its spawners clean up and exit)
//   restart  start it again on the same ports and data dir
//   stop     SIGTERM and wait
//   pid      dsecd's pid now
//   admin LINE         one admin console command (after AUTH); its reply
//   kill9-node ID      kill -9 the node ID
//   restart-node ID    start the node ID again (it rejoins)
// At EOF on stdin (the test ended, or died) it stops dsecd and removes
// everything, as the C++ tests' fixtures do.
#include <unistd.h>

#include <cstdlib>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "tests/support/host_probes.hpp"

using dsec::testing::BinDir;
using dsec::testing::RunProcess;
using dsec::testing::TestDaemon;
using nlohmann::json;

// What a test left open on `d` (it failed midway): closed, said on stderr.
// Containers outlive their dsecd, so they must go while it runs.
static void CloseLeftovers(TestDaemon& d) {
  if (!d.running()) return;
  auto ls = d.Admin("ls");
  for (const auto& s : ls.value("sessions", json::array())) {
    std::string name = s.value("name", "");
    if (name.empty() || s.value("phase", "") == "closed") continue;
    std::cerr << "dsec-test-daemon: closing session " << name << ", left open by the test\n";
    d.Admin("kill " + name);
  }
  for (const auto& s : d.Admin("ls").value("sandboxes", json::array())) {
    std::string id = s.value("id", "");
    if (id.empty()) continue;
    std::cerr << "dsec-test-daemon: destroying sandbox " << id << ", left by the test\n";
    d.Admin("kill " + id);
  }
}

static int Usage() {
  std::cerr << "usage: dsec-test-daemon [--image NAME] [--nodes N] [--cgroup-parent P] [-- dsecd flags...]\n"
               "Starts a test dsecd (with --nodes: a controller and N nodes joined to it) and prints its\n"
               "endpoints as JSON; then reads kill9, restart, stop, pid, admin LINE, kill9-node ID,\n"
               "restart-node ID on stdin; EOF stops everything and removes its data.\n";
  return 2;
}

int main(int argc, char** argv) {
  std::string image;
  int nodes = 0;
  dsec::testing::TestDaemonOptions o;
  o.cgroup_parent = "dsec-test";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") return Usage(), 0;
    if (a == "--image" && i + 1 < argc) image = argv[++i];
    else if (a == "--cgroup-parent" && i + 1 < argc) o.cgroup_parent = argv[++i];
    else if (a == "--nodes" && i + 1 < argc) nodes = std::atoi(argv[++i]);
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
  if (nodes < 0 || nodes > 8) return Usage();
  if (nodes > 0) o.role = "controller";
  auto d = TestDaemon::Start(o);
  if (!d.ok()) return say({{"error", "dsecd did not start: " + d.status().ToString()}}), 1;
  auto& daemon = *d;
  // The nodes, by id; they join the controller with its secret.
  std::map<std::string, std::unique_ptr<TestDaemon>> node;
  json rows = json::array();
  for (int i = 0; i < nodes; ++i) {
    dsec::testing::TestDaemonOptions no;
    no.cgroup_parent = o.cgroup_parent;
    no.extra_args = {"--role", "node", "--join", daemon->cluster_addr(), "--cluster-secret",
                     daemon->data_dir() + "/cluster.secret"};
    auto n = TestDaemon::Start(no);
    if (!n.ok()) return say({{"error", "node " + std::to_string(i) + " did not start: " + n.status().ToString()}}), 1;
    std::string id = (*n)->Admin("status").value("node", "");
    rows.push_back({{"id", id}, {"pid", (*n)->pid()}, {"sdk", (*n)->sdk_addr()}});
    node[id] = std::move(*n);
  }
  // Every node joined (it says so in its heartbeat's first answer).
  for (int tries = 0; nodes > 0; ++tries) {
    int up = 0;
    for (const auto& row : daemon->Admin("nodes").value("nodes", json::array())) up += row.value("state", "") == "up";
    if (up == nodes) break;
    if (tries == 400) return say({{"error", "the nodes did not join within 20 s: " + daemon->Admin("nodes").dump()}}), 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
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
       {"kinds", status.value("kinds", json::array())},
       {"nodes", rows}});
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
    } else if (line.rfind("admin ", 0) == 0) {
      say(daemon->Admin(line.substr(6)));
    } else if (line.rfind("kill9-node ", 0) == 0 || line.rfind("restart-node ", 0) == 0) {
      bool kill = line[0] == 'k';
      auto it = node.find(line.substr(line.find(' ') + 1));
      if (it == node.end()) {
        say({{"error", "no node '" + line.substr(line.find(' ') + 1) + "' (the ids are in the first line)"}});
      } else if (kill) {
        it->second->Kill9();
        say({{"ok", true}});
      } else {
        auto st = it->second->Restart();
        if (st.ok()) say({{"ok", true}, {"pid", it->second->pid()}});
        else say({{"error", st.ToString()}});
      }
    } else {
      say({{"error", "unknown command '" + line + "' (kill9, restart, stop, pid, admin LINE, kill9-node ID, "
                     "restart-node ID)"}});
    }
  }
  for (auto& [id, n] : node) {
    // A node the test killed still has its containers: started again, it takes them back and closes them.
    if (!n->running() && !n->Restart().ok()) std::cerr << "dsec-test-daemon: node " << id << " did not start again\n";
    CloseLeftovers(*n);
  }
  if (node.empty()) CloseLeftovers(*daemon);
  return 0;
}
