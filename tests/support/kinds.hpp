// The sandbox kinds of the registry as test parameters: suites that every
// kind (or every kind with a trait) must pass take them from here, so a new
// kind is tested by being registered.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "drivers/registry.hpp"
#include "harness/daemon.hpp"

namespace dsec::testing {

struct KindParam {
  std::string name;
  v1::Kind kind;
  drivers::KindTraits traits;
};

// Every registered kind for which `want` holds (all when it is empty);
// kinds for tests (the fake) only when `with_test_kinds`: a suite that
// checks what a kind's isolation forbids has nothing to check on them.
inline std::vector<KindParam> RegisteredKinds(std::function<bool(const drivers::KindTraits&)> want = nullptr,
                                              bool with_test_kinds = false) {
  std::vector<KindParam> out;
  for (const auto& k : drivers::AllKinds()) {
    if (k->traits().test_only && !with_test_kinds) continue;
    if (!want || want(k->traits())) out.push_back({k->name(), k->kind(), k->traits()});
  }
  return out;
}

// The kinds whose programs run on the host's kernel (fncall, containers):
// suites that check what the host's kernel forbids a sandbox, or that watch
// a sandbox's processes from the host, are theirs. A VM's guest is its own
// machine; tests/security/vm_isolation_test.cpp checks what a guest cannot
// do to the host.
inline bool OnTheHostKernel(const drivers::KindTraits& t) { return t.isolation < v1::ISOLATION_KERNEL; }

// Why this host cannot run `k`'s sandboxes in tests ("" when it can): VM
// kinds need QEMU and the guest (prepared once here, EnsureTestGuest). The
// gaps are probed apart from dsec; a guest dsec-image fails to prepare on a
// host that could have it is the test's failure (recorded here), never a
// skip: the text returned then starts with "FAILED".
inline std::string KindHostGap(const KindParam& k) {
  if (k.traits.isolation < v1::ISOLATION_KERNEL) return "";
  if (::system("command -v qemu-system-x86_64 >/dev/null 2>&1") != 0)
    return k.name + " sandboxes need QEMU: apt-get install qemu-system-x86";
  if (k.kind == v1::KIND_VM && ::system("virsh -q -c qemu:///system uri >/dev/null 2>&1") != 0)
    return k.name + " sandboxes need libvirtd at qemu:///system: apt-get install libvirt-daemon-system, then "
                    "`virtlogd -d; libvirtd -d` (scripts/dev test does both)";
  auto guest = EnsureTestGuest();
  if (!guest.failure.empty()) {
    ADD_FAILURE() << k.name << " sandboxes: " << guest.failure;
    return "FAILED: " + guest.failure;
  }
  return guest.skip.empty() ? "" : k.name + " sandboxes need the VM guest: " + guest.skip;
}

// The kinds whose sandboxes are VMs (microvm, vm).
inline bool IsVm(const drivers::KindTraits& t) { return t.isolation >= v1::ISOLATION_KERNEL; }

// The test's name suffix: the kind's.
inline std::string KindParamName(const ::testing::TestParamInfo<KindParam>& info) { return info.param.name; }

// gtest prints a parameter with this, not as raw bytes.
inline void PrintTo(const KindParam& k, std::ostream* os) { *os << k.name; }

}  // namespace dsec::testing
