// The one authorization step of every server's handlers: who calls (the
// peer certificate, credentials.h) and whether that identity may do
// `action` (libs/security/authz.h holds the rules).
//
//   DT_ASSIGN_OR_RETURN(security::Identity who,
//                       rpc::AuthorizedPeer(*ctx, security::Action::kSubmitJob));
#ifndef DTRAIN_LIBS_RPC_AUTHORIZE_H_
#define DTRAIN_LIBS_RPC_AUTHORIZE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/security/authz.h"
#include "libs/security/identity.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace dtrain {
namespace rpc {

// The caller of `ctx` if it may do `action` (to a job of `owner`), else the
// denial: PERMISSION_DENIED, or UNAUTHENTICATED for a certificate that names
// no dtrain identity.
absl::StatusOr<security::Identity> AuthorizedPeer(const grpc::ServerContextBase& ctx,
                                                  security::Action action,
                                                  absl::string_view owner = "");

}  // namespace rpc
}  // namespace dtrain

#endif  // DTRAIN_LIBS_RPC_AUTHORIZE_H_
