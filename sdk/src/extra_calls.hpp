// Calls of a sandbox beyond client.hpp's (dsec/files.hpp, dsec/processes.hpp, dsec/watch.hpp),
// made through Sandbox's private Call (instantiated for them in handles.cpp).
#pragma once

#include "dsec/client.hpp"

namespace dsec {

struct ExtraCalls {
  template <class Reply, class Request>
  static void Call(const Sandbox& sb, Request req, Done<Reply> done, OnOutput on_output = nullptr) {
    sb.Call<Reply>(std::move(req), std::move(done), std::move(on_output));
  }
};

}  // namespace dsec
