// The router's directory: where each sandbox and session is (its actor),
// why recently ended sandboxes ended, and which SDK client owns which
// sandbox. Data only, no messages: the router (today the node actor, in a
// cluster the controller) keeps one and acts on what it says.
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "actors/node/sandbox.hpp"
#include "actors/node/session.hpp"

namespace dsec {

class Directory {
 public:
  // ---- sandboxes and sessions: by id (name), and back from an actor ----
  void PutSandbox(const std::string& id, const sandbox_actor& a);
  sandbox_actor FindSandbox(const std::string& id) const;  // null: none here
  // The sandbox that actor `addr` served (nullopt: it served none). Its
  // entry goes, unless a newer actor by that id has taken it.
  std::optional<std::string> DropSandboxActor(const caf::actor_addr& addr);
  // Forgets sandbox `id` whatever actor serves it (it answered a destroy).
  void ForgetSandbox(const std::string& id);
  const std::unordered_map<std::string, sandbox_actor>& sandboxes() const { return sandboxes_; }

  void PutSession(const std::string& name, const session_actor& a);
  session_actor FindSession(const std::string& name) const;
  std::optional<std::string> DropSessionActor(const caf::actor_addr& addr);
  void ForgetSession(const std::string& name);
  const std::unordered_map<std::string, session_actor>& sessions() const { return sessions_; }

  // ---- why recently ended sandboxes ended (the last kMaxEnded) ----
  static constexpr size_t kMaxEnded = 4096;
  void NoteEnded(const std::string& id, const std::string& why);
  const std::string* EndedWhy(const std::string& id) const;  // null: not known to have ended
  void Reuse(const std::string& id) { ended_.erase(id); }     // a new sandbox by that id

  // ---- SDK clients (by the client id of their Hello) and what they own ----
  // A new connection of `client` from `addr`; false when `addr` said hello
  // before. `*first`: the client had no other connection.
  bool AddConnection(const caf::actor_addr& addr, const std::string& client, bool* first);
  // The client whose connection `addr` was (nullopt: none). `*last`: it has
  // no other one left (an owner is then gone since `now`).
  std::optional<std::string> DropConnection(const caf::actor_addr& addr, int64_t now, bool* last);
  bool Connected(const std::string& client) const;
  // `owner` owns sandbox `id` (gone since `now` if not connected).
  void Claim(const std::string& owner, const std::string& id, int64_t now);
  // Sandbox `id` has ended: its owner's claim goes.
  void Unclaim(const std::string& id);
  const std::string* OwnerOf(const std::string& id) const;
  const std::unordered_set<std::string>* Owned(const std::string& client) const;
  // Owners without a connection, since when.
  const std::unordered_map<std::string, int64_t>& gone_since() const { return gone_since_; }

 private:
  std::unordered_map<std::string, sandbox_actor> sandboxes_;
  std::unordered_map<caf::actor_addr, std::string> sandbox_of_;
  std::unordered_map<std::string, session_actor> sessions_;
  std::unordered_map<caf::actor_addr, std::string> session_of_;
  std::unordered_map<std::string, std::string> ended_;
  std::deque<std::string> ended_order_;
  std::unordered_map<caf::actor_addr, std::string> client_of_;                // connected SDK agents
  std::unordered_map<std::string, int> connections_;                         // client id -> agents
  std::unordered_map<std::string, std::unordered_set<std::string>> owned_;   // client id -> sandbox ids
  std::unordered_map<std::string, int64_t> gone_since_;
  std::unordered_map<std::string, std::string> owner_of_;                    // sandbox id -> client id
};

}  // namespace dsec
