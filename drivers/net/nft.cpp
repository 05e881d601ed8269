#include "drivers/net/nft.hpp"

#include <nftables/libnftables.h>

namespace dsec::net {

Result<std::unique_ptr<Nft>> Nft::Open() {
  std::unique_ptr<Nft> n(new Nft());
  n->ctx_ = nft_ctx_new(NFT_CTX_DEFAULT);
  if (!n->ctx_) return Status::Internal("nftables: cannot make a libnftables context");
  if (nft_ctx_buffer_output(n->ctx_) != 0 || nft_ctx_buffer_error(n->ctx_) != 0)
    return Status::Internal("nftables: cannot buffer libnftables' output");
  // Probe: listing tables needs netlink access (root, or CAP_NET_ADMIN).
  if (auto probe = n->Run("list tables"); !probe.ok())
    return Status::FailedPrecondition("nftables unavailable: " + probe.status().message() +
                                      " (network policies need root, or CAP_NET_ADMIN, and nf_tables in the kernel)");
  return n;
}

Nft::~Nft() {
  if (ctx_) nft_ctx_free(ctx_);
}

Result<std::string> Nft::Run(const std::string& commands) {
  std::lock_guard<std::mutex> lk(mu_);
  int rc = nft_run_cmd_from_buffer(ctx_, commands.c_str());
  std::string out = nft_ctx_get_output_buffer(ctx_);  // each get empties its buffer
  std::string err = nft_ctx_get_error_buffer(ctx_);
  if (rc != 0) {
    while (!err.empty() && err.back() == '\n') err.pop_back();
    return Status::Internal("nftables refused the batch: " + (err.empty() ? std::string("no reason given") : err));
  }
  return out;
}

}  // namespace dsec::net
