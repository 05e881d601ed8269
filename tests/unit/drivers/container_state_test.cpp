// A container's driver state in its sandbox record: a ContainerState
// message, and the JSON object dsec wrote before it, which a record on an
// upgraded data dir still holds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "drivers/container/container_driver.hpp"

namespace dsec::drivers {
namespace {

using ::testing::HasSubstr;

TEST(ContainerState, RoundTripsAsProtobuf) {
  container::ContainerState in;
  in.set_digest("sha256:ab");
  in.set_image_file("/data/images/ab.erofs");
  in.set_cgroup("dsec/c/sb-1");
  in.set_init_pid(4242);
  auto out = ContainerDriver::ParseState(in.SerializeAsString());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->digest(), "sha256:ab");
  EXPECT_EQ(out->image_file(), "/data/images/ab.erofs");
  EXPECT_EQ(out->cgroup(), "dsec/c/sb-1");
  EXPECT_EQ(out->init_pid(), 4242);
}

TEST(ContainerState, ARecordFromBeforeProtobufStillReadopts) {
  auto out = ContainerDriver::ParseState(
      R"({"digest":"sha256:cd","image_file":"/i/cd.erofs","cgroup":"dsec/c/sb-2","init_pid":77})");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->digest(), "sha256:cd");
  EXPECT_EQ(out->image_file(), "/i/cd.erofs");
  EXPECT_EQ(out->cgroup(), "dsec/c/sb-2");
  EXPECT_EQ(out->init_pid(), 77);
}

TEST(ContainerState, GarbageAndNothingAreRefusedSayingWhy) {
  auto empty = ContainerDriver::ParseState("");
  EXPECT_EQ(empty.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(empty.status().message(), HasSubstr("no driver state"));
  auto broken_json = ContainerDriver::ParseState("{not json");
  EXPECT_EQ(broken_json.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(broken_json.status().message(), HasSubstr("neither protobuf nor JSON"));
  auto garbage = ContainerDriver::ParseState(std::string("\xff\xff\xff\xff", 4));
  EXPECT_EQ(garbage.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(garbage.status().message(), HasSubstr("not a ContainerState"));
}

}  // namespace
}  // namespace dsec::drivers
