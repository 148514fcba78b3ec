// Who is calling: the name and role a dtrain certificate carries.
//
// Every dtrain certificate (issued by `trainctl certs`, certs.h) names its
// holder in the subject's common name (CN=alice) and its role in the
// organizational unit (OU=user); the subject alternative names repeat both
// as the URI dtrain://<role>/<name>. Servers take the caller's Identity from
// the verified peer certificate (libs/rpc/credentials.h) and decide with
// authz.h.
//
//   absl::StatusOr<Identity> who = IdentityFromCertPem(pem);
//   if (who.ok() && who->role == Role::kAdmin) ...
#ifndef DTRAIN_LIBS_SECURITY_IDENTITY_H_
#define DTRAIN_LIBS_SECURITY_IDENTITY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace security {

enum class Role {
  kUser,       // submits and watches its own jobs
  kAdmin,      // everything: every job, trainers, kvstore administration
  kTrainer,    // ClusterService (its own assignments) and the kvstore's data
  kKvstore,    // a kvstore shard (a server; as a client: other shards)
  kScheduler,  // the scheduler (a server; as a client: the kvstore)
};

// "user", "admin", "trainer", "kvstore", "scheduler".
const char* RoleName(Role role);
// The inverse of RoleName; InvalidArgument naming the accepted roles.
absl::StatusOr<Role> ParseRole(absl::string_view name);

struct Identity {
  std::string name;  // the certificate's CN: "alice", "trainer-0", "scheduler"
  Role role = Role::kUser;
  // false: the server runs with --insecure and nobody is authenticated; such
  // callers may do everything (authz.h) and own no jobs ("" owner).
  bool authenticated = true;

  // "alice (user)", or "anonymous (insecure)".
  std::string ToString() const;
};

// The caller of a server that runs without TLS.
Identity Anonymous();

// The identity in a PEM certificate (the leaf a TLS peer presented; its chain
// was verified by TLS already). InvalidArgument when it is not a PEM
// certificate, or has no CN or no OU naming a known role.
absl::StatusOr<Identity> IdentityFromCertPem(absl::string_view pem);

// Names a certificate may carry: 1 to 64 of [A-Za-z0-9._-], not starting
// with '.' or '-' (they become file names: <dir>/<name>.pem).
bool ValidName(absl::string_view name);

}  // namespace security
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SECURITY_IDENTITY_H_
