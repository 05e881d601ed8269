// controller_sim: a SIMULATION of one controller's capacity. The real
// controller actor (actors/controller.cpp, with its RocksDB store in a temp
// dir and the group committer) and N simulated nodes in one process. A
// simulated node is an actor that joins and heartbeats like a node's link
// and answers a create with a record only: no sandbox, process or image
// exists. It measures what one controller can place and hold, not what a
// cluster can run.
//
//   controller_sim [--nodes 160] [--sandboxes 380000] [--inflight 512] [--threads 2]
//
// Prints placements/s, the controller process's CPU per placement, and its
// resident memory before and after the directory holds every sandbox.
#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <unistd.h>

#include "actors/controller/controller.hpp"
#include "perf/bench_util.hpp"
#include "runtime/files.hpp"
#include "runtime/log.hpp"
#include "runtime/metrics.hpp"
#include "state/group_commit.hpp"
#include "state/store.hpp"
#include "wire/wire.hpp"

namespace {

using dsec::bench::Clock;
using pulse_atom = caf::atom_constant<caf::atom("simpulse")>;

struct SimNodeState {
  uint64_t sandboxes = 0;
  std::string id;
  static constexpr const char* name = "sim_node";
};

// A simulated node: a record per create, a heartbeat a second.
caf::behavior SimNode(caf::stateful_actor<SimNodeState>* self, std::string id, caf::actor controller) {
  self->state.id = id;
  self->send(self, pulse_atom::value);
  return {
      [self](dsec::v1::CreateRequest& req) {
        dsec::v1::SandboxReply r;
        r.mutable_sandbox()->set_id(req.id());
        r.mutable_sandbox()->set_node_id(self->state.id);
        r.mutable_sandbox()->set_phase(dsec::v1::SANDBOX_PHASE_RUNNING);
        self->state.sandboxes++;
        return r;
      },
      [self, controller](pulse_atom) {
        dsec::cluster::v1::NodeLoad load;
        load.set_sandboxes(self->state.sandboxes);
        load.set_slots(2500);
        load.add_images("img@sha256:sim");
        self->send(controller, dsec::beat_atom::value, self->state.id, std::move(load));
        self->delayed_send(self, std::chrono::seconds(1), pulse_atom::value);
      },
  };
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 160;
  uint64_t total = 380000;
  int inflight = 512;
  size_t threads = 2;
  CLI::App app{"controller_sim: SIMULATION of one controller placing sandboxes on N simulated nodes (records only)"};
  app.add_option("--nodes", nodes, "simulated nodes")->capture_default_str();
  app.add_option("--sandboxes", total, "sandboxes to place (all stay live)")->capture_default_str();
  app.add_option("--inflight", inflight, "creates in flight at once")->capture_default_str();
  app.add_option("--threads", threads, "actor scheduler threads")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  dsec::LogOptions lo;
  lo.level = "warn";
  dsec::InitLogging(lo);

  char tmpl[] = "/tmp/dsec-controller-sim-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  std::string dir = tmpl;
  auto store = dsec::state::OpenRocksStore(dir + "/db");
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  dsec::state::GroupCommitter committer(store->get());
  double rss_start = dsec::metrics::ReadHostFigures().process_rss / 1048576.0;
  double placed_s = 0, cpu_s = 0, rss_before = 0, rss_after = 0;
  {
    caf::actor_system_config cfg;
    dsec::CafOptions co;
    co.scheduler_threads = threads;
    dsec::ConfigureCaf(cfg, co);
    caf::actor_system sys{cfg};
    auto ctx = std::make_shared<dsec::ControllerContext>();
    ctx->id = "controller-sim";
    ctx->store = store->get();
    ctx->committer = &committer;
    ctx->log = dsec::Logger("controller");
    ctx->down_after_ms = 10000;
    auto controller = dsec::SpawnController(sys, ctx);
    caf::scoped_actor self{sys};
    std::vector<caf::actor> sims;
    for (int i = 0; i < nodes; ++i) {
      std::string id = "sim-" + std::to_string(i);
      auto a = sys.spawn(SimNode, id, caf::actor_cast<caf::actor>(controller));
      dsec::cluster::v1::NodeJoin j;
      j.mutable_node()->set_id(id);
      j.mutable_node()->set_sdk_address("10.0.0." + std::to_string(i) + ":7400");
      j.mutable_node()->add_kinds("container");
      j.mutable_load()->set_slots(2500);
      j.mutable_load()->add_images("img@sha256:sim");
      bool ok = false;
      self->request(controller, std::chrono::seconds(10), dsec::join_atom::value, j, a)
          .receive([&](dsec::cluster::v1::JoinReply& r) { ok = r.status().code() == dsec::v1::Status::OK; },
                   [&](caf::error& e) { std::fprintf(stderr, "join: %s\n", sys.render(e).c_str()); });
      if (!ok) return 1;
      sims.push_back(a);
    }
    rss_before = dsec::metrics::ReadHostFigures().process_rss / 1048576.0;
    dsec::v1::CreateRequest req;
    req.mutable_spec()->set_kind(dsec::v1::KIND_CONTAINER);
    req.mutable_spec()->set_image("img");
    uint64_t failed = 0;
    std::string first_error;
    auto count = [&](const dsec::v1::SandboxReply& r) {
      if (r.status().code() != dsec::v1::Status::OK && !failed++) first_error = r.status().message();
    };
    // Latency: one create at a time.
    const uint64_t kSequential = std::min<uint64_t>(2000, total);
    std::vector<double> lat;
    for (uint64_t i = 0; i < kSequential; ++i) {
      auto started = Clock::now();
      self->request(controller, std::chrono::seconds(60), req)
          .receive([&](dsec::v1::SandboxReply& r) { count(r); },
                   [&](caf::error& e) {
                     if (!failed++) first_error = sys.render(e);
                   });
      lat.push_back(dsec::bench::Ms(started, Clock::now()));
    }
    // Throughput: a window of `inflight` creates; each reply (a plain
    // message back to this actor) lets the next one go.
    double cpu0 = dsec::bench::CpuSeconds(::getpid());
    auto t0 = Clock::now();
    uint64_t rest = total - kSequential, sent = 0, done = 0;
    while (done < rest) {
      while (sent < rest && sent - done < static_cast<uint64_t>(inflight)) {
        self->send(controller, req);
        ++sent;
      }
      self->receive([&](dsec::v1::SandboxReply& r) {
        count(r);
        ++done;
      });
    }
    placed_s = std::chrono::duration<double>(Clock::now() - t0).count();
    cpu_s = dsec::bench::CpuSeconds(::getpid()) - cpu0;
    rss_after = dsec::metrics::ReadHostFigures().process_rss / 1048576.0;
    auto p = dsec::bench::Percentiles(lat);
    std::printf("SIMULATION (controller_sim): one real controller actor, %d simulated nodes (records only, no "
                "sandboxes), RocksDB store, %zu scheduler threads\n",
                nodes, threads);
    std::printf("placement       p50 %.3f ms, p99 %.3f ms (%llu creates one at a time, round trip to a simulated node "
                "included)\n",
                p.p50, p.p99, static_cast<unsigned long long>(kSequential));
    std::printf("placed          %llu sandboxes in %.2f s with %d in flight: %.0f placements/s (%llu failed%s%s)\n",
                static_cast<unsigned long long>(rest), placed_s, inflight, rest / placed_s,
                static_cast<unsigned long long>(failed), failed ? ": " : "", first_error.c_str());
    std::printf("process CPU     %.1f us per placement (controller, simulated nodes and this driver together)\n",
                cpu_s / rest * 1e6);
    std::printf("resident memory %.0f MiB at start, %.0f MiB with %d nodes joined, %.0f MiB with %llu live "
                "sandboxes in the directory (%.1f MiB per 10 000)\n",
                rss_start, rss_before, nodes, rss_after, static_cast<unsigned long long>(total),
                (rss_after - rss_before) / (total / 10000.0));
    for (auto& a : sims) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(controller, caf::exit_reason::user_shutdown);
  }
  committer.Stop();
  store->reset();
  (void)dsec::RemoveTree(dir);
  return 0;
}
