// TLS behind the front door (dsecd --tls), with CAF's OpenSSL module: a
// connection goes through the door's token handshake in the clear (an HMAC
// challenge and response; no secret crosses the wire), and when the door's
// challenge says TLS, both ends turn the socket into a TLS session of
// caf::openssl before BASP's first byte. Everything BASP carries (every
// request, reply and output) is then encrypted.
//
// Without certificates the session is anonymous TLS: encrypted, but an
// active man in the middle could end it on both sides (it could not pass
// the door, whose challenge covers the TLS flag, but it could read what
// follows). With a certificate, key and CA file on every end, both ends
// check each other's certificate against the CA.
#pragma once

#include <caf/fwd.hpp>
#include <caf/io/fwd.hpp>

#include <string>

#include "dsec/status.hpp"

namespace dsec::tls {

struct Files {
  std::string cert, key, ca;  // PEM files; all empty: anonymous TLS
  bool empty() const { return cert.empty() && key.empty() && ca.empty(); }
};

// Loads CAF's OpenSSL module into `cfg` (after the middleman) with `files`.
void Configure(caf::actor_system_config& cfg, const Files& files);

// Whether `files` are usable: a certificate, its key and a CA file all
// together (or none), each readable, the key matching the certificate.
// The error names the file and what is wrong with it.
Status Check(const Files& files);

// A scribe for a socket that passed the door, for BASP: a plain one, or
// with `tls` a TLS session (`accepted`: the server's end). The socket is
// owned by the scribe from here on (closed on error too).
Result<caf::io::scribe_ptr> NewScribe(caf::actor_system& sys, int fd, bool tls, bool accepted);

}  // namespace dsec::tls
