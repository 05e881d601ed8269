// What a test sees of a dsecd's VM sandboxes from the host, for either VM
// kind: microvm (QEMU run by dsecd, its VMs in <data>/vms/<id>) and vm
// (libvirt domains dsec-<tag>-<id>, their dirs in <data>/domains/<id>).
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "drivers/fullvm/vm_driver.hpp"
#include "drivers/vm/guest.hpp"
#include "harness/daemon.hpp"
#include "runtime/files.hpp"

namespace dsec::testing {

// The kind's dir of VM dirs in `daemon`'s data dir.
inline std::string VmRoot(const TestDaemon& daemon, v1::Kind k) {
  return daemon.data_dir() + (k == v1::KIND_VM ? "/domains" : "/vms");
}

// The QEMU processes of `daemon`'s VMs of kind `k` (their command lines
// name the kind's dir: a microVM's sockets, a domain's initramfs).
inline std::vector<pid_t> VmProcesses(const TestDaemon& daemon, v1::Kind k) {
  return ProcessesMatching(VmRoot(daemon, k) + "/");
}

// The QEMU of VM `id` (empty when it is gone).
inline std::vector<pid_t> VmProcessesOf(const TestDaemon& daemon, v1::Kind k, const std::string& id) {
  if (k == v1::KIND_VM)
    return ProcessesMatching("guest=" + drivers::VmDriver::DomainPrefix(daemon.data_dir()) + id + ",");
  return ProcessesMatching(VmRoot(daemon, k) + "/" + id + "/");
}

inline std::string VirshOutput(const std::string& args) {
  std::string out;
  if (FILE* f = ::popen(("virsh -q -c qemu:///system " + args + " 2>&1").c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    ::pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// `daemon`'s libvirt domains (vm sandboxes), running or not.
inline std::vector<std::string> VmDomains(const TestDaemon& daemon) {
  std::vector<std::string> out;
  std::string prefix = drivers::VmDriver::DomainPrefix(daemon.data_dir());
  std::string names = VirshOutput("list --all --name");
  size_t start = 0;
  while (start < names.size()) {
    size_t end = names.find('\n', start);
    if (end == std::string::npos) end = names.size();
    std::string n = names.substr(start, end - start);
    if (n.rfind(prefix, 0) == 0) out.push_back(n);
    start = end + 1;
  }
  return out;
}

// How the host keeps VM `id` of kind `k`: "paused" or "running" (QEMU's
// run state from its monitor, or the domain's state from libvirt).
inline std::string VmRunState(const TestDaemon& daemon, v1::Kind k, const std::string& id) {
  if (k == v1::KIND_VM) return VirshOutput("domstate " + drivers::VmDriver::DomainPrefix(daemon.data_dir()) + id);
  auto r = drivers::vm::QmpExecute(VmRoot(daemon, k) + "/" + id + "/q", "query-status", "", 5000);
  if (!r.ok()) return r.status().ToString();
  auto j = nlohmann::json::parse(*r, nullptr, false);
  return j.is_object() ? j.value("status", "") : "";
}

}  // namespace dsec::testing
