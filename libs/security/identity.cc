#include "libs/security/identity.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace security {
namespace {

// The text of the first `nid` entry of `name`, or "".
std::string NameEntry(X509_NAME* name, int nid) {
  const int at = X509_NAME_get_index_by_NID(name, nid, -1);
  if (at < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, at));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, data);
  if (n < 0) return "";
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return out;
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kUser:
      return "user";
    case Role::kAdmin:
      return "admin";
    case Role::kTrainer:
      return "trainer";
    case Role::kKvstore:
      return "kvstore";
    case Role::kScheduler:
      return "scheduler";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kUser, Role::kAdmin, Role::kTrainer, Role::kKvstore, Role::kScheduler}) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("role '", name, "' is not one of user, admin, trainer, kvstore, scheduler"));
}

std::string Identity::ToString() const {
  if (!authenticated) return "anonymous (insecure)";
  return absl::StrCat(name, " (", RoleName(role), ")");
}

Identity Anonymous() {
  Identity id;
  id.authenticated = false;
  return id;
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64 || name[0] == '.' || name[0] == '-') return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

absl::StatusOr<Identity> IdentityFromCertPem(absl::string_view pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  if (bio == nullptr) return absl::InternalError("out of memory reading a certificate");
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (cert == nullptr) return absl::InvalidArgumentError("not a PEM certificate");
  X509_NAME* subject = X509_get_subject_name(cert.get());
  Identity id;
  id.name = NameEntry(subject, NID_commonName);
  if (!ValidName(id.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("certificate's common name '", id.name, "' is not a dtrain name"));
  }
  const std::string ou = NameEntry(subject, NID_organizationalUnitName);
  absl::StatusOr<Role> role = ParseRole(ou);
  if (!role.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate of '", id.name, "' names no dtrain role (OU): ", role.status().message()));
  }
  id.role = *role;
  return id;
}

}  // namespace security
}  // namespace dtrain
