// The container spawner on its own, driven through spawner.proto as dsecd
// drives it (SpawnerLink): inits that fail in their setup, several at once,
// are each answered with the sandbox, the step and the reason, leave no
// process behind, and the spawner goes on serving.
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "drivers/spawner/spawner.pb.h"
#include "drivers/spawner/spawner_link.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

// Processes whose parent is `pid`.
std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    pid_t p = static_cast<pid_t>(std::atoi(e->d_name));
    if (p <= 0) continue;
    std::ifstream in("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == pid) out.push_back(p);
  }
  ::closedir(d);
  return out;
}

TEST(ContainerSpawner, InitsThatFailInTheirSetupAreAnsweredAndLeaveNothing) {
  // The container spawner needs of the host what fncall's does (its Init):
  // only a host without it skips; on one with it, a spawner that says it
  // cannot run fails the test.
  if (auto gap = FncallHostGap(); !gap.empty()) GTEST_SKIP() << "this host cannot run containers: " << gap;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, spawner::ContainerCreated> answers;
  drivers::SpawnerLinkOptions o;
  o.name = "container";
  o.args = {"--containers", "--pool", "0", "--container-netns", "2", "--cgroup-parent",
            "dsec-test-spawner-" + std::to_string(::getpid())};
  auto link = drivers::SpawnerLink::Start(
      o,
      [&](spawner::Event& ev) {
        if (!ev.has_container_created()) return;
        std::lock_guard<std::mutex> lk(mu);
        answers[ev.container_created().id()] = ev.container_created();
        cv.notify_all();
      },
      [](const std::string&, bool) {});
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  pid_t spawner = (*link)->pid();

  char tmpl[] = "/tmp/dsec-test-spawner-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string tmp = tmpl;
  // Sent together: their inits set up at the same time.
  constexpr uint64_t kInits = 8;
  for (uint64_t i = 1; i <= kInits; ++i) {
    spawner::Request req;
    auto* c = req.mutable_create_container();
    c->set_id(i);
    c->set_sandbox_id("sb-bad" + std::to_string(i));
    c->set_lower(tmp + "/no-such-image");  // the overlay cannot be made
    c->set_upper(tmp);
    c->set_work(tmp);
    c->set_run_dir(tmp);
    c->set_agent_path("/bin/true");
    c->set_hostname("bad");
    ASSERT_TRUE((*link)->Send(req).ok());
  }
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return answers.size() == kInits; }))
        << answers.size() << " of " << kInits << " creations answered";
  }
  for (const auto& [id, a] : answers) {
    EXPECT_EQ(a.pid(), 0) << id;
    EXPECT_NE(a.error().find("container sb-bad" + std::to_string(id) + ": open the overlay's lower layers"), std::string::npos)
        << a.error();
  }
  // Every failed init exits and is reaped by the spawner.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!Children(spawner).empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the condition, bounded
  EXPECT_TRUE(Children(spawner).empty()) << Children(spawner).size() << " children of the spawner are left";
  EXPECT_EQ((*link)->pid(), spawner) << "the spawner was restarted";
  EXPECT_TRUE((*link)->Available().ok()) << (*link)->Available().ToString();
  (*link)->Stop();
  ::rmdir(tmp.c_str());
}

}  // namespace
}  // namespace dsec::testing
