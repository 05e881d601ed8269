// The dsec C++ SDK: what a trainer links. dsec::Client talks to a dsecd
// (role all) over CAF's network layer; every call returns errors as values
// (dsec::Status / dsec::Result), has a finite timeout, and the client
// reconnects by itself after the daemon restarts. Thread-safe: call it from
// as many threads as you like, or use the *Async forms for thousands of
// concurrent runs from one thread.
//
//   auto client = dsec::Client::Connect();  // $DSEC_ADDR or ./dsec-data/dsecd.json; token from ./dsec-data/sdk.token
//   if (!client.ok()) { ... client.status().ToString() ... }
//   auto r = (*client)->Run(dsec::FncallSpec(), dsec::Command({"python3", "-c", "print(6*7)"}));
//   if (r.ok()) std::cout << r->stdout();                // "42\n"
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "dsec/status.hpp"
#include "dsec/v1/service.pb.h"
#include "dsec/v1/types.pb.h"

namespace dsec {

struct ClientOptions {
  // host:port of the dsecd SDK entry (dsecd --listen). Empty (the default):
  // $DSEC_ADDR, else the "sdk" address in <data_dir>/dsecd.json (written by
  // a running dsecd), else 127.0.0.1:7400.
  std::string address;
  // The SDK token dsecd asks every connection to prove it holds (dsecd
  // --sdk-token-file, default <data-dir>/sdk.token). Empty (the default):
  // $DSEC_SDK_TOKEN, else the contents of token_file, else of
  // <data_dir>/sdk.token.
  std::string token;
  std::string token_file;
  // dsecd's data dir, where the address and the token are looked up.
  // Empty: $DSEC_DATA_DIR, else ./dsec-data.
  std::string data_dir;
  // How long Connect waits for the first connection (default 5 s). A
  // refused connection or a wrong token fails at once.
  std::chrono::milliseconds connect_timeout{5000};
  // Timeout of calls that run nothing (create, get, ...), default 30 s; runs, execs
  // and steps: their time limit plus this; snapshot, fork, pause, resume: >= 5 min.
  std::chrono::milliseconds rpc_timeout{30000};
  // SDK worker threads (default 2).
  size_t threads = 2;
  // TLS certificates (PEM files) for a dsecd started with --tls-cert,
  // --tls-key and --tls-ca: this client's certificate and key, and the CA
  // dsecd's certificate must chain to. Empty: $DSEC_TLS_CERT, $DSEC_TLS_KEY,
  // $DSEC_TLS_CA. A dsecd with plain --tls needs none: the client speaks TLS
  // whenever dsecd's door says so (docs/cluster.md, "TLS").
  std::string tls_cert, tls_key, tls_ca;
};

// `options` with address, token and data_dir filled in as Connect would
// (environment, data dir files, defaults); a status when no token is found.
Result<ClientOptions> ResolveClientOptions(ClientOptions options);

class Client;

// Callback forms: every call has one (`...Async(args, done)`), for
// thousands of concurrent calls without a thread or a future each (the
// Python SDK's asyncio client completes through them). `done` runs exactly
// once, on an SDK thread (or, for an error found before anything is sent,
// on the caller's); keep it short and do not block there. It may issue the
// next call.
template <class T>
using Done = std::function<void(Result<T>)>;
using DoneStatus = std::function<void(Status)>;
using OnOutput = std::function<void(const v1::ExecOutput&)>;

// A sandbox created with Client::Create. Cheap to copy; valid while its
// Client lives.
class Sandbox {
 public:
  const std::string& id() const { return id_; }
  Result<v1::ExecResult> Exec(v1::ExecRequest req) const;
  std::future<Result<v1::ExecResult>> ExecAsync(v1::ExecRequest req) const;
  // Exec with output handed to `on_output` as it is produced (in order, on
  // an SDK thread; do not block there); the result carries no output.
  // Kinds that cannot stream (fncall: each exec is one fresh run whose
  // output comes back whole) answer Unimplemented, having run nothing.
  Result<v1::ExecResult> ExecStream(v1::ExecRequest req,
                                    std::function<void(const v1::ExecOutput&)> on_output) const;
  Result<v1::SandboxRecord> Get() const;
  // On an error the sandbox may still be there: Destroy again removes it.
  Status Destroy() const;
  // Freeze every process (no CPU used; `memory`: its memory freed too, running.md) / continue them.
  Status Pause(bool memory = false) const;
  Status Resume() const;
  // Destroyed `seconds` from now (within dsecd --sandbox-max-ttl); the
  // record comes back with the new end. Refused for a session's sandboxes.
  Result<v1::SandboxRecord> SetTimeout(uint32_t seconds) const;
  // A new network policy (service.proto, SetNetworkRequest), in force for
  // new connections when this returns; the record comes back.
  Result<v1::SandboxRecord> SetNetwork(const v1::NetworkPolicy& policy, v1::NetworkChange change) const;
  // Files (kinds with state), by absolute paths without ".." (more: dsec/files.hpp).
  Result<std::string> ReadFile(const std::string& path, uint64_t max_bytes = 0) const;
  Status WriteFile(const std::string& path, const std::string& content, uint32_t mode = 0644,
                   bool make_parents = false) const;
  // The path's FileInfo in `info`, and a directory's entries.
  Result<v1::FileReply> ListFiles(const std::string& path) const;

  // Callback forms (see Done).
  void ExecAsync(v1::ExecRequest req, Done<v1::ExecResult> done) const;
  void ExecStreamAsync(v1::ExecRequest req, OnOutput on_output, Done<v1::ExecResult> done) const;
  void GetAsync(Done<v1::SandboxRecord> done) const;
  void DestroyAsync(DoneStatus done) const;
  void PauseAsync(DoneStatus done, bool memory = false) const;
  void ResumeAsync(DoneStatus done) const;
  void SetTimeoutAsync(uint32_t seconds, Done<v1::SandboxRecord> done) const;
  void SetNetworkAsync(const v1::NetworkPolicy& policy, v1::NetworkChange change, Done<v1::SandboxRecord> done) const;
  void ReadFileAsync(const std::string& path, uint64_t max_bytes, Done<std::string> done) const;
  void WriteFileAsync(const std::string& path, const std::string& content, uint32_t mode, bool make_parents,
                      DoneStatus done) const;
  void ListFilesAsync(const std::string& path, Done<v1::FileReply> done) const;

 private:
  friend class Client;
  friend struct SnapshotCalls;  // dsec/snapshot.hpp
  friend struct ExtraCalls;     // dsec/files.hpp, dsec/processes.hpp
  template <class Reply, class Request>
  void Call(Request req, Done<Reply> done, OnOutput on_output = nullptr) const;
  Sandbox(Client* c, std::string id, v1::SandboxSpec spec, std::string route)
      : client_(c), id_(std::move(id)), spec_(std::move(spec)), route_(std::move(route)) {}
  Client* client_;
  std::string id_;
  v1::SandboxSpec spec_;  // its limits decide how long an exec may take
  // In a cluster: the SDK address of the node that holds it, where its
  // calls go (the controller named it); "": the address the client dialed.
  std::string route_;
};

// Per-step options: which of the session's sandboxes runs it, and what the
// trainer attaches (reward, token counts, notes; see Session::Annotate).
struct StepOptions {
  std::string sandbox;              // role; default "agent"
  v1::StepMeta meta;
  // The step has effects outside the sandbox that must not happen twice: a
  // restartable session is not re-run past it (SessionOptions::restartable).
  bool not_replayable = false;
};

// A rollout session (DESIGN.md section 4): steps are numbered from 0; a
// step already in the log is answered from it (fast-forward) without running
// again, so a restarted trainer can replay its rollout from the start. The
// session and its sandboxes outlive the trainer by the lease, so a new
// trainer process can open it again by name and go on.
class Session {
 public:
  const std::string& name() const { return name_; }
  // The record as of open/attach: roles and sandbox ids, lease.
  const v1::SessionRecord& record() const { return *rec_; }
  Result<v1::StepReply> Step(uint64_t index, v1::ExecRequest req, const StepOptions& options = {}) const;
  std::future<Result<v1::StepReply>> StepAsync(uint64_t index, v1::ExecRequest req,
                                               const StepOptions& options = {}) const;
  // Callback forms: `done` runs on an SDK thread; keep it short (it may
  // issue the session's next call: that is how one thread keeps thousands of
  // rollouts moving without a future each).
  void StepAsync(uint64_t index, v1::ExecRequest req, const StepOptions& options,
                 std::function<void(Result<v1::StepReply>)> done) const;
  // Adds metadata to a logged step: a set reward or token count replaces the
  // old one; notes are merged. The step's metadata as now logged comes back
  // (not its request and output: Steps() reads the whole step). Annotations
  // issued together travel to dsecd in one message, still in the order they
  // were issued relative to other calls. Unavailable ("send it again") if the
  // session actor crashed or closed before answering: annotating again is
  // safe.
  Result<v1::StepMeta> Annotate(uint64_t index, const v1::StepMeta& meta) const;
  std::future<Result<v1::StepMeta>> AnnotateAsync(uint64_t index, const v1::StepMeta& meta) const;
  void AnnotateAsync(uint64_t index, const v1::StepMeta& meta, std::function<void(Result<v1::StepMeta>)> done) const;
  // Logged steps [from, from + limit) (limit 0: up to 1 000) and the record; Grade: dsec/report.hpp.
  Result<v1::StepsReply> Steps(uint64_t from = 0, uint32_t limit = 0) const;
  Result<v1::SessionRecord> Get() const;
  // The session's sandbox for `role`, to look at it outside the log (files,
  // execs that are not steps). FailedPrecondition for a fncall role.
  Result<Sandbox> sandbox(const std::string& role = "agent") const;
  // Closes the session: its sandboxes go; its log is kept for dsec-replay.
  Status Close() const;

  void StepsAsync(uint64_t from, uint32_t limit, Done<v1::StepsReply> done) const;
  void GetAsync(Done<v1::SessionRecord> done) const;
  void SandboxAsync(const std::string& role, Done<Sandbox> done) const;
  void CloseAsync(DoneStatus done) const;

 private:
  friend class Client;
  friend void GradeAsync(const Session& session, uint64_t index, Done<v1::StepReply> done);
  Session(Client* c, std::string name, v1::SessionRecord rec)
      : client_(c), name_(std::move(name)), rec_(std::make_shared<const v1::SessionRecord>(std::move(rec))) {}
  Client* client_;
  std::string name_;
  std::shared_ptr<const v1::SessionRecord> rec_;
};

struct SessionOptions {
  // Sandboxes beyond "agent" (the spec OpenSession gets), by role, e.g.
  // {"eval", ContainerSpec("py311")}. Roles: [a-z0-9_-], at most 32 bytes.
  std::vector<std::pair<std::string, v1::SandboxSpec>> more_sandboxes;
  uint32_t lease_s = 0;  // seconds it outlives its last trainer; 0: the node's default
  // In a cluster: if its node dies, the controller re-runs its log's steps
  // on another node and the session goes on there (docs/cluster.md). Its
  // steps then go through the controller, which keeps the log's copy.
  bool restartable = false;
  v1::GradeSpec grade;  // how Grade (dsec/report.hpp) grades it; needs spec.task.root
  v1::SessionFork fork_of;  // its log begins with another's steps (ForkSession, dsec/snapshot.hpp)
};

struct CreateOptions {
  std::string id;          // see Client::Create
  bool detached = false;   // outlives this client (until its ttl)
  uint32_t lease_s = 0;    // how long it outlives this client gone; 0: the node's (dsecd --sandbox-lease)
};

class Client {
 public:
  // Connects to dsecd; Unavailable (saying where and what to check) when it
  // cannot be reached within options.connect_timeout.
  static Result<std::unique_ptr<Client>> Connect(ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // One-shot run in a fresh fncall sandbox.
  Result<v1::ExecResult> Run(const v1::SandboxSpec& spec, v1::ExecRequest exec);
  std::future<Result<v1::ExecResult>> RunAsync(const v1::SandboxSpec& spec, v1::ExecRequest exec);
  // Callback form: `done` runs on an SDK thread; keep it short.
  void RunAsync(const v1::SandboxSpec& spec, v1::ExecRequest exec,
                std::function<void(Result<v1::ExecResult>)> done);

  // A new sandbox. `id` names it ([a-z0-9-], at most 64 bytes); empty: one
  // is made up. AlreadyExists when the id is taken. It belongs to this
  // client: once the client has had no connection for the lease (the
  // process died, the network is gone), dsecd destroys it, unless it was
  // made detached. Its ttl and idle timeout are in the spec
  // (SandboxSpec.ttl_s, idle_timeout_s, on_idle; unset: the node's).
  Result<Sandbox> Create(const v1::SandboxSpec& spec, const std::string& id = "");
  Result<Sandbox> Create(const v1::SandboxSpec& spec, const CreateOptions& options);
  // A handle to an existing sandbox (NotFound when the node has none by that id).
  Result<Sandbox> Attach(const std::string& sandbox_id);
  // Sandboxes that match every filter of `filter` (phases, kinds, image,
  // labels, owner, created after, session: v1::ListSandboxesRequest), one
  // page in the order of their ids; a controller lists every node's. For
  // the next page, pass the reply's next_page_token as filter.page_token
  // ("" after the last page).
  Result<v1::ListSandboxesReply> ListSandboxes(const v1::ListSandboxesRequest& filter = {});

  // Opens a session by name, or re-opens it (idempotent with the same specs).
  // Its sandboxes exist when this returns.
  Result<Session> OpenSession(const std::string& name, const v1::SandboxSpec& spec,
                              const SessionOptions& options = {});
  // A handle to a session that is already open (NotFound when there is none
  // by that name).
  Result<Session> AttachSession(const std::string& name);

  // Images (dsec-image builds them; these register and manage them).
  Result<v1::ImageManifest> RegisterImage(const v1::ImageManifest& manifest, bool replace);
  Result<v1::ImageManifest> GetImage(const std::string& name);
  Result<std::vector<v1::ImageManifest>> ListImages();
  Status RemoveImage(const std::string& name);
  // Callback forms (see Done).
  void CreateAsync(const v1::SandboxSpec& spec, const CreateOptions& options, Done<Sandbox> done);
  void AttachAsync(const std::string& sandbox_id, Done<Sandbox> done);
  void ListSandboxesAsync(const v1::ListSandboxesRequest& filter, Done<v1::ListSandboxesReply> done);
  void OpenSessionAsync(const std::string& name, const v1::SandboxSpec& spec, const SessionOptions& options,
                        Done<Session> done);
  void AttachSessionAsync(const std::string& name, Done<Session> done);
  void RegisterImageAsync(const v1::ImageManifest& manifest, bool replace, Done<v1::ImageManifest> done);
  void GetImageAsync(const std::string& name, Done<v1::ImageManifest> done);
  void ListImagesAsync(Done<std::vector<v1::ImageManifest>> done);
  void RemoveImageAsync(const std::string& name, DoneStatus done);

  const std::string& client_id() const;  // the owner of the sandboxes it makes (SandboxRecord.owner)
  // Connected right now (the client reconnects by itself when not).
  bool connected() const;
  // Connections made so far (1 after Connect; +1 per reconnect).
  uint64_t connections() const;
  const ClientOptions& options() const;
  struct Impl;

 private:
  friend class Sandbox;
  friend class Session;
  friend struct SnapshotCalls;
  friend void GradeAsync(const Session& session, uint64_t index, Done<v1::StepReply> done);
  explicit Client(std::unique_ptr<Impl> impl);
  // Attach through `route` (a node's SDK address; "": the dialed one).
  static void AttachVia(Client* c, const std::string& route, const std::string& sandbox_id, Done<Sandbox> done);
  std::unique_ptr<Impl> impl_;
};

v1::ExecRequest Command(std::vector<std::string> argv);
v1::SandboxSpec FncallSpec();
// A container on `image` (built with dsec-image build).
v1::SandboxSpec ContainerSpec(const std::string& image);

}  // namespace dsec
