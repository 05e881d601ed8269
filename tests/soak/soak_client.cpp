// dsec-test-soak-client: one client process of the soak test. Until it gets
// SIGTERM it cycles through what trainers do: a one-shot fncall run, a
// container's life (create under an id of its own, exec, destroy) and a
// rollout session of ten counting steps (step k appends a line and prints
// the count, so it must print k+1: a step lost or run twice shows). Every
// call that fails because dsecd is away (it is killed -9 every few minutes)
// is sent again as it was: the same run, the same sandbox id, the same step
// index. Lines on stdout:
//   run <n>                        a run answered right
//   sandbox <id>                   a container made, used and destroyed
//   step <session> <k> <printed>   an acknowledged step
//   session <name> <steps>         a session finished and closed
//   open <session>                 a session opened (closed later, or left open at the end)
//   FAIL <what>                    something the platform got wrong
//   done runs=R sandboxes=S steps=T sessions=U
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "dsec/client.hpp"

namespace {

std::atomic<bool> stop{false};

void OnTerm(int) { stop = true; }

bool Transient(const dsec::Status& s) {
  using C = dsec::Status::Code;
  return s.code() == C::kUnavailable || s.code() == C::kDeadlineExceeded;
}

// Calls `f` until it succeeds or fails for a reason that is not dsecd
// being away (up to two minutes).
template <class F>
auto Retry(F f) -> decltype(f()) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  for (;;) {
    auto r = f();
    if (r.ok() || !Transient(r.status()) || std::chrono::steady_clock::now() > deadline) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // dsecd restarting: back off
  }
}

void Say(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

dsec::v1::ExecRequest Sh(const std::string& script) { return dsec::Command({"/bin/sh", "-c", script}); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsec-test-soak-client: one client of the soak test"};
  std::string addr, data_dir, image = "tools";
  int worker = 0;
  app.add_option("--addr", addr);
  app.add_option("--data-dir", data_dir);
  app.add_option("--image", image);
  app.add_option("--worker", worker);
  CLI11_PARSE(app, argc, argv);
  ::signal(SIGTERM, OnTerm);
  dsec::ClientOptions o;
  o.address = addr;
  o.data_dir = data_dir;
  o.rpc_timeout = std::chrono::milliseconds(10000);
  auto client = dsec::Client::Connect(o);
  if (!client.ok()) {
    Say("FAIL connect: " + client.status().ToString());
    return 1;
  }
  auto& c = **client;
  std::string w = std::to_string(worker);
  uint64_t runs = 0, sandboxes = 0, steps = 0, sessions = 0;
  for (uint64_t round = 0; !stop; ++round) {
    // A one-shot run.
    std::string token = "run-" + w + "-" + std::to_string(round);
    auto r = Retry([&] { return c.Run(dsec::FncallSpec(), dsec::Command({"echo", token})); });
    if (!r.ok()) Say("FAIL run " + token + ": " + r.status().ToString());
    else if (r->stdout() != token + "\n") Say("FAIL run " + token + " printed '" + r->stdout() + "'");
    else Say("run " + std::to_string(++runs));
    if (stop) break;
    // A container's life, under an id of our own: a create whose answer was
    // lost is found again, not made twice.
    dsec::CreateOptions co;
    co.id = "soak-" + w + "-" + std::to_string(round);
    auto sb = Retry([&]() -> dsec::Result<dsec::Sandbox> {
      auto made = c.Create(dsec::ContainerSpec(image), co);
      if (!made.ok() && made.status().code() == dsec::Status::Code::kAlreadyExists) return c.Attach(co.id);
      return made;
    });
    if (!sb.ok()) {
      Say("FAIL create " + co.id + ": " + sb.status().ToString());
    } else {
      auto e = Retry([&] { return sb->Exec(Sh("echo " + co.id + " > /work/f && cat /work/f")); });
      if (!e.ok() || e->stdout() != co.id + "\n")
        Say("FAIL exec in " + co.id + ": " +
            (e.ok() ? "printed '" + e->stdout() + "' (" + dsec::v1::Verdict_Name(e->verdict()) + ", exit " +
                          std::to_string(e->exit_code()) + ", signal " + std::to_string(e->signal()) + ": " +
                          e->error() + ")"
                    : e.status().ToString()));
      auto d = Retry([&]() -> dsec::Result<bool> {
        auto st = sb->Destroy();
        if (st.ok() || st.code() == dsec::Status::Code::kNotFound) return true;
        return st;
      });
      if (!d.ok()) Say("FAIL destroy " + co.id + ": " + d.status().ToString());
      else Say("sandbox " + co.id + " " + std::to_string(++sandboxes));
    }
    if (stop) break;
    // A rollout session: step k must print k+1.
    std::string name = "soak/w" + w + "/r" + std::to_string(round);
    auto s = Retry([&] { return c.OpenSession(name, dsec::ContainerSpec(image)); });
    if (!s.ok()) {
      Say("FAIL open " + name + ": " + s.status().ToString());
      continue;
    }
    Say("open " + name);
    const uint64_t kSteps = 10;
    bool whole = true;
    for (uint64_t k = 0; k < kSteps && !stop; ++k) {
      auto st = Retry([&] { return s->Step(k, Sh("echo x >> /work/log; wc -l < /work/log")); });
      if (!st.ok()) {
        Say("FAIL step " + name + " " + std::to_string(k) + ": " + st.status().ToString());
        whole = false;
        break;
      }
      std::string out = st->step().result().stdout();
      while (!out.empty() && out.back() == '\n') out.pop_back();
      Say("step " + name + " " + std::to_string(k) + " " + out);
      ++steps;
      if (out != std::to_string(k + 1)) {
        const auto& res = st->step().result();
        Say("FAIL step " + name + " " + std::to_string(k) + " printed '" + out + "' (" +
            dsec::v1::Verdict_Name(res.verdict()) + ", exit " + std::to_string(res.exit_code()) + ", signal " +
            std::to_string(res.signal()) + ", sandbox " + st->step().sandbox() + ": " + res.error() + "; stderr '" +
            res.stderr() + "')");
      }
    }
    if (!whole || stop) continue;
    auto closed = Retry([&]() -> dsec::Result<bool> {
      auto st = s->Close();
      if (!st.ok()) return st;
      return true;
    });
    if (!closed.ok()) Say("FAIL close " + name + ": " + closed.status().ToString());
    else Say("session " + name + " " + std::to_string(kSteps) + " " + std::to_string(++sessions));
  }
  Say("done runs=" + std::to_string(runs) + " sandboxes=" + std::to_string(sandboxes) + " steps=" +
      std::to_string(steps) + " sessions=" + std::to_string(sessions));
  return 0;
}
