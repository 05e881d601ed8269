// The E2B door's control plane (DESIGN.md section 15, docs/e2b.md) driven
// by the real client: the `e2b` package from the npm registry, unmodified,
// run by node against a real dsecd with E2B_API_URL and E2B_API_KEY set as
// a user sets them. Skips, saying why, where the host has no node or npm,
// or the registry cannot be reached.
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "drivers/images/debian.hpp"
#include "dsec/snapshot.hpp"
#include "harness/daemon.hpp"
#include "runtime/files.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/e2b_sdk.hpp"
#include "tests/support/http_probe.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

class E2bDoor : public ContainerTest {
 protected:
  static void SetUpTestSuite() {
    ContainerTest::SetUpTestSuite();
    module_ = E2bSdkModule(&skip_);
  }
  void SetUp() override {
    ContainerTest::SetUp();
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }

  // Runs `script` (in this directory) with the SDK pointed at the door.
  ProcResult Node(const std::string& script, const std::vector<std::string>& env) {
    EXPECT_TRUE(::access((daemon_->data_dir() + "/e2b.key").c_str(), R_OK) == 0) << "dsecd writes its first E2B key there";
    return RunE2bScript(*daemon_, module_, script, env);
  }

  static std::string module_, skip_;
};
std::string E2bDoor::module_, E2bDoor::skip_;

TEST_F(E2bDoor, TheUnmodifiedSdkCreatesListsExtendsAndKillsSandboxes) {
  std::string run = RandomHex(8);
  auto r = Node("control_plane.cjs", {"RUN_ID=" + run, std::string("TEMPLATE=") + kImage});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto out = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;
  std::string id = out.value("id", "");
  // Gone with the test whatever it finds (the SDK's kill is what is checked).
  struct Cleanup {
    Client* client;
    std::string id;
    ~Cleanup() {
      if (auto sb = client->Attach(id); sb.ok()) (void)sb->Destroy();
    }
  } cleanup{client_.get(), id};
  EXPECT_THAT(id, ::testing::MatchesRegex("[a-z0-9]+")) << "ids as E2B's SDK takes them";
  auto& info = out["info"];
  EXPECT_EQ(info["sandboxId"], id);
  EXPECT_EQ(info["templateId"], kImage);
  EXPECT_EQ(info["state"], "running");
  EXPECT_EQ(info["metadata"]["run"], run);
  EXPECT_EQ(info["envdVersion"], "0.6.3") << "the highest whose every behaviour dsec serves (docs/e2b.md)";
  EXPECT_NEAR(info["lifetime"].get<double>(), 120, 2) << "E2B's timeout is its lifetime";
  EXPECT_NEAR(out["extendedBy"].get<double>(), 480, 5) << "setTimeout(600 s) is 600 s from now";
  // getMetrics: one sample, of now (dsec keeps no history); none for a
  // window that ended long ago.
  ASSERT_EQ(out["metrics"].size(), 1u) << out["metrics"].dump();
  auto& m = out["metrics"][0];
  EXPECT_LE(std::abs(m["age"].get<int>()), 5) << m.dump();
  EXPECT_GE(m["cpuCount"].get<int>(), 1) << m.dump();
  EXPECT_GE(m["cpuUsedPct"].get<double>(), 0.0) << m.dump();
  EXPECT_GT(m["memUsed"].get<double>(), 0.0) << m.dump();
  EXPECT_GT(m["memTotal"].get<double>(), m["memUsed"].get<double>()) << m.dump();
  EXPECT_TRUE(m.contains("memCache") && m.contains("diskUsed") && m.contains("diskTotal")) << m.dump();
  EXPECT_EQ(out["pastMetrics"], 0);
  EXPECT_EQ(out["listed"], nlohmann::json::array({id})) << "listed by its metadata";
  EXPECT_EQ(out["newestFirst"], true) << "E2B's order: by start, newest first, across pages of 1";
  EXPECT_EQ(out["oldestFirst"], true) << "order=asc";
  EXPECT_EQ(out["startedAfter"], true) << "started at or after the time";
  EXPECT_EQ(out["badOrder"], 400);
  EXPECT_EQ(out["othersListed"], 0);
  EXPECT_EQ(out["running"], 1);
  EXPECT_EQ(out["connected"], id);
  EXPECT_EQ(out["killed"], true);
  EXPECT_EQ(out["killedAgain"], false) << "a second kill is E2B's 404: false";
  EXPECT_THAT(out["afterKill"].get<std::string>(), HasSubstr("NotFound"));
  EXPECT_EQ(out["autoPaused"], "paused") << "onTimeout 'pause': paused at its timeout's end, not killed";
  EXPECT_EQ(out["lifecycle"], nlohmann::json({{"onTimeout", "pause"}, {"autoResume", true}}));
  EXPECT_EQ(out["network"], nlohmann::json::parse(R"([false, {"allowOut": [], "denyOut": ["0.0.0.0/0"]}])"))
      << "no internet on this node: none, said as E2B says it";
  EXPECT_EQ(out["autoResumed"], "kept") << "autoResume: a command resumes it, its files kept";
  EXPECT_EQ(out["connectedAfter"], true);
  EXPECT_EQ(out["runningAfter"], "running") << "connect gave it 60 s more";
  EXPECT_THAT(out["badKey"].get<std::string>(), HasSubstr("AuthenticationError"));
  EXPECT_THAT(out["badTemplate"].get<std::string>(), HasSubstr("no-such-image"));
  EXPECT_THAT(out["badKind"].get<std::string>(), HasSubstr("zeppelin"));
  // Nothing of it is left on the node.
  auto left = client_->ListSandboxes();
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  for (const auto& sb : left->sandboxes()) EXPECT_NE(sb.id(), id);
}

// E2B's fork and snapshots, through the unmodified SDK: forks in the
// source's state and independent of it and of each other, each with the
// lifetime asked; a snapshot is a template; bad input refused; and nothing
// of them left on the node (the forks' own snapshot goes with the last).
TEST_F(E2bDoor, TheSdkForksAndSnapshotsSandboxes) {
  std::string run = RandomHex(8);
  auto r = Node("snapshots.cjs", {"RUN_ID=" + run, std::string("TEMPLATE=") + kImage});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto out = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;
  using J = nlohmann::json;
  EXPECT_EQ(out["forks"], J({"sandbox", "sandbox"}));
  EXPECT_EQ(out["forkIds"], 3) << "each fork its own id";
  EXPECT_EQ(out["forkRead"], "state before fork");
  EXPECT_EQ(out["sourceAfter"], "state before fork") << "a fork's writes are its own";
  EXPECT_EQ(out["otherFork"], "state before fork");
  EXPECT_THAT(out["forkRuns"].get<std::string>(), HasSubstr("hi from e"));
  EXPECT_NEAR(out["forkLifetime"].get<double>(), 60, 5) << "the fork's timeout is its lifetime";
  EXPECT_EQ(out["sourceRunning"], true);
  EXPECT_EQ(out["forkById"], true);
  EXPECT_EQ(out["forkOfFork"], "modified in fork");
  EXPECT_EQ(out["snapshot"], J({{"snapshotId", "snap-" + run}, {"names", {"snap-" + run}}}));
  EXPECT_THAT(out["snapshotAgain"].get<std::string>(), HasSubstr("exists"));
  EXPECT_THAT(out["badName"].get<std::string>(), HasSubstr("Not A Name!"));
  EXPECT_EQ(out["fromSnapshot"], "state before fork") << "a snapshot is a template";
  EXPECT_EQ(out["fromSnapshotTemplate"], kImage) << "its image under it";
  EXPECT_EQ(out["listed"], J({"snap-" + run})) << "a fork's own snapshot is not listed";
  EXPECT_EQ(out["listedByName"], 1);
  EXPECT_THAT(out["deleteInUse"].get<std::string>(), HasSubstr("409: snapshot 'snap-" + run + "' is in use by sandbox"));
  EXPECT_EQ(out["deleted"], true);
  EXPECT_EQ(out["deletedAgain"], false) << "E2B's 404: false";
  EXPECT_THAT(out["fromDeleted"].get<std::string>(), HasSubstr("snap-" + run));
  EXPECT_EQ(out["tooMany"][0], 400);
  EXPECT_THAT(out["tooMany"][1].get<std::string>(), HasSubstr("from 1 to 100"));
  EXPECT_EQ(out["countNotNumber"][0], 400);
  EXPECT_THAT(out["forkUnknown"].get<std::string>(), HasSubstr("NotFound"));
  EXPECT_THAT(out["forkKilled"].get<std::string>(), HasSubstr("NotFound"));
  // Nothing left: no sandbox, no snapshot.
  auto left = client_->ListSandboxes();
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_EQ(out["made"].size(), 6u) << "the source, 2 forks, 1 by id, a fork's fork, one from the snapshot";
  for (const auto& sb : left->sandboxes())
    for (const auto& id : out["made"]) EXPECT_NE(sb.id(), id.get<std::string>());
  auto snaps = ListSnapshots(*client_);
  ASSERT_TRUE(snaps.ok()) << snaps.status().ToString();
  for (const auto& s : *snaps) ADD_FAILURE() << "left behind: snapshot " << s.name();
}

// A stranger's requests: no key, a key dsec did not issue, garbage: each
// 401 or 4xx in E2B's error shape, and nothing made.
TEST_F(E2bDoor, RequestsWithoutAValidKeyAreRefusedAndMakeNothing) {
  std::string url = "http://" + daemon_->e2b_addr() + "/sandboxes";
  auto curl = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/curl", "-s", "-o", "-", "-w", "\n%{http_code}"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv).out;
  };
  EXPECT_THAT(curl({"-X", "POST", url, "-d", "{\"templateID\":\"tools\"}"}), HasSubstr("\"code\":401"));
  EXPECT_THAT(curl({"-X", "POST", url, "-H", "X-API-KEY: e2b_00", "-d", "{\"templateID\":\"tools\"}"}),
              HasSubstr("\n401"));
  auto key = ReadFileToString(daemon_->data_dir() + "/e2b.key");
  ASSERT_TRUE(key.ok());
  std::string h = "X-API-KEY: " + key->substr(0, key->find('\n'));
  EXPECT_THAT(curl({"-X", "POST", url, "-H", h, "-d", "not json"}), HasSubstr("\n400"));
  EXPECT_THAT(curl({"-X", "POST", url, "-H", h, "-d", "{\"templateID\":\"tools\",\"timeout\":-5}"}),
              HasSubstr("\n400"));
  EXPECT_THAT(curl({"-X", "POST", url, "-H", h, "-d", "{\"templateID\":\"tools\",\"metadata\":{\"a\":1}}"}),
              HasSubstr("\n400"));
  EXPECT_THAT(curl({"-H", h, url + "/NOT-AN-ID"}), HasSubstr("\n404"));
  EXPECT_THAT(curl({"-H", h, "http://" + daemon_->e2b_addr() + "/v2/sandboxes?limit=0"}), HasSubstr("\n400"));
  // envd's calls: no sandbox named, or no token of it.
  std::string files = "http://" + daemon_->e2b_addr() + "/files?path=/etc/passwd";
  EXPECT_THAT(curl({files}), HasSubstr("\n400"));
  EXPECT_THAT(curl({"-H", "E2b-Sandbox-Id: e0123", files}), HasSubstr("\n401"));
  EXPECT_THAT(curl({"-H", "E2b-Sandbox-Id: e0123", "-H", "X-Access-Token: 00", files}), HasSubstr("\n401"));
  // Each answer is counted, by call and status.
  auto metrics = RunProcess({"/usr/bin/curl", "-s", "http://" + daemon_->http_addr() + "/metrics"}).out;
  EXPECT_THAT(metrics, HasSubstr("dsec_e2b_requests_total{call=\"create\",code=\"401\"}"));
  EXPECT_THAT(metrics, HasSubstr("dsec_e2b_requests_total{call=\"create\",code=\"400\"}"));
  EXPECT_THAT(metrics, HasSubstr("dsec_e2b_requests_total{call=\"get\",code=\"404\"}"));
  auto all = client_->ListSandboxes();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->sandboxes_size(), 0) << "nothing was made";
  for (const auto& sb : all->sandboxes())  // what a broken door made, gone with the test
    if (auto made = client_->Attach(sb.id()); made.ok()) (void)made->Destroy();
}

// envd's files and health on the same port (E2B_SANDBOX_URL): what the
// SDK writes, it reads back byte for byte, parents made; a missing file is
// its NotFound; another sandbox's token is refused.
TEST_F(E2bDoor, TheSdkWritesAndReadsFilesThroughTheSandboxUrl) {
  using J = nlohmann::json;
  auto r = Node("envd_files.cjs", {std::string("TEMPLATE=") + kImage});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto out = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;
  EXPECT_EQ(out["written"]["path"], "/tmp/e2b/deep/a.txt");
  EXPECT_EQ(out["read"], "hello from e2b\n");
  EXPECT_EQ(out["binarySame"], true);
  EXPECT_EQ(out["c"], "c");
  const nlohmann::json meta = {{"author", "mish"}, {"purpose", "upload"}};
  EXPECT_EQ(out["metaWritten"], meta) << "envd 0.6.2: file metadata";
  EXPECT_EQ(out["metaInfo"], meta);
  EXPECT_EQ(out["metaListed"], meta);
  EXPECT_EQ(out["metaRenamed"], meta);
  EXPECT_EQ(out["metaOverwritten"], nlohmann::json::parse("[null, null]")) << "a rewrite without metadata drops it";
  EXPECT_EQ(out["metaByHand"], nlohmann::json({{"by", "hand"}})) << "a user.e2b.* attribute set in the sandbox";
  EXPECT_TRUE(out["noMeta"].is_null());
  EXPECT_EQ(out["gzipSame"], true) << "a gzip-compressed upload is written as its content";
  EXPECT_EQ(out["streamed"], "part1 part2") << "a streamed (chunked) upload";
  EXPECT_EQ(out["twoMembers"], nlohmann::json::array({200, "first second"})) << "a gzip body of two members, whole";
  ASSERT_EQ(out["badGzip"].size(), 2u) << out.dump();
  EXPECT_EQ(out["badGzip"][0], 400);
  EXPECT_THAT(out["badGzip"][1].get<std::string>(), HasSubstr("not gzip")) << "E2B's error shape, saying why";
  EXPECT_THAT(out["missing"].get<std::string>(), HasSubstr("NotFound"));
  EXPECT_EQ(out["running"], true);
  EXPECT_THAT(out["crossToken"].get<std::string>(), HasSubstr("status 401"));
  // Signed URLs: plain fetches without headers, the sandbox found by its token's signature.
  EXPECT_EQ(out["signedRead"], J::parse(R"([200, "c"])")) << "downloadUrl, fetched as a browser would";
  EXPECT_EQ(out["signedWrite"], J::parse(R"([200, "uploaded"])")) << "uploadUrl, a form posted to it";
  EXPECT_EQ(out["signedExpired"], J::parse(R"([401, {"code": 401, "message": "signature is already expired"}])"));
  EXPECT_EQ(out["signedForged"], 401);
  EXPECT_EQ(out["readUrlWrites"], 401) << "a read's signature does not write";
  EXPECT_EQ(out["signedWithId"], 200) << "with E2b-Sandbox-Id, the signature stands for the token";
  EXPECT_EQ(out["runningAfterKill"], false);
  // A service in the sandbox, by its port.
  EXPECT_EQ(out["portRead"], J::parse(R"([200, "hello from a port", "text/plain"])")) << "E2b-Sandbox-Port";
  EXPECT_EQ(out["portBig"], true) << "300 000 bytes, whole and in order";
  EXPECT_EQ(out["portMissing"], 404) << "the service's own answer";
  EXPECT_EQ(out["portByHost"], J::parse(R"([200, "hello from a port"])")) << "Host: getHost(8000)";
  ASSERT_EQ(out["portClosed"].size(), 2u) << out.dump();
  EXPECT_EQ(out["portClosed"][0], 502);
  EXPECT_EQ(out["portClosed"][1]["message"], "The sandbox is running but port is not open");
  EXPECT_EQ(out["portGone"], J::parse(R"([502, "The sandbox was not found"])")) << "as E2B's proxy says it";
}

// envd's Connect services (process Start, List, SendInput, CloseStdin,
// SendSignal; the filesystem calls) through the door, as the SDK uses them:
// output streamed as it comes and in order, exit codes and the SDK's
// errors, processes by their own pid, commands and files as the SDK's
// default user `user` (from the image's passwd) or as root.
TEST_F(E2bDoor, TheSdkRunsCommandsAndWalksTheFilesystem) {
  auto r = Node("envd_rpc.cjs", {std::string("TEMPLATE=") + kImage});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto out = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;
  using J = nlohmann::json;
  EXPECT_EQ(out["run"], J({{"exitCode", 0}, {"stdout", "line1\nline2\nline3\n"}, {"stderr", "err\n"}}));
  EXPECT_GE(out["chunks"].size(), 4u) << out["chunks"].dump();
  EXPECT_GT(out["streamedSpanMs"].get<int>(), 250) << "the lines came as they were written, not at the end";
  EXPECT_EQ(out["whoami"], "user\n/home/user\n/home/user\n") << "the SDK's default user, its HOME and cwd";
  EXPECT_EQ(out["rootWho"], "0\n/root\n");
  EXPECT_EQ(out["envs"], "bar baz\n");
  EXPECT_EQ(out["exit3"], "CommandExitError: exit status 3") << "envd's error: Go's, from Wait";
  EXPECT_EQ(out["exit3Code"], 3);
  EXPECT_THAT(out["timeout"].get<std::string>(), HasSubstr("Timeout"));
  EXPECT_THAT(out["unknownUser"].get<std::string>(), HasSubstr("no user 'nosuchuser'"));
  EXPECT_EQ(out["bgPidIsBash"], true) << "the pid the SDK holds is the process's own";
  EXPECT_EQ(out["cat"], "hello\nworld\n") << "stdin sent by pid, as it comes";
  EXPECT_EQ(out["closedStdin"], "a\nend\n") << "closeStdin: it reads end-of-file after what was sent";
  EXPECT_EQ(out["catNoStdin"], "") << "without stdin: true, stdin is closed at once";
  EXPECT_EQ(out["listed"], J::parse(R"([["/bin/bash",["-l","-c","sleep 30"]]])"));
  EXPECT_EQ(out["killed"], true);
  EXPECT_THAT(out["sleeperEnd"].get<std::string>(), HasSubstr("CommandExitError"));
  EXPECT_EQ(out["killAgain"], false) << "a gone process: the SDK's NotFound, false";
  EXPECT_THAT(out["inputToGone"].get<std::string>(), HasSubstr("NotFound"));
  EXPECT_EQ(out["reconnected"], J({{"pid", true}, {"exitCode", 0}, {"stdout", "got x\n"}, {"seen", "got x\n"}}))
      << "a disconnected command runs on; connect gets its output and its end";
  EXPECT_THAT(out["connectGone"].get<std::string>(), HasSubstr("NotFound"));
  // Bad input: a stream's error is its end message (HTTP 200, flag 0x02); a unary call's, an HTTP status.
  EXPECT_EQ(out["truncated"][0], 200);
  EXPECT_THAT(out["truncated"][1].get<std::string>(), HasSubstr("\"code\":\"invalid_argument\""));
  EXPECT_EQ(out["truncated"][1].get<std::string>()[0], '\x02') << "the end-of-stream flag";
  EXPECT_THAT(out["claims1GiB"][1].get<std::string>(), HasSubstr("says 1073741824 bytes; 2 came"));
  EXPECT_EQ(out["notJson"][0], 400);
  EXPECT_THAT(out["notJson"][1].get<std::string>(), HasSubstr("invalid_argument"));
  EXPECT_EQ(out["protoBody"][0], 415) << "JSON only, said so";
  EXPECT_EQ(out["polled"], J::parse(R"([["EVENT_TYPE_CREATE","f"],["EVENT_TYPE_WRITE","f"]])"))
      << "a polled watcher's events, each once";
  EXPECT_EQ(out["polledEntry"], J::parse(R"(["/tmp/polled/f", "FILE_TYPE_FILE", "2"])")) << "includeEntry (envd 0.6.3)";
  EXPECT_EQ(out["pollAgain"], J::parse(R"([200, {"events": []}])")) << "taken by the poll before";
  EXPECT_EQ(out["removedWatcher"], J::parse(R"([200, {}])"));
  EXPECT_EQ(out["pollRemoved"][0], 404);
  EXPECT_EQ(out["pollRemoved"][1]["code"], "not_found");
  EXPECT_EQ(out["watcherMissingDir"][0], 404);
  EXPECT_EQ(out["watcherNoId"][0], 400);
  EXPECT_THAT(out["watcherNoId"][1]["message"].get<std::string>(), HasSubstr("watcherId"));
  EXPECT_THAT(out["ptyOut"].get<std::string>(), HasSubstr("tty 100 30 True False"))
      << "a terminal of the size it was resized to; python3 is not the session's leader, bash is";
  EXPECT_THAT(out["ptyEnd"].get<std::string>(), HasSubstr("CommandExitError: exit status 7"))
      << "bash's exit code ends the terminal";
  EXPECT_EQ(out["madeDir"], true);
  EXPECT_EQ(out["madeAgain"], false) << "an existing directory: makeDir's false";
  EXPECT_EQ(out["dirOwner"], "user") << "what makeDir made belongs to the caller's user";
  EXPECT_EQ(out["list1"], J::parse(R"([["/tmp/fs/a","dir"]])"));
  EXPECT_EQ(out["list3"], J::parse(R"([["/tmp/fs/a","dir",null],["/tmp/fs/a/b","dir",null],)"
                                   R"(["/tmp/fs/a/b/two.txt","file",2],["/tmp/fs/a/one.txt","file",1]])"))
      << "depth 3, in walk order";
  EXPECT_EQ(out["exists"], true);
  EXPECT_EQ(out["existsNot"], false);
  EXPECT_EQ(out["info"], J({{"name", "one.txt"}, {"type", "file"}, {"size", 1}, {"mode", 0644},
                            {"permissions", "-rw-r--r--"}, {"owner", "user"}, {"group", "user"}, {"recent", true}}));
  EXPECT_THAT(out["homeInfo"].get<std::string>(), HasSubstr("NotFound"));
  EXPECT_EQ(out["relative"], "relativeuser\n") << "a relative path is under the user's home, and the file its own";
  EXPECT_EQ(out["moved"], J({"/tmp/fs/uno.txt", "uno.txt", false}));
  EXPECT_EQ(out["afterRemove"], J({"/tmp/fs/uno.txt"})) << "a directory removed with all it held";
  EXPECT_THAT(out["listFile"].get<std::string>(), HasSubstr("not a directory"));
  EXPECT_THAT(out["listMissing"].get<std::string>(), HasSubstr("NotFound"));
  EXPECT_EQ(out["watched"],
            J::parse(R"([["create","sub"],["create","sub/f.txt"],["write","sub/f.txt"],["remove","sub/f.txt"]])"))
      << "a recursive watch, through the SDK's watchDir (envd 0.1.4)";
  EXPECT_EQ(out["watchEntries"], J::parse(R"([["/tmp/wd/sub","dir",null],["/tmp/wd/sub/f.txt","file",1],null])"))
      << "envd 0.6.3: each event's entry where its path can be stat-ed (includeEntry), none for a remove";
  EXPECT_THAT(out["watchMissing"].get<std::string>(), HasSubstr("NotFound"));
  EXPECT_EQ(out["removeMissing"], "no error") << "envd's remove of what is not there";
  EXPECT_EQ(out["pauseBusy"], J({true, false})) << "paused with a command running, as E2B pauses";
  EXPECT_EQ(out["busyListed"], true) << "after connect (a resume) the command is there";
  EXPECT_EQ(out["busyAttached"], true);
  EXPECT_EQ(out["linkTarget"], "/tmp/fs/uno.txt") << "a relative target, from the link's directory";
  EXPECT_THAT(out["killedDuringRun"].get<std::string>(), HasSubstr("TimeoutError"));
  EXPECT_THAT(out["killedDuringRun"].get<std::string>(), HasSubstr("killed or reached its end of life"))
      << "the stream cut without an end, as E2B's proxy cuts it; the SDK's health check says the sandbox is gone";
}

// A client that starts a command printing 64 MiB and never reads its
// stream: what waits for it is bounded (the door cuts it off once 1 MiB
// waits), the command runs on to its end, dsecd's memory does not grow
// with the output, and the door goes on answering.
TEST_F(E2bDoor, AClientThatNeverReadsCostsABoundedBuffer) {
  int port = HttpPort(daemon_->e2b_addr());
  auto key = ReadFileToString(daemon_->data_dir() + "/e2b.key");
  ASSERT_TRUE(key.ok());
  std::string body = std::string(R"({"templateID":")") + kImage + R"(","timeout":120})";
  auto made = HttpExchange(port, "POST /sandboxes HTTP/1.1\r\nHost: dsec\r\nX-API-Key: " +
                                     key->substr(0, key->find('\n')) + "\r\nContent-Type: application/json\r\n"
                                     "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  ASSERT_EQ(made.code, 201) << made.raw;
  auto sb = nlohmann::json::parse(made.body, nullptr, false);
  ASSERT_TRUE(sb.is_object()) << made.body;
  std::string id = sb.value("sandboxID", ""), token = sb.value("envdAccessToken", "");
  auto envd = [&](const std::string& path, const std::string& type, const std::string& payload) {
    return "POST " + path + " HTTP/1.1\r\nHost: dsec\r\nE2b-Sandbox-Id: " + id + "\r\nX-Access-Token: " + token +
           "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(payload.size()) + "\r\n\r\n" +
           payload;
  };
  // 64 MiB of output, which would sit in dsecd's memory (more, as base64)
  // if nothing held it back.
  std::string start = R"({"process":{"cmd":"/bin/sh","args":["-c","echo > /tmp/started; )"
                      R"(yes 0123456789abcdef | head -c 67108864; echo > /tmp/finished"]}})";
  uint32_t n = static_cast<uint32_t>(start.size());
  std::string envelope = std::string(1, '\0') + static_cast<char>(n >> 24) + static_cast<char>(n >> 16) +
                         static_cast<char>(n >> 8) + static_cast<char>(n) + start;
  auto rss_kib = [&] {
    std::ifstream in("/proc/" + std::to_string(daemon_->pid()) + "/status");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return 0L;
  };
  long rss0 = rss_kib();
  int fd = DialLoopback(port);
  ASSERT_GE(fd, 0);
  std::string req = envd("/process.Process/Start", "application/connect+json", envelope);
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  auto listed = [&] {
    auto r = HttpExchange(port, envd("/process.Process/List", "application/json", "{}"), 1000);
    EXPECT_EQ(r.code, 200) << "the door answers meanwhile: " << r.raw;
    return r.body.find("yes") != std::string::npos;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto mine = client_->Attach(id);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  // It does not read: once 1 MiB waits for it, the door cuts it off; the
  // command runs on to its end (a streamed exec has no output limit), its
  // output going nowhere, and dsecd's memory stays flat meanwhile.
  long peak = 0;
  while (!mine->ReadFile("/tmp/finished").ok() && std::chrono::steady_clock::now() < deadline) {
    peak = std::max(peak, rss_kib());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a polling period, not a wait
  }
  ASSERT_TRUE(mine->ReadFile("/tmp/finished").ok()) << "the command ran to its end though nobody read it";
  EXPECT_LT(peak - rss0, 40 * 1024) << "KiB more while a client does not read";
  EXPECT_FALSE(listed()) << "it ended";
  // What reached the client: a part, then the connection's end, without
  // the stream's end message.
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string tail;
  size_t total = 0;
  char buf[1 << 16];
  for (ssize_t got; (got = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
    total += static_cast<size_t>(got);
    tail.append(buf, static_cast<size_t>(got));
    if (tail.size() > (4u << 10)) tail.erase(0, tail.size() - (4u << 10));
  }
  ::close(fd);
  EXPECT_GT(total, 0u);
  EXPECT_LT(total, 32u << 20) << "cut off, not sent 64 MiB";
  EXPECT_EQ(tail.find("\"exited\""), std::string::npos) << "no end message on a cut stream";
  EXPECT_EQ(HttpExchange(port, "DELETE /sandboxes/" + id + " HTTP/1.1\r\nHost: dsec\r\nX-API-Key: " +
                                   key->substr(0, key->find('\n')) + "\r\n\r\n")
                .code,
            204);
}

// E2B's `base` template is one documented command away (docs/e2b.md):
// Debian's packages and a user `user`, as the SDK's own tests expect.
// Skips without debootstrap or, when the tree is not cached yet, without
// Debian's mirror.
TEST_F(E2bDoor, TheBaseTemplateIsOneDsecImageCommandAway) {
  if (::access("/usr/sbin/debootstrap", X_OK) != 0) GTEST_SKIP() << "no debootstrap (apt-get install debootstrap)";
  const std::vector<std::string> cmd = {"build", "--debian", "bookworm", "--packages",
                                        "python3,git,curl,sudo,ca-certificates", "--user", "user", "base"};
  images::DebianOptions deb;
  deb.packages = {"python3", "git", "curl", "sudo", "ca-certificates"};
  deb.users = {"user"};
  struct stat st;
  bool cached = ::stat(("/var/cache/dsec/debian/" + images::DebianCacheName(deb) + "/etc/debian_version").c_str(),
                       &st) == 0;
  if (!cached && RunProcess({"/usr/bin/curl", "-sfI", "-m", "10", "http://deb.debian.org/debian/dists/bookworm/Release"})
                         .exit_code != 0)
    GTEST_SKIP() << "deb.debian.org is not reachable and the base tree is not cached";
  std::vector<std::string> argv = {BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir()};
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  auto built = RunProcess(argv, {}, 1200);
  ASSERT_EQ(built.exit_code, 0) << built.err;
  auto r = Node("base_template.cjs", {});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto out = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;
  EXPECT_EQ(out["who"], "user\n/home/user\n/home/user\n");
  EXPECT_EQ(out["sudo"], nlohmann::json({"-rwsr-xr-x\n", "user ALL=(ALL:ALL) NOPASSWD: ALL\n"}))
      << "sudo, with user's passwordless rule";
  EXPECT_EQ(out["tools"], "42\ngit version\ncurl\n");
  EXPECT_EQ(out["bashIsLogin"], "login\n") << "commands run in bash -l, as E2B's";
  EXPECT_EQ(out["root"], "root\n");
  (void)RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "rm", "base"});
}

// An operator issues a key (dsecctl e2b-key, through the admin console),
// the SDK's calls pass with it, and once revoked they get 401 at once.
TEST_F(E2bDoor, AnIssuedKeyWorksUntilItIsRevoked) {
  auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {BinDir() + "/dsecctl", "--data-dir", daemon_->data_dir(), "e2b-key"});
    args.push_back("--raw");
    return RunProcess(args);
  };
  auto issued = ctl({"issue", "trainer-a"});
  ASSERT_EQ(issued.exit_code, 0) << issued.out << issued.err;
  auto j = nlohmann::json::parse(issued.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << issued.out;
  std::string key = j.value("key", "");
  EXPECT_THAT(key, ::testing::MatchesRegex("e2b_[0-9a-f]{40}"));
  auto listed = ctl({"ls"});
  EXPECT_THAT(listed.out, HasSubstr("\"trainer-a\""));
  EXPECT_THAT(listed.out, ::testing::Not(HasSubstr(key))) << "only the key's first characters are shown";
  EXPECT_NE(ctl({"issue", "trainer-a"}).exit_code, 0) << "a name is one key";
  std::string url = "http://" + daemon_->e2b_addr() + "/v2/sandboxes";
  auto code = [&](const std::string& k) {
    return RunProcess({"/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "X-API-KEY: " + k, url}).out;
  };
  EXPECT_EQ(code(key), "200");
  EXPECT_EQ(ctl({"revoke", "trainer-a"}).exit_code, 0);
  EXPECT_EQ(code(key), "401");
  auto again = ctl({"revoke", "trainer-a"});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.out + again.err, HasSubstr("no E2B API key named 'trainer-a'"));
}

}  // namespace
}  // namespace dsec::testing
