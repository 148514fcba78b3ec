#include "libs/scheduler/kvstore_map.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace scheduler {
namespace {

using kvstore::v1::REPLICA_ACTIVE;
using kvstore::v1::REPLICA_JOINING;

const absl::Time kStart = absl::FromUnixSeconds(1000000);

// A replica as the owner sees it: it follows the map of its last reply and
// holds the state once ACTIVE there (or once told so: a finished transfer).
struct Replica {
  int shard = 0;
  int replica = 0;
  uint64_t incarnation = 0;
  ShardMap map;
  bool transferred = false;
  int caught_up_replica = 0;
  uint64_t caught_up_incarnation = 0;

  std::string address() const { return absl::StrCat("10.0.", shard, ".", replica, ":7000"); }

  bool ActiveInMap() const {
    for (const auto& c : map.chains()) {
      if (c.shard() != shard) continue;
      for (const ChainMember& m : c.members()) {
        if (m.replica() == replica && m.incarnation() == incarnation) {
          return m.state() == REPLICA_ACTIVE;
        }
      }
    }
    return false;
  }

  KvstoreHeartbeatRequest Request(int num_shards) const {
    KvstoreHeartbeatRequest r;
    r.set_shard(shard);
    r.set_replica(replica);
    r.set_address(address());
    r.set_incarnation(incarnation);
    *r.mutable_map() = map;
    r.set_has_state(ActiveInMap() || transferred);
    r.set_caught_up_replica(caught_up_replica);
    r.set_caught_up_incarnation(caught_up_incarnation);
    r.set_num_shards(num_shards);
    return r;
  }
};

class KvstoreMapTest : public ::testing::Test {
 protected:
  KvstoreMapTest() : owner_(std::make_unique<KvstoreMembership>(Options(), kStart)) {}

  static KvstoreMembershipOptions Options() {
    KvstoreMembershipOptions o;
    o.heartbeat_interval = absl::Milliseconds(200);
    o.heartbeat_timeout = absl::Seconds(2);
    o.startup_grace = absl::ZeroDuration();
    return o;
  }

  Replica* Add(int shard, int replica) {
    replicas_.push_back(std::make_unique<Replica>());
    Replica* r = replicas_.back().get();
    r->shard = shard;
    r->replica = replica;
    r->incarnation = next_incarnation_++;
    return r;
  }

  // One heartbeat of `r` at now_; it follows the reply's map.
  ShardMap Beat(Replica* r) {
    auto reply = owner_->Heartbeat(r->Request(num_shards_), now_);
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return ShardMap();
    EXPECT_EQ(reply->heartbeat_interval_ms(), 200);
    r->map = reply->map();
    return reply->map();
  }

  // Every replica in `rs` heartbeats once, `dt` after the previous round.
  ShardMap Round(const std::vector<Replica*>& rs, absl::Duration dt = absl::Milliseconds(200)) {
    now_ += dt;
    ShardMap m;
    for (Replica* r : rs) m = Beat(r);
    return m;
  }

  // "r0:A r1:J" for shard `shard` of the owner's map.
  std::string Chain(int shard) const {
    ShardMap m = owner_->Map();
    std::vector<std::string> parts;
    for (const auto& c : m.chains()) {
      if (c.shard() != shard) continue;
      for (const ChainMember& mem : c.members()) {
        parts.push_back(absl::StrCat("r", mem.replica(),
                                     mem.state() == REPLICA_ACTIVE    ? ":A"
                                     : mem.state() == REPLICA_JOINING ? ":J"
                                                                      : ":?"));
      }
    }
    return absl::StrJoin(parts, " ");
  }

  // `from` reports that it transferred its state to `to`.
  void CatchUp(Replica* from, Replica* to) {
    to->transferred = true;
    from->caught_up_replica = to->replica;
    from->caught_up_incarnation = to->incarnation;
    Beat(from);
    from->caught_up_replica = 0;
    from->caught_up_incarnation = 0;
  }

  uint64_t Version() const { return owner_->Map().version(); }

  int num_shards_ = 1;
  absl::Time now_ = kStart;
  uint64_t next_incarnation_ = 0x1000;
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::unique_ptr<KvstoreMembership> owner_;
};

TEST_F(KvstoreMapTest, BadInputNamesTheField) {
  num_shards_ = 2;
  Replica* a = Add(0, 0);
  Beat(a);
  struct Case {
    const char* field;
    std::function<void(KvstoreHeartbeatRequest*)> spoil;
  };
  const std::vector<Case> cases = {
      {"shard:", [](KvstoreHeartbeatRequest* r) { r->set_shard(-1); }},
      {"replica:", [](KvstoreHeartbeatRequest* r) { r->set_replica(-3); }},
      {"address:", [](KvstoreHeartbeatRequest* r) { r->clear_address(); }},
      {"incarnation:", [](KvstoreHeartbeatRequest* r) { r->set_incarnation(0); }},
      {"num_shards:", [](KvstoreHeartbeatRequest* r) { r->set_num_shards(0); }},
      {"shard:", [](KvstoreHeartbeatRequest* r) { r->set_shard(2); }},
      {"num_shards:",
       [](KvstoreHeartbeatRequest* r) {
         r->set_num_shards(3);  // the map has 2
       }},
      {"map.num_shards:",
       [](KvstoreHeartbeatRequest* r) {
         r->mutable_map()->set_version(99);
         r->mutable_map()->set_num_shards(5);
       }},
      {"map.chains[shard 0].members.address:",
       [](KvstoreHeartbeatRequest* r) {
         r->mutable_map()->set_version(99);
         r->mutable_map()->mutable_chains(0)->mutable_members(0)->clear_address();
       }},
  };
  const uint64_t version = Version();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    KvstoreHeartbeatRequest r = a->Request(num_shards_);
    c.spoil(&r);
    auto reply = owner_->Heartbeat(r, now_);
    ASSERT_FALSE(reply.ok());
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(reply.status().message().find(c.field), 0u) << reply.status();
  }
  EXPECT_EQ(Version(), version);
  EXPECT_EQ(Chain(0), "r0:A");
}

TEST_F(KvstoreMapTest, FirstReplicaIsActiveOthersJoinAndCatchUpInOrder) {
  num_shards_ = 2;
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Replica* c = Add(1, 0);
  EXPECT_EQ(Version(), 0u);
  ShardMap m = Round({a, b, c});
  EXPECT_EQ(m.num_shards(), 2);
  ASSERT_EQ(m.chains_size(), 2);
  EXPECT_EQ(m.chains(1).shard(), 1);
  EXPECT_EQ(Chain(0), "r0:A r1:J");
  EXPECT_EQ(Chain(1), "r0:A");
  EXPECT_EQ(Version(), 3u);  // one change per heartbeat that changed the map
  CatchUp(a, b);
  EXPECT_EQ(Chain(0), "r0:A r1:A");
  EXPECT_EQ(Version(), 4u);
  EXPECT_TRUE(b->map.version() < Version());
  Beat(b);  // follows the new map: ACTIVE there, has_state
  EXPECT_TRUE(b->ActiveInMap());
  EXPECT_EQ(Version(), 4u);
}

TEST_F(KvstoreMapTest, CaughtUpNeedsTheActivePredecessorAndTheIncarnation) {
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Replica* c = Add(0, 2);
  Round({a, b, c});
  EXPECT_EQ(Chain(0), "r0:A r1:J r2:J");
  const uint64_t v = Version();
  // b is JOINING: it cannot vouch for c.
  CatchUp(b, c);
  // a is not c's predecessor.
  CatchUp(a, c);
  // The right predecessor, an old incarnation of b.
  a->caught_up_replica = 1;
  a->caught_up_incarnation = b->incarnation + 77;
  Beat(a);
  a->caught_up_incarnation = 0;
  EXPECT_EQ(Chain(0), "r0:A r1:J r2:J");
  EXPECT_EQ(Version(), v);
  // Two JOINING members become ACTIVE one after the other.
  CatchUp(a, b);
  EXPECT_EQ(Chain(0), "r0:A r1:A r2:J");
  Beat(b);
  CatchUp(b, c);
  EXPECT_EQ(Chain(0), "r0:A r1:A r2:A");
  EXPECT_EQ(Version(), v + 2);
}

TEST_F(KvstoreMapTest, SteadyHeartbeatsNeverChangeTheVersion) {
  num_shards_ = 2;
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Replica* c = Add(1, 0);
  Replica* d = Add(1, 1);
  Round({a, b, c, d});
  CatchUp(a, b);
  CatchUp(c, d);
  Round({a, b, c, d});
  const uint64_t v = Version();
  const std::string before = owner_->Map().DebugString();
  for (int i = 0; i < 100; ++i) {
    // Jitter: some rounds come late, but never past the timeout.
    Round({d, a, c, b}, i % 7 == 0 ? absl::Milliseconds(1900) : absl::Milliseconds(200));
    owner_->Expire(now_);
  }
  EXPECT_EQ(Version(), v);
  EXPECT_EQ(owner_->Map().DebugString(), before);
  EXPECT_EQ(owner_->Stats().changes, v);
}

TEST_F(KvstoreMapTest, ReplicaRestartingFasterThanTheTimeoutRejoinsAsJoining) {
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Round({a, b});
  CatchUp(a, b);
  Round({a, b});
  EXPECT_EQ(Chain(0), "r0:A r1:A");
  // The head restarts: new incarnation, no state, no map, within 200 ms.
  a->incarnation = next_incarnation_++;
  a->map.Clear();
  const uint64_t v = Version();
  Round({a});
  EXPECT_EQ(Chain(0), "r1:A r0:J");
  EXPECT_EQ(Version(), v + 1);
  ShardMap m = owner_->Map();
  EXPECT_EQ(m.chains(0).members(1).incarnation(), a->incarnation);
  EXPECT_EQ(m.chains(0).members(1).address(), a->address());
  // Its new predecessor transfers the state; it is ACTIVE again, at the tail.
  Round({a, b});
  CatchUp(b, a);
  EXPECT_EQ(Chain(0), "r1:A r0:A");
}

TEST_F(KvstoreMapTest, ActiveMemberWithoutStateRejoins) {
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Round({a, b});
  CatchUp(a, b);
  Round({a, b});
  // a follows the map that made it ACTIVE and says it holds no state.
  KvstoreHeartbeatRequest r = a->Request(1);
  r.set_has_state(false);
  auto reply = owner_->Heartbeat(r, now_);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(Chain(0), "r1:A r0:J");
}

TEST_F(KvstoreMapTest, PromotedWithoutTransferIsNotALossUntilItSeesTheMap) {
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Round({a, b});
  EXPECT_EQ(Chain(0), "r0:A r1:J");
  // a dies before b caught up: b becomes ACTIVE (the shard's state is lost).
  for (int i = 0; i < 10; ++i) Round({b});
  EXPECT_EQ(Chain(0), "r1:A");
  const uint64_t v = Version();
  // b's map (of its previous beat) already shows it ACTIVE, so it holds the
  // (empty) state; but even a beat from the older map it followed before the
  // promotion must not count as a loss.
  KvstoreHeartbeatRequest old = b->Request(1);
  old.mutable_map()->set_version(v - 1);
  old.set_has_state(false);
  ASSERT_TRUE(owner_->Heartbeat(old, now_).ok());
  EXPECT_EQ(Chain(0), "r1:A");
  EXPECT_EQ(Version(), v);
}

TEST_F(KvstoreMapTest, TimeoutOfTheHeadMakesTheNextTheHead) {
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Replica* c = Add(0, 2);
  Round({a, b, c});
  CatchUp(a, b);
  Round({a, b, c});
  CatchUp(b, c);
  EXPECT_EQ(Chain(0), "r0:A r1:A r2:A");
  // a falls silent; b and c go on. Just under the timeout: still there.
  const absl::Time last_a = now_;
  while (now_ + absl::Milliseconds(200) - last_a < absl::Seconds(2)) Round({b, c});
  EXPECT_EQ(Chain(0), "r0:A r1:A r2:A");
  const uint64_t v = Version();
  Round({b, c});
  EXPECT_EQ(Chain(0), "r1:A r2:A");
  EXPECT_EQ(Version(), v + 1);
  // The tail goes silent too; Expire alone removes it.
  now_ += absl::Seconds(1);
  Beat(b);
  now_ += absl::Seconds(1);
  owner_->Expire(now_);
  EXPECT_EQ(Chain(0), "r1:A");
  EXPECT_EQ(Version(), v + 2);
  // a comes back (a new process): it joins behind b.
  a->incarnation = next_incarnation_++;
  a->map.Clear();
  Beat(a);
  EXPECT_EQ(Chain(0), "r1:A r0:J");
}

TEST_F(KvstoreMapTest, TwoJoiningBecomeActiveWhenTheOnlyActiveTimesOut) {
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Replica* c = Add(0, 2);
  Round({a, b, c});
  EXPECT_EQ(Chain(0), "r0:A r1:J r2:J");
  now_ += absl::Seconds(2);
  owner_->Expire(now_);  // every member is silent: the chain empties
  EXPECT_EQ(Chain(0), "");
  Round({a, b, c});
  EXPECT_EQ(Chain(0), "r0:A r1:J r2:J");
  for (int i = 0; i < 10; ++i) Round({b, c});
  EXPECT_EQ(Chain(0), "r1:A r2:A");
  // Both follow the map that made them ACTIVE now; no further change.
  const uint64_t v = Version();
  for (int i = 0; i < 5; ++i) Round({b, c});
  EXPECT_EQ(Version(), v);
}

TEST_F(KvstoreMapTest, SchedulerRestartAdoptsTheHighestVersion) {
  num_shards_ = 2;
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Replica* c = Add(1, 0);
  Replica* d = Add(1, 1);
  Round({a, b, c, d});
  CatchUp(a, b);
  Round({a, b, c, d});
  EXPECT_EQ(Chain(0), "r0:A r1:A");
  EXPECT_EQ(Chain(1), "r0:A r1:J");
  const ShardMap c_old = c->map;  // c will not see the next map
  const uint64_t v_old = c_old.version();
  CatchUp(c, d);
  c->map = c_old;
  Round({a, b, d});  // c has not seen the newest map yet
  const uint64_t v = Version();
  const std::string before = owner_->Map().DebugString();
  ASSERT_LT(v_old, v);
  // The scheduler restarts: a fresh owner, no map.
  now_ += absl::Seconds(1);
  owner_ = std::make_unique<KvstoreMembership>(Options(), now_);
  EXPECT_EQ(Version(), 0u);
  Beat(c);  // an older map: adopted for now
  EXPECT_EQ(Version(), v_old);
  EXPECT_EQ(Chain(1), "r0:A r1:J");
  Beat(a);  // the newest map wins
  EXPECT_EQ(Version(), v);
  EXPECT_EQ(owner_->Map().DebugString(), before);
  Round({a, b, c, d});
  EXPECT_EQ(Version(), v);
  // Every adopted member heartbeats: none expires.
  for (int i = 0; i < 20; ++i) Round({a, b, c, d});
  EXPECT_EQ(owner_->Map().DebugString(), before);
}

// A previous scheduler gave replica c a map (version v + 1) that the new
// owner never saw; the owner adopts v from a and its own next change is
// v + 1 too. c must not be left following its map: the owner raises the
// version, and c takes the owner's map.
TEST_F(KvstoreMapTest, SameVersionOtherMapRaisesTheVersion) {
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Replica* c = Add(0, 2);
  Round({a, b, c});
  CatchUp(a, b);
  Round({a, b, c});
  const ShardMap v_map = a->map;
  CatchUp(b, c);  // version v + 1: c ACTIVE; only b and c see it
  Beat(c);
  const uint64_t v = v_map.version();
  ASSERT_EQ(c->map.version(), v + 1);
  owner_ = std::make_unique<KvstoreMembership>(Options(), now_);
  a->map = v_map;
  Beat(a);  // adopts v: c JOINING there
  EXPECT_EQ(Version(), v);
  Replica* d = Add(0, 3);
  Beat(d);  // the owner's own version v + 1: d joins
  EXPECT_EQ(Version(), v + 1);
  EXPECT_EQ(Chain(0), "r0:A r1:A r2:J r3:J");
  ShardMap m = Beat(c);  // c's v + 1 differs from the owner's
  EXPECT_EQ(m.version(), v + 2);
  EXPECT_EQ(c->map.version(), v + 2);
  // From then on, steady.
  for (int i = 0; i < 5; ++i) Round({a, b, c, d});
  EXPECT_EQ(Version(), v + 2);
}

TEST_F(KvstoreMapTest, StartupGraceAdoptsRatherThanCreatingAnEmptyShard) {
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Round({a, b});
  CatchUp(a, b);
  Round({a, b});
  // The scheduler and b restart together; b beats first.
  KvstoreMembershipOptions o = Options();
  o.startup_grace = absl::Seconds(2);
  owner_ = std::make_unique<KvstoreMembership>(o, now_);
  b->incarnation = next_incarnation_++;
  b->map.Clear();
  ShardMap m = Round({b});
  EXPECT_EQ(m.version(), 0u);
  EXPECT_EQ(Chain(0), "");  // not an empty ACTIVE shard
  Round({a});
  EXPECT_EQ(Chain(0), "r0:A r1:A");
  Round({b});  // b restarted: it rejoins behind a, which holds the state
  EXPECT_EQ(Chain(0), "r0:A r1:J");
  // Without a replica with a map, the grace ends and the shard starts empty.
  owner_ = std::make_unique<KvstoreMembership>(o, now_);
  a->map.Clear();
  a->incarnation = next_incarnation_++;
  Round({a});
  EXPECT_EQ(Chain(0), "");
  for (int i = 0; i < 10; ++i) Round({a});
  EXPECT_EQ(Chain(0), "r0:A");
}

TEST_F(KvstoreMapTest, AddressChangeIsAMapChange) {
  Replica* a = Add(0, 0);
  Round({a});
  const uint64_t v = Version();
  KvstoreHeartbeatRequest r = a->Request(1);
  r.set_address("10.9.9.9:7001");
  ASSERT_TRUE(owner_->Heartbeat(r, now_).ok());
  EXPECT_EQ(Version(), v + 1);
  EXPECT_EQ(owner_->Map().chains(0).members(0).address(), "10.9.9.9:7001");
}

TEST_F(KvstoreMapTest, StatsCountMembersByState) {
  num_shards_ = 2;
  Replica* a = Add(0, 0);
  Replica* b = Add(0, 1);
  Replica* c = Add(1, 0);
  Round({a, b, c});
  KvstoreMembershipStats st = owner_->Stats();
  EXPECT_EQ(st.version, Version());
  ASSERT_EQ(st.replicas.size(), 2u);
  EXPECT_EQ(st.replicas[0].first, 0);
  EXPECT_EQ(st.replicas[0].second, std::make_pair(1, 1));
  EXPECT_EQ(st.replicas[1].second, std::make_pair(1, 0));
}

TEST_F(KvstoreMapTest, ConcurrentHeartbeatsKeepOneChainPerShard) {
  num_shards_ = 4;
  std::vector<Replica*> rs;
  for (int s = 0; s < 4; ++s) {
    for (int r = 0; r < 3; ++r) rs.push_back(Add(s, r));
  }
  std::vector<std::thread> threads;
  for (Replica* r : rs) {
    threads.emplace_back([this, r] {
      for (int i = 0; i < 50; ++i) {
        auto reply = owner_->Heartbeat(r->Request(4), kStart + absl::Milliseconds(i));
        EXPECT_TRUE(reply.ok()) << reply.status();
        if (reply.ok()) r->map = reply->map();
      }
    });
  }
  for (auto& t : threads) t.join();
  ShardMap m = owner_->Map();
  ASSERT_EQ(m.chains_size(), 4);
  for (const auto& c : m.chains()) {
    ASSERT_EQ(c.members_size(), 3) << c.DebugString();
    EXPECT_EQ(c.members(0).state(), REPLICA_ACTIVE);
    EXPECT_EQ(c.members(1).state(), REPLICA_JOINING);
    EXPECT_EQ(c.members(2).state(), REPLICA_JOINING);
  }
  EXPECT_EQ(m.version(), 12u);
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
