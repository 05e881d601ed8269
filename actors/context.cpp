#include "actors/context.hpp"

#include <chrono>

#include "dsec/status_proto.hpp"

namespace dsec {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<drivers::Driver*> NodeContext::DriverFor(v1::Kind kind) const {
  switch (kind) {
    case v1::KIND_UNSPECIFIED:
    case v1::KIND_AUTO:
    case v1::KIND_FNCALL:
      if (!fncall) return fncall_unavailable;
      return fncall;
    default:
      return Status::Unavailable(std::string("sandbox kind '") + KindName(kind) +
                                 "' is not available on this node yet (available: fncall)");
  }
}

}  // namespace dsec
