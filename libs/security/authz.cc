#include "libs/security/authz.h"

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace security {

Action KvstoreAction(absl::string_view method) {
  if (method == "Snapshot") return Action::kKvAdmin;
  if (method == "Replicate") return Action::kReplicate;
  if (method == "GetShardMap") return Action::kReadKvstoreMap;
  return Action::kKvData;
}

const char* ActionName(Action action) {
  switch (action) {
    case Action::kSubmitJob:
      return "submit jobs";
    case Action::kListJobs:
      return "list jobs";
    case Action::kReadJob:
      return "read this job";
    case Action::kCancelJob:
      return "cancel this job";
    case Action::kListTrainers:
      return "list trainers";
    case Action::kDrainTrainer:
      return "drain trainers";
    case Action::kListQueues:
      return "list queues";
    case Action::kApplyQueues:
      return "change the queues";
    case Action::kTrainerCall:
      return "call the trainers' ClusterService";
    case Action::kKvData:
      return "use the kvstore";
    case Action::kKvAdmin:
      return "administer the kvstore";
    case Action::kReplicate:
      return "replicate kvstore writes";
    case Action::kKvstoreHeartbeat:
      return "heartbeat as a kvstore replica";
    case Action::kReadKvstoreMap:
      return "read the kvstore map";
  }
  return "do this";
}

absl::Status Authorize(const Identity& who, Action action, absl::string_view owner) {
  if (!who.authenticated || who.role == Role::kAdmin) return absl::OkStatus();
  bool ok = false;
  switch (action) {
    case Action::kSubmitJob:
    case Action::kListJobs:
    case Action::kListTrainers:
    case Action::kListQueues:
      ok = who.role == Role::kUser;
      break;
    case Action::kReadJob:
    case Action::kCancelJob:
      ok = who.role == Role::kUser && who.name == owner;
      if (!ok && who.role == Role::kUser) {
        return absl::PermissionDeniedError(
            absl::StrCat(who.ToString(), " may not ", ActionName(action),
                         ": it belongs to another user (only its owner and admins may)"));
      }
      break;
    case Action::kDrainTrainer:
    case Action::kApplyQueues:
      break;  // admins only
    case Action::kTrainerCall:
      ok = who.role == Role::kTrainer;
      break;
    case Action::kKvData:
      ok = who.role == Role::kTrainer || who.role == Role::kScheduler || who.role == Role::kKvstore;
      break;
    case Action::kKvAdmin:
      ok = who.role == Role::kScheduler;
      break;
    case Action::kReplicate:
    case Action::kKvstoreHeartbeat:
      ok = who.role == Role::kKvstore;
      break;
    case Action::kReadKvstoreMap:
      ok = true;
      break;
  }
  if (ok) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(who.ToString(), " may not ", ActionName(action),
                                                  " (role ", RoleName(who.role), ")"));
}

bool SeesAllJobs(const Identity& who) { return !who.authenticated || who.role == Role::kAdmin; }

std::string OwnerOf(const Identity& who) { return who.authenticated ? who.name : ""; }

void TrainerBinding::Bind(const std::string& trainer_id, const Identity& who) {
  if (!who.authenticated) return;
  absl::MutexLock lock(&mu_);
  owner_[trainer_id] = who.name;
}

absl::Status TrainerBinding::Check(const std::string& trainer_id, const Identity& who) const {
  if (!who.authenticated) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = owner_.find(trainer_id);
  if (it == owner_.end() || it->second == who.name) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(who.ToString(), " may not act as trainer ",
                                                  trainer_id, ", which ", it->second,
                                                  " registered"));
}

}  // namespace security
}  // namespace dtrain
