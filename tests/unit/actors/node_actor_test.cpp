// The node actor on the fake kind (tests/support/actor_node.hpp): what it
// answers itself rather than a sandbox's or a session's actor: listings and
// their pages, one-shot runs, SDK clients and what they own, the image
// worker, and the admin console with and without test hooks.
#include <gmock/gmock.h>

#include <algorithm>
#include <memory>

#include "runtime/clock.hpp"
#include "tests/support/actor_node.hpp"

namespace dsec::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

class NodeActor : public ::testing::Test {
 protected:
  std::string Make(v1::SandboxSpec spec = ActorNode::Fake(), const std::string& id = "") {
    auto sb = node_.Create(std::move(spec), id);
    EXPECT_TRUE(sb.ok()) << sb.status().ToString();
    return sb.ok() ? sb->id() : "";
  }
  // A sandbox owned by SDK client `owner` (made by `as`, the harness's trainer by default).
  Result<v1::SandboxReply> MakeOwned(const std::string& id, const std::string& owner, uint32_t lease_s,
                                     caf::scoped_actor* as = nullptr, bool detached = false) {
    v1::CreateRequest req;
    *req.mutable_spec() = ActorNode::Fake();
    req.set_id(id);
    req.set_owner(owner);
    req.set_lease_s(lease_s);
    req.set_detached(detached);
    return as ? node_.CallAs(*as, req) : node_.Call(req);
  }
  v1::SessionRecord OpenSession(const std::string& name) {
    v1::OpenSessionRequest req;
    req.set_name(name);
    *req.mutable_spec() = ActorNode::Fake();
    auto r = node_.Call(req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->session() : v1::SessionRecord();
  }
  void Pause(const std::string& id) {
    v1::PauseRequest p;
    p.set_sandbox_id(id);
    ASSERT_TRUE(node_.Call(p).ok());
  }
  static std::vector<std::string> Ids(const v1::ListSandboxesReply& r) {
    std::vector<std::string> out;
    for (const auto& sb : r.sandboxes()) out.push_back(sb.id());
    return out;
  }
  std::vector<std::string> ListIds(const v1::ListSandboxesRequest& req) {
    auto r = node_.Call(req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? Ids(*r) : std::vector<std::string>{"(failed)"};
  }
  static v1::Hello HelloFrom(const std::string& client_id) {
    v1::Hello h;
    h.set_client_id(client_id);
    return h;
  }
  // The first of `rows` (a console listing) whose `key` is `value`.
  static nlohmann::json Row(const nlohmann::json& rows, const std::string& key, const std::string& value) {
    for (const auto& r : rows)
      if (r.value(key, "") == value) return r;
    return nullptr;
  }
  ActorNode node_;
};

TEST_F(NodeActor, ListSandboxesFiltersOnPhaseKindAndLabels) {
  v1::SandboxSpec a = ActorNode::Fake(), b = ActorNode::Fake();
  (*a.mutable_labels())["job"] = "j1";
  (*a.mutable_labels())["team"] = "x";
  (*b.mutable_labels())["job"] = "j2";
  Make(a, "a-1");
  Make(b, "b-1");
  Make(ActorNode::Fake(), "c-1");
  Pause("c-1");
  v1::ListSandboxesRequest req;
  req.add_phases(v1::SANDBOX_PHASE_PAUSED);
  EXPECT_THAT(ListIds(req), ElementsAre("c-1"));
  req.clear_phases();
  req.add_phases(v1::SANDBOX_PHASE_RUNNING);
  EXPECT_THAT(ListIds(req), ElementsAre("a-1", "b-1"));
  req.add_phases(v1::SANDBOX_PHASE_PAUSED);
  EXPECT_THAT(ListIds(req), ElementsAre("a-1", "b-1", "c-1")) << "any of the phases";
  req.clear_phases();
  req.add_kinds(v1::KIND_CONTAINER);
  EXPECT_THAT(ListIds(req), IsEmpty());
  req.add_kinds(v1::KIND_FAKE);
  EXPECT_THAT(ListIds(req), ElementsAre("a-1", "b-1", "c-1"));
  req.clear_kinds();
  (*req.mutable_labels())["job"] = "j1";
  EXPECT_THAT(ListIds(req), ElementsAre("a-1"));
  (*req.mutable_labels())["team"] = "y";
  EXPECT_THAT(ListIds(req), IsEmpty()) << "every label must match";
}

TEST_F(NodeActor, ListSandboxesFiltersOnOwnerAndSession) {
  ASSERT_TRUE(MakeOwned("own-1", "c0ffee", 600).ok());
  Make(ActorNode::Fake(), "plain-1");
  auto session = OpenSession("job/list/1");
  v1::ListSandboxesRequest req;
  req.set_owner("c0ffee");
  EXPECT_THAT(ListIds(req), ElementsAre("own-1"));
  req.set_owner("deadbeef");
  EXPECT_THAT(ListIds(req), IsEmpty());
  req.clear_owner();
  req.set_session("job/list/1");
  EXPECT_THAT(ListIds(req), ElementsAre(session.sandboxes(0).id()));
  req.set_session("job/list/2");
  EXPECT_THAT(ListIds(req), IsEmpty());
  EXPECT_EQ(ListIds(v1::ListSandboxesRequest()).size(), 3u) << "no filter: all";
}

TEST_F(NodeActor, ListSandboxesFiltersOnCreationTime) {
  auto early = node_.Create(ActorNode::Fake(), "early");
  ASSERT_TRUE(early.ok());
  // The next creation in a later millisecond than this one's.
  ASSERT_TRUE(node_.WaitFor([&] { return WallClockMs() > early->created_ms(); }));
  auto late = node_.Create(ActorNode::Fake(), "late");
  ASSERT_TRUE(late.ok());
  v1::ListSandboxesRequest req;
  req.set_created_after_ms(late->created_ms());
  EXPECT_THAT(ListIds(req), ElementsAre("late"));
  req.set_created_after_ms(early->created_ms());
  EXPECT_THAT(ListIds(req), ElementsAre("early", "late")) << "at or after";
}

TEST_F(NodeActor, ListSandboxesPagesWithLimitAndNextPageToken) {
  std::vector<std::string> all;
  for (int i = 0; i < 25; ++i) {
    char id[8];
    snprintf(id, sizeof id, "p-%02d", i);
    all.push_back(Make(ActorNode::Fake(), id));
  }
  std::vector<std::string> seen;
  std::vector<int> sizes;
  v1::ListSandboxesRequest req;
  req.set_limit(10);
  for (int pages = 0; pages < 10; ++pages) {
    auto page = node_.Call(req);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    sizes.push_back(page->sandboxes_size());
    for (const auto& id : Ids(*page)) seen.push_back(id);
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_THAT(sizes, ElementsAre(10, 10, 5));
  EXPECT_EQ(seen, all) << "each once, in id order";
  v1::ListSandboxesRequest whole;
  auto one = node_.Call(whole);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->sandboxes_size(), 25) << "the default page holds 100";
  EXPECT_TRUE(one->next_page_token().empty());
}

TEST_F(NodeActor, AForeignPageTokenOrAnOversizedLimitIsRefused) {
  Make();
  v1::ListSandboxesRequest req;
  req.set_page_token("page-2");
  auto foreign = node_.Call(req);
  EXPECT_EQ(foreign.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(foreign.status().message(), HasSubstr("page token 'page-2' is not one this server gave"));
  v1::ListSandboxesRequest big;
  big.set_limit(1001);
  auto over = node_.Call(big);
  EXPECT_EQ(over.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(over.status().message(), HasSubstr("a limit of 1001 is above the maximum of 1000"));
}

TEST_F(NodeActor, ListedRecordsShowWhenAndWhyTheyEnd) {
  v1::SandboxSpec ttl = ActorNode::Fake();
  ttl.set_ttl_s(3600);
  Make(ttl, "e-ttl");
  v1::SandboxSpec idle = ActorNode::Fake();
  idle.set_idle_timeout_s(100);
  idle.set_on_idle(v1::IDLE_ACTION_PAUSE);
  Make(idle, "e-idle");
  ASSERT_TRUE(MakeOwned("e-owned", "abc123", 60).ok());  // its owner has no connection
  auto session = OpenSession("job/ends/1");
  int64_t now = WallClockMs();
  auto list = node_.Call(v1::ListSandboxesRequest());
  ASSERT_TRUE(list.ok());
  std::map<std::string, v1::SandboxRecord> by_id;
  for (const auto& r : list->sandboxes()) by_id[r.id()] = r;
  const auto& t = by_id["e-ttl"];
  EXPECT_EQ(t.expires_ms(), t.ttl_deadline_ms());
  EXPECT_NEAR(t.expires_ms() - now, 3600e3, 5e3);
  EXPECT_EQ(t.expires_because(), "ttl");
  EXPECT_EQ(t.expiry_action(), "destroy");
  EXPECT_NEAR(by_id["e-idle"].expires_ms() - now, 100e3, 5e3);
  EXPECT_EQ(by_id["e-idle"].expires_because(), "idle timeout");
  EXPECT_EQ(by_id["e-idle"].expiry_action(), "pause");
  EXPECT_NEAR(by_id["e-owned"].expires_ms() - now, 60e3, 5e3);
  EXPECT_EQ(by_id["e-owned"].expires_because(), "owner gone");
  EXPECT_GT(by_id["e-owned"].owner_gone_ms(), 0);
  EXPECT_EQ(by_id[session.sandboxes(0).id()].expires_ms(), 0) << "a session's sandbox ends with its session";
}

TEST_F(NodeActor, ARunForAKindWithStateIsRefusedSayingRunsAreForKindsWithoutState) {
  v1::RunRequest run;
  *run.mutable_spec() = ActorNode::Fake();
  run.mutable_exec()->add_argv("true");
  auto r = node_.Call(run);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("one-shot runs are for kinds without state"));
  EXPECT_THAT(r.status().message(), HasSubstr("for a fake create a sandbox"));
  EXPECT_EQ(node_.driver_faults().calls(drivers::FaultDriver::Op::kExec), 0u) << "nothing ran";
  EXPECT_EQ(node_.Admin("stats").value("rejected", -1), 1) << "counted as refused";
}

TEST_F(NodeActor, ARunForAKindWithoutStateRunsInAFreshBox) {
  ActorNodeOptions o;
  o.fake.traits.stateful = false;
  ActorNode plain(o);
  v1::RunRequest run;
  *run.mutable_spec() = ActorNode::Fake();
  for (const char* a : {"sh", "-c", "echo x >> /work/f; cat /work/f"}) run.mutable_exec()->add_argv(a);
  for (int i = 0; i < 2; ++i) {
    auto r = plain.Call(run);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->result().stdout(), "x\n") << "run " << i << " starts from nothing";
  }
}

TEST_F(NodeActor, HelloMakesTheClientTheOwnerAndItsSandboxesEndAfterTheLeaseOnceItGoes) {
  auto client = std::make_unique<caf::scoped_actor>(node_.sys());
  (*client)->send(node_.entry(), HelloFrom("c0ffee01"));
  auto owned = MakeOwned("mine-1", "c0ffee01", 1, client.get());
  ASSERT_TRUE(owned.ok()) << owned.status().ToString();
  EXPECT_EQ(owned->sandbox().owner(), "c0ffee01");
  EXPECT_EQ(owned->sandbox().lease_s(), 1u);
  auto kept = MakeOwned("kept-1", "c0ffee01", 1, client.get(), /*detached=*/true);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->sandbox().owner().empty()) << "detached: nobody's";
  EXPECT_EQ(node_.Get("mine-1")->owner_gone_ms(), 0) << "its owner is connected";
  v1::ListSandboxesRequest mine;
  mine.set_owner("c0ffee01");
  auto listed = node_.Call(mine);
  ASSERT_EQ(listed->sandboxes_size(), 1);
  EXPECT_EQ(listed->sandboxes(0).expires_because(), "ttl") << "no lease runs while its owner is there";
  auto gone = std::chrono::steady_clock::now();
  client.reset();  // the client's connection ends
  ASSERT_TRUE(node_.WaitFor([&] { return node_.Get("mine-1").status().code() == Status::Code::kNotFound; },
                            std::chrono::seconds(5)));
  EXPECT_GE(std::chrono::steady_clock::now() - gone, std::chrono::milliseconds(950)) << "not before its lease";
  EXPECT_THAT(node_.Get("mine-1").status().message(),
              HasSubstr("its owner (SDK client c0ffee01) was gone for its lease of 1 s"));
  EXPECT_TRUE(node_.Get("kept-1").ok()) << "a detached sandbox outlives its maker";
}

TEST_F(NodeActor, ABadClientIdInHelloChangesNothing) {
  ASSERT_TRUE(MakeOwned("owned-1", "abc123", 600).ok());
  caf::scoped_actor client{node_.sys()};
  auto because = [&] {
    auto r = node_.CallAs(client, v1::ListSandboxesRequest());
    return r.ok() && r->sandboxes_size() == 1 ? r->sandboxes(0).expires_because() : "(failed)";
  };
  EXPECT_EQ(because(), "owner gone");
  for (const auto& bad : {std::string(), std::string("abc123!"), std::string("abc 123"), std::string(65, 'a')})
    client->send(node_.entry(), HelloFrom(bad));
  EXPECT_EQ(because(), "owner gone") << "a bad hello connects nobody";
  EXPECT_GT(node_.Get("owned-1")->owner_gone_ms(), 0);
  // The same actor's good hello still counts: the bad ones left no mark.
  client->send(node_.entry(), HelloFrom("abc123"));
  EXPECT_EQ(because(), "ttl");
  EXPECT_EQ(node_.Get("owned-1")->owner_gone_ms(), 0);
}

TEST_F(NodeActor, ImageCallsAreAnsweredByTheImageWorker) {
  auto list = node_.Call(v1::ListImagesRequest());
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->images_size(), 0);
  v1::GetImageRequest get;
  get.set_name("py311");
  auto unknown = node_.Call(get);
  EXPECT_EQ(unknown.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("image 'py311' not found"));
  v1::RemoveImageRequest rm;
  rm.set_name("py311");
  EXPECT_EQ(node_.Call(rm).status().code(), Status::Code::kNotFound);
}

TEST_F(NodeActor, ConsoleStatusCountsWhatTheNodeHolds) {
  Make();
  Make();
  OpenSession("job/console/1");
  auto j = node_.Admin("status");
  ASSERT_TRUE(j.value("ok", false)) << j.dump();
  EXPECT_EQ(j.value("node", ""), "node-test");
  EXPECT_EQ(j.value("sandboxes", -1), 3) << "two plain ones and the session's";
  EXPECT_EQ(j.value("sessions", -1), 1);
  EXPECT_EQ(j.value("readopting", -1), 0);
  EXPECT_THAT(j["kinds"].get<std::vector<std::string>>(), ElementsAre("fake"));
  // Each kind's optional capabilities, from its traits (the fake's default
  // has files, pause and streaming; no kind snapshots or forks yet).
  EXPECT_THAT(j["capabilities"]["fake"].get<std::vector<std::string>>(), ElementsAre("files", "pause", "streaming"));
}

TEST_F(NodeActor, ConsoleLsListsTheRowsAndFiltersThem) {
  Make(ActorNode::Fake(), "ls-a");
  Make(ActorNode::Fake(), "ls-b");
  Pause("ls-b");
  auto session = OpenSession("job/ls/1");
  auto j = node_.Admin("ls");
  ASSERT_TRUE(j.value("ok", false)) << j.dump();
  EXPECT_EQ(j["sandboxes"].size(), 3u);
  auto own = Row(j["sandboxes"], "id", session.sandboxes(0).id());
  ASSERT_FALSE(own.is_null()) << j.dump();
  EXPECT_EQ(own["session"], "job/ls/1");
  EXPECT_EQ(Row(j["sandboxes"], "id", "ls-a")["kind"], "fake");
  ASSERT_EQ(j["sessions"].size(), 1u);
  EXPECT_EQ(j["sessions"][0]["name"], "job/ls/1");
  auto paused = node_.Admin("ls --state paused");
  ASSERT_EQ(paused["sandboxes"].size(), 1u) << paused.dump();
  EXPECT_EQ(paused["sandboxes"][0]["id"], "ls-b");
  EXPECT_EQ(node_.Admin("ls --kind fake")["sandboxes"].size(), 3u);
  EXPECT_EQ(node_.Admin("ls --kind container")["sandboxes"].size(), 0u);
  auto bad = node_.Admin("ls --colour red");
  EXPECT_FALSE(bad.value("ok", true));
  EXPECT_THAT(bad.value("error", ""), HasSubstr("usage: ls"));
}

TEST_F(NodeActor, ConsoleSessionsListsOpenAndClosedOnes) {
  auto one = OpenSession("job/sessions/1");
  ASSERT_TRUE(node_.Step("job/sessions/1", 0, "true").ok());
  OpenSession("job/sessions/2");
  v1::CloseSessionRequest close;
  close.set_name("job/sessions/2");
  close.set_reason("done");
  ASSERT_TRUE(node_.Call(close).ok());
  auto j = node_.Admin("sessions");
  ASSERT_TRUE(j.value("ok", false)) << j.dump();
  EXPECT_EQ(j.value("open", -1), 1);
  EXPECT_EQ(j.value("listed", -1), 2);
  auto open = Row(j["sessions"], "name", "job/sessions/1");
  EXPECT_EQ(open["phase"], "open");
  EXPECT_EQ(open["steps"], 1);
  EXPECT_EQ(open["sandboxes"]["agent"], one.sandboxes(0).id());
  auto closed = Row(j["sessions"], "name", "job/sessions/2");
  EXPECT_EQ(closed["phase"], "closed");
  EXPECT_EQ(closed["close_reason"], "done");
}

TEST_F(NodeActor, ConsoleStatsCountsRefusalsWritesAndTheDriversWork) {
  std::string id = Make();
  ASSERT_TRUE(node_.Exec(id, "true").ok());
  ASSERT_TRUE(node_.Create(ActorNode::Fake(), "Bad_Id").status().code() == Status::Code::kInvalidArgument);
  auto j = node_.Admin("stats");
  ASSERT_TRUE(j.value("ok", false)) << j.dump();
  EXPECT_EQ(j.value("rejected", -1), 1);
  EXPECT_GT(j.value("store_writes", 0), 0);
  EXPECT_EQ(j.value("supervisor_restarts", -1), 0);
  ASSERT_TRUE(j["fake"].is_object()) << "each kind's driver by its name: " << j.dump();
  EXPECT_EQ(j["fake"].value("execs", -1), 1);
  EXPECT_EQ(j["fake"].value("created", -1), 1);
}

TEST_F(NodeActor, ConsoleInspectShowsASessionOpenOrClosed) {
  OpenSession("job/inspect/1");
  ASSERT_TRUE(node_.Step("job/inspect/1", 0, "true").ok());
  auto open = node_.Admin("inspect job/inspect/1");
  ASSERT_TRUE(open.value("ok", false)) << open.dump();
  EXPECT_EQ(open["session"]["name"], "job/inspect/1");
  EXPECT_EQ(open["session"]["step_count"], 1);
  EXPECT_EQ(open["session"]["phase"], "open");
  v1::CloseSessionRequest close;
  close.set_name("job/inspect/1");
  ASSERT_TRUE(node_.Call(close).ok());
  auto closed = node_.Admin("inspect job/inspect/1");
  ASSERT_TRUE(closed.value("ok", false)) << closed.dump();
  EXPECT_EQ(closed["session"]["phase"], "closed") << "from the store";
  auto none = node_.Admin("inspect sb-nowhere");
  EXPECT_FALSE(none.value("ok", true));
  EXPECT_THAT(none.value("error", ""), HasSubstr("no sandbox, session or run 'sb-nowhere' on this node"));
}

TEST_F(NodeActor, ConsoleKillDestroysASandboxAndClosesASession) {
  Make(ActorNode::Fake(), "victim");
  auto killed = node_.Admin("kill victim");
  ASSERT_TRUE(killed.value("ok", false)) << killed.dump();
  EXPECT_EQ(killed["killed"], "victim");
  EXPECT_THAT(node_.Get("victim").status().message(), HasSubstr("destroyed by an operator (admin console kill)"));
  auto session = OpenSession("job/kill/1");
  ASSERT_TRUE(node_.Admin("kill job/kill/1").value("ok", false));
  auto rec = node_.GetSession("job/kill/1");
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->phase(), v1::SESSION_PHASE_CLOSED);
  EXPECT_EQ(rec->close_reason(), "killed by an operator (admin console)");
  EXPECT_EQ(node_.Get(session.sandboxes(0).id()).status().code(), Status::Code::kNotFound);
  EXPECT_TRUE(node_.world()->Ids().empty());
}

TEST_F(NodeActor, ConsoleCrashAndFaultWorkWithTestHooks) {
  std::string id = Make();
  auto fault = node_.Admin("fault fake exec fail 1");
  ASSERT_TRUE(fault.value("ok", false)) << fault.dump();
  EXPECT_THAT(fault.value("fault", ""), HasSubstr("fake exec: the next 1 call(s) fail"));
  auto failed = node_.Exec(id, "true");
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("injected driver fault")) << "the armed fault failed it";
  EXPECT_EQ(node_.Exec(id, "echo again")->stdout(), "again\n") << "one call only";
  auto crash = node_.Admin("crash " + id);
  ASSERT_TRUE(crash.value("ok", false)) << crash.dump();
  EXPECT_TRUE(node_.WaitFor([&] {
    auto r = node_.Get(id);
    return r.ok() && r->restarts() == 1;
  }));
}

TEST_F(NodeActor, ConsoleCrashAndFaultAreRefusedWithoutTestHooksSayingSo) {
  ActorNodeOptions o;
  o.node.test_hooks = false;
  ActorNode plain(o);
  auto sb = plain.Create(ActorNode::Fake());
  ASSERT_TRUE(sb.ok());
  for (const std::string& line : {"crash " + sb->id(), std::string("fault fake exec fail 1")}) {
    auto j = plain.Admin(line);
    EXPECT_FALSE(j.value("ok", true)) << line;
    EXPECT_THAT(j.value("error", ""), HasSubstr("is a test hook: this node runs without --test-hooks")) << line;
  }
  EXPECT_EQ(plain.Exec(sb->id(), "echo fine")->stdout(), "fine\n") << "no fault armed";
  EXPECT_EQ(plain.Get(sb->id())->restarts(), 0u) << "no crash";
}

}  // namespace
}  // namespace dsec::testing
