// Internal to the E2B door: what its control plane (e2b_door.cpp) and its
// envd Connect services (envd_rpc.cpp) share. Not for other includes.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/http_server.hpp"
#include "wire/wire.hpp"

namespace dsec::e2b {

// One request, handed from the server's thread to the door's actor.
struct Call {
  HttpRequest req;
  std::shared_ptr<HttpResponder> reply;
};

inline constexpr const char* kJson = "application/json";

// How long the door waits for dsec to answer one call.
inline constexpr auto kCallTimeout = std::chrono::minutes(5);

// Unix epoch milliseconds as RFC 3339 ("2026-12-05T19:01:02.345Z").
std::string Rfc3339(int64_t ms);

// A path as envd takes it: relative ones under the user's home.
std::string EnvdPath(const std::string& path, const std::string& user);

// envd's Connect services (POST /filesystem.Filesystem/<M>,
// /process.Process/<M>; docs/e2b.md): unary JSON calls and server streams
// of Connect envelopes. `user` is the call's Basic user (E2B's SDK sends
// one with each call), "" for root.
void ServeEnvdRpc(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& sandbox);

}  // namespace dsec::e2b

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::e2b::Call)
