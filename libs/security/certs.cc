#include "libs/security/certs.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/base/files.h"
#include "libs/base/status.h"

namespace dtrain {
namespace security {
namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using CertPtr = std::unique_ptr<X509, decltype(&X509_free)>;

absl::Status OpenSslError(absl::string_view what) {
  char buf[256] = {0};
  ERR_error_string_n(ERR_get_error(), buf, sizeof(buf));
  return absl::InternalError(absl::StrCat(what, ": ", buf));
}

absl::StatusOr<KeyPtr> NewKey() {
  KeyPtr key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  if (key == nullptr) return OpenSslError("generating a P-256 key");
  return key;
}

std::string ToPem(EVP_PKEY* key) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string ToPem(X509* cert) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  PEM_write_bio_X509(bio.get(), cert);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// Writes `contents` to `path` atomically with mode `mode`.
absl::Status WriteWithMode(const std::string& path, const std::string& contents, mode_t mode) {
  const mode_t old = umask(mode == 0600 ? 0077 : 0022);
  absl::Status s = WriteFileAtomically(path, contents);
  umask(old);
  if (s.ok() && chmod(path.c_str(), mode) != 0) {
    return absl::InternalError(absl::StrCat("chmod ", path, ": ", std::strerror(errno)));
  }
  return s;
}

bool IsIp(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError(absl::StrCat("certificate extension ", value));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) return OpenSslError("adding a certificate extension");
  return absl::OkStatus();
}

// A certificate for `key` with subject CN=cn, OU=ou, O=dtrain, signed by
// issuer_key (self-signed when issuer is null).
absl::StatusOr<CertPtr> MakeCert(EVP_PKEY* key, const std::string& cn, const std::string& ou,
                                 X509* issuer, EVP_PKEY* issuer_key, bool ca,
                                 const std::vector<std::string>& sans, int valid_days) {
  CertPtr cert(X509_new(), &X509_free);
  if (cert == nullptr) return OpenSslError("X509_new");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("random serial");
  serial[0] &= 0x7f;
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(BN_bin2bn(serial, sizeof(serial), nullptr),
                                                 &BN_free);
  BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get()));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(valid_days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  auto add = [&](const char* field, const std::string& value) {
    X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                               reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1, 0);
  };
  add("O", "dtrain");
  add("OU", ou);
  add("CN", cn);
  X509_set_issuer_name(cert.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (ca) {
    DT_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE"));
    DT_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign"));
  } else {
    DT_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE"));
    DT_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature,keyAgreement"));
    std::vector<std::string> alt = {absl::StrCat("URI:dtrain://", ou, "/", cn)};
    for (const std::string& s : sans) alt.push_back(absl::StrCat(IsIp(s) ? "IP:" : "DNS:", s));
    DT_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_subject_alt_name, absl::StrJoin(alt, ",")));
  }
  DT_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash"));
  if (X509_sign(cert.get(), issuer_key != nullptr ? issuer_key : key, EVP_sha256()) == 0) {
    return OpenSslError("signing a certificate");
  }
  return cert;
}

absl::Status Issue(const std::string& dir, X509* ca, EVP_PKEY* ca_key, const CertRequest& r) {
  if (!ValidName(r.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate name '", r.name,
        "' must be 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"));
  }
  if (r.valid_days < 1) return absl::InvalidArgumentError("valid_days must be >= 1");
  for (const std::string& s : r.extra_sans) {
    if (s.empty() || s.find_first_of(",: \t") != std::string::npos) {
      if (!IsIp(s)) return absl::InvalidArgumentError(absl::StrCat("bad SAN '", s, "'"));
    }
  }
  DT_ASSIGN_OR_RETURN(KeyPtr key, NewKey());
  std::vector<std::string> sans = {"localhost", r.name, "127.0.0.1", "::1"};
  sans.insert(sans.end(), r.extra_sans.begin(), r.extra_sans.end());
  DT_ASSIGN_OR_RETURN(CertPtr cert, MakeCert(key.get(), r.name, RoleName(r.role), ca, ca_key, false,
                                             sans, r.valid_days));
  DT_RETURN_IF_ERROR(WriteWithMode(absl::StrCat(dir, "/", r.name, ".key"), ToPem(key.get()), 0600));
  return WriteWithMode(absl::StrCat(dir, "/", r.name, ".pem"), ToPem(cert.get()), 0644);
}

}  // namespace

absl::Status InitCertDir(const std::string& dir, const InitOptions& options) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (stat(absl::StrCat(dir, "/ca.pem").c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        dir,
        "/ca.pem exists: this directory has a CA already (issue more certificates with "
        "`trainctl certs issue --dir=",
        dir, "`)"));
  }
  DT_ASSIGN_OR_RETURN(KeyPtr ca_key, NewKey());
  DT_ASSIGN_OR_RETURN(CertPtr ca, MakeCert(ca_key.get(), "dtrain-ca", "ca", nullptr, nullptr, true,
                                           {}, options.valid_days * 10));
  DT_RETURN_IF_ERROR(WriteWithMode(dir + "/ca.key", ToPem(ca_key.get()), 0600));
  DT_RETURN_IF_ERROR(WriteWithMode(dir + "/ca.pem", ToPem(ca.get()), 0644));
  for (Role role : {Role::kScheduler, Role::kKvstore, Role::kAdmin}) {
    CertRequest r;
    r.name = RoleName(role);
    r.role = role;
    r.valid_days = options.valid_days;
    if (role != Role::kAdmin) r.extra_sans = options.service_sans;
    DT_RETURN_IF_ERROR(Issue(dir, ca.get(), ca_key.get(), r));
  }
  unsigned char secret[32];
  if (RAND_bytes(secret, sizeof(secret)) != 1) return OpenSslError("random cluster secret");
  return WriteWithMode(
      dir + "/cluster.secret",
      absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(secret), sizeof(secret))),
      0600);
}

absl::Status IssueCert(const std::string& dir, const CertRequest& request) {
  absl::StatusOr<std::string> ca_pem = ReadFile(dir + "/ca.pem");
  absl::StatusOr<std::string> key_pem = ReadFile(dir + "/ca.key");
  if (!ca_pem.ok() || !key_pem.ok()) {
    return absl::NotFoundError(absl::StrCat(
        dir, " has no CA (ca.pem and ca.key); run `trainctl certs init --dir=", dir, "` first"));
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> cb(
      BIO_new_mem_buf(ca_pem->data(), static_cast<int>(ca_pem->size())), &BIO_free);
  CertPtr ca(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr), &X509_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> kb(
      BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size())), &BIO_free);
  KeyPtr ca_key(PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  if (ca == nullptr || ca_key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/ca.pem or ca.key is not PEM"));
  }
  return Issue(dir, ca.get(), ca_key.get(), request);
}

}  // namespace security
}  // namespace dtrain
