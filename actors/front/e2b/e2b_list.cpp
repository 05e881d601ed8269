// GET /v2/sandboxes (E2B's Sandbox.list; docs/e2b.md): the sandboxes made
// through the door, filtered by metadata, state, template and start time,
// in order of their start (newest first unless `order=asc`) across the
// whole list, a page of `limit` at a time. dsec's own listing pages by id,
// so the door reads every match (a page of 1 000 at a time, at most
// kMaxListed) and orders them itself; a page's token is the start and id
// of its last sandbox, so a sandbox made or ended meanwhile moves nothing.
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "actors/front/e2b/door_internal.hpp"

namespace dsec::e2b {

namespace {

using nlohmann::json;

constexpr size_t kMaxListed = 100'000;

struct Listing {
  v1::ListSandboxesRequest req;  // filters; its page token advanced as pages come
  int64_t started_after_ms = 0;
  bool ascending = false;
  size_t limit = 100;
  std::string after;  // the previous page's token: "<created ms>.<id>"
  std::vector<v1::SandboxRecord> found;
};

// RFC 3339 as toISOString writes it (2026-12-06T08:09:37.862Z), or with an
// offset (+01:00); -1 when it is not one.
int64_t ParseRfc3339(const std::string& s) {
  struct tm tm = {};
  const char* rest = strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!rest) return -1;
  int64_t ms = static_cast<int64_t>(timegm(&tm)) * 1000;
  if (*rest == '.') {
    int64_t scale = 100;
    for (++rest; *rest >= '0' && *rest <= '9'; ++rest, scale /= 10) ms += (*rest - '0') * scale;
  }
  if (*rest == 'Z' && rest[1] == '\0') return ms;
  int h = 0, m = 0;
  if ((*rest == '+' || *rest == '-') && std::sscanf(rest + 1, "%2d:%2d", &h, &m) == 2 && std::strlen(rest) == 6)
    return ms - (*rest == '+' ? 1 : -1) * (h * 3600 + m * 60) * int64_t{1000};
  return -1;
}

std::string TokenOf(const v1::SandboxRecord& r) { return std::to_string(r.created_ms()) + "." + r.id(); }

// Whether `a` comes before `b` in the listing's order.
bool Before(const Listing& l, int64_t a_ms, const std::string& a_id, int64_t b_ms, const std::string& b_id) {
  if (a_ms != b_ms) return l.ascending ? a_ms < b_ms : a_ms > b_ms;
  return l.ascending ? a_id < b_id : a_id > b_id;
}

void Answer(const std::shared_ptr<Listing>& l, const std::shared_ptr<HttpResponder>& reply) {
  auto& all = l->found;
  std::sort(all.begin(), all.end(), [&l](const v1::SandboxRecord& a, const v1::SandboxRecord& b) {
    return Before(*l, a.created_ms(), a.id(), b.created_ms(), b.id());
  });
  size_t from = 0;
  if (!l->after.empty()) {  // past the token's sandbox (it need not exist any more)
    size_t dot = l->after.find('.');
    int64_t ms = std::strtoll(l->after.substr(0, dot).c_str(), nullptr, 10);
    std::string id = dot == std::string::npos ? "" : l->after.substr(dot + 1);
    while (from < all.size() && !Before(*l, ms, id, all[from].created_ms(), all[from].id())) ++from;
  }
  json out = json::array();
  size_t to = std::min(all.size(), from + l->limit);
  for (size_t i = from; i < to; ++i) out.push_back(Info(all[i]));
  HttpHeaders extra;
  if (to < all.size()) extra.emplace_back("X-Next-Token", TokenOf(all[to - 1]));
  reply->Send(200, kJson, out.dump(), extra);
}

void Collect(caf::event_based_actor* self, const entry_actor& entry, std::shared_ptr<Listing> l,
             std::shared_ptr<HttpResponder> reply) {
  self->request(entry, kCallTimeout, l->req)
      .then(
          [self, entry, l, reply](v1::ListSandboxesReply& r) {
            Status s = FromProto(r.status());
            if (!s.ok()) return Error(reply, s);
            for (auto& sb : *r.mutable_sandboxes())
              if (E2bId(sb.id()) && !Gone(sb) && sb.created_ms() >= l->started_after_ms)
                l->found.push_back(std::move(sb));
            if (l->found.size() > kMaxListed)
              return Error(reply, 400, "more than " + std::to_string(kMaxListed) +
                                           " sandboxes match: narrow the list (metadata, state, startedAfter)");
            if (r.next_page_token().empty()) return Answer(l, reply);
            l->req.set_page_token(r.next_page_token());
            Collect(self, entry, l, reply);
          },
          [reply](caf::error& e) { Error(reply, 503, "dsec did not answer: " + caf::to_string(e)); });
}

}  // namespace

void ListSandboxes(caf::event_based_actor* self, const entry_actor& entry, Call& c) {
  auto q = Query(c.req.query);
  auto l = std::make_shared<Listing>();
  l->req.set_limit(1000);
  if (auto it = q.find("metadata"); it != q.end())
    for (const auto& [k, v] : Query(it->second)) (*l->req.mutable_labels())[k] = v;
  if (auto it = q.find("state"); it != q.end()) {
    for (size_t at = 0; at <= it->second.size();) {
      size_t comma = it->second.find(',', at);
      std::string s = it->second.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      if (s == "running") l->req.add_phases(v1::SANDBOX_PHASE_RUNNING), l->req.add_phases(v1::SANDBOX_PHASE_STARTING);
      else if (s == "paused") l->req.add_phases(v1::SANDBOX_PHASE_PAUSED);
      else if (!s.empty()) return Error(c.reply, 400, "state '" + s.substr(0, 32) + "': running or paused");
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }
  if (auto it = q.find("limit"); it != q.end()) {
    char* end = nullptr;
    long n = std::strtol(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end || n < 1 || n > 100) return Error(c.reply, 400, "limit: 1 to 100");
    l->limit = static_cast<size_t>(n);
  }
  if (auto it = q.find("order"); it != q.end()) {
    if (it->second != "asc" && it->second != "desc") return Error(c.reply, 400, "order: asc or desc");
    l->ascending = it->second == "asc";
  }
  if (auto it = q.find("startedAfter"); it != q.end()) {
    l->started_after_ms = ParseRfc3339(it->second);
    if (l->started_after_ms < 0)
      return Error(c.reply, 400, "startedAfter '" + it->second.substr(0, 40) + "' is not an RFC 3339 time");
  }
  if (auto it = q.find("nextToken"); it != q.end()) {
    if (it->second.find('.') == std::string::npos || it->second.size() > 128)
      return Error(c.reply, 400, "nextToken is not one this door gave (X-Next-Token)");
    l->after = it->second;
  }
  if (auto it = q.find("template"); it != q.end()) l->req.set_image(it->second);
  Collect(self, entry, l, c.reply);
}

}  // namespace dsec::e2b
