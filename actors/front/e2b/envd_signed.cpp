// envd's signed file URLs (docs/e2b.md, "Signed URLs"): the SDK's
// downloadUrl and uploadUrl add `signature` (v1_ and the unpadded base64 of
// SHA-256 of "path:operation:username:token[:expiration]") and
// `signature_expiration` (unix seconds) to /files, for a client that has
// no headers to send (a browser, curl). Under E2B_SANDBOX_URL such a URL
// names no sandbox, so the door finds the one whose token signed it among
// the sandboxes made through it: one HMAC and one SHA-256 each.
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <cstdlib>

#include "actors/front/e2b/door_internal.hpp"
#include "runtime/clock.hpp"

namespace dsec::e2b {

namespace {

bool SameBytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Keeps listing the sandboxes a page at a time until one's token signed it.
void Search(caf::event_based_actor* self, const entry_actor& entry, std::string method, std::string query,
            std::string secret, std::string page, std::function<void(Result<std::string>)> then) {
  v1::ListSandboxesRequest list;
  list.set_limit(1000);
  list.set_page_token(page);
  self->request(entry, kCallTimeout, std::move(list))
      .then(
          [self, entry, method, query, secret, then](v1::ListSandboxesReply& r) {
            Status s = FromProto(r.status());
            if (!s.ok()) return then(s);
            for (const auto& sb : r.sandboxes()) {
              if (!E2bId(sb.id()) || Gone(sb)) continue;
              Status signed_by = CheckSignature(method, query, Token(secret, sb.id()));
              if (signed_by.code() != Status::Code::kUnauthenticated || signed_by.message() != kBadSignature) {
                if (!signed_by.ok()) return then(signed_by);
                return then(sb.id());
              }
            }
            if (r.next_page_token().empty()) return then(Status::Unauthenticated(kBadSignature));
            Search(self, entry, method, query, secret, r.next_page_token(), then);
          },
          [then](caf::error& e) { then(Status::Unavailable("dsec did not answer: " + caf::to_string(e))); });
}

}  // namespace

Status CheckSignature(const std::string& method, const std::string& query, const std::string& token) {
  auto q = Query(query);
  std::string raw = q["path"] + ":" + (method == "GET" ? "read" : "write") + ":" + q["username"] + ":" + token;
  auto exp = q.find("signature_expiration");
  if (exp != q.end()) raw += ":" + exp->second;
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(raw.data()), raw.size(), md);
  std::string want = Base64(std::string(reinterpret_cast<char*>(md), sizeof md));
  while (!want.empty() && want.back() == '=') want.pop_back();
  if (!SameBytes(q["signature"], "v1_" + want)) return Status::Unauthenticated(kBadSignature);
  if (exp != q.end()) {
    char* end = nullptr;
    long long at = std::strtoll(exp->second.c_str(), &end, 10);
    if (exp->second.empty() || *end) return Status::InvalidArgument("signature_expiration is unix seconds");
    if (at * 1000 < WallClockMs()) return Status::Unauthenticated("signature is already expired");
  }
  return Status::Ok();
}

void FindSigner(caf::event_based_actor* self, const entry_actor& entry, const std::string& secret,
                const HttpRequest& req, std::function<void(Result<std::string>)> then) {
  Search(self, entry, req.method, req.query, secret, "", std::move(then));
}

}  // namespace dsec::e2b
