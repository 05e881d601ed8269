// A fresh directory under /tmp for one test, removed with everything in it.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace dsec::state::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/dsec-state-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + " failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;  // best effort: a leftover dir must not fail the test
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Where a store goes: a subdirectory RocksDB creates itself.
  std::string db() const { return path_ + "/db"; }

 private:
  std::string path_;
};

}  // namespace dsec::state::testing
