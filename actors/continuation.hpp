// Continuation: "run this on the actor's own thread". Drivers and the group
// committer call back on their threads; the callback posts a Continuation to
// the actor, whose handler runs it, so actor state is only ever touched by
// the actor. Local only: it cannot be serialised, so it never crosses the wire.
#pragma once

#include <caf/all.hpp>

#include <functional>

namespace dsec {

struct Continuation {
  std::function<void()> fn;
};

}  // namespace dsec

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::Continuation)

namespace dsec {

// Posts `fn` to `target` from any thread.
template <class Handle>
void Post(const Handle& target, std::function<void()> fn) {
  caf::anon_send(target, Continuation{std::move(fn)});
}

}  // namespace dsec
