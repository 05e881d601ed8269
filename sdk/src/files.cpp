#include "dsec/files.hpp"

#include "sdk/src/client_impl.hpp"
#include "sdk/src/extra_calls.hpp"

namespace dsec {

void PathOpAsync(const Sandbox& sandbox, v1::PathOpRequest req, Done<v1::FileReply> done) {
  ExtraCalls::Call<v1::FileReply>(sandbox, std::move(req), std::move(done));
}

namespace {

Result<v1::FileInfo> Op(const Sandbox& sb, v1::PathOp op, const std::string& path, const std::string& dest,
                        const std::string& user) {
  v1::PathOpRequest req;
  req.set_op(op);
  req.set_path(path);
  req.set_destination(dest);
  req.set_user(user);
  auto r = Wait<v1::FileReply>([&](Done<v1::FileReply> d) { PathOpAsync(sb, std::move(req), std::move(d)); });
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_info());
}

}  // namespace

Result<v1::FileInfo> MakeDir(const Sandbox& sandbox, const std::string& path, const std::string& user) {
  return Op(sandbox, v1::PATH_OP_MAKE_DIR, path, "", user);
}

Result<v1::FileInfo> Move(const Sandbox& sandbox, const std::string& from, const std::string& to) {
  return Op(sandbox, v1::PATH_OP_MOVE, from, to, "");
}

Status Remove(const Sandbox& sandbox, const std::string& path) {
  return Op(sandbox, v1::PATH_OP_REMOVE, path, "", "").status();
}

void WriteAsync(const Sandbox& sandbox, v1::WriteFileRequest req, DoneStatus done) {
  ExtraCalls::Call<v1::FileReply>(sandbox, std::move(req),
                                  [done = std::move(done)](Result<v1::FileReply> r) { done(r.status()); });
}

Status Write(const Sandbox& sandbox, v1::WriteFileRequest req) {
  return Wait<v1::FileReply>([&](Done<v1::FileReply> d) {
           ExtraCalls::Call<v1::FileReply>(sandbox, std::move(req), std::move(d));
         })
      .status();
}

}  // namespace dsec
