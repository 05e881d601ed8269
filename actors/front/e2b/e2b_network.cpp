// E2B's egress settings as dsec network policies (docs/e2b.md "Network"):
// at create (`allow_internet_access`, `network`) and in updateNetwork
// (PUT /sandboxes/{id}/network). dsec's policies list what a sandbox may
// reach (docs/running.md "Network"), so E2B's "deny all, allow these" maps
// whole; "deny these" of an open sandbox does not, and is refused saying so.
#include <nlohmann/json.hpp>
#include <string>

#include "actors/front/e2b/door_internal.hpp"

namespace dsec::e2b {
namespace {

using nlohmann::json;

// E2B's ALL_TRAFFIC.
constexpr const char* kAllTraffic = "0.0.0.0/0";

// A list of strings (absent: empty), or InvalidArgument naming the field.
Status StringList(const json& net, const char* field, std::vector<std::string>* out) {
  auto it = net.find(field);
  if (it == net.end() || it->is_null()) return Status::Ok();
  if (!it->is_array()) return Status::InvalidArgument(std::string("'network.") + field + "' must be a list of strings");
  for (const auto& v : *it) {
    if (!v.is_string())
      return Status::InvalidArgument(std::string("'network.") + field + "' must be a list of strings");
    out->push_back(v.get<std::string>());
  }
  return Status::Ok();
}

}  // namespace

Result<v1::NetworkPolicy> E2bNetwork(const json* allow_internet, const json& net, bool internet_open) {
  if (allow_internet && !allow_internet->is_null() && !allow_internet->is_boolean())
    return Status::InvalidArgument("'allow_internet_access' must be true or false");
  if (!net.is_null() && !net.is_object()) return Status::InvalidArgument("'network' must be an object");
  std::vector<std::string> allow_out, deny_out;
  if (net.is_object()) {
    DSEC_RETURN_IF_ERROR(StringList(net, "allowOut", &allow_out));
    DSEC_RETURN_IF_ERROR(StringList(net, "denyOut", &deny_out));
    if (auto r = net.find("rules"); r != net.end() && !r->is_null() && !r->empty())
      return Status::InvalidArgument("'network.rules' (per-host request transforms) are not served by dsec");
    if (auto p = net.find("egressProxy"); p != net.end() && !p->is_null())
      return Status::InvalidArgument("'network.egressProxy' is not served by dsec");
  }
  bool internet = !(allow_internet && allow_internet->is_boolean() && !allow_internet->get<bool>());
  bool deny_all = !internet;
  for (const auto& d : deny_out) {
    if (d == kAllTraffic) deny_all = true;
  }
  for (const auto& d : deny_out)
    if (d != kAllTraffic && !deny_all)
      return Status::InvalidArgument("network.denyOut '" + d.substr(0, 64) +
                                     "': dsec's policies list what a sandbox may reach, not what it may not: deny "
                                     "all traffic ('0.0.0.0/0') and allowOut what it may reach");
  v1::NetworkPolicy p;
  bool everything = false;
  for (const auto& a : allow_out) everything = everything || a == kAllTraffic;
  if (everything || (!deny_all && internet_open)) {
    if (!internet_open)
      return Status::InvalidArgument("network.allowOut '0.0.0.0/0': this node gives sandboxes no open internet "
                                     "(its operator turns it on with dsecd --network-open)");
    p.set_mode(v1::NETWORK_MODE_OPEN);
    return p;
  }
  // Denied all but what it lists; or the internet, which this node does
  // not give (no --network-open): what it lists, else nothing.
  if (allow_out.empty()) {
    p.set_mode(v1::NETWORK_MODE_NONE);
    return p;
  }
  p.set_mode(v1::NETWORK_MODE_ALLOW);
  for (auto& a : allow_out) p.add_allow(std::move(a));
  return p;
}

void UpdateNetwork(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& id,
                   bool internet_open) {
  json body;
  if (!Body(c, &body)) return;
  auto allow = body.find("allow_internet_access");
  auto p = E2bNetwork(allow == body.end() ? nullptr : &*allow, body, internet_open);
  if (!p.ok()) return Error(c.reply, 400, p.status().message());
  v1::SetNetworkRequest req;
  req.set_sandbox_id(id);
  *req.mutable_policy() = std::move(*p);
  req.set_change(v1::NETWORK_CHANGE_REPLACE);
  auto reply = c.reply;
  // A sandbox made without a network has no link to change (dsec cannot
  // add one to a running sandbox): said so, not "not found".
  v1::GetSandboxRequest get;
  get.set_sandbox_id(id);
  Ask<v1::SandboxReply>(self, entry, reply, std::move(get), [=](v1::SandboxReply& got) {
    if (Gone(got.sandbox())) return Error(reply, 404, "sandbox " + id + " ended");
    auto mode = got.sandbox().spec().network().mode();
    if (mode == v1::NETWORK_MODE_NONE || mode == v1::NETWORK_MODE_UNSPECIFIED)
      return Error(reply, 409,
                   "sandbox " + id + " was made without a network (no internet on this node, no allowOut): dsec "
                   "cannot give a running sandbox a link; create it with network.allowOut (or on a node with "
                   "dsecd --network-open)");
    Ask<v1::SandboxReply>(self, entry, reply, req, [reply](v1::SandboxReply&) { reply->Send(204, kJson, ""); });
  });
}

}  // namespace dsec::e2b
