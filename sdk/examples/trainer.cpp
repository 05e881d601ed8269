// An example trainer: N one-shot fncall runs with up to C in flight, through
// the SDK, checking every result. The smallest useful program against dsec.
//   dsec-example-trainer --runs 1000 --concurrency 1000
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>

#include "dsec/client.hpp"
#include "dsec/status_proto.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dsec example trainer: many concurrent fncall runs through the SDK"};
  std::string addr, data_dir;
  int runs = 1000, concurrency = 1000;
  app.add_option("--addr", addr, "dsecd SDK entry host:port (default: $DSEC_ADDR, else <data-dir>/dsecd.json)");
  app.add_option("--data-dir", data_dir, "dsecd's data dir, for its address and sdk.token ($DSEC_DATA_DIR, else ./dsec-data)");
  app.add_option("--runs", runs, "how many runs")->capture_default_str();
  app.add_option("--concurrency", concurrency, "runs in flight at once")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  dsec::ClientOptions o;
  o.address = addr;
  o.data_dir = data_dir;
  auto client = dsec::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "trainer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::mutex mu;
  std::condition_variable cv;
  int inflight = 0, done = 0, wrong = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < runs; ++i) {
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return inflight < concurrency; });
      ++inflight;
    }
    // Each run computes something of its own, so a mixed-up reply shows.
    std::string expect = std::to_string(i * 7) + "\n";
    (*client)->RunAsync(dsec::FncallSpec(),
                        dsec::Command({"sh", "-c", "echo $((" + std::to_string(i) + " * 7))"}),
                        [&, expect](dsec::Result<dsec::v1::ExecResult> r) {
                          bool good = r.ok() && r->verdict() == dsec::v1::VERDICT_OK && r->stdout() == expect;
                          if (!good)
                            std::fprintf(stderr, "trainer: run failed: %s\n",
                                         r.ok() ? (std::string(dsec::VerdictName(r->verdict())) + " " + r->error()).c_str()
                                                : r.status().ToString().c_str());
                          std::lock_guard<std::mutex> lk(mu);
                          --inflight;
                          ++done;
                          if (!good) ++wrong;
                          cv.notify_all();
                        });
  }
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return done == runs; });
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("trainer: %d runs, %d failed, %.2f s, %.0f runs/s\n", runs, wrong, s, runs / s);
  return wrong == 0 ? 0 : 1;
}
