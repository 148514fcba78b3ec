#include "libs/rpc/credential_flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"

ABSL_FLAG(std::string, ca, "", "CA certificate (PEM) of mutual TLS (default: $DTRAIN_CA)");
ABSL_FLAG(std::string, cert, "", "this program's certificate (PEM) (default: $DTRAIN_CERT)");
ABSL_FLAG(std::string, key, "", "this program's private key (PEM) (default: $DTRAIN_KEY)");
ABSL_FLAG(bool, insecure, false,
          "plain text instead of mutual TLS: no encryption, no identities, anyone who reaches "
          "the port may do anything (also $DTRAIN_INSECURE=1)");

namespace dtrain {
namespace rpc {
namespace {

std::string FlagOrEnv(const absl::Flag<std::string>& flag, const char* env) {
  std::string v = absl::GetFlag(flag);
  if (!v.empty()) return v;
  const char* e = std::getenv(env);
  return e != nullptr ? e : "";
}

}  // namespace

TlsFiles TlsFilesFromFlags() {
  TlsFiles f;
  f.ca = FlagOrEnv(FLAGS_ca, "DTRAIN_CA");
  f.cert = FlagOrEnv(FLAGS_cert, "DTRAIN_CERT");
  f.key = FlagOrEnv(FLAGS_key, "DTRAIN_KEY");
  return f;
}

bool InsecureFlag() { return absl::GetFlag(FLAGS_insecure); }

bool InsecureFromFlags() {
  if (absl::GetFlag(FLAGS_insecure)) return true;
  const char* e = std::getenv("DTRAIN_INSECURE");
  return e != nullptr && std::string(e) == "1";
}

absl::StatusOr<std::shared_ptr<const Credentials>> CredentialsFromFlags(absl::string_view program) {
  const TlsFiles f = TlsFilesFromFlags();
  if (InsecureFromFlags()) {
    DT_LOG(WARNING) << program
                    << ": --insecure: plain text, no identities; anyone who reaches its ports "
                       "may do anything";
    return Credentials::Insecure();
  }
  if (f.ca.empty() && f.cert.empty() && f.key.empty()) {
    return absl::InvalidArgumentError(
        "no credentials: pass --ca, --cert and --key (or set DTRAIN_CA, DTRAIN_CERT and "
        "DTRAIN_KEY; `trainctl cluster up` prints them), or --insecure for plain text");
  }
  if (f.ca.empty() || f.cert.empty() || f.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mutual TLS needs all of --ca, --cert and --key (or DTRAIN_CA, DTRAIN_CERT, DTRAIN_KEY); "
        "missing:",
        f.ca.empty() ? " --ca" : "", f.cert.empty() ? " --cert" : "",
        f.key.empty() ? " --key" : ""));
  }
  return Credentials::Load(f);
}

absl::Status UseCredentialsFromFlags(absl::string_view program) {
  absl::StatusOr<std::shared_ptr<const Credentials>> credentials = CredentialsFromFlags(program);
  if (!credentials.ok()) return credentials.status();
  SetDefaultCredentials(*std::move(credentials));
  return absl::OkStatus();
}

}  // namespace rpc
}  // namespace dtrain
