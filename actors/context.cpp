#include "actors/context.hpp"

#include <chrono>

#include "dsec/status_proto.hpp"

namespace dsec {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<drivers::Driver*> NodeContext::DriverFor(const v1::SandboxSpec& spec) const {
  v1::Kind kind = spec.kind();
  if (kind == v1::KIND_UNSPECIFIED || kind == v1::KIND_AUTO) {
    switch (spec.isolation()) {
      case v1::ISOLATION_KERNEL: kind = v1::KIND_MICROVM; break;
      case v1::ISOLATION_HARDWARE: kind = v1::KIND_VM; break;
      case v1::ISOLATION_CONTAINER: kind = v1::KIND_CONTAINER; break;
      default:
        kind = spec.image().empty() || spec.image() == "host" ? v1::KIND_FNCALL : v1::KIND_CONTAINER;
    }
  }
  switch (kind) {
    case v1::KIND_FNCALL:
      if (!fncall) return fncall_unavailable;
      return fncall;
    case v1::KIND_CONTAINER:
      if (!container) return container_unavailable;
      return container;
    default:
      return Status::Unavailable(std::string("sandbox kind '") + KindName(kind) +
                                 "' is not available on this node yet (available: fncall, container)");
  }
}

std::vector<drivers::Driver*> NodeContext::Drivers() const {
  std::vector<drivers::Driver*> out;
  for (auto* d : {fncall, container})
    if (d) out.push_back(d);
  return out;
}

void NodeContext::Kinds(std::vector<std::string>* available, std::vector<std::string>* unavailable) const {
  auto one = [&](const char* kind, drivers::Driver* d, const Status& why_not) {
    Status st = d ? d->Available() : why_not;
    if (st.ok()) available->push_back(kind);
    else unavailable->push_back(std::string(kind) + ": " + st.message());
  };
  one("fncall", fncall, fncall_unavailable);
  one("container", container, container_unavailable);
  for (const char* k : {"microvm", "vm"}) unavailable->push_back(std::string(k) + ": not implemented yet");
}

}  // namespace dsec
