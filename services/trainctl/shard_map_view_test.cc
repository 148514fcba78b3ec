#include "services/trainctl/shard_map_view.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace trainctl {
namespace {

using kvstore::v1::REPLICA_ACTIVE;
using kvstore::v1::REPLICA_JOINING;

kvstore::v1::Chain MakeChain(int shard, const std::vector<kvstore::v1::ReplicaState>& states) {
  kvstore::v1::Chain c;
  c.set_shard(shard);
  for (size_t i = 0; i < states.size(); ++i) {
    auto* m = c.add_members();
    m->set_replica(static_cast<int>(i));
    m->set_address("127.0.0.1:" + std::to_string(7000 + i));
    m->set_state(states[i]);
    m->set_incarnation(i + 1);
  }
  return c;
}

TEST(ShardMapViewTest, Roles) {
  auto c = MakeChain(0, {REPLICA_ACTIVE, REPLICA_ACTIVE, REPLICA_ACTIVE, REPLICA_JOINING});
  EXPECT_EQ(ChainRole(c, 0), "head");
  EXPECT_EQ(ChainRole(c, 1), "middle");
  EXPECT_EQ(ChainRole(c, 2), "tail");
  EXPECT_EQ(ChainRole(c, 3), "joining");
  auto one = MakeChain(1, {REPLICA_ACTIVE, REPLICA_JOINING});
  EXPECT_EQ(ChainRole(one, 0), "head,tail");
  auto rows = ChainRows(one);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], "1      0        127.0.0.1:7000        ACTIVE   head,tail");
  EXPECT_EQ(rows[1], "1      1        127.0.0.1:7001        JOINING  joining");
}

TEST(ShardMapViewTest, ChainsReadyNeedsEveryShardWithRActive) {
  kvstore::v1::ShardMap map;
  EXPECT_EQ(ChainsReady(map, 2, 2).code(), absl::StatusCode::kUnavailable);
  map.set_version(7);
  map.set_num_shards(2);
  *map.add_chains() = MakeChain(0, {REPLICA_ACTIVE, REPLICA_ACTIVE});
  *map.add_chains() = MakeChain(1, {REPLICA_ACTIVE, REPLICA_JOINING});
  absl::Status s = ChainsReady(map, 2, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(),
            "kvstore shard map version 7: shard 1: 1 of 2 replicas ACTIVE (replica 1 JOINING)");
  EXPECT_TRUE(ChainsReady(map, 2, 1).ok());
  EXPECT_EQ(ChainsReady(map, 3, 1).message(), "the shard map has 2 shards, not 3");
  map.mutable_chains(1)->mutable_members(1)->set_state(REPLICA_ACTIVE);
  EXPECT_TRUE(ChainsReady(map, 2, 2).ok());
}

}  // namespace
}  // namespace trainctl
}  // namespace dtrain
