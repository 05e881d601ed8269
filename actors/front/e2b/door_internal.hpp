// Internal to the E2B door: what its control plane (e2b_door.cpp) and its
// envd Connect services (envd_rpc.cpp) share. Not for other includes.
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dsec/status.hpp"
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

// The user a call names, else the default one (envd 0.4.0 picks it on the
// server; E2B's templates, and dsec's `base`, have a user `user`).
inline std::string EnvdUser(std::string named) { return named.empty() ? "user" : named; }

// The Connect protocol (connect_codec.cpp): a status code's Connect name
// and the HTTP status a unary call's error gets; an error's body
// ({"code", "message"}); an envelope ([flags][u32 big-endian length][payload]);
// bytes as standard base64 and back (padding optional; false: not base64).
const char* ConnectCode(Status::Code c);
int ConnectHttp(Status::Code c);
nlohmann::json ErrorJson(const Status& s);
std::string Envelope(uint8_t flags, const std::string& payload);
std::string Base64(const std::string& bytes);
bool Unbase64(const std::string& in, std::string* out);
// A gzip body's content: InvalidArgument when it is not gzip or is cut
// short; ResourceExhausted past `max` bytes (it stops there).
Result<std::string> Gunzip(const std::string& in, size_t max);

// envd's Connect services (POST /filesystem.Filesystem/<M>,
// /process.Process/<M>; docs/e2b.md): unary JSON calls and server streams
// of Connect envelopes. `user` is the call's Basic user (E2B's SDK sends
// one with each call), "" for root.
void ServeEnvdRpc(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& sandbox);

}  // namespace dsec::e2b

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::e2b::Call)
