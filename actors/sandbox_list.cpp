#include "actors/sandbox_list.hpp"

#include <algorithm>

#include "dsec/status_proto.hpp"
#include "dsec/store/v1/records.pb.h"
#include "drivers/limits.hpp"
#include "state/table.hpp"

namespace dsec {

namespace {

constexpr const char* kTokenPrefix = "after:";

v1::ListSandboxesReply Failed(const Status& s) {
  v1::ListSandboxesReply r;
  ToProto(s, r.mutable_status());
  return r;
}

}  // namespace

Status CheckListRequest(const v1::ListSandboxesRequest& req) {
  if (req.limit() > kMaxListLimit)
    return Status::InvalidArgument("ListSandboxes: a limit of " + std::to_string(req.limit()) +
                                   " is above the maximum of " + std::to_string(kMaxListLimit) +
                                   "; page through with the reply's next_page_token");
  const std::string& t = req.page_token();
  if (!t.empty() && (t.rfind(kTokenPrefix, 0) != 0 || t.size() == std::string(kTokenPrefix).size() || t.size() > 128))
    return Status::InvalidArgument("ListSandboxes: page token '" + t.substr(0, 64) +
                                   "' is not one this server gave (pass next_page_token from the last reply)");
  v1::SandboxSpec labels;  // the labels filter is bounded as a spec's labels are
  *labels.mutable_labels() = req.labels();
  if (Status s = drivers::CheckLabels(labels); !s.ok()) return s.Annotate("ListSandboxes filter");
  return Status::Ok();
}

uint32_t ListLimit(const v1::ListSandboxesRequest& req) { return req.limit() ? req.limit() : kDefaultListLimit; }

std::string ListStartAfter(const v1::ListSandboxesRequest& req) {
  return req.page_token().empty() ? "" : req.page_token().substr(std::string(kTokenPrefix).size());
}

std::string ListPageToken(const std::string& last_id) { return kTokenPrefix + last_id; }

bool ListMatches(const v1::ListSandboxesRequest& req, const v1::SandboxRecord& rec) {
  if (req.phases_size() && std::find(req.phases().begin(), req.phases().end(), rec.phase()) == req.phases().end())
    return false;
  if (req.kinds_size() && std::find(req.kinds().begin(), req.kinds().end(), rec.spec().kind()) == req.kinds().end())
    return false;
  if (!req.image().empty()) {
    const std::string& image = rec.spec().image().empty() ? std::string("host") : rec.spec().image();
    if (image != req.image()) return false;
  }
  for (const auto& [k, v] : req.labels()) {
    auto it = rec.spec().labels().find(k);
    if (it == rec.spec().labels().end() || it->second != v) return false;
  }
  if (!req.owner().empty() && rec.owner() != req.owner()) return false;
  if (req.created_after_ms() && rec.created_ms() < req.created_after_ms()) return false;
  if (!req.session().empty() && rec.session() != req.session()) return false;
  if (!req.node().empty() && rec.node_id() != req.node()) return false;
  return true;
}

v1::ListSandboxesReply ListFromStore(state::Store* store, const v1::ListSandboxesRequest& req,
                                     const std::function<void(v1::SandboxRecord*)>& shown) {
  if (Status s = CheckListRequest(req); !s.ok()) return Failed(s);
  v1::ListSandboxesReply out;
  const uint32_t limit = ListLimit(req);
  const std::string after = ListStartAfter(req);
  bool more = false;
  Status s = state::TypedTable<store::v1::SandboxRow>(store, state::Table::kSandboxes)
                 .ScanFrom("", after, [&](const std::string& key, store::v1::SandboxRow&& row) {
                   if (key == after) return true;  // the last of the page before
                   auto& rec = *row.mutable_record();
                   if (rec.phase() == v1::SANDBOX_PHASE_STOPPED || !ListMatches(req, rec)) return true;
                   if (static_cast<uint32_t>(out.sandboxes_size()) == limit) {
                     more = true;  // one more matches: there is a next page
                     return false;
                   }
                   if (shown) shown(&rec);
                   *out.add_sandboxes() = std::move(rec);
                   return true;
                 });
  if (!s.ok()) return Failed(s.Annotate("ListSandboxes"));
  if (more) out.set_next_page_token(ListPageToken(out.sandboxes(out.sandboxes_size() - 1).id()));
  return out;
}

v1::ListSandboxesReply MergeListPages(const v1::ListSandboxesRequest& req, std::vector<v1::ListSandboxesReply> pages) {
  std::vector<v1::SandboxRecord> all;
  bool more = false;
  for (auto& p : pages) {
    if (p.status().code() != v1::Status::OK) return p;
    more = more || !p.next_page_token().empty();
    for (auto& r : *p.mutable_sandboxes()) all.push_back(std::move(r));
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.id() < b.id(); });
  const uint32_t limit = ListLimit(req);
  v1::ListSandboxesReply out;
  // More than a page from all nodes, or a node with more of its own: a
  // next page starts after the last one kept.
  if (all.size() > limit) {
    all.resize(limit);
    more = true;
  }
  if (more && !all.empty()) out.set_next_page_token(ListPageToken(all.back().id()));
  for (auto& r : all) *out.add_sandboxes() = std::move(r);
  return out;
}

}  // namespace dsec
