// Nft: nftables through libnftables, in the network namespace the calling
// thread is in when Open is called. Each Run is one transaction: every
// command of the batch applies, or none does (what makes a policy change
// atomic for the sandbox's next connection).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "dsec/status.hpp"

struct nft_ctx;

namespace dsec::net {

class Nft {
 public:
  // Fails when libnftables cannot start (no netlink access: not root).
  static Result<std::unique_ptr<Nft>> Open();
  ~Nft();
  Nft(const Nft&) = delete;
  Nft& operator=(const Nft&) = delete;

  // Runs `commands` (nft's syntax, one or more lines) as one transaction;
  // what nft printed (a list command's output). On failure, nft's own
  // error text, which names the line.
  Result<std::string> Run(const std::string& commands);

 private:
  Nft() = default;
  std::mutex mu_;  // libnftables' context is not thread-safe
  nft_ctx* ctx_ = nullptr;
};

}  // namespace dsec::net
