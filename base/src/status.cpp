#include "dsec/status.hpp"

#include <cerrno>
#include <cstring>

namespace dsec {

Status Status::FromErrno(int err, const std::string& what) {
  Code code = Code::kInternal;
  switch (err) {
    case ENOENT: code = Code::kNotFound; break;
    case EEXIST: code = Code::kAlreadyExists; break;
    case EINVAL: code = Code::kInvalidArgument; break;
    case EACCES:
    case EPERM: code = Code::kFailedPrecondition; break;
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case EAGAIN: code = Code::kResourceExhausted; break;
    default: break;
  }
  return Status(code, what + ": " + std::strerror(err));
}

const char* Status::CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid_argument";
    case Code::kNotFound: return "not_found";
    case Code::kAlreadyExists: return "already_exists";
    case Code::kFailedPrecondition: return "failed_precondition";
    case Code::kResourceExhausted: return "resource_exhausted";
    case Code::kUnavailable: return "unavailable";
    case Code::kDeadlineExceeded: return "deadline_exceeded";
    case Code::kInternal: return "internal";
    case Code::kUnimplemented: return "unimplemented";
    case Code::kAborted: return "aborted";
    case Code::kUnauthenticated: return "unauthenticated";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::Annotate(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace dsec
