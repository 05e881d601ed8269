#include "wire/tls.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/interfaces.hpp>
#include <caf/io/network/native_socket.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/io/scribe.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/session.hpp>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <memory>

namespace dsec::tls {

void Configure(caf::actor_system_config& cfg, const Files& files) {
  cfg.load<caf::openssl::manager>();
  cfg.openssl_certificate = files.cert;
  cfg.openssl_key = files.key;
  cfg.openssl_cafile = files.ca;
}

namespace {

std::string OpensslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

bool Readable(const std::string& path) { return ::access(path.c_str(), R_OK) == 0; }

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

// The private key in PEM file `path`, or null.
KeyPtr ReadKey(const std::string& path) {
  KeyPtr key(nullptr, &EVP_PKEY_free);
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    key.reset(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
    std::fclose(f);
  }
  return key;
}

// The stream policy: BASP's bytes through the session (which finishes the
// TLS handshake on the first reads and writes).
class SessionPolicy {
 public:
  explicit SessionPolicy(caf::openssl::session_ptr s) : session_(std::move(s)) {}
  // OpenSSL's error queue is per thread and CAF's session never empties it
  // (only its logging would): an error another connection left on this
  // multiplexer thread (a peer gone without a TLS goodbye, a refused
  // certificate) would make SSL_get_error judge this connection's harmless
  // "want read" fatal and close it. Each operation starts with it empty.
  caf::io::network::rw_state read_some(size_t& result, caf::io::network::native_socket fd, void* buf, size_t len) {
    ERR_clear_error();
    return session_->read_some(result, fd, buf, len);
  }
  caf::io::network::rw_state write_some(size_t& result, caf::io::network::native_socket fd, const void* buf,
                                        size_t len) {
    ERR_clear_error();
    return session_->write_some(result, fd, buf, len);
  }
  bool must_read_more(caf::io::network::native_socket fd, size_t threshold) {
    return session_->must_read_more(fd, threshold);
  }

 private:
  caf::openssl::session_ptr session_;
};

// A scribe over a TLS session, as CAF's own OpenSSL middleman makes for
// the connections it dials and accepts; here for one the door admitted.
class TlsScribe : public caf::io::scribe {
 public:
  TlsScribe(caf::io::network::default_multiplexer& mpx, int fd, caf::openssl::session_ptr s)
      : caf::io::scribe(caf::io::network::conn_hdl_from_socket(fd)), stream_(mpx, fd, std::move(s)) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) Launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  void Launch() {
    launched_ = true;
    stream_.start(this);
    // A write with nothing to write drives the handshake when it still
    // waits on the peer.
    stream_.force_empty_write(this);
  }
  bool launched_ = false;
  caf::io::network::stream_impl<SessionPolicy> stream_;
};

}  // namespace

Status Check(const Files& f) {
  if (f.empty()) return Status::Ok();
  if (f.cert.empty() || f.key.empty() || f.ca.empty())
    return Status::InvalidArgument(
        "TLS with certificates needs all three of a certificate, its key and the CA file (--tls-cert, --tls-key, "
        "--tls-ca); with none of them TLS is anonymous");
  for (const auto* p : {&f.cert, &f.key, &f.ca})
    if (!Readable(*p)) return Status::InvalidArgument("cannot read the TLS file " + *p);
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (!ctx) return Status::Internal("cannot make an OpenSSL context: " + OpensslError());
  Status st = Status::Ok();
  KeyPtr key = ReadKey(f.key);
  if (SSL_CTX_use_certificate_chain_file(ctx, f.cert.c_str()) != 1)
    st = Status::InvalidArgument("the TLS certificate " + f.cert + " is not a PEM certificate: " + OpensslError());
  else if (!key)
    st = Status::InvalidArgument("the TLS key " + f.key + " is not a PEM private key: " + OpensslError());
  else if (SSL_CTX_use_PrivateKey(ctx, key.get()) != 1 || SSL_CTX_check_private_key(ctx) != 1)
    st = Status::InvalidArgument("the TLS key " + f.key + " does not belong to the certificate " + f.cert);
  else if (SSL_CTX_load_verify_locations(ctx, f.ca.c_str(), nullptr) != 1)
    st = Status::InvalidArgument("the TLS CA file " + f.ca + " holds no PEM certificate: " + OpensslError());
  ERR_clear_error();
  SSL_CTX_free(ctx);
  return st;
}

Result<caf::io::scribe_ptr> NewScribe(caf::actor_system& sys, int fd, bool tls, bool accepted) {
  auto& mpx = static_cast<caf::io::network::default_multiplexer&>(sys.middleman().backend());
  if (!tls) return mpx.new_scribe(fd);
  if (!sys.has_openssl_manager()) {
    ::close(fd);
    return Status::FailedPrecondition("the peer speaks TLS (dsecd --tls) and this process was started without it");
  }
  caf::io::network::nonblocking(fd, true);
  caf::openssl::session_ptr session;
  try {
    ERR_clear_error();  // see SessionPolicy
    // (CAF reads the certificate files again for each session; dsecd
    // checked them at start.)
    session = caf::openssl::make_session(sys, fd, accepted);
  } catch (const std::exception& e) {
    ::close(fd);
    return Status::FailedPrecondition(std::string("cannot start a TLS session: ") + e.what());
  }
  if (!session) {
    ::close(fd);
    return Status::Unavailable("the TLS handshake failed at once: " + OpensslError());
  }
  return caf::io::scribe_ptr{caf::make_counted<TlsScribe>(mpx, fd, std::move(session))};
}

}  // namespace dsec::tls
