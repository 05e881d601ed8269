// Store micro benchmarks: what one durable step costs alone, and how group
// commit spreads an fsync over concurrent sessions. items_per_second is steps
// durable (or, for the nosync rows, accepted) per second of wall time.
//
//   store_bench [--benchmark_filter=...]   (DSEC_BENCH_DIR picks the disk; default /tmp)
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "dsec/v1/types.pb.h"
#include "state/group_commit.hpp"
#include "state/store.hpp"

namespace dsec::state {
namespace {

// A typical step: a short command and a few lines of output, ~300 bytes.
std::string StepValue() {
  v1::StepRecord step;
  step.set_session("job-17/prompt-3/sample-2");
  step.set_index(42);
  step.set_started_ms(1700000000000);
  step.set_finished_ms(1700000000123);
  auto* req = step.mutable_request();
  req->add_argv("python3");
  req->add_argv("-c");
  req->add_argv("import solution; print(solution.answer(7))");
  req->set_cwd("/work");
  auto* res = step.mutable_result();
  res->set_verdict(v1::VERDICT_OK);
  res->set_stdout(std::string(160, 'o'));
  res->set_stderr(std::string(24, 'e'));
  res->set_cpu_us(81234);
  res->set_wall_us(123456);
  res->set_peak_memory_bytes(12 << 20);
  return step.SerializeAsString();
}

// One store shared by every benchmark, in a directory removed at exit.
class BenchStore {
 public:
  BenchStore() {
    const char* base = getenv("DSEC_BENCH_DIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/dsec-store-bench-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "store_bench: mkdtemp %s failed\n", tmpl.c_str());
      std::exit(1);
    }
    dir_ = tmpl;
    auto opened = OpenRocksStore(dir_ + "/db");
    if (!opened.ok()) {
      std::fprintf(stderr, "store_bench: %s\n", opened.status().ToString().c_str());
      std::exit(1);
    }
    store_ = std::move(opened).value();
  }
  ~BenchStore() {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Store* store() { return store_.get(); }

 private:
  std::string dir_;
  std::unique_ptr<Store> store_;
};

BenchStore* bench_store = nullptr;
const std::string& Value() {
  static const std::string value = StepValue();
  return value;
}
// Distinct keys across runs so every write is a fresh row, as in a real log.
std::atomic<uint64_t> next_index{0};

void WriteOneStep(benchmark::State& state, bool sync) {
  Store* store = bench_store->store();
  for (auto _ : state) {
    WriteBatch b;
    b.Put(Table::kSteps, StepKey("bench", next_index++), Value());
    Status st = store->Write(b, sync);
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * Value().size());
}

void BM_DirectWriteSync(benchmark::State& state) { WriteOneStep(state, true); }
void BM_DirectWriteNoSync(benchmark::State& state) { WriteOneStep(state, false); }

// Every benchmark thread is one session waiting for each step to be durable
// before its next, as a trainer's rollout does; thread 0 owns the committer.
GroupCommitter* committer = nullptr;

void GroupCommit(benchmark::State& state, bool sync) {
  if (state.thread_index() == 0) {
    GroupCommitOptions options;
    options.sync = sync;
    committer = new GroupCommitter(bench_store->store(), options);
  }
  // The first iteration waits for every thread, so `committer` is set by then.
  const std::string session = "bench-" + std::to_string(state.thread_index());
  for (auto _ : state) {
    WriteBatch b;
    b.Put(Table::kSteps, StepKey(session, next_index++), Value());
    Status st = committer->WriteSync(std::move(b));
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    // Past the loop every thread is done with the committer too.
    auto stats = committer->stats();
    delete committer;
    committer = nullptr;
    state.counters["steps_per_write"] =
        stats.writes ? static_cast<double>(stats.batches) / stats.writes : 0;
  }
}

void BM_GroupCommitSync(benchmark::State& state) { GroupCommit(state, true); }
void BM_GroupCommitNoSync(benchmark::State& state) { GroupCommit(state, false); }

BENCHMARK(BM_DirectWriteSync)->UseRealTime();
BENCHMARK(BM_DirectWriteNoSync)->UseRealTime();
BENCHMARK(BM_GroupCommitSync)->Threads(1)->Threads(4)->Threads(16)->Threads(64)->UseRealTime();
BENCHMARK(BM_GroupCommitNoSync)->Threads(1)->Threads(4)->Threads(16)->Threads(64)->UseRealTime();

}  // namespace
}  // namespace dsec::state

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  dsec::state::BenchStore store;
  dsec::state::bench_store = &store;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
