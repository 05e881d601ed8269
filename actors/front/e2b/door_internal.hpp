// Internal to the E2B door: what its control plane (e2b_door.cpp) and its
// envd Connect services (envd_rpc.cpp) share. Not for other includes.
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dsec/status.hpp"
#include "dsec/status_proto.hpp"
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

// A sandbox's lifetime when a call names none (E2B's default).
inline constexpr uint32_t kDefaultTimeoutS = 300;

// An answer in E2B's error shape ({"code": <HTTP status>, "message"}); a
// dsec status as E2B's HTTP status.
void Error(const std::shared_ptr<HttpResponder>& reply, int code, const std::string& message);
void Error(const std::shared_ptr<HttpResponder>& reply, const Status& s);
int HttpCode(const Status& s);
// E2B's SDK takes ids of [a-z0-9] only (a '-' breaks its host names).
bool E2bId(const std::string& id);
// A query string's fields, decoded.
std::map<std::string, std::string> Query(const std::string& q);
// What create, connect and fork answer: the sandbox and how to reach its
// envd (`secret` keys its access token).
nlohmann::json Created(const v1::SandboxRecord& r, const std::string& secret);
// Stopped or stopping.
bool Gone(const v1::SandboxRecord& r);
// A JSON body (an object; none is {}), or an answer of 400 saying why not.
bool Body(const Call& c, nlohmann::json* out);
// A whole number of seconds field (`dflt` when absent), or an answer of 400.
bool Seconds(const Call& c, const nlohmann::json& body, const char* field, uint32_t dflt, uint32_t* out);

// Asks the entry; a reply whose status is not OK (or none) is answered
// here, in E2B's shape; `ok` gets the others.
template <class R, class Req>
void Ask(caf::event_based_actor* self, const entry_actor& entry, const std::shared_ptr<HttpResponder>& reply, Req req,
         std::function<void(R&)> ok) {
  self->request(entry, kCallTimeout, std::move(req))
      .then(
          [reply, ok](R& r) {
            Status s = FromProto(r.status());
            if (!s.ok()) return Error(reply, s);
            ok(r);
          },
          [reply](caf::error& e) { Error(reply, 503, "dsec did not answer: " + caf::to_string(e)); });
}

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

// A service in a sandbox by its port (e2b_ports.cpp): whether a request's
// head names one (E2b-Sandbox-Id and an E2b-Sandbox-Port not envd's, or a
// Host of <port>-<id>.<domain>), and its relay when `c` is one (false:
// it is not).
bool PortTarget(const std::function<std::string(const char*)>& header, std::string* id, uint32_t* port);
bool ServePort(caf::event_based_actor* self, const entry_actor& entry, Call& c);

// A record as E2B's SandboxInfo / ListedSandbox.
nlohmann::json Info(const v1::SandboxRecord& r);
// GET /v2/sandboxes (e2b_list.cpp): filtered, in order of start, paged.
void ListSandboxes(caf::event_based_actor* self, const entry_actor& entry, Call& c);

// A sandbox's envd access token: HMAC-SHA256 of its id under the door's
// secret (nothing stored; the same after a restart).
std::string Token(const std::string& secret, const std::string& id);
// envd's signed /files URLs (envd_signed.cpp): whether the query's
// `signature` (and `signature_expiration`) was made with `token` for this
// method: Unauthenticated(kBadSignature) when not, "signature is already
// expired" when it was and is past.
inline constexpr const char* kBadSignature = "invalid signature";
Status CheckSignature(const std::string& method, const std::string& query, const std::string& token);
// The sandbox (made through this door) whose token signed `req`.
void FindSigner(caf::event_based_actor* self, const entry_actor& entry, const std::string& secret,
                const HttpRequest& req, std::function<void(Result<std::string>)> then);

// dsec's FileInfo as envd's EntryInfo, at `path` (envd_entries.cpp).
nlohmann::json Entry(const v1::FileInfo& f, const std::string& path);
std::string Join(const std::string& dir, const std::string& name);
// A watch of `dir`: `add` takes each of its pieces, and `out` gets each
// event as envd's FilesystemEvent, in order; with `include_entry` (envd
// 0.6.3) each whose path can be stat-ed carries its entry (a remove or a
// move away has none). `finish(then)`: `then` once every event added has
// gone out. For the actor `self` that has the watch.
struct WatchEventFeed {
  std::function<void(const v1::ExecOutput&)> add;
  std::function<void(std::function<void()>)> finish;
};
WatchEventFeed WatchEvents(caf::event_based_actor* self, const entry_actor& entry, const std::string& sandbox,
                           const std::string& dir, bool include_entry, std::function<void(nlohmann::json)> out);

// envd's polled watchers (envd_watchers.cpp): filesystem.CreateWatcher
// (`path` resolved already), GetWatcherEvents, RemoveWatcher of
// `sandbox`, answered through `answer`. False: `method` is none of them.
bool ServeWatchers(caf::event_based_actor* self, const entry_actor& entry, const std::string& sandbox,
                   const std::string& method, const nlohmann::json& msg, const std::string& path,
                   std::function<void(Result<nlohmann::json>)> answer);

// Snapshots and forks (e2b_snapshots.cpp; docs/e2b.md): POST
// /sandboxes/{id}/fork and /sandboxes/{id}/snapshots, GET /snapshots,
// DELETE /templates/{name}. False: `c` is none of them.
bool ServeSnapshots(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& secret);
// E2B's egress settings (create's `allow_internet_access` and `network`;
// updateNetwork's body) as a dsec network policy (e2b_network.cpp;
// docs/e2b.md "Network"). `internet_open`: this node gives sandboxes the
// internet (dsecd --network-open). InvalidArgument naming what dsec does
// not serve.
Result<v1::NetworkPolicy> E2bNetwork(const nlohmann::json* allow_internet, const nlohmann::json& net,
                                     bool internet_open);
// PUT /sandboxes/{id}/network: the policy replaced.
void UpdateNetwork(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& id,
                   bool internet_open);
// Whether E2B's templateID names a snapshot: `then` gets it (found), or
// NotFound (an image's name, then), or why dsec could not tell.
void FindSnapshot(caf::event_based_actor* self, const entry_actor& entry, const std::string& name,
                  std::function<void(Result<v1::SnapshotInfo>)> then);

}  // namespace dsec::e2b

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::e2b::Call)
