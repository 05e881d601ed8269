// A reply (any message with a `status` field) that carries only an error.
#pragma once

#include "dsec/status_proto.hpp"

namespace dsec {

template <class Reply>
Reply ErrorReply(const Status& s) {
  Reply r;
  ToProto(s, r.mutable_status());
  return r;
}

}  // namespace dsec
