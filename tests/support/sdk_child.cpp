// dsec-test-sdk-child: an SDK client in a process of its own, for tests that
// kill one. Creates sandboxes (owned by it, or detached), prints each id on
// a line and then "ready", and waits to be killed.
//
//   dsec-test-sdk-child --addr A --data-dir D [--owned N] [--detached N]
//                       [--containers N --image I] [--lease S]
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cstdio>

#include "dsec/client.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dsec-test-sdk-child: creates sandboxes, then waits to be killed"};
  std::string addr, data_dir, image;
  int owned = 0, detached = 0, containers = 0;
  uint32_t lease = 0;
  app.add_option("--addr", addr);
  app.add_option("--data-dir", data_dir);
  app.add_option("--owned", owned, "fncall sandboxes owned by this client");
  app.add_option("--detached", detached, "fncall sandboxes made detached");
  app.add_option("--containers", containers, "owned containers on --image");
  app.add_option("--image", image);
  app.add_option("--lease", lease, "lease of the owned ones, seconds");
  CLI11_PARSE(app, argc, argv);
  dsec::ClientOptions o;
  o.address = addr;
  o.data_dir = data_dir;
  auto client = dsec::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "sdk child: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto make = [&](const dsec::v1::SandboxSpec& spec, bool is_detached) {
    dsec::CreateOptions co;
    co.detached = is_detached;
    co.lease_s = lease;
    auto sb = (*client)->Create(spec, co);
    if (!sb.ok()) {
      std::fprintf(stderr, "sdk child: create: %s\n", sb.status().ToString().c_str());
      std::exit(1);
    }
    std::printf("%s %s\n", is_detached ? "detached" : "owned", sb->id().c_str());
  };
  for (int i = 0; i < owned; ++i) make(dsec::FncallSpec(), false);
  for (int i = 0; i < detached; ++i) make(dsec::FncallSpec(), true);
  for (int i = 0; i < containers; ++i) make(dsec::ContainerSpec(image), false);
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) ::pause();
}
