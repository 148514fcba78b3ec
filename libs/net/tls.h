// TLS for dtrain's own sockets: one place that sets up OpenSSL for the
// kvstore's data port (mutual TLS with the cluster's certificates,
// libs/kvstore/data_port.h) and the collective's TCP transport (a
// pre-shared key per connection, libs/collective/tcp_transport.h). Like
// gloo's transport/tcp/tls: the context is made here; each transport keeps
// its own connection (blocking or not) and handshake loop.
//
//   net::TlsContextOptions options;
//   options.side = net::TlsContextOptions::Side::kServer;
//   options.files = {ca, cert, key};            // mutual TLS
//   options.read_ahead = true;
//   DT_ASSIGN_OR_RETURN(std::shared_ptr<SSL_CTX> ctx, net::NewTlsContext(options));
//   SSL* ssl = SSL_new(ctx.get());                // then SSL_set_fd, SSL_accept...
//
// Every context speaks TLS 1.3 only and sends no session tickets. Making a
// context also ignores SIGPIPE if the process left it at its default:
// OpenSSL writes to a socket itself (an alert, a record after the peer
// went away) without MSG_NOSIGNAL, and a default SIGPIPE would kill the
// process.
//
// Thread-safety: NewTlsContext and OpenSslErrors are thread-safe; a
// context may be shared by connections on any threads.
#ifndef DTRAIN_LIBS_NET_TLS_H_
#define DTRAIN_LIBS_NET_TLS_H_

#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace dtrain {
namespace net {

// The certificate files of mutual TLS (rpc::Credentials' files).
struct TlsFiles {
  std::string ca_file, cert_file, key_file;
};

struct TlsContextOptions {
  // The side the context's connections take. kAny: either (SSL_set_accept_state
  // or SSL_set_connect_state per connection; a rank of the collective both
  // accepts and connects).
  enum class Side { kClient, kServer, kAny };
  Side side = Side::kAny;
  // Mutual TLS: this process's certificate chain and key, and the CA the
  // peer's certificate must be signed by (a server refuses a client without
  // one). Empty cert_file: no certificates (a pre-shared key instead).
  TlsFiles files;
  // Pre-shared keys (psk_dhe_ke: (EC)DHE on top of the key): each
  // connection's key is given with SetTlsPsk before its handshake.
  bool psk = false;
  // TLS 1.3 cipher suites, OpenSSL's syntax; "": OpenSSL's default list.
  std::string ciphersuites;
  // Read whatever the socket holds instead of a record's header and then
  // its body: one system call per small record (SSL_CTX_set_read_ahead).
  bool read_ahead = false;
  // For non-blocking sockets: SSL_write may write part of a buffer, and
  // retry a write from another address (the caller's buffer moved).
  bool partial_writes = false;
};

// A context as `options` say. kInternal when OpenSSL cannot make or
// configure one; kInvalidArgument naming the file (certificate, key or CA)
// it cannot read.
absl::StatusOr<std::shared_ptr<SSL_CTX>> NewTlsContext(const TlsContextOptions& options);

// The pre-shared key of `ssl` (of a context with `psk`): read during its
// handshake, so `key` must outlive it; SetTlsPsk(ssl, nullptr) after it.
void SetTlsPsk(SSL* ssl, const std::string* key);

// The calling thread's OpenSSL errors ("error:...; error:..."), which it
// clears; "no OpenSSL error queued" when there are none.
std::string OpenSslErrors();

}  // namespace net
}  // namespace dtrain

#endif  // DTRAIN_LIBS_NET_TLS_H_
