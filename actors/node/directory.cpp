#include "actors/node/directory.hpp"

namespace dsec {

namespace {

template <class Actor>
void Put(std::unordered_map<std::string, Actor>& by_id, std::unordered_map<caf::actor_addr, std::string>& of,
         const std::string& id, const Actor& a) {
  by_id[id] = a;
  of[a.address()] = id;
}

template <class Actor>
Actor Find(const std::unordered_map<std::string, Actor>& by_id, const std::string& id) {
  auto it = by_id.find(id);
  return it == by_id.end() ? Actor{} : it->second;
}

template <class Actor>
std::optional<std::string> DropActor(std::unordered_map<std::string, Actor>& by_id,
                                     std::unordered_map<caf::actor_addr, std::string>& of,
                                     const caf::actor_addr& addr) {
  auto it = of.find(addr);
  if (it == of.end()) return std::nullopt;
  std::string id = it->second;
  of.erase(it);
  // Only if the map still names this actor (not a newer one by that id).
  if (auto cur = by_id.find(id); cur != by_id.end() && cur->second.address() == addr) by_id.erase(cur);
  return id;
}

template <class Actor>
void Forget(std::unordered_map<std::string, Actor>& by_id, std::unordered_map<caf::actor_addr, std::string>& of,
            const std::string& id) {
  auto it = by_id.find(id);
  if (it == by_id.end()) return;
  of.erase(it->second.address());
  by_id.erase(it);
}

}  // namespace

void Directory::PutSandbox(const std::string& id, const sandbox_actor& a) { Put(sandboxes_, sandbox_of_, id, a); }
sandbox_actor Directory::FindSandbox(const std::string& id) const { return Find(sandboxes_, id); }
std::optional<std::string> Directory::DropSandboxActor(const caf::actor_addr& addr) {
  return DropActor(sandboxes_, sandbox_of_, addr);
}
void Directory::ForgetSandbox(const std::string& id) { Forget(sandboxes_, sandbox_of_, id); }

void Directory::PutSession(const std::string& name, const session_actor& a) { Put(sessions_, session_of_, name, a); }
session_actor Directory::FindSession(const std::string& name) const { return Find(sessions_, name); }
std::optional<std::string> Directory::DropSessionActor(const caf::actor_addr& addr) {
  return DropActor(sessions_, session_of_, addr);
}
void Directory::ForgetSession(const std::string& name) { Forget(sessions_, session_of_, name); }

void Directory::NoteEnded(const std::string& id, const std::string& why) {
  if (ended_.emplace(id, why).second) ended_order_.push_back(id);
  else ended_[id] = why;
  while (ended_order_.size() > kMaxEnded) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

const std::string* Directory::EndedWhy(const std::string& id) const {
  auto it = ended_.find(id);
  return it == ended_.end() ? nullptr : &it->second;
}

bool Directory::AddConnection(const caf::actor_addr& addr, const std::string& client, bool* first) {
  if (!client_of_.emplace(addr, client).second) return false;
  *first = ++connections_[client] == 1;
  if (*first) gone_since_.erase(client);
  return true;
}

std::optional<std::string> Directory::DropConnection(const caf::actor_addr& addr, int64_t now, bool* last) {
  auto it = client_of_.find(addr);
  if (it == client_of_.end()) return std::nullopt;
  std::string client = it->second;
  client_of_.erase(it);
  *last = --connections_[client] <= 0;
  if (*last) {
    connections_.erase(client);
    if (owned_.count(client)) gone_since_[client] = now;
  }
  return client;
}

bool Directory::Connected(const std::string& client) const {
  auto it = connections_.find(client);
  return !client.empty() && it != connections_.end() && it->second > 0;
}

void Directory::Claim(const std::string& owner, const std::string& id, int64_t now) {
  if (owner.empty()) return;
  owned_[owner].insert(id);
  owner_of_[id] = owner;
  if (!Connected(owner)) gone_since_.emplace(owner, now);
}

void Directory::Unclaim(const std::string& id) {
  auto o = owner_of_.find(id);
  if (o == owner_of_.end()) return;
  std::string owner = o->second;
  owner_of_.erase(o);
  auto it = owned_.find(owner);
  if (it == owned_.end()) return;
  it->second.erase(id);
  if (it->second.empty()) {
    owned_.erase(it);
    gone_since_.erase(owner);
  }
}

const std::string* Directory::OwnerOf(const std::string& id) const {
  auto it = owner_of_.find(id);
  return it == owner_of_.end() ? nullptr : &it->second;
}

const std::unordered_set<std::string>* Directory::Owned(const std::string& client) const {
  auto it = owned_.find(client);
  return it == owned_.end() ? nullptr : &it->second;
}

}  // namespace dsec
