// libvirt helpers the vm kind's files share (vm_driver.cpp,
// vm_snapshot.cpp). Internal to drivers/fullvm.
#pragma once

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include <string>

namespace dsec::drivers::vmx {

inline std::string XmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&apos;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

inline std::string LastError() {
  const char* m = virGetLastErrorMessage();
  return m ? m : "unknown libvirt error";
}

// libvirt prints every error to stderr unless told otherwise: ours go into
// Status messages instead.
inline void Quiet(void*, virErrorPtr) {}

struct DomainRef {
  virDomainPtr d = nullptr;
  ~DomainRef() {
    if (d) virDomainFree(d);
  }
};

}  // namespace dsec::drivers::vmx
