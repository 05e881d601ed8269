// The table of calls: every request a trainer, a tool or a front end can
// make of dsecd, declared once with its reply and how it is routed. The
// entry interface, the sandbox and session actors' interfaces, the node's
// and the controller's forwarders and type registration all come from this
// table (wire/calls_meta.hpp turns it into types). Adding a call is a line
// here, its handler (the sandbox's or the session's for a call routed to
// one; the node's and the controller's for the others), and its SDK,
// Python and CLI surface.
//
// X(Request, Reply, Route, key): messages of the dsec.v1 package. A Reply of
// `void` is a one-way message. `key` names the field that routes it (a
// sandbox id, a session name); `_` where the route needs none.
//
// Routes (who answers; how a node and a controller pass it on):
//   kRun         a one-shot run: a node's host runs it (no actor); a
//                controller places it on a node
//   kNewSandbox  makes a sandbox: the node spawns its actor and hands it the
//                request; a controller places it on a node
//   kSandbox     one sandbox, by `key`: the node hands it to the sandbox's
//                actor; a controller to the node that holds the sandbox
//   kNewSession  opens (or re-opens) a session: the node hands it to the
//                session's actor (spawning one for a new name); a controller
//                places it, or passes it to the node that holds it
//   kSession     one session, by `key`: the node hands it to the session's
//                actor (a closed session is answered from the store); a
//                controller to the node that holds it
//   kImages      the image registry: a node's image worker; a controller's
//                own registry
//   kFanout      every node answers for what it holds; a controller asks
//                each node and merges the answers
//   kSnapshots   a node's snapshots (node-local): the node answers from its
//                own; a controller asks every node (a name is on one)
//   kOneWay      one-way messages (Reply void), handled where they land
#pragma once

#define DSEC_CALLS(X)                                                            \
  X(RunRequest, RunReply, kRun, _)                                               \
  X(CreateRequest, SandboxReply, kNewSandbox, id)                                \
  X(ExecRequest, ExecReply, kSandbox, sandbox_id)                                \
  X(DestroyRequest, SandboxReply, kSandbox, sandbox_id)                          \
  X(GetSandboxRequest, SandboxReply, kSandbox, sandbox_id)                       \
  X(PauseRequest, SandboxReply, kSandbox, sandbox_id)                            \
  X(ResumeRequest, SandboxReply, kSandbox, sandbox_id)                           \
  X(SetTimeoutRequest, SandboxReply, kSandbox, sandbox_id)                       \
  X(SetNetworkRequest, SandboxReply, kSandbox, sandbox_id)                       \
  X(SnapshotRequest, SnapshotReply, kSandbox, sandbox_id)                        \
  X(ForkRequest, ForkReply, kSandbox, sandbox_id)                                \
  X(ReadFileRequest, FileReply, kSandbox, sandbox_id)                            \
  X(WriteFileRequest, FileReply, kSandbox, sandbox_id)                           \
  X(ListFilesRequest, FileReply, kSandbox, sandbox_id)                           \
  X(PathOpRequest, FileReply, kSandbox, sandbox_id)                              \
  X(ProcessRequest, ProcessReply, kSandbox, sandbox_id)                          \
  X(WatchRequest, WatchReply, kSandbox, sandbox_id)                              \
  X(UsageRequest, UsageReply, kSandbox, sandbox_id)                              \
  X(ListSandboxesRequest, ListSandboxesReply, kFanout, _)                        \
  X(OpenSessionRequest, SessionReply, kNewSession, name)                         \
  X(StepRequest, StepReply, kSession, session)                                   \
  X(GradeRequest, StepReply, kSession, session)                                  \
  X(CloseSessionRequest, SessionReply, kSession, name)                           \
  X(GetSessionRequest, SessionReply, kSession, name)                             \
  X(AnnotateStepRequest, StepReply, kSession, session)                           \
  X(ListStepsRequest, StepsReply, kSession, session)                             \
  X(AnnotateBatch, void, kOneWay, _)                                             \
  X(Hello, void, kOneWay, _)                                                     \
  X(RegisterImageRequest, ImageReply, kImages, _)                                \
  X(GetImageRequest, ImageReply, kImages, _)                                     \
  X(ListImagesRequest, ImagesReply, kImages, _)                                  \
  X(RemoveImageRequest, ImageReply, kImages, _)                                  \
  X(GetSnapshotRequest, SnapshotReply, kSnapshots, _)                            \
  X(ListSnapshotsRequest, SnapshotsReply, kSnapshots, _)                         \
  X(RemoveSnapshotRequest, SnapshotReply, kSnapshots, _)

#include <caf/all.hpp>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dsec/v1/service.pb.h"
#include "dsec/v1/types.pb.h"

namespace dsec::calls {

enum class Route { kRun, kNewSandbox, kSandbox, kNewSession, kSession, kImages, kFanout, kSnapshots, kOneWay };

// One struct per line of the table: ExecRequestCall has Request, Reply,
// route and Key(request) (the routing field; only for routes that have one).
namespace entries {
using namespace ::dsec::v1;  // NOLINT: the table names dsec.v1 messages unqualified
#define DSEC_CALL_ENTRY(Req, Rep, R, key)                           \
  struct Req##Call {                                                \
    using Request = Req;                                            \
    using Reply = Rep;                                              \
    static constexpr Route route = Route::R;                        \
    static constexpr const char* name = #Req;                       \
    template <class T = Request>                                    \
    static const std::string& Key(const T& r) {                     \
      return r.key();                                               \
    }                                                               \
  };
DSEC_CALLS(DSEC_CALL_ENTRY)
#undef DSEC_CALL_ENTRY
}  // namespace entries

// Every call, in the table's order.
namespace detail {
struct Head;
#define DSEC_CALL_LISTED(Req, Rep, R, key) , entries::Req##Call
using WithHead = caf::detail::type_list<Head DSEC_CALLS(DSEC_CALL_LISTED)>;
#undef DSEC_CALL_LISTED
}  // namespace detail
using All = typename caf::detail::tl_tail<detail::WithHead>::type;

// The call whose request is `Req`: CallOf<v1::ExecRequest>::type.
template <class Req>
struct CallOf;
#define DSEC_CALL_OF(Req, Rep, R, key) \
  template <>                          \
  struct CallOf<v1::Req> {             \
    using type = entries::Req##Call;   \
  };
DSEC_CALLS(DSEC_CALL_OF)
#undef DSEC_CALL_OF
template <class Req>
using ReplyOf = typename CallOf<Req>::type::Reply;

// The calls of these routes, in the table's order.
template <Route... Rs>
struct RouteIn {
  template <class C>
  struct type : std::integral_constant<bool, ((C::route == Rs) || ...)> {};
};
template <Route... Rs>
using CallsTo = typename caf::detail::tl_filter<All, RouteIn<Rs...>::template type>::type;

// The typed-actor signature of a call, and an actor handle for a list of them.
template <class Req, class Rep>
struct SigOf {
  using type = typename caf::replies_to<Req>::template with<Rep>;
};
template <class Req>
struct SigOf<Req, void> {
  using type = caf::reacts_to<Req>;
};
template <class List>
struct ActorOf;
template <class... Cs>
struct ActorOf<caf::detail::type_list<Cs...>> {
  using type = caf::typed_actor<typename SigOf<typename Cs::Request, typename Cs::Reply>::type...>;
};

// One message handler per call of `List`, each handing its request to `f`
// (a generic lambda over the actor's own overloads: `[self](auto& req) {
// return Handle(self, req); }`), as a tuple for MakeBehavior.
template <class C, class F>
auto HandlerFor(F f) {
  if constexpr (std::is_void<typename C::Reply>::value)
    return [f](typename C::Request& req) mutable { f(req); };
  else
    return [f](typename C::Request& req) mutable -> caf::result<typename C::Reply> { return f(req); };
}
template <class... Cs, class F>
auto Handlers(caf::detail::type_list<Cs...>, F f) {
  return std::make_tuple(HandlerFor<Cs>(f)...);
}

// A typed behavior from the calls' handlers and the actor's others.
template <class Behavior, class Tuple, class... More>
Behavior MakeBehavior(Tuple calls, More... more) {
  return std::apply([&](auto&... hs) { return Behavior{hs..., more...}; }, calls);
}

}  // namespace dsec::calls
