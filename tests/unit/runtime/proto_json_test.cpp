// The one JSON shape of records and results (runtime/proto_json.hpp).
#include "runtime/proto_json.hpp"

#include <gtest/gtest.h>

#include "dsec/v1/service.pb.h"
#include "dsec/v1/types.pb.h"

namespace dsec {
namespace {

TEST(ProtoJson, EveryFieldIsPresentWithPlainValues) {
  v1::ExecResult r;
  r.set_verdict(v1::VERDICT_TIME_LIMIT);
  r.set_stdout(std::string("line\n\xff", 6));  // not UTF-8 at the end
  r.set_cpu_us(1ull << 40);
  auto j = ProtoJson(r);
  EXPECT_EQ(j["verdict"], "time_limit");
  EXPECT_TRUE(j["exit_code"].is_number_integer()) << "a zero exit code is there";
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_TRUE(j["cpu_us"].is_number_unsigned()) << "64-bit numbers are numbers, not strings";
  EXPECT_EQ(j["cpu_us"].get<uint64_t>(), 1ull << 40);
  EXPECT_EQ(j["stderr"], "");
  EXPECT_FALSE(j["stdout_truncated"].get<bool>());
  // Bytes are text: invalid UTF-8 is replaced when dumped, never base64.
  auto text = DumpJson(j);
  EXPECT_NE(text.find("\"stdout\":\"line\\n\xef\xbf\xbd\""), std::string::npos) << text;
}

TEST(ProtoJson, EnumsNestedMessagesMapsAndOptionals) {
  v1::SandboxRecord rec;
  rec.set_phase(v1::SANDBOX_PHASE_RUNNING);
  rec.mutable_spec()->set_kind(v1::KIND_CONTAINER);
  rec.mutable_spec()->set_on_idle(v1::IDLE_ACTION_DESTROY);
  (*rec.mutable_spec()->mutable_labels())["team"] = "rl";
  auto j = ProtoJson(rec);
  EXPECT_EQ(j["phase"], "running");
  EXPECT_EQ(j["spec"]["kind"], "container");
  EXPECT_EQ(j["spec"]["on_idle"], "destroy");
  EXPECT_EQ(j["spec"]["labels"]["team"], "rl");
  EXPECT_TRUE(j["spec"]["ttl_s"].is_null()) << "an unset optional field";
  rec.mutable_spec()->set_ttl_s(0);
  EXPECT_EQ(ProtoJson(rec)["spec"]["ttl_s"], 0) << "set to 0 is not unset";
  EXPECT_TRUE(j["spec"]["limits"].is_object()) << "an unset message is there with its zeros";
  v1::Status st;
  st.set_code(v1::Status::INVALID_ARGUMENT);
  EXPECT_EQ(ProtoJson(st)["code"], "invalid_argument");
  v1::StepMeta meta;
  EXPECT_TRUE(ProtoJson(meta)["reward"].is_null());
  meta.set_reward(0.5);
  EXPECT_DOUBLE_EQ(ProtoJson(meta)["reward"].get<double>(), 0.5);
}

}  // namespace
}  // namespace dsec
