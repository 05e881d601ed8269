// Status and Result<T>: errors as values, used by every layer of dsec (state,
// drivers, actors, SDK). Codes mirror dsec.v1.Status.Code so a Status crosses
// the wire unchanged. Messages say what failed, on which object, and what to do.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace dsec {

class [[nodiscard]] Status {
 public:
  enum class Code : int {
    kOk = 0,
    kInvalidArgument = 1,
    kNotFound = 2,
    kAlreadyExists = 3,
    kFailedPrecondition = 4,
    kResourceExhausted = 5,
    kUnavailable = 6,
    kDeadlineExceeded = 7,
    kInternal = 8,
    kUnimplemented = 9,
    kAborted = 10,
    kUnauthenticated = 11,  // the peer did not prove who it is (a wrong or missing token)
  };

  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {Code::kFailedPrecondition, std::move(m)};
  }
  static Status ResourceExhausted(std::string m) {
    return {Code::kResourceExhausted, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) {
    return {Code::kDeadlineExceeded, std::move(m)};
  }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {Code::kUnimplemented, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
  static Status Unauthenticated(std::string m) { return {Code::kUnauthenticated, std::move(m)}; }
  // An errno-carrying failure: "<what>: <strerror(err)>".
  static Status FromErrno(int err, const std::string& what);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "not_found: sandbox sb-3 ..." ; "ok" when ok.
  std::string ToString() const;
  // Prefixes the message with context: "open store: <old message>".
  Status Annotate(const std::string& context) const;

  static const char* CodeName(Code code);

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline bool operator==(const Status& a, const Status& b) {
  return a.code() == b.code() && a.message() == b.message();
}

// Either a value or a non-ok Status.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an ok Status");
  }

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace dsec

// Propagates a non-ok Status out of the enclosing function.
#define DSEC_RETURN_IF_ERROR(expr)        \
  do {                                    \
    ::dsec::Status dsec_status_ = (expr); \
    if (!dsec_status_.ok()) return dsec_status_; \
  } while (0)
