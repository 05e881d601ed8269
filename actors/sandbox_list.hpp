// ListSandboxesRequest, apart from any actor: checking a request, matching a
// record against its filters, reading a page from a node's store, and
// merging nodes' pages (a controller). Pages are in the order of sandbox
// ids; a page token names the last id of the page before.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dsec/status.hpp"
#include "dsec/v1/service.pb.h"
#include "state/store.hpp"

namespace dsec {

inline constexpr uint32_t kDefaultListLimit = 100;
inline constexpr uint32_t kMaxListLimit = 1000;

// InvalidArgument naming what is wrong (a limit above the maximum, a page
// token this server did not give, a filter out of bounds).
Status CheckListRequest(const v1::ListSandboxesRequest& req);
// The page's size: the request's limit, or the default.
uint32_t ListLimit(const v1::ListSandboxesRequest& req);
// The id the page starts after ("" for the first page); the request was checked.
std::string ListStartAfter(const v1::ListSandboxesRequest& req);
std::string ListPageToken(const std::string& last_id);

// True when `rec` passes every filter of `req`.
bool ListMatches(const v1::ListSandboxesRequest& req, const v1::SandboxRecord& rec);

// A page from the `sandboxes` table (blocking: run it off an actor's
// thread). `shown` fills in what a read adds to a stored record (its next
// end, its owner's absence); it may be empty.
v1::ListSandboxesReply ListFromStore(state::Store* store, const v1::ListSandboxesRequest& req,
                                     const std::function<void(v1::SandboxRecord*)>& shown);

// One page from several nodes' pages for the same request (each in id
// order, each at most the page's size): the first ones by id, and the
// token after them. A node's failure fails the whole page, naming it.
v1::ListSandboxesReply MergeListPages(const v1::ListSandboxesRequest& req, std::vector<v1::ListSandboxesReply> pages);

}  // namespace dsec
