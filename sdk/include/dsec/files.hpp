// A sandbox's tree changed (service.proto, PathOpRequest): directories
// made, paths moved and removed; kinds with state (container, microvm,
// vm). Paths are absolute, without "..". `user` names a user of the
// sandbox's /etc/passwd (or a uid) that owns what is made; "" is root.
// Reading and writing files: Sandbox::ReadFile, WriteFile, ListFiles.
#pragma once

#include <string>

#include "dsec/client.hpp"

namespace dsec {

// `path` and the parents it lacks; AlreadyExists when `path` exists.
Result<v1::FileInfo> MakeDir(const Sandbox& sandbox, const std::string& path, const std::string& user = "");
// rename(2) inside the sandbox (a file at `to` is replaced); the result's info.
Result<v1::FileInfo> Move(const Sandbox& sandbox, const std::string& from, const std::string& to);
// A file, or a directory with all it holds (symlinks are removed, not followed).
Status Remove(const Sandbox& sandbox, const std::string& path);
// A write as `req` says (sandbox_id set here): content, mode, parents, its
// user and extended attributes (`xattrs`, set as user.<name>, E2B's file
// metadata; `xattrs_replace` drops others of a namespace), which
// ListFiles shows (FileInfo.xattrs).
Status Write(const Sandbox& sandbox, v1::WriteFileRequest req);
// Write, with `done` on an SDK thread.
void WriteAsync(const Sandbox& sandbox, v1::WriteFileRequest req, DoneStatus done);

// The request as given (sandbox_id set here); `done` on an SDK thread.
void PathOpAsync(const Sandbox& sandbox, v1::PathOpRequest req, Done<v1::FileReply> done);

}  // namespace dsec
