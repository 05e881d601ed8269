// dsec-agent end to end: files (write, read, stat, list) and their errors.
#include "tests/integration/agent/agent_fixture.hpp"

namespace dsec::testing {
namespace {

TEST_F(AgentTest, FilesWriteReadStatList) {
  std::string f = dir_ + "/a/b/c.txt";
  ASSERT_TRUE(client_->WriteFileSync(Write(f, "data", 0, true), kWait).ok());
  auto data = client_->ReadFileSync(f, kWait);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(*data, "data");
  auto st = client_->StatSync(f, kWait);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->name(), "c.txt");
  EXPECT_TRUE(S_ISREG(st->mode()));
  EXPECT_EQ(st->mode() & 07777, 0644u);
  EXPECT_EQ(st->size(), 4u);
  EXPECT_GT(st->mtime_ms(), 0);
  // Overwrite: shorter content, an explicit mode.
  ASSERT_TRUE(client_->WriteFileSync(Write(f, "xy", 0600), kWait).ok());
  EXPECT_EQ(*client_->ReadFileSync(f, kWait), "xy");
  EXPECT_EQ(client_->StatSync(f, kWait)->mode() & 07777, 0600u);
  ASSERT_EQ(::symlink("c.txt", (dir_ + "/a/b/link").c_str()), 0);
  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/a/b/empty", ""), kWait).ok());
  auto ls = client_->ListDirSync(dir_ + "/a/b", kWait);
  ASSERT_TRUE(ls.ok()) << ls.status().ToString();
  ASSERT_EQ(ls->size(), 3u);
  EXPECT_EQ((*ls)[0].name(), "c.txt");
  EXPECT_EQ((*ls)[1].name(), "empty");
  EXPECT_EQ((*ls)[1].size(), 0u);
  EXPECT_EQ((*ls)[2].name(), "link");
  EXPECT_TRUE(S_ISLNK((*ls)[2].mode()));
  EXPECT_EQ((*ls)[2].link_target(), "c.txt");
  auto link = client_->StatSync(dir_ + "/a/b/link", kWait);
  ASSERT_TRUE(link.ok());
  EXPECT_TRUE(S_ISLNK(link->mode()));
  EXPECT_EQ(link->link_target(), "c.txt");
  EXPECT_EQ(*client_->ReadFileSync(dir_ + "/a/b/link", kWait), "xy");  // followed: it is the sandbox's own
  // Binary content survives.
  std::string bin("\0\x01\xff\n\0", 5);
  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/bin.dat", bin), kWait).ok());
  EXPECT_EQ(*client_->ReadFileSync(dir_ + "/bin.dat", kWait), bin);
  // A file written by the agent is visible to its commands.
  auto r = Run(Cmd({"cat", f}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), "xy");
}

TEST_F(AgentTest, FileErrorsNameThePath) {
  std::string missing = dir_ + "/missing.txt";
  auto rd = client_->ReadFileSync(missing, kWait);
  ASSERT_FALSE(rd.ok());
  EXPECT_EQ(rd.status().code(), Status::Code::kNotFound);
  EXPECT_NE(rd.status().message().find(missing), std::string::npos) << rd.status().message();
  EXPECT_NE(rd.status().message().find("No such file"), std::string::npos) << rd.status().message();

  rd = client_->ReadFileSync(dir_, kWait);
  ASSERT_FALSE(rd.ok());
  EXPECT_EQ(rd.status().code(), Status::Code::kFailedPrecondition) << rd.status().ToString();
  EXPECT_NE(rd.status().message().find(dir_), std::string::npos) << rd.status().message();
  EXPECT_NE(rd.status().message().find("directory"), std::string::npos) << rd.status().message();

  // A FIFO is refused at once rather than blocking the agent.
  std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  rd = client_->ReadFileSync(fifo, kWait);
  ASSERT_FALSE(rd.ok());
  EXPECT_NE(rd.status().message().find("FIFO"), std::string::npos) << rd.status().message();

  ASSERT_TRUE(client_->WriteFileSync(Write(dir_ + "/ten", "0123456789"), kWait).ok());
  rd = client_->ReadFileSync(dir_ + "/ten", kWait, 5);
  ASSERT_FALSE(rd.ok());
  EXPECT_EQ(rd.status().code(), Status::Code::kResourceExhausted) << rd.status().ToString();
  EXPECT_EQ(*client_->ReadFileSync(dir_ + "/ten", kWait, 10), "0123456789");

  std::string deep = dir_ + "/no/such/dir/f.txt";
  Status st = client_->WriteFileSync(Write(deep, "x"), kWait);
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find(deep), std::string::npos) << st.message();
  st = client_->WriteFileSync(Write(dir_, "x"), kWait);
  EXPECT_EQ(st.code(), Status::Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find(dir_), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Is a directory"), std::string::npos) << st.message();

  auto s = client_->StatSync(missing, kWait);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kNotFound);
  EXPECT_NE(s.status().message().find(missing), std::string::npos);
  auto ls = client_->ListDirSync(missing, kWait);
  ASSERT_FALSE(ls.ok());
  EXPECT_EQ(ls.status().code(), Status::Code::kNotFound);
  EXPECT_NE(ls.status().message().find(missing), std::string::npos);
  ls = client_->ListDirSync(dir_ + "/ten", kWait);
  ASSERT_FALSE(ls.ok());
  EXPECT_EQ(ls.status().code(), Status::Code::kFailedPrecondition) << ls.status().ToString();
  EXPECT_NE(ls.status().message().find(dir_ + "/ten"), std::string::npos);
  EXPECT_NE(ls.status().message().find("Not a directory"), std::string::npos) << ls.status().message();
}

}  // namespace
}  // namespace dsec::testing
