// Effective limits (exec over spec over node defaults, within the node's
// maxima) and the shape checks every exec request passes before a driver
// sees it.
#include "drivers/limits.hpp"

#include "drivers/driver.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dsec::drivers {
namespace {

using ::testing::HasSubstr;

// One Limits field, reachable by name, so every field gets the same checks.
struct Field {
  const char* name;
  std::function<uint64_t(const v1::Limits&)> get;
  std::function<void(v1::Limits*, uint64_t)> set;
};

const std::vector<Field>& Fields() {
  static const std::vector<Field> kFields = {
      {"memory_bytes", [](const v1::Limits& l) { return l.memory_bytes(); },
       [](v1::Limits* l, uint64_t v) { l->set_memory_bytes(v); }},
      {"pids", [](const v1::Limits& l) { return uint64_t{l.pids()}; },
       [](v1::Limits* l, uint64_t v) { l->set_pids(static_cast<uint32_t>(v)); }},
      {"cpu_millis", [](const v1::Limits& l) { return uint64_t{l.cpu_millis()}; },
       [](v1::Limits* l, uint64_t v) { l->set_cpu_millis(static_cast<uint32_t>(v)); }},
      {"timeout_ms", [](const v1::Limits& l) { return uint64_t{l.timeout_ms()}; },
       [](v1::Limits* l, uint64_t v) { l->set_timeout_ms(static_cast<uint32_t>(v)); }},
      {"cpu_time_ms", [](const v1::Limits& l) { return uint64_t{l.cpu_time_ms()}; },
       [](v1::Limits* l, uint64_t v) { l->set_cpu_time_ms(static_cast<uint32_t>(v)); }},
      {"output_bytes", [](const v1::Limits& l) { return l.output_bytes(); },
       [](v1::Limits* l, uint64_t v) { l->set_output_bytes(v); }},
      {"file_size_bytes", [](const v1::Limits& l) { return l.file_size_bytes(); },
       [](v1::Limits* l, uint64_t v) { l->set_file_size_bytes(v); }},
      {"open_files", [](const v1::Limits& l) { return uint64_t{l.open_files()}; },
       [](v1::Limits* l, uint64_t v) { l->set_open_files(static_cast<uint32_t>(v)); }},
  };
  return kFields;
}

// Every field set to distinct, valid values; base keeps the three sources apart.
v1::Limits Distinct(uint64_t base) {
  v1::Limits l;
  l.set_memory_bytes((64 + base) << 20);
  l.set_pids(static_cast<uint32_t>(100 + base));
  l.set_cpu_millis(static_cast<uint32_t>(500 + base));
  l.set_timeout_ms(static_cast<uint32_t>(1000 + base));
  l.set_cpu_time_ms(static_cast<uint32_t>(2000 + base));
  l.set_output_bytes(4096 + base);
  l.set_file_size_bytes(8192 + base);
  l.set_open_files(static_cast<uint32_t>(64 + base));
  return l;
}

class EffectiveLimitsTest : public ::testing::Test {
 protected:
  LimitPolicy policy_ = LimitPolicy::Default();
  KindTraits kind_;  // no disk of its own
  v1::SandboxSpec spec_;
  v1::ExecRequest exec_;

  v1::Limits MustEffective() {
    auto r = EffectiveLimits(policy_, kind_, spec_, exec_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : v1::Limits();
  }
};

TEST_F(EffectiveLimitsTest, DefaultPolicyIsSane) {
  const auto& d = policy_.defaults;
  const auto& m = policy_.maxima;
  for (const auto& f : Fields()) {
    EXPECT_LE(f.get(d), f.get(m)) << f.name << ": the default is above the maximum";
    EXPECT_GT(f.get(m), 0u) << f.name;
  }
  EXPECT_GT(d.memory_bytes(), 0u);
  EXPECT_GT(d.timeout_ms(), 0u) << "a run without a wall-clock limit could hang forever";
  EXPECT_GT(policy_.max_argv_env_bytes, 0u);
  EXPECT_GT(policy_.max_stdin_bytes, 0u);
}

TEST_F(EffectiveLimitsTest, DefaultsWhenNeitherSpecNorExecSetsAValue) {
  v1::Limits got = MustEffective();
  for (const auto& f : Fields()) EXPECT_EQ(f.get(got), f.get(policy_.defaults)) << f.name;
}

// The kind's traits, not its name, decide its defaults: a kind with a disk
// of its own gets the node's disk default and its files are bounded by that
// disk; another gets no disk limit and the node's file size limit.
TEST_F(EffectiveLimitsTest, AKindWithADiskOfItsOwnGetsTheDiskDefaultInsteadOfAFileSizeLimit) {
  policy_.container_file_size_bytes = 0;
  v1::Limits plain = MustEffective();
  EXPECT_EQ(plain.disk_bytes(), 0u);
  EXPECT_EQ(plain.file_size_bytes(), policy_.defaults.file_size_bytes());
  kind_.own_disk = true;
  v1::Limits own = MustEffective();
  EXPECT_EQ(own.disk_bytes(), policy_.defaults.disk_bytes());
  EXPECT_EQ(own.file_size_bytes(), 0u) << "no RLIMIT_FSIZE: the disk bounds the files";
}

TEST_F(EffectiveLimitsTest, SpecOverridesDefaults) {
  *spec_.mutable_limits() = Distinct(1);
  v1::Limits got = MustEffective();
  for (const auto& f : Fields()) EXPECT_EQ(f.get(got), f.get(spec_.limits())) << f.name;
}

TEST_F(EffectiveLimitsTest, ExecOverridesSpec) {
  *spec_.mutable_limits() = Distinct(1);
  *exec_.mutable_limits() = Distinct(2);
  v1::Limits got = MustEffective();
  for (const auto& f : Fields()) EXPECT_EQ(f.get(got), f.get(exec_.limits())) << f.name;
}

TEST_F(EffectiveLimitsTest, PrecedenceIsPerField) {
  // For each field alone: exec > spec > default, the other fields untouched.
  const v1::Limits spec_values = Distinct(1), exec_values = Distinct(2);
  for (const auto& f : Fields()) {
    SCOPED_TRACE(f.name);
    spec_.Clear();
    exec_.Clear();
    f.set(spec_.mutable_limits(), f.get(spec_values));
    v1::Limits got = MustEffective();
    EXPECT_EQ(f.get(got), f.get(spec_values));

    f.set(exec_.mutable_limits(), f.get(exec_values));
    got = MustEffective();
    EXPECT_EQ(f.get(got), f.get(exec_values));
    for (const auto& other : Fields()) {
      if (std::string(other.name) == f.name) continue;
      EXPECT_EQ(other.get(got), other.get(policy_.defaults)) << "other field " << other.name;
    }

    spec_.Clear();  // exec alone, over the defaults
    got = MustEffective();
    EXPECT_EQ(f.get(got), f.get(exec_values));
  }
}

TEST_F(EffectiveLimitsTest, ValueAtTheMaximumIsAccepted) {
  *exec_.mutable_limits() = policy_.maxima;
  v1::Limits got = MustEffective();
  for (const auto& f : Fields()) EXPECT_EQ(f.get(got), f.get(policy_.maxima)) << f.name;
}

TEST_F(EffectiveLimitsTest, AboveTheMaximumIsInvalidArgumentNamingTheField) {
  for (bool via_exec : {true, false}) {
    for (const auto& f : Fields()) {
      SCOPED_TRACE(std::string(f.name) + (via_exec ? " via exec" : " via spec"));
      spec_.Clear();
      exec_.Clear();
      const uint64_t max = f.get(policy_.maxima);
      f.set(via_exec ? exec_.mutable_limits() : spec_.mutable_limits(), max + 1);
      auto r = EffectiveLimits(policy_, kind_, spec_, exec_);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
      const std::string& m = r.status().message();
      EXPECT_THAT(m, HasSubstr(f.name));
      EXPECT_THAT(m, HasSubstr(std::to_string(max + 1)));
      EXPECT_THAT(m, HasSubstr("maximum " + std::to_string(max)));
    }
  }
}

TEST_F(EffectiveLimitsTest, ExecCannotEscapeTheMaximumThroughASaneSpec) {
  spec_.mutable_limits()->set_memory_bytes(128 << 20);
  exec_.mutable_limits()->set_memory_bytes(policy_.maxima.memory_bytes() + 1);
  auto r = EffectiveLimits(policy_, kind_, spec_, exec_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("memory_bytes"));
}

TEST_F(EffectiveLimitsTest, ADefaultAboveTheMaximumIsRefusedToo) {
  policy_.defaults.set_pids(policy_.maxima.pids() + 1);
  auto r = EffectiveLimits(policy_, kind_, spec_, exec_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("pids"));
}

TEST_F(EffectiveLimitsTest, BelowTheMinimumIsInvalidArgumentNamingTheField) {
  struct Case {
    const char* name;
    uint64_t too_small;
    uint64_t minimum;
  };
  const Case cases[] = {
      {"memory_bytes", (16u << 20) - 1, 16u << 20},
      {"cpu_millis", 9, 10},
      {"open_files", 15, 16},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    exec_.Clear();
    for (const auto& f : Fields())
      if (std::string(f.name) == c.name) f.set(exec_.mutable_limits(), c.too_small);
    auto r = EffectiveLimits(policy_, kind_, spec_, exec_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(c.name));
    EXPECT_THAT(r.status().message(), HasSubstr("minimum " + std::to_string(c.minimum)));

    for (const auto& f : Fields())  // the minimum itself is fine
      if (std::string(f.name) == c.name) f.set(exec_.mutable_limits(), c.minimum);
    auto ok = EffectiveLimits(policy_, kind_, spec_, exec_);
    ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  }
}

TEST_F(EffectiveLimitsTest, ZeroCpuTimeMeansNone) {
  ASSERT_EQ(policy_.defaults.cpu_time_ms(), 0u);
  v1::Limits got = MustEffective();
  EXPECT_EQ(got.cpu_time_ms(), 0u);  // no minimum applies to "none"
  EXPECT_EQ(got.cpu_millis(), 0u);   // likewise: no CPU quota

  // Zero in exec means "not set here": the spec's value stays.
  spec_.mutable_limits()->set_cpu_time_ms(1500);
  exec_.mutable_limits()->set_cpu_time_ms(0);
  got = MustEffective();
  EXPECT_EQ(got.cpu_time_ms(), 1500u);
}

TEST_F(EffectiveLimitsTest, SmallestNonZeroCpuTimeIsAccepted) {
  exec_.mutable_limits()->set_cpu_time_ms(1);
  EXPECT_EQ(MustEffective().cpu_time_ms(), 1u);
}

// ---------------------------------------------------------------------------

class CheckExecRequestTest : public ::testing::Test {
 protected:
  LimitPolicy policy_ = LimitPolicy::Default();
  v1::ExecRequest exec_;

  void SetUp() override {
    exec_.add_argv("python3");
    exec_.add_argv("-c");
    exec_.add_argv("print(1)");
    (*exec_.mutable_env())["PATH"] = "/usr/bin:/bin";
    exec_.set_cwd("/work");
    exec_.set_stdin("input");
  }

  // Expects InvalidArgument whose message contains every one of `parts`.
  void ExpectRefused(const std::vector<std::string>& parts) {
    Status st = CheckExecRequest(policy_, exec_);
    ASSERT_FALSE(st.ok()) << "accepted; expected a message with '" << parts.front() << "'";
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
    for (const auto& p : parts) EXPECT_THAT(st.message(), HasSubstr(p));
  }
};

TEST_F(CheckExecRequestTest, AcceptsAnOrdinaryRequest) {
  Status st = CheckExecRequest(policy_, exec_);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(CheckExecRequestTest, EmptyArgvIsRefused) {
  exec_.clear_argv();
  ExpectRefused({"argv is empty"});
}

TEST_F(CheckExecRequestTest, EmptyCommandIsRefused) {
  exec_.clear_argv();
  exec_.add_argv("");
  exec_.add_argv("arg");
  ExpectRefused({"argv is empty"});
}

TEST_F(CheckExecRequestTest, EmptyLaterArgumentIsFine) {
  exec_.add_argv("");
  EXPECT_TRUE(CheckExecRequest(policy_, exec_).ok());
}

TEST_F(CheckExecRequestTest, NulByteInArgvIsRefused) {
  exec_.set_argv(2, std::string("print(1)\0rm -rf /", 17));
  ExpectRefused({"argv", "NUL"});
  exec_.set_argv(2, "print(1)");
  exec_.set_argv(0, std::string("py\0thon", 7));
  ExpectRefused({"argv", "NUL"});
}

TEST_F(CheckExecRequestTest, NulByteInEnvValueIsRefused) {
  (*exec_.mutable_env())["LD_LIBRARY_PATH"] = std::string("/lib\0/evil", 10);
  ExpectRefused({"LD_LIBRARY_PATH", "NUL"});
}

TEST_F(CheckExecRequestTest, NulByteInEnvNameIsRefused) {
  (*exec_.mutable_env())[std::string("A\0B", 3)] = "v";
  ExpectRefused({"environment variable", "NUL"});
}

TEST_F(CheckExecRequestTest, EnvNameWithEqualsIsRefused) {
  (*exec_.mutable_env())["A=B"] = "v";
  ExpectRefused({"environment variable name", "'A=B'"});
}

TEST_F(CheckExecRequestTest, EmptyEnvNameIsRefused) {
  (*exec_.mutable_env())[""] = "v";
  ExpectRefused({"environment variable", "empty"});
}

TEST_F(CheckExecRequestTest, EmptyEnvValueIsFine) {
  (*exec_.mutable_env())["EMPTY"] = "";
  EXPECT_TRUE(CheckExecRequest(policy_, exec_).ok());
}

TEST_F(CheckExecRequestTest, NulByteInCwdIsRefused) {
  exec_.set_cwd(std::string("/work\0/etc", 10));
  ExpectRefused({"cwd", "NUL"});
}

TEST_F(CheckExecRequestTest, ArgvAndEnvAboveTheMaximumAreRefused) {
  // Each argv element counts its terminating NUL; each env entry "K=V\0".
  exec_.clear_argv();
  exec_.clear_env();
  exec_.add_argv("ab");                      // 3
  (*exec_.mutable_env())["K"] = "value";     // 1 + 5 + 2 = 8
  policy_.max_argv_env_bytes = 11;
  EXPECT_TRUE(CheckExecRequest(policy_, exec_).ok()) << "exactly at the maximum";
  policy_.max_argv_env_bytes = 10;
  ExpectRefused({"argv+env", "11 bytes", "maximum 10"});
}

TEST_F(CheckExecRequestTest, LargeArgvIsRefusedByTheDefaultPolicy) {
  exec_.add_argv(std::string(policy_.max_argv_env_bytes, 'x'));
  ExpectRefused({"argv+env", "maximum " + std::to_string(policy_.max_argv_env_bytes)});
}

TEST_F(CheckExecRequestTest, LargeEnvIsRefused) {
  (*exec_.mutable_env())["BIG"] = std::string(policy_.max_argv_env_bytes, 'x');
  ExpectRefused({"argv+env"});
}

TEST_F(CheckExecRequestTest, StdinAboveTheMaximumIsRefused) {
  policy_.max_stdin_bytes = 5;
  exec_.set_stdin("12345");
  EXPECT_TRUE(CheckExecRequest(policy_, exec_).ok()) << "exactly at the maximum";
  exec_.set_stdin("123456");
  ExpectRefused({"stdin", "6 bytes", "maximum 5", "files"});
}

TEST_F(CheckExecRequestTest, LargeStdinIsRefusedByTheDefaultPolicy) {
  exec_.set_stdin(std::string(policy_.max_stdin_bytes + 1, 's'));
  ExpectRefused({"stdin", "maximum " + std::to_string(policy_.max_stdin_bytes)});
}

}  // namespace
}  // namespace dsec::drivers
