// KvstoreMembership: the one owner of the kvstore shard map (which replicas
// form each shard's chain, in order, and their states; protos/replication.proto),
// without any transport (services/scheduler serves it as
// ClusterService.KvstoreHeartbeat).
//
//   KvstoreMembership members(KvstoreMembershipOptions{});
//   // each replica, every heartbeat_interval:
//   DT_ASSIGN_OR_RETURN(KvstoreHeartbeatReply reply, members.Heartbeat(request, absl::Now()));
//   // periodically (Heartbeat does it too):
//   members.Expire(absl::Now());
//   ShardMap map = members.Map();   // for trainctl kvstore, metrics
//
// The map has one chain per shard (Chain.shard = its index, head first) and
// a version, one counter for the whole map, raised by one on every call that
// changes it (0: no map yet). Rules, per shard's chain:
//
//   - Adoption. The map is soft state: a restarted scheduler starts with
//     none and rebuilds it from its replicas. A heartbeat whose map
//     (request.map, the one the replica follows) has a higher version than
//     the owner's replaces the owner's whole map (all chains and the
//     version); every adopted member counts as heard from now.
//     A heartbeat whose map has the owner's version but other contents (a
//     previous scheduler gave it out, and this owner's own changes reached
//     the same number) raises the owner's version, since replicas take
//     only newer maps.
//   - Lost state. A member whose heartbeat carries another incarnation than
//     recorded (its process restarted), or an ACTIVE member that reports
//     has_state = false although the map it follows is at least the one
//     that made it ACTIVE, lost its state: it is removed and appended again
//     as JOINING, with the request's incarnation and address. (A member
//     that follows an older map, e.g. a JOINING member that Expire promoted
//     without a transfer, has not learnt it is ACTIVE yet: not a loss.)
//   - Joining. A replica not in its chain is appended: ACTIVE if the chain
//     has no ACTIVE member (a new, empty shard), else JOINING.
//   - Caught up. request.caught_up_replica / caught_up_incarnation (0: no
//     report) names the requester's successor, to which it transferred the
//     shard's state: if that member is JOINING with that incarnation, and
//     the requester is ACTIVE and its predecessor in the chain, it becomes
//     ACTIVE.
//   - Expiry. A member not heard from for heartbeat_timeout leaves its
//     chain. A chain left with JOINING but no ACTIVE members (or a lost
//     state leaving only JOINING ones) makes them ACTIVE: the shard's state
//     is lost, which is logged at WARNING naming the shard (clients see
//     their job gone and retry from a checkpoint).
//   - Order. ACTIVE members keep their relative order, JOINING ones follow
//     all ACTIVE ones (the head is the first ACTIVE member, the tail the last).
//   - Startup grace. For startup_grace after construction the owner makes no
//     chain ACTIVE from nothing (the Joining rule's "new, empty shard"): a
//     replica that kept its state may still report the map the previous
//     scheduler gave out, and adopting it must win over creating an empty
//     shard. Such heartbeats get the current map back unchanged.
//
// Steady heartbeats (same incarnation and address, has_state as expected, no
// new caught-up report) never change the map or its version.
//
// Bad input is answered with kInvalidArgument naming the field: shard,
// replica, address, incarnation, num_shards (< 1, shard >= num_shards, or
// different from the map's), or a map to adopt that is malformed.
//
// Thread-safety: every method is thread-safe.
#ifndef DTRAIN_LIBS_SCHEDULER_KVSTORE_MAP_H_
#define DTRAIN_LIBS_SCHEDULER_KVSTORE_MAP_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "protos/replication.pb.h"

namespace dtrain {
namespace scheduler {

using kvstore::v1::ChainMember;
using kvstore::v1::KvstoreHeartbeatReply;
using kvstore::v1::KvstoreHeartbeatRequest;
using kvstore::v1::ShardMap;

struct KvstoreMembershipOptions {
  // Returned to replicas (KvstoreHeartbeatReply.heartbeat_interval_ms): how
  // often each heartbeats. Small, so that a map change reaches the chain fast.
  absl::Duration heartbeat_interval = absl::Milliseconds(200);
  // A member silent this long leaves its chain (10 heartbeats: a slow
  // machine's hiccup is not a failure; a dead replica stalls pushes at most
  // this long).
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  // See "Startup grace" above. Negative: heartbeat_timeout.
  absl::Duration startup_grace = absl::Seconds(-1);
};

// Members per shard and state, for metrics.
struct KvstoreMembershipStats {
  uint64_t version = 0;
  uint64_t changes = 0;  // map changes since construction (adoptions included)
  // (shard, active members, joining members), by shard.
  std::vector<std::pair<int, std::pair<int, int>>> replicas;
};

class KvstoreMembership {
 public:
  // `now`: the construction time (the start of the startup grace).
  explicit KvstoreMembership(const KvstoreMembershipOptions& options, absl::Time now = absl::Now());
  KvstoreMembership(const KvstoreMembership&) = delete;
  KvstoreMembership& operator=(const KvstoreMembership&) = delete;

  // Records a replica's heartbeat at `now` (Expire(now) first) and applies
  // the rules above. Returns the whole map (after the change) and the
  // heartbeat interval. Errors: kInvalidArgument (nothing changes).
  absl::StatusOr<KvstoreHeartbeatReply> Heartbeat(const KvstoreHeartbeatRequest& request,
                                                  absl::Time now);

  // Removes members not heard from since now - heartbeat_timeout.
  void Expire(absl::Time now);

  // The current map: num_shards chains (none before the first heartbeat).
  ShardMap Map() const;

  KvstoreMembershipStats Stats() const;

 private:
  struct Member {
    ChainMember member;
    absl::Time last_heard;
    // The map version that made this member ACTIVE (see "Lost state").
    uint64_t active_since = 0;
  };
  using Chain = std::vector<Member>;

  void ExpireLocked(absl::Time now, bool* changed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Active members first (stable); a chain with only JOINING members gets
  // them ACTIVE (its state is lost; logged). `next` is the version the
  // change will have.
  void NormalizeLocked(int shard, uint64_t next, bool* changed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdoptLocked(const ShardMap& map, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ShardMap MapLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const KvstoreMembershipOptions options_;
  const absl::Time grace_end_;
  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Chain> chains_ ABSL_GUARDED_BY(mu_);  // by shard; size = num_shards
};

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_KVSTORE_MAP_H_
