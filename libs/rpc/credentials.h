// Credentials of every dtrain gRPC server and channel, from one place.
//
// Mutual TLS: a process holds a CA certificate (ca.pem), its own certificate
// and key (libs/security/certs.h issues them); its servers require and
// verify a client certificate signed by that CA, and its channels verify the
// server's certificate against the CA and the address's host name (the
// certificates carry localhost, 127.0.0.1 and the names given at issue).
// Plain text only when asked for (--insecure), with a warning.
//
// A main sets the process's credentials once, from its flags
// (credential_flags.h), before it starts servers or opens channels:
//   SetDefaultCredentials(*CredentialsFromFlags("kvstore_server"));
// rpc::Server (server.h) then listens with them, and clients open channels
// with NewChannel (never grpc::CreateChannel):
//   auto stub = Foo::NewStub(rpc::NewChannel("127.0.0.1:7000"));
// Until a main sets them the default is plain text (library tests).
//
// A server learns who calls from the peer certificate:
//   absl::StatusOr<security::Identity> who = rpc::PeerIdentity(*ctx);
// and decides with libs/security/authz.h.
#ifndef DTRAIN_LIBS_RPC_CREDENTIALS_H_
#define DTRAIN_LIBS_RPC_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/security/identity.h"

namespace grpc {
class Channel;
class ChannelArguments;
class ChannelCredentials;
class ServerContextBase;
class ServerCredentials;
}  // namespace grpc

namespace dtrain {
namespace rpc {

// PEM files: the CA that signs every certificate of the cluster, and this
// process's certificate and private key.
struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
};

// Immutable; share it freely.
class Credentials {
 public:
  // Reads and checks the three files (each must exist and hold PEM; the
  // certificate must name a dtrain identity). Errors name the file.
  static absl::StatusOr<std::shared_ptr<const Credentials>> Load(const TlsFiles& files);
  // Plain text: no TLS, no identities.
  static std::shared_ptr<const Credentials> Insecure();

  bool insecure() const { return insecure_; }
  // This process's identity (Anonymous() when insecure).
  const security::Identity& identity() const { return identity_; }
  const TlsFiles& files() const { return files_; }

  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

 private:
  Credentials() = default;
  bool insecure_ = true;
  TlsFiles files_;
  std::string ca_pem_, cert_pem_, key_pem_;
  security::Identity identity_ = security::Anonymous();
};

// The process's credentials (Insecure() until set). Thread-safe.
void SetDefaultCredentials(std::shared_ptr<const Credentials> credentials);
std::shared_ptr<const Credentials> DefaultCredentials();

// A channel to `target` with `credentials` (nullptr: the default). Every
// channel reconnects to a server that went away with a backoff of
// kInitialReconnectBackoffMs doubling to kMaxReconnectBackoffMs (gRPC's own
// default grows to two minutes), so clients are back within about a second of
// a restarted server answering, also those whose calls fail at once meanwhile
// (no wait_for_ready): a process linking this library polls its channels'
// connection attempts every kBackupPollIntervalMs (gRPC's backup poller,
// $GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS, set at start-up unless the
// environment sets it; gRPC's default is 5 s a step of the attempt).
constexpr int kInitialReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 500;
constexpr int kBackupPollIntervalMs = 100;
std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                          const Credentials* credentials = nullptr);
std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                          const grpc::ChannelArguments& args,
                                          const Credentials* credentials = nullptr);

// The caller of the call `ctx` serves: from its verified certificate, or
// Anonymous() on a plain-text server. Unauthenticated when the certificate
// names no dtrain identity.
absl::StatusOr<security::Identity> PeerIdentity(const grpc::ServerContextBase& ctx);

}  // namespace rpc
}  // namespace dtrain

#endif  // DTRAIN_LIBS_RPC_CREDENTIALS_H_
