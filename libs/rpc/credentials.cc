#include "libs/rpc/credentials.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <cstdlib>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/base/files.h"
#include "libs/base/status.h"

namespace dtrain {
namespace rpc {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what, const char* marker) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("no ", what, " file given"));
  absl::StatusOr<std::string> read = ReadFile(path);
  if (!read.ok()) return Annotate(read.status(), absl::StrCat("cannot read the ", what, " file"));
  std::string pem = *std::move(read);
  if (!absl::StrContains(pem, marker)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " file ", path, " holds no PEM ", marker));
  }
  return pem;
}

// gRPC's backup poll interval, kBackupPollIntervalMs instead of 5 s, set
// for the process before gRPC initializes (which reads it once): during
// static initialization, so every program and test that opens channels
// through this library has it. A value the environment sets wins. Nothing
// else drives a channel's connection attempt while its calls fail at once
// (no wait_for_ready), as a trainer's heartbeats do while the scheduler is
// away: each step of the attempt (TCP connect, TLS handshake, HTTP/2
// settings) waited for the next backup poll, and a trainer registered again
// 14-16 s after the new scheduler answered.
const bool kBackupPollIntervalSet = [] {
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS",
         std::to_string(kBackupPollIntervalMs).c_str(), /*overwrite=*/0);
  return true;
}();

absl::Mutex g_mu;
std::shared_ptr<const Credentials>* g_default ABSL_GUARDED_BY(g_mu) = nullptr;

// Parsed identities by certificate: a peer presents the same certificate on
// every call of a connection.
class IdentityCache {
 public:
  absl::StatusOr<security::Identity> Get(const std::string& pem) {
    {
      absl::MutexLock lock(&mu_);
      auto it = cache_.find(pem);
      if (it != cache_.end()) return it->second;
    }
    absl::StatusOr<security::Identity> id = security::IdentityFromCertPem(pem);
    if (!id.ok()) return id;
    absl::MutexLock lock(&mu_);
    if (cache_.size() > 4096) cache_.clear();
    cache_.emplace(pem, *id);
    return id;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, security::Identity> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Credentials>> Credentials::Load(const TlsFiles& files) {
  std::shared_ptr<Credentials> c(new Credentials());
  c->insecure_ = false;
  c->files_ = files;
  absl::StatusOr<std::string> ca = ReadPem(files.ca, "CA certificate (--ca)", "CERTIFICATE");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadPem(files.cert, "certificate (--cert)", "CERTIFICATE");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(files.key, "private key (--key)", "PRIVATE KEY");
  if (!key.ok()) return key.status();
  absl::StatusOr<security::Identity> id = security::IdentityFromCertPem(*cert);
  if (!id.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(files.cert, ": ", id.status().message()));
  }
  c->ca_pem_ = *std::move(ca);
  c->cert_pem_ = *std::move(cert);
  c->key_pem_ = *std::move(key);
  c->identity_ = *id;
  return std::shared_ptr<const Credentials>(std::move(c));
}

std::shared_ptr<const Credentials> Credentials::Insecure() {
  static const auto* insecure =
      new std::shared_ptr<const Credentials>(std::shared_ptr<Credentials>(new Credentials()));
  return *insecure;
}

std::shared_ptr<grpc::ServerCredentials> Credentials::ServerCredentials() const {
  if (insecure_) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ca_pem_;
  options.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> Credentials::ChannelCredentials() const {
  if (insecure_) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_pem_;
  options.pem_private_key = key_pem_;
  options.pem_cert_chain = cert_pem_;
  return grpc::SslCredentials(options);
}

void SetDefaultCredentials(std::shared_ptr<const Credentials> credentials) {
  absl::MutexLock lock(&g_mu);
  if (g_default == nullptr) g_default = new std::shared_ptr<const Credentials>();
  *g_default = std::move(credentials);
}

std::shared_ptr<const Credentials> DefaultCredentials() {
  absl::MutexLock lock(&g_mu);
  if (g_default == nullptr || *g_default == nullptr) return Credentials::Insecure();
  return *g_default;
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                          const Credentials* credentials) {
  return NewChannel(target, grpc::ChannelArguments(), credentials);
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                          const grpc::ChannelArguments& args,
                                          const Credentials* credentials) {
  std::shared_ptr<const Credentials> keep;
  if (credentials == nullptr) {
    keep = DefaultCredentials();
    credentials = keep.get();
  }
  // Reconnect backoff bounded to 500 ms: gRPC's default grows to 120 s.
  // 100 ms doubling to 500 ms (+-20% jitter), with the backup poll interval
  // above, reconnects within a second of a server coming back (trainers
  // re-registered 0.5-1.5 s after a restarted scheduler answered with a
  // 1 s bound) and costs two connection attempts a second while it is away.
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left at its default: gRPC uses it
  // as the deadline of each connection attempt (20 s), and 100 ms there
  // failed TLS handshakes of busy trainers ("tcp handshaker shutdown").
  // Callers do not set these.
  grpc::ChannelArguments with_backoff = args;
  with_backoff.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kInitialReconnectBackoffMs);
  with_backoff.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  return grpc::CreateCustomChannel(target, credentials->ChannelCredentials(), with_backoff);
}

absl::StatusOr<security::Identity> PeerIdentity(const grpc::ServerContextBase& ctx) {
  static IdentityCache* cache = new IdentityCache();
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return security::Anonymous();
  std::vector<grpc::string_ref> transport =
      auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
  const bool tls = !transport.empty() && transport[0] == GRPC_SSL_TRANSPORT_SECURITY_TYPE;
  if (!tls) return security::Anonymous();  // a plain-text server's caller
  if (!auth->IsPeerAuthenticated()) {
    return absl::UnauthenticatedError("the peer presented no verified certificate");
  }
  std::vector<grpc::string_ref> pem = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pem.empty()) {
    return absl::UnauthenticatedError("the peer presented no certificate");
  }
  absl::StatusOr<security::Identity> id = cache->Get(std::string(pem[0].data(), pem[0].size()));
  if (!id.ok()) return absl::UnauthenticatedError(id.status().message());
  return id;
}

}  // namespace rpc
}  // namespace dtrain
