#include "actors/front/e2b/api_keys.hpp"

#include <nlohmann/json.hpp>

#include "drivers/images/image_store.hpp"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"
#include "state/table.hpp"

namespace dsec::e2b {

using images::Sha256Hex;

namespace {
state::TypedTable<store::v1::ApiKeyRecord> Table(state::Store* s) { return {s, state::Table::kApiKeys}; }
}  // namespace

Result<std::string> ApiKeys::Load(const std::string& first_path) {
  std::lock_guard<std::mutex> lk(mu_);
  hashes_.clear();
  DSEC_RETURN_IF_ERROR(Table(store_).Scan("", [this](const std::string&, store::v1::ApiKeyRecord&& r) {
    hashes_.insert(r.sha256());
    return true;
  }));
  if (!hashes_.empty()) return std::string();
  auto key = Make("first");
  if (!key.ok()) return key.status();
  DSEC_RETURN_IF_ERROR(WriteFileAtomic(first_path, *key + "\n", 0600));
  return "the first E2B API key is in " + first_path + " (set E2B_API_KEY to it)";
}

Result<std::string> ApiKeys::Make(const std::string& name) {
  std::string key = "e2b_" + RandomHex(40);
  store::v1::ApiKeyRecord r;
  r.set_name(name);
  r.set_sha256(Sha256Hex(key));
  r.set_shown(key.substr(0, 8));
  r.set_created_ms(WallClockMs());
  state::WriteBatch b;
  Table(store_).Put(&b, name, r);
  DSEC_RETURN_IF_ERROR(store_->Write(b, true));
  hashes_.insert(r.sha256());
  return key;
}

Result<std::string> ApiKeys::Issue(const std::string& name) {
  DSEC_RETURN_IF_ERROR(images::CheckObjectName("API key", name));
  std::lock_guard<std::mutex> lk(mu_);
  if (Table(store_).Get(name).ok())
    return Status::AlreadyExists("an E2B API key named '" + name + "' exists; revoke it first or pick another name");
  return Make(name);
}

Status ApiKeys::Revoke(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto r = Table(store_).Get(name);
  if (!r.ok())
    return Status::NotFound("no E2B API key named '" + name.substr(0, 64) + "' (e2b-key ls lists them)");
  state::WriteBatch b;
  Table(store_).Delete(&b, name);
  DSEC_RETURN_IF_ERROR(store_->Write(b, true));
  hashes_.erase(r->sha256());
  return Status::Ok();
}

std::vector<store::v1::ApiKeyRecord> ApiKeys::List() const {
  std::vector<store::v1::ApiKeyRecord> out;
  (void)Table(store_).Scan("", [&out](const std::string&, store::v1::ApiKeyRecord&& r) {
    r.clear_sha256();
    out.push_back(std::move(r));
    return true;
  });
  return out;
}

std::string ApiKeys::Admin(const std::vector<std::string>& args) {
  using nlohmann::json;
  auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  auto error = [&](const std::string& m) { return dump(json{{"ok", false}, {"error", m}}); };
  const std::string verb = args.empty() ? "" : args[0];
  if (verb == "ls" && args.size() == 1) {
    json keys = json::array();
    for (const auto& k : List())
      keys.push_back({{"name", k.name()}, {"shown", k.shown() + "..."}, {"created_ms", k.created_ms()}});
    return dump(json{{"ok", true}, {"keys", keys}});
  }
  if (verb == "issue" && args.size() == 2) {
    auto key = Issue(args[1]);
    if (!key.ok()) return error(key.status().message());
    return dump(json{{"ok", true}, {"name", args[1]}, {"key", *key}});
  }
  if (verb == "revoke" && args.size() == 2) {
    Status s = Revoke(args[1]);
    if (!s.ok()) return error(s.message());
    return dump(json{{"ok", true}, {"revoked", args[1]}});
  }
  return error("usage: e2b-key ls | issue NAME | revoke NAME");
}

bool ApiKeys::Check(const std::string& key) const {
  if (key.size() < 5 || key.size() > 128 || key.compare(0, 4, "e2b_") != 0) return false;
  std::string h = Sha256Hex(key);
  std::lock_guard<std::mutex> lk(mu_);
  return hashes_.count(h) > 0;
}

}  // namespace dsec::e2b
