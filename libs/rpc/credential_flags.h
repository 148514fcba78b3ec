// The flags every dtrain program takes for its credentials
// (credentials.h):
//   --ca=FILE --cert=FILE --key=FILE   mutual TLS (default: $DTRAIN_CA,
//                                      $DTRAIN_CERT, $DTRAIN_KEY)
//   --insecure                         plain text, no identities (a warning
//                                      is logged); also $DTRAIN_INSECURE=1
// A program given neither fails with a message saying what to pass.
#ifndef DTRAIN_LIBS_RPC_CREDENTIAL_FLAGS_H_
#define DTRAIN_LIBS_RPC_CREDENTIAL_FLAGS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/rpc/credentials.h"

namespace dtrain {
namespace rpc {

// The credentials the flags (else the environment) name; `program` prefixes
// the insecure warning. InvalidArgument saying what to pass when none are
// given or only some of the three files; Load's errors.
absl::StatusOr<std::shared_ptr<const Credentials>> CredentialsFromFlags(absl::string_view program);

// CredentialsFromFlags made this process's default credentials
// (SetDefaultCredentials), as every program's main does first:
//   if (absl::Status s = UseCredentialsFromFlags("trainer"); !s.ok()) ...exit 2
absl::Status UseCredentialsFromFlags(absl::string_view program);

// The TLS files the flags (else the environment) name (empty fields where
// neither says), and whether --insecure was asked for.
TlsFiles TlsFilesFromFlags();
bool InsecureFromFlags();
// --insecure alone (not the environment): what `cluster up` goes by, so that a
// shell's DTRAIN_INSECURE from an earlier cluster does not turn TLS off.
bool InsecureFlag();

}  // namespace rpc
}  // namespace dtrain

#endif  // DTRAIN_LIBS_RPC_CREDENTIAL_FLAGS_H_
