// Content-addressed chunks (drivers/images/chunks.hpp): where an image is
// cut, that shared content gives shared chunks wherever it lies, and that
// the image service's index answers bad requests with clear errors.
#include <gmock/gmock.h>

#include <fcntl.h>
#include <unistd.h>

#include <random>
#include <set>

#include "drivers/images/chunks.hpp"
#include "drivers/images/image_store.hpp"
#include "runtime/files.hpp"

namespace dsec::images {
namespace {

using ::testing::HasSubstr;

class Chunks : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsec-chunks-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  static std::string Random(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string path = dir_ + "/" + name;
    EXPECT_TRUE(WriteFileAtomic(path, bytes).ok());
    return path;
  }
  static std::set<std::string> Digests(const cluster::v1::ChunkMap& m) {
    std::set<std::string> out;
    for (const auto& c : m.chunks()) out.insert(c.digest());
    return out;
  }
  std::string dir_;
};

TEST_F(Chunks, CutsFallOnBlocksWithinTheBoundsAndCoverTheFile) {
  std::string bytes = Random(3 << 20, 1) + std::string(300000, '\0');  // random, then a run of zeros
  auto m = CutIntoChunks(Write("a", bytes), "sha256:x");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->size_bytes(), bytes.size());
  uint64_t at = 0;
  for (int i = 0; i < m->chunks_size(); ++i) {
    const auto& c = m->chunks(i);
    EXPECT_EQ(c.offset(), at);
    EXPECT_EQ(c.offset() % kChunkBlock, 0u);
    EXPECT_LE(c.length(), kChunkMax);
    if (i + 1 < m->chunks_size()) {
      EXPECT_GE(c.length(), kChunkMin);
    }
    EXPECT_EQ(c.digest(), Sha256Hex(bytes.substr(c.offset(), c.length())));
    at += c.length();
  }
  EXPECT_EQ(at, bytes.size());
  EXPECT_TRUE(CheckChunkMap(*m).ok());
  EXPECT_GT(m->chunks_size(), 20) << "about 80 KiB a chunk on average";
}

// The same content at another block-aligned place gives the same chunks
// (after the first cut past the shift): what a second image of a family
// shares with the first, it fetches from no one.
TEST_F(Chunks, SharedContentGivesSharedChunksWhereverItLies) {
  std::string shared = Random(4 << 20, 2);
  auto one = CutIntoChunks(Write("one", Random(64 << 10, 3) + shared), "sha256:1");
  auto two = CutIntoChunks(Write("two", Random(200 << 10, 4) + shared + Random(8192, 5)), "sha256:2");
  ASSERT_TRUE(one.ok() && two.ok());
  auto a = Digests(*one), b = Digests(*two);
  size_t common = 0;
  for (const auto& d : b) common += a.count(d);
  EXPECT_GE(common * 10, a.size() * 8) << common << " of " << a.size() << " chunks shared";
}

TEST_F(Chunks, TheIndexAnswersBadRequestsWithClearErrors) {
  std::string file = Write("img.erofs", Random(1 << 20, 6));
  ChunkIndex index(dir_);
  auto map = index.MapOf("sha256:" + std::string(64, 'a'), file);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  auto got = index.Read({map->chunks(0).digest()});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(Sha256Hex(got->at(0)), map->chunks(0).digest());

  auto unknown = index.Read({std::string(64, 'f')});
  EXPECT_EQ(unknown.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr(std::string(64, 'f')));
  auto garbage = index.Read({"../../etc/passwd"});
  EXPECT_EQ(garbage.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(garbage.status().message(), HasSubstr("not a chunk digest"));
  auto many = index.Read(std::vector<std::string>(kChunkRequestCount + 1, map->chunks(0).digest()));
  EXPECT_EQ(many.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(many.status().message(), HasSubstr("at most"));
  EXPECT_FALSE(index.MapOf("sha256:zz", file).ok());
  EXPECT_EQ(index.SetPrefetch("sha256:" + std::string(64, 'b'), {0}).code(), Status::Code::kNotFound);

  // A map that does not cover its file, or points past it, is refused.
  cluster::v1::ChunkMap bad = *map;
  bad.set_size_bytes(bad.size_bytes() + 1);
  EXPECT_FALSE(CheckChunkMap(bad).ok());
  bad = *map;
  bad.add_prefetch(static_cast<uint32_t>(bad.chunks_size()));
  EXPECT_THAT(CheckChunkMap(bad).message(), HasSubstr("prefetch index"));
  bad = *map;
  bad.mutable_chunks(0)->set_digest("x");
  EXPECT_FALSE(CheckChunkMap(bad).ok());
}

}  // namespace
}  // namespace dsec::images
