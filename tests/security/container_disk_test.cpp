// A container cannot fill the node's disk: it gets EDQUOT at its own disk
// limit, the others keep writing, the limit and what it uses are in its
// record, and what a removed container wrote is given back.
#include <gmock/gmock.h>
#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "dsec/processes.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

class ContainerDisk : public ContainerTest {
 protected:
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped()) return;
    // Only a host without what the disk needs skips; on one with it all,
    // a dsecd without disk limits fails.
    if (auto gap = SandboxDiskHostGap(); !gap.empty()) GTEST_SKIP() << "disk limits unavailable on this host: " << gap;
    auto stats = daemon_->Admin("stats");
    ASSERT_TRUE(stats["container"]["disk"].contains("filesystem"))
        << "dsecd has no disk limits on a host that has all they need: " << stats["container"]["disk"].dump();
  }
  // Bytes in use on the sandboxes' filesystem, after a commit.
  static uint64_t FsUsed() {
    std::string dir = daemon_->data_dir() + "/sandboxes";
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    ::syncfs(fd);
    struct statfs fs{};
    ::fstatfs(fd, &fs);
    ::close(fd);
    return (fs.f_blocks - fs.f_bfree) * fs.f_bsize;
  }
};

TEST_F(ContainerDisk, AWriterStopsAtItsLimitAndTheOthersKeepWriting) {
  v1::Limits small;
  small.set_disk_bytes(64ull << 20);
  auto a = Make(small);
  auto b = Make();
  ASSERT_TRUE(a.ok() && b.ok());
  auto full = ShIn(*a, "dd if=/dev/zero of=/work/big bs=1M count=128 2>&1; echo dd=$?; "
                       "echo x > /work/more 2>&1; echo echo=$?; stat -c %s /work/big");
  EXPECT_THAT(full.stdout(), HasSubstr("Disk quota exceeded"));
  EXPECT_THAT(full.stdout(), HasSubstr("dd=1"));
  EXPECT_THAT(full.stdout(), HasSubstr("echo=2")) << "a full container gets EDQUOT on every write";
  auto size_line = full.stdout().substr(full.stdout().rfind("echo=") + 7);
  EXPECT_LE(std::stoull(size_line), 64ull << 20) << full.stdout();
  auto other = ShIn(*b, "dd if=/dev/zero of=/work/big bs=1M count=128 2>&1 | tail -1; stat -c %s /work/big");
  EXPECT_THAT(other.stdout(), HasSubstr("134217728")) << "another container still writes";
  // The limit in force and the use, in the record (use as of the last
  // commit of the filesystem: a sync makes one).
  FsUsed();
  auto rec = a->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->spec().limits().disk_bytes(), 64ull << 20);
  EXPECT_GE(rec->disk_used_bytes(), 60ull << 20);
  EXPECT_LE(rec->disk_used_bytes(), 65ull << 20);
  auto use = MeasureUsage(*a);  // the same count, in what it uses
  ASSERT_TRUE(use.ok()) << use.status().ToString();
  EXPECT_EQ(use->disk_total_bytes(), 64ull << 20);
  EXPECT_GE(use->disk_used_bytes(), 60ull << 20);
  EXPECT_LE(use->disk_used_bytes(), 65ull << 20);
  auto brec = b->Get();
  ASSERT_TRUE(brec.ok());
  EXPECT_EQ(brec->spec().limits().disk_bytes(), 10ull << 30) << "the node's default";
  // An exec cannot change it.
  v1::Limits more;
  more.set_disk_bytes(1ull << 30);
  auto refused = a->Exec(Sh("true", more));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("disk"));
}

TEST_F(ContainerDisk, WhatARemovedContainerWroteIsGivenBack) {
  uint64_t before = FsUsed();
  auto a = Make();
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(ShIn(*a, "dd if=/dev/urandom of=/work/big bs=1M count=200 2>/dev/null").exit_code(), 0);
  uint64_t during = FsUsed();
  EXPECT_GE(during, before + (190ull << 20));
  Destroy(*a);
  uint64_t after = FsUsed();
  for (int i = 0; i < 100 && after > before + (16ull << 20); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polling for btrfs to free the extents
    after = FsUsed();
  }
  EXPECT_LE(after, before + (16ull << 20)) << "before " << before << " during " << during << " after " << after;
}

TEST_F(ContainerDisk, FncallSandboxesTakeNoDiskLimit) {
  auto spec = FncallSpec();
  spec.mutable_limits()->set_disk_bytes(1 << 30);
  auto sb = client_->Create(spec);
  ASSERT_FALSE(sb.ok());
  EXPECT_THAT(sb.status().message(), HasSubstr("in memory"));
}

}  // namespace
}  // namespace dsec::testing
