// How trainctl shows the kvstore shard map (protos/replication.proto):
// `trainctl kvstore`'s rows and `cluster up`'s readiness check.
#ifndef DTRAIN_SERVICES_TRAINCTL_SHARD_MAP_VIEW_H_
#define DTRAIN_SERVICES_TRAINCTL_SHARD_MAP_VIEW_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "protos/replication.pb.h"

namespace dtrain {
namespace trainctl {

// The role of chain.members(index): "head", "middle" or "tail" among the
// ACTIVE members (ordered first; one ACTIVE member is "head,tail"), or
// "joining".
std::string ChainRole(const kvstore::v1::Chain& chain, int index);

// One line per member: SHARD REPLICA ADDRESS STATE ROLE (the column widths
// of trainctl kvstore's header).
std::vector<std::string> ChainRows(const kvstore::v1::Chain& chain);

// OK when `map` has `num_shards` shards, each with at least `replicas`
// ACTIVE members; else kUnavailable saying what is missing per shard
// ("shard 1: 1 of 2 replicas ACTIVE (replica 1 JOINING)").
absl::Status ChainsReady(const kvstore::v1::ShardMap& map, int num_shards, int replicas);

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_SHARD_MAP_VIEW_H_
