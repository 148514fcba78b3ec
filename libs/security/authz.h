// Who may do what: the one decision function of dtrain's servers.
//
// Servers take the caller's Identity from its certificate
// (libs/rpc/credentials.h: PeerIdentity), call Authorize once at the top of
// each handler, and turn a denial into PERMISSION_DENIED (it already is one).
// Nothing here knows about gRPC.
//
// The rules (an unauthenticated caller of an --insecure server may do
// everything; admins may do everything):
//   kSubmitJob, kListJobs          users (List shows them only their jobs:
//                                  SeesAllJobs), admins
//   kReadJob, kCancelJob           the job's owner, admins
//   kListTrainers                  users, admins
//   kDrainTrainer                  admins
//   kListQueues                    users, admins (JobService.ListQueues)
//   kApplyQueues                   admins (JobService.ApplyQueues)
//   kTrainerCall                   trainers (ClusterService; the server also
//                                  binds trainer ids to the identity that
//                                  registered them: TrainerBinding)
//   kKvData                        trainers, the scheduler, kvstore shards
//                                  (Push, Pull, Init, CreateJob, DeleteJob,
//                                  GetJob: trainers create and delete their
//                                  attempt's kvstore job themselves)
//   kKvAdmin                       the scheduler, admins (Snapshot)
//   kReplicate                     kvstore shards (a replica forwarding writes
//                                  down its chain: Replica.Replicate)
//   kKvstoreHeartbeat              kvstore shards (ClusterService.KvstoreHeartbeat)
//   kReadKvstoreMap                any authenticated caller (the shard map:
//                                  JobService.GetKvstoreMap, Replica.GetShardMap)
#ifndef DTRAIN_LIBS_SECURITY_AUTHZ_H_
#define DTRAIN_LIBS_SECURITY_AUTHZ_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "libs/security/identity.h"

namespace dtrain {
namespace security {

enum class Action {
  kSubmitJob,
  kListJobs,
  kReadJob,  // Get, Watch
  kCancelJob,
  kListTrainers,
  kDrainTrainer,
  kListQueues,
  kApplyQueues,
  kTrainerCall,
  kKvData,
  kKvAdmin,
  kReplicate,
  kKvstoreHeartbeat,
  kReadKvstoreMap,
};

// What a call of the kvstore's `method` ("Push", "Snapshot", ...) does:
// kKvAdmin for Snapshot, kReplicate for Replicate, kReadKvstoreMap for
// GetShardMap, kKvData for the rest.
Action KvstoreAction(absl::string_view method);

// "submit jobs", "read job", ... (for messages).
const char* ActionName(Action action);

// OK, or PermissionDenied naming the caller and what it may not do.
// `owner`: the job's owner for kReadJob and kCancelJob (ignored otherwise).
absl::Status Authorize(const Identity& who, Action action, absl::string_view owner = "");

// Whether List shows `who` every job (admins, anonymous) or only its own.
bool SeesAllJobs(const Identity& who);

// The owner recorded for a job `who` submits ("" when anonymous).
std::string OwnerOf(const Identity& who);

// Which identity registered each trainer id, so that a trainer's later calls
// (heartbeats, reports, rendezvous) are accepted only from that identity: a
// trainer cannot pose as another by sending its id. Thread-safe.
class TrainerBinding {
 public:
  // Records that `who` registered `trainer_id`.
  void Bind(const std::string& trainer_id, const Identity& who);
  // OK when `who` registered `trainer_id` (or is anonymous); PermissionDenied
  // otherwise. An id nobody registered here is left to the scheduler (which
  // answers NotFound so that the trainer registers again), so this is OK.
  absl::Status Check(const std::string& trainer_id, const Identity& who) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> owner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace security
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SECURITY_AUTHZ_H_
