// The Connect protocol's pieces the E2B door's envd services use (see
// envd_rpc.cpp): status codes by Connect's names and HTTP statuses, error
// bodies, envelopes, base64 for bytes in proto3 JSON, and gzip bodies.
#include <openssl/evp.h>
#include <zlib.h>

#include "actors/front/e2b/door_internal.hpp"

namespace dsec::e2b {

using nlohmann::json;

// Connect's name for a status code.
const char* ConnectCode(Status::Code c) {
  switch (c) {
    case Status::Code::kNotFound: return "not_found";
    case Status::Code::kInvalidArgument: return "invalid_argument";
    case Status::Code::kAlreadyExists: return "already_exists";
    case Status::Code::kFailedPrecondition: return "failed_precondition";
    case Status::Code::kResourceExhausted: return "resource_exhausted";
    case Status::Code::kUnavailable: return "unavailable";
    case Status::Code::kUnimplemented: return "unimplemented";
    case Status::Code::kUnauthenticated: return "unauthenticated";
    case Status::Code::kDeadlineExceeded: return "deadline_exceeded";
    case Status::Code::kAborted: return "aborted";
    default: return "internal";
  }
}

// The HTTP status Connect gives a unary call's error.
int ConnectHttp(Status::Code c) {
  switch (c) {
    case Status::Code::kNotFound: return 404;
    case Status::Code::kInvalidArgument:
    case Status::Code::kFailedPrecondition: return 400;
    case Status::Code::kAlreadyExists: return 409;
    case Status::Code::kResourceExhausted: return 429;
    case Status::Code::kUnavailable: return 503;
    case Status::Code::kUnimplemented: return 501;
    case Status::Code::kUnauthenticated: return 401;
    case Status::Code::kDeadlineExceeded: return 504;
    case Status::Code::kAborted: return 409;
    default: return 500;
  }
}

json ErrorJson(const Status& s) { return {{"code", ConnectCode(s.code())}, {"message", s.message()}}; }

std::string Envelope(uint8_t flags, const std::string& payload) {
  std::string out(5, '\0');
  out[0] = static_cast<char>(flags);
  uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) out[1 + i] = static_cast<char>((n >> (24 - 8 * i)) & 0xff);
  return out + payload;
}

std::string Base64(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// Standard base64 (padding optional) to bytes; false when it is not.
bool Unbase64(const std::string& in, std::string* out) {
  std::string b64 = in;
  while (b64.size() % 4) b64 += '=';
  out->assign(b64.size() / 4 * 3 + 1, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out->data()),
                          reinterpret_cast<const unsigned char*>(b64.data()), static_cast<int>(b64.size()));
  if (n < 0) return false;
  size_t pad = 0;
  for (size_t i = b64.size(); i > 0 && b64[i - 1] == '=' && pad < 2; --i) ++pad;
  out->resize(static_cast<size_t>(n) - pad);  // EVP_DecodeBlock counts the padding as zero bytes
  return true;
}

Result<std::string> Gunzip(const std::string& in, size_t max) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return Status::Internal("zlib: inflateInit2 failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  std::string out;
  char buf[64 << 10];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
    if (out.size() > max) {
      inflateEnd(&z);
      return Status::ResourceExhausted("the gzip body holds more than " + std::to_string(max >> 20) + " MiB");
    }
    if (rc == Z_STREAM_END && z.avail_in > 0) rc = inflateReset(&z);  // another member follows (as gzip -d reads)
  }
  std::string why = z.msg ? z.msg : "";
  inflateEnd(&z);
  if (rc == Z_STREAM_END) return out;
  if (rc == Z_MEM_ERROR) return Status::ResourceExhausted("zlib: out of memory inflating the body");
  return Status::InvalidArgument(rc == Z_BUF_ERROR ? "the gzip body is cut short" : "the body is not gzip: " + why);
}

}  // namespace dsec::e2b
