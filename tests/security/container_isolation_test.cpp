// Containers one after the other, and by name: nothing of a removed
// container reaches the one that reuses its dir (the container kind keeps
// a removed container's dir, emptied, for the next one), and each has its
// sandbox id as hostname. That two sandboxes see nothing of each other
// while both run (files, processes, System V objects, abstract unix
// sockets) is checked for every kind (sandbox_isolation_test.cpp), and so
// is that no sandbox can signal another's program by its host pid
// (sandbox_host_view_test.cpp).
#include <string>

#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

class ContainerIsolation : public ContainerTest {};

// Walks the container's whole tree (/proc left out) for files named secret,
// x, y or z and for files holding `token`: prints "True found: nothing" when
// there are none (True: more than 100 files were read).
v1::ExecRequest SearchFor(const std::string& token) {
  return Command({"python3", "-c",
                  "import os, sys\n"
                  "token = sys.argv[1].encode()\n"
                  "files, hits = 0, []\n"
                  "for d, dirs, names in os.walk('/'):\n"
                  "    if d == '/':\n"
                  "        dirs.remove('proc')\n"
                  "    for n in names + dirs:\n"
                  "        if n in ('secret', 'x', 'y', 'z'):\n"
                  "            hits.append(os.path.join(d, n))\n"
                  "    for n in names:\n"
                  "        p = os.path.join(d, n)\n"
                  "        if not os.path.isfile(p) or os.path.islink(p):\n"
                  "            continue\n"
                  "        files += 1\n"
                  "        try:\n"
                  "            with open(p, 'rb') as f:\n"
                  "                if token in f.read():\n"
                  "                    hits.append(p)\n"
                  "        except OSError:\n"
                  "            pass\n"
                  "print(files > 100, 'found:', ' '.join(hits) or 'nothing')\n",
                  token});
}

TEST_F(ContainerIsolation, NothingOfARemovedContainerReachesTheOneThatReusesItsDir) {
  // A removed container's dir is emptied and kept for the next one.
  auto free_dirs = [] { return daemon_->Admin("stats")["container"].value("free_dirs", -1); };
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::string token = UniqueToken("dsec-secret");
  // Files everywhere, a process still writing, and the root dir itself
  // changed (its mode and an extended attribute live in the upper dir).
  ASSERT_EQ(ShIn(*a, "for d in /work /tmp /root /etc; do echo " + token + " > $d/secret; done; "
                     "mkdir -p /work/x/y && echo " + token + " > /work/x/y/z; "
                     "(while :; do echo " + token + " >> /tmp/x; sleep 0.01; done) > /dev/null 2>&1 & "
                     "chmod 0700 / && python3 -c \"import os; os.setxattr('/', 'user.dsec', b'" + token + "')\"")
                .verdict(),
            v1::VERDICT_OK);
  Destroy(*a);
  int kept = free_dirs();
  ASSERT_GE(kept, 1) << "the removed container's dir was not kept";

  auto b = Make();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(free_dirs(), kept - 1) << "the new container did not take the kept dir";
  auto search = Exec(*b, SearchFor(token));
  ASSERT_EQ(search.verdict(), v1::VERDICT_OK) << search.error() << "\n" << search.stderr();
  EXPECT_EQ(search.stdout(), "True found: nothing\n");
  auto root = Exec(*b, Command({"python3", "-c",
                                "import os\n"
                                "print(oct(os.stat('/').st_mode & 0o7777), os.listxattr('/'))\n"}));
  EXPECT_EQ(root.stdout(), "0o755 []\n") << root.stderr();
  Destroy(*b);
}

TEST_F(ContainerIsolation, EachHasItsSandboxIdAsHostname) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  EXPECT_NE(a->id(), b->id());
  EXPECT_EQ(ShIn(*a, "hostname").stdout(), a->id() + "\n");
  EXPECT_EQ(ShIn(*b, "hostname").stdout(), b->id() + "\n");
  EXPECT_EQ(ShIn(*b, "cat /proc/sys/kernel/hostname").stdout(), b->id() + "\n");
  Destroy(*a);
  Destroy(*b);
}

}  // namespace
}  // namespace dsec::testing
