// dsecd: the dsec daemon. Role `all` (the default) is the embedded
// single-node platform: a controller with one node in its process; `node`
// runs sandboxes and joins a controller; `controller` places them. See
// docs/running.md and docs/cluster.md; tools/dsecd/daemon.hpp for how a
// start is put together.
#include <signal.h>

#include <CLI/CLI.hpp>

#include <cstdio>

#include "runtime/log.hpp"
#include "tools/dsecd/daemon.hpp"

int main(int argc, char** argv) {
  dsec::daemon::Flags f;
  CLI::App app{"dsecd: the dsec sandbox daemon (role all = the embedded single-node platform)"};
  app.set_version_flag("--version", DSEC_VERSION);
  dsec::drivers::Registry kinds;
  dsec::daemon::AddFlags(app, &f, kinds);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // Signals are waited for in Run; block them before any thread starts so
  // no other thread takes them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  dsec::LogOptions lo;
  lo.level = f.log_level;
  lo.file = f.log_file;
  if (auto err = dsec::InitLogging(lo); !err.empty()) {
    std::fprintf(stderr, "dsecd: %s\n", err.c_str());
    return 2;
  }
  int rc = dsec::daemon::Run(f, kinds);
  dsec::ShutdownLogging();
  return rc;
}
