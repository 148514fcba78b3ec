// Certificates for a dtrain cluster: a CA and the certificates it issues
// (`trainctl certs init|issue`, `trainctl cluster up`).
//
//   DT_RETURN_IF_ERROR(InitCertDir("/etc/dtrain/certs", {}));   // ca.pem, ca.key,
//                         // scheduler, kvstore, admin (.pem/.key), cluster.secret
//   DT_RETURN_IF_ERROR(IssueCert("/etc/dtrain/certs", {"alice", Role::kUser}));
//
// Keys are ECDSA P-256; certificates are valid for `valid_days` from an hour
// ago (clock skew). A certificate's subject is CN=<name>, OU=<role>,
// O=dtrain; its subject alternative names are the URI dtrain://<role>/<name>,
// DNS localhost and <name>, IP 127.0.0.1 and ::1, and `extra_sans` (DNS
// names, or IP addresses). Any dtrain certificate can both serve and call
// (a trainer serves health checks, the scheduler calls the kvstore), so none
// carries an extended key usage. Private keys are written 0600.
#ifndef DTRAIN_LIBS_SECURITY_CERTS_H_
#define DTRAIN_LIBS_SECURITY_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "libs/security/identity.h"

namespace dtrain {
namespace security {

struct CertRequest {
  std::string name;  // ValidName
  Role role = Role::kUser;
  std::vector<std::string> extra_sans;  // DNS names or IP addresses
  int valid_days = 365;
};

struct InitOptions {
  // Added to the service certificates (scheduler, kvstore): the names
  // clients reach them by, e.g. Kubernetes services
  // ("scheduler.dtrain.svc", "*.kvstore.dtrain.svc").
  std::vector<std::string> service_sans;
  int valid_days = 365;
};

// Makes `dir` (if needed) with a new CA (ca.pem, ca.key), the service
// certificates scheduler (role scheduler) and kvstore (role kvstore), an
// admin certificate `admin` (role admin), each as <name>.pem and <name>.key,
// and cluster.secret (32 random bytes, hex: the key of per-job kvstore
// tokens, which the scheduler and the shards share). AlreadyExists when
// dir/ca.pem exists (a second init would orphan every certificate issued).
absl::Status InitCertDir(const std::string& dir, const InitOptions& options);

// Issues <dir>/<name>.pem and <dir>/<name>.key signed by dir's CA
// (overwriting an earlier one of that name: renewal). InvalidArgument for a
// bad name; NotFound naming `trainctl certs init` when dir has no CA.
absl::Status IssueCert(const std::string& dir, const CertRequest& request);

}  // namespace security
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SECURITY_CERTS_H_
