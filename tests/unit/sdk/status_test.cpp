// Status / Result<T> and their wire form (dsec.v1.Status), plus the human
// names of the public enums.
#include "dsec/status.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dsec/status_proto.hpp"

namespace dsec {
namespace {

using Code = Status::Code;

const std::vector<Code>& AllCodes() {
  static const std::vector<Code> kAll = {
      Code::kOk,           Code::kInvalidArgument,   Code::kNotFound,         Code::kAlreadyExists,
      Code::kFailedPrecondition, Code::kResourceExhausted, Code::kUnavailable,
      Code::kDeadlineExceeded,   Code::kInternal,          Code::kUnimplemented,
      Code::kAborted,      Code::kUnauthenticated};
  return kAll;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Code::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "ok");
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok(), Status());
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
  struct Case {
    Status s;
    Code code;
    const char* name;
  };
  const Case cases[] = {
      {Status::InvalidArgument("m"), Code::kInvalidArgument, "invalid_argument"},
      {Status::NotFound("m"), Code::kNotFound, "not_found"},
      {Status::AlreadyExists("m"), Code::kAlreadyExists, "already_exists"},
      {Status::FailedPrecondition("m"), Code::kFailedPrecondition, "failed_precondition"},
      {Status::ResourceExhausted("m"), Code::kResourceExhausted, "resource_exhausted"},
      {Status::Unavailable("m"), Code::kUnavailable, "unavailable"},
      {Status::DeadlineExceeded("m"), Code::kDeadlineExceeded, "deadline_exceeded"},
      {Status::Internal("m"), Code::kInternal, "internal"},
      {Status::Unimplemented("m"), Code::kUnimplemented, "unimplemented"},
      {Status::Aborted("m"), Code::kAborted, "aborted"},
      {Status::Unauthenticated("m"), Code::kUnauthenticated, "unauthenticated"},
  };
  for (const auto& c : cases) {
    EXPECT_FALSE(c.s.ok()) << c.name;
    EXPECT_EQ(c.s.code(), c.code) << c.name;
    EXPECT_EQ(c.s.message(), "m") << c.name;
    EXPECT_STREQ(Status::CodeName(c.code), c.name);
    EXPECT_EQ(c.s.ToString(), std::string(c.name) + ": m");
  }
  EXPECT_STREQ(Status::CodeName(Code::kOk), "ok");
}

TEST(StatusTest, ToStringShowsCodeThenMessage) {
  EXPECT_EQ(Status::NotFound("sandbox sb-3 not found").ToString(),
            "not_found: sandbox sb-3 not found");
}

TEST(StatusTest, EqualityComparesCodeAndMessage) {
  EXPECT_EQ(Status::NotFound("a"), Status::NotFound("a"));
  EXPECT_FALSE(Status::NotFound("a") == Status::NotFound("b"));
  EXPECT_FALSE(Status::NotFound("a") == Status::Internal("a"));
}

TEST(StatusTest, AnnotatePrefixesContextAndKeepsTheCode) {
  Status s = Status::NotFound("no such file").Annotate("open store");
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), "open store: no such file");
  // Nested context reads outermost first.
  EXPECT_EQ(s.Annotate("start dsecd").message(), "start dsecd: open store: no such file");
}

TEST(StatusTest, AnnotateLeavesOkAlone) {
  Status s = Status::Ok().Annotate("open store");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "ok");
}

TEST(StatusTest, FromErrnoMapsCodes) {
  struct Case {
    int err;
    Code code;
  };
  const Case cases[] = {
      {ENOENT, Code::kNotFound},           {EEXIST, Code::kAlreadyExists},
      {EINVAL, Code::kInvalidArgument},    {EACCES, Code::kFailedPrecondition},
      {EPERM, Code::kFailedPrecondition},  {ENOMEM, Code::kResourceExhausted},
      {ENOSPC, Code::kResourceExhausted},  {EMFILE, Code::kResourceExhausted},
      {ENFILE, Code::kResourceExhausted},  {EAGAIN, Code::kResourceExhausted},
      {EIO, Code::kInternal},              {EBADF, Code::kInternal},
      {ENOTDIR, Code::kInternal},
  };
  for (const auto& c : cases) {
    Status s = Status::FromErrno(c.err, "open /data/x");
    EXPECT_EQ(s.code(), c.code) << std::strerror(c.err);
    EXPECT_FALSE(s.ok());
  }
}

TEST(StatusTest, FromErrnoMessageIsWhatThenStrerror) {
  Status s = Status::FromErrno(ENOENT, "open /data/x");
  EXPECT_EQ(s.message(), std::string("open /data/x: ") + std::strerror(ENOENT));
}

TEST(ResultTest, HoldsAValue) {
  Result<int> r = 42;
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(static_cast<bool>(r));
  EXPECT_EQ(r.value(), 42);
  EXPECT_EQ(*r, 42);
  EXPECT_TRUE(r.status().ok());
  *r = 7;
  EXPECT_EQ(r.value(), 7);
}

TEST(ResultTest, HoldsAnError) {
  Result<std::string> r = Status::NotFound("sandbox sb-1 not found");
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(static_cast<bool>(r));
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().message(), "sandbox sb-1 not found");
}

TEST(ResultTest, ArrowAndMoveOut) {
  Result<std::string> r = std::string("hello");
  EXPECT_EQ(r->size(), 5u);
  const Result<std::string>& cr = r;
  EXPECT_EQ(cr->front(), 'h');
  EXPECT_EQ(*cr, "hello");

  Result<std::unique_ptr<int>> p = std::make_unique<int>(9);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> owned = std::move(p).value();
  ASSERT_NE(owned, nullptr);
  EXPECT_EQ(*owned, 9);
}

Status Step(bool fail, int* reached) {
  DSEC_RETURN_IF_ERROR(fail ? Status::Aborted("step failed") : Status::Ok());
  ++*reached;
  return Status::Ok();
}

Result<int> Outer(bool fail, int* reached) {
  DSEC_RETURN_IF_ERROR(Step(fail, reached));
  return 1;
}

TEST(ResultTest, ReturnIfErrorPropagatesOnlyFailures) {
  int reached = 0;
  EXPECT_TRUE(Step(false, &reached).ok());
  EXPECT_EQ(reached, 1);
  Status s = Step(true, &reached);
  EXPECT_EQ(s, Status::Aborted("step failed"));
  EXPECT_EQ(reached, 1);

  auto r = Outer(true, &reached);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAborted);
  auto r2 = Outer(false, &reached);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(*r2, 1);
}

TEST(StatusProtoTest, RoundTripsEveryCode) {
  for (Code c : AllCodes()) {
    Status s = c == Code::kOk ? Status::Ok() : Status(c, "what failed: " + std::string(Status::CodeName(c)));
    v1::Status p = ToProto(s);
    // Same meaning on the wire, not just the same number.
    EXPECT_EQ(v1::Status::Code_Name(p.code()), Upper(Status::CodeName(c)));
    EXPECT_EQ(p.message(), s.message());
    EXPECT_EQ(FromProto(p), s) << Status::CodeName(c);

    v1::Status out;
    out.set_message("stale");
    ToProto(s, &out);
    EXPECT_EQ(out.code(), p.code());
    EXPECT_EQ(out.message(), s.message());
  }
}

TEST(StatusProtoTest, EveryWireCodeComesBackAsTheSameNamedCode) {
  const auto* desc = v1::Status::Code_descriptor();
  ASSERT_EQ(desc->value_count(), static_cast<int>(AllCodes().size()));
  for (int i = 0; i < desc->value_count(); ++i) {
    v1::Status p;
    p.set_code(static_cast<v1::Status::Code>(desc->value(i)->number()));
    p.set_message("m");
    Status s = FromProto(p);
    EXPECT_EQ(Upper(Status::CodeName(s.code())), desc->value(i)->name());
  }
}

TEST(StatusProtoTest, OkOnTheWireIsOkWhateverTheMessage) {
  v1::Status p;
  p.set_code(v1::Status::OK);
  p.set_message("ignored");
  Status s = FromProto(p);
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s, Status::Ok());
  EXPECT_TRUE(FromProto(v1::Status()).ok());  // an unset status is ok
}

TEST(EnumNamesTest, VerdictName) {
  EXPECT_STREQ(VerdictName(v1::VERDICT_OK), "ok");
  EXPECT_STREQ(VerdictName(v1::VERDICT_RUNTIME_ERROR), "runtime_error");
  EXPECT_STREQ(VerdictName(v1::VERDICT_TIME_LIMIT), "time_limit");
  EXPECT_STREQ(VerdictName(v1::VERDICT_MEMORY_LIMIT), "memory_limit");
  EXPECT_STREQ(VerdictName(v1::VERDICT_OUTPUT_LIMIT), "output_limit");
  EXPECT_STREQ(VerdictName(v1::VERDICT_PLATFORM_ERROR), "platform_error");
  EXPECT_STREQ(VerdictName(v1::VERDICT_UNSPECIFIED), "unspecified");
}

TEST(EnumNamesTest, KindName) {
  EXPECT_STREQ(KindName(v1::KIND_FNCALL), "fncall");
  EXPECT_STREQ(KindName(v1::KIND_CONTAINER), "container");
  EXPECT_STREQ(KindName(v1::KIND_MICROVM), "microvm");
  EXPECT_STREQ(KindName(v1::KIND_VM), "vm");
  EXPECT_STREQ(KindName(v1::KIND_AUTO), "auto");
  EXPECT_STREQ(KindName(v1::KIND_UNSPECIFIED), "auto");  // treated as auto
}

TEST(EnumNamesTest, PhaseName) {
  EXPECT_STREQ(PhaseName(v1::SANDBOX_PHASE_PENDING), "pending");
  EXPECT_STREQ(PhaseName(v1::SANDBOX_PHASE_STARTING), "starting");
  EXPECT_STREQ(PhaseName(v1::SANDBOX_PHASE_RUNNING), "running");
  EXPECT_STREQ(PhaseName(v1::SANDBOX_PHASE_PAUSED), "paused");
  EXPECT_STREQ(PhaseName(v1::SANDBOX_PHASE_STOPPING), "stopping");
  EXPECT_STREQ(PhaseName(v1::SANDBOX_PHASE_STOPPED), "stopped");
  EXPECT_STREQ(PhaseName(v1::SANDBOX_PHASE_FAILED), "failed");
  EXPECT_STREQ(PhaseName(v1::SANDBOX_PHASE_UNSPECIFIED), "unspecified");
}

TEST(EnumNamesTest, EveryNamedEnumValueHasAName) {
  // A value added to the proto without a name here would print as a default.
  const auto* verdicts = v1::Verdict_descriptor();
  for (int i = 0; i < verdicts->value_count(); ++i) {
    auto v = static_cast<v1::Verdict>(verdicts->value(i)->number());
    if (v == v1::VERDICT_UNSPECIFIED) continue;
    EXPECT_STRNE(VerdictName(v), "unspecified") << verdicts->value(i)->name();
  }
  const auto* phases = v1::SandboxPhase_descriptor();
  for (int i = 0; i < phases->value_count(); ++i) {
    auto p = static_cast<v1::SandboxPhase>(phases->value(i)->number());
    if (p == v1::SANDBOX_PHASE_UNSPECIFIED) continue;
    EXPECT_STRNE(PhaseName(p), "unspecified") << phases->value(i)->name();
  }
}

TEST(EnumNamesTest, ParseKindInvertsKindName) {
  for (v1::Kind k : {v1::KIND_FNCALL, v1::KIND_CONTAINER, v1::KIND_MICROVM, v1::KIND_VM,
                     v1::KIND_AUTO}) {
    v1::Kind parsed = v1::KIND_UNSPECIFIED;
    ASSERT_TRUE(ParseKind(KindName(k), &parsed)) << KindName(k);
    EXPECT_EQ(parsed, k);
  }
}

TEST(EnumNamesTest, ParseKindRejectsUnknownNames) {
  for (const char* bad : {"", "docker", "fncall ", "vms", "unspecified"}) {
    v1::Kind out = v1::KIND_VM;
    EXPECT_FALSE(ParseKind(bad, &out)) << "'" << bad << "'";
    EXPECT_EQ(out, v1::KIND_VM) << "the output must be left alone on failure";
  }
}

}  // namespace
}  // namespace dsec
