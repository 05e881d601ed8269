#include "actors/front/e2b/api_keys.hpp"

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

bool ApiKeys::Check(const std::string& key) const {
  if (key.size() < 5 || key.size() > 128 || key.compare(0, 4, "e2b_") != 0) return false;
  std::string h = Sha256Hex(key);
  std::lock_guard<std::mutex> lk(mu_);
  return hashes_.count(h) > 0;
}

}  // namespace dsec::e2b
