// Reading a kvstore shard map (protos/replication.proto): each shard is a
// chain of replicas, head first; writes enter at the head, reads are served
// by the tail (the last ACTIVE member). These helpers answer "who is what"
// for clients and replicas alike; the map's owner (the scheduler,
// libs/scheduler/kvstore_map.h) is the only one that changes it.
#ifndef DTRAIN_LIBS_KVSTORE_SHARD_MAP_H_
#define DTRAIN_LIBS_KVSTORE_SHARD_MAP_H_

#include <string>

#include "protos/replication.pb.h"

namespace dtrain {
namespace kvstore {

// The member `replica` of `shard`'s chain, or nullptr.
const v1::ChainMember* FindMember(const v1::ShardMap& map, int shard, int replica);
// The chain's first member if it is ACTIVE (where writes go), or nullptr.
const v1::ChainMember* ChainHead(const v1::ShardMap& map, int shard);
// The chain's last ACTIVE member (where reads go), or nullptr.
const v1::ChainMember* ChainTail(const v1::ShardMap& map, int shard);
// The member after / before `replica` in `shard`'s chain (JOINING ones
// included), or nullptr.
const v1::ChainMember* Successor(const v1::ShardMap& map, int shard, int replica);
const v1::ChainMember* Predecessor(const v1::ShardMap& map, int shard, int replica);
// "shard 0 (map version 7): r1@10.0.0.2:7070 -> r0@10.0.0.1:7070 (joining)".
std::string DescribeChain(const v1::ShardMap& map, int shard);

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_SHARD_MAP_H_
