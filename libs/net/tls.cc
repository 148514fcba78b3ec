#include "libs/net/tls.h"

#include <openssl/err.h>
#include <signal.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace net {
namespace {

void IgnoreDefaultSigpipe() {
  static const bool ignored = [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
    return true;
  }();
  (void)ignored;
}

unsigned int CopyPsk(SSL* ssl, unsigned char* psk, unsigned int max_psk_len) {
  const auto* key = static_cast<const std::string*>(SSL_get_app_data(ssl));
  if (key == nullptr || key->size() > max_psk_len) return 0;
  std::memcpy(psk, key->data(), key->size());
  return static_cast<unsigned int>(key->size());
}

unsigned int ClientPsk(SSL* ssl, const char* /*hint*/, char* identity,
                       unsigned int max_identity_len, unsigned char* psk,
                       unsigned int max_psk_len) {
  if (max_identity_len < 2) return 0;
  std::strcpy(identity, "c");  // NOLINT: one byte; the key, not the identity, matters
  return CopyPsk(ssl, psk, max_psk_len);
}

unsigned int ServerPsk(SSL* ssl, const char* /*identity*/, unsigned char* psk,
                       unsigned int max_psk_len) {
  return CopyPsk(ssl, psk, max_psk_len);
}

}  // namespace

std::string OpenSslErrors() {
  std::string out;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "no OpenSSL error queued" : out;
}

void SetTlsPsk(SSL* ssl, const std::string* key) {
  SSL_set_app_data(ssl, const_cast<std::string*>(key));
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> NewTlsContext(const TlsContextOptions& options) {
  using Side = TlsContextOptions::Side;
  IgnoreDefaultSigpipe();
  const SSL_METHOD* method = options.side == Side::kServer   ? TLS_server_method()
                             : options.side == Side::kClient ? TLS_client_method()
                                                             : TLS_method();
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(method), SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslErrors());
  if (SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(ctx.get(), TLS1_3_VERSION) != 1 ||
      (!options.ciphersuites.empty() &&
       SSL_CTX_set_ciphersuites(ctx.get(), options.ciphersuites.c_str()) != 1)) {
    return absl::InternalError(absl::StrCat("configuring TLS 1.3: ", OpenSslErrors()));
  }
  SSL_CTX_set_num_tickets(ctx.get(), 0);  // no post-handshake messages
  if (options.read_ahead) SSL_CTX_set_read_ahead(ctx.get(), 1);
  if (options.partial_writes) {
    SSL_CTX_set_mode(ctx.get(),
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  }
  const TlsFiles& files = options.files;
  if (!files.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx.get(), files.cert_file.c_str()) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("certificate ", files.cert_file, ": ", OpenSslErrors()));
    }
    if (SSL_CTX_use_PrivateKey_file(ctx.get(), files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("key ", files.key_file, ": ", OpenSslErrors()));
    }
    if (SSL_CTX_load_verify_locations(ctx.get(), files.ca_file.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("CA ", files.ca_file, ": ", OpenSslErrors()));
    }
    SSL_CTX_set_verify(
        ctx.get(),
        SSL_VERIFY_PEER | (options.side == Side::kServer ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
        nullptr);
  }
  if (options.psk) {
    SSL_CTX_set_psk_client_callback(ctx.get(), ClientPsk);
    SSL_CTX_set_psk_server_callback(ctx.get(), ServerPsk);
  }
  return ctx;
}

}  // namespace net
}  // namespace dtrain
