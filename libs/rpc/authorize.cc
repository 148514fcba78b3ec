#include "libs/rpc/authorize.h"

#include "libs/base/status.h"
#include "libs/rpc/credentials.h"

namespace dtrain {
namespace rpc {

absl::StatusOr<security::Identity> AuthorizedPeer(const grpc::ServerContextBase& ctx,
                                                  security::Action action,
                                                  absl::string_view owner) {
  DT_ASSIGN_OR_RETURN(security::Identity who, PeerIdentity(ctx));
  DT_RETURN_IF_ERROR(security::Authorize(who, action, owner));
  return who;
}

}  // namespace rpc
}  // namespace dtrain
