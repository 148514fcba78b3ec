// Replicator: chains of replicas in one process, connected by a link that
// calls the successor's Receive directly (the gRPC link is tested end to end
// in //services/kvstore:replication_test and tests/e2e). Each replica has its
// own Store; the tests compare the stores' exported state bit for bit.
#include "libs/kvstore/replicator.h"

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/kvstore/proto_convert.h"
#include "libs/kvstore/shard_map.h"

namespace dtrain {
namespace kvstore {
namespace {

// Delivers batches to replicas of this process; addresses in `down` fail.
class Link : public ReplicaLink {
 public:
  // Values that travel apart are handed over as they came (the data port's
  // way); the parsed batch is what a successor would get.
  absl::StatusOr<v1::ReplicateReply> Replicate(
      const std::string& address, const std::string& bytes,
      const std::vector<absl::string_view>& values) override {
    v1::ReplicateBatch batch;
    if (!batch.ParseFromString(bytes)) return absl::InvalidArgumentError("bad batch");
    absl::Notification* gate;
    {
      absl::MutexLock lock(&mu_);
      gate = gates_.back().get();
    }
    gate->WaitForNotification();
    Replicator* to = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (down_.count(address)) return absl::UnavailableError(absl::StrCat(address, " is down"));
      auto it = replicas_.find(address);
      if (it == replicas_.end()) return absl::UnavailableError(absl::StrCat("no ", address));
      to = it->second;
      ++batches_;
      last_sender_ = std::this_thread::get_id();
    }
    return to->Receive(batch, absl::Now() + absl::Seconds(10), values);
  }
  void Add(const std::string& address, Replicator* r) {
    absl::MutexLock lock(&mu_);
    replicas_[address] = r;
  }
  void SetDown(const std::string& address, bool down) {
    absl::MutexLock lock(&mu_);
    if (down) {
      down_.insert(address);
    } else {
      down_.erase(address);
    }
  }
  // Holds every batch until Open() (called once).
  void Close() {
    absl::MutexLock lock(&mu_);
    gates_.push_back(std::make_unique<absl::Notification>());
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    gates_.back()->Notify();
  }
  int batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  // The thread that sent the last batch.
  std::thread::id last_sender() {
    absl::MutexLock lock(&mu_);
    return last_sender_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, Replicator*> replicas_;
  std::set<std::string> down_;
  std::vector<std::unique_ptr<absl::Notification>> gates_ = Opened();
  static std::vector<std::unique_ptr<absl::Notification>> Opened() {
    std::vector<std::unique_ptr<absl::Notification>> gates;
    gates.push_back(std::make_unique<absl::Notification>());
    gates.back()->Notify();
    return gates;
  }
  int batches_ = 0;
  std::thread::id last_sender_;
};

struct Node {
  explicit Node(Link* link, int replica)
      : store(StoreOptions()),
        replicator(&store, link, {0, replica, static_cast<uint64_t>(100 + replica)}) {}
  Store store;
  Replicator replicator;
};

// A map of shard 0 with the given (replica, state) members in order.
v1::ShardMap Map(uint64_t version, const std::vector<std::pair<int, v1::ReplicaState>>& members) {
  v1::ShardMap map;
  map.set_version(version);
  map.set_num_shards(1);
  v1::Chain* chain = map.add_chains();
  chain->set_shard(0);
  for (const auto& [replica, state] : members) {
    v1::ChainMember* m = chain->add_members();
    m->set_replica(replica);
    m->set_address(absl::StrCat("r", replica));
    m->set_state(state);
    m->set_incarnation(static_cast<uint64_t>(100 + replica));
  }
  return map;
}

constexpr auto kActive = v1::REPLICA_ACTIVE;
constexpr auto kJoining = v1::REPLICA_JOINING;

v1::Mutation CreateJob(int workers, Consistency consistency) {
  JobConfig c;
  c.job = "j";
  c.num_workers = workers;
  c.consistency = consistency;
  c.optimizer = OptimizerKind::kSgd;
  c.learning_rate = 0.1;
  c.momentum = 0.9;
  v1::Mutation m;
  *m.mutable_create_job()->mutable_config() = ToProto(c);
  return m;
}

v1::Mutation Init(int64_t n) {
  SliceSpec spec;
  spec.key = "w";
  spec.shape = {n};
  spec.count = n;
  v1::Mutation m;
  m.mutable_init()->set_job("j");
  *m.mutable_init()->add_slices() = ToProto(spec);
  std::vector<float> init(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) init[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i);
  v1::Chunk* c = m.mutable_init()->add_chunks();
  c->set_item(0);
  c->set_data(std::string(reinterpret_cast<const char*>(init.data()), init.size() * 4));
  return m;
}

v1::Mutation Push(int worker, int64_t round, int64_t n) {
  v1::Mutation m;
  v1::ReplicatedPush* p = m.mutable_push();
  p->set_job("j");
  p->set_worker(worker);
  v1::PushItem* item = p->add_items();
  item->set_key("w");
  item->set_round(round);
  item->set_dtype(static_cast<int>(DType::kF32));
  item->add_shape(n);
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    g[static_cast<size_t>(i)] = 1.0f / static_cast<float>(1 + worker + i % 7) + 1e-3f * round;
  }
  p->add_data(std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4));
  return m;
}

// The store's whole state as bytes (config, rounds, values, momentum).
std::string Fingerprint(const Store& store) {
  std::string out;
  for (const JobState& job : store.Export()) {
    absl::StrAppend(&out, DescribeJobConfig(job.config), "\n");
    for (const SliceState& s : job.slices) {
      absl::StrAppend(&out, DescribeSlice(s.spec), " completed=", s.completed_round,
                      " pending=", s.pending, " pushed=");
      for (int64_t r : s.pushed) absl::StrAppend(&out, r, ",");
      out.append(reinterpret_cast<const char*>(s.value->data()), s.value->size() * 4);
      if (s.momentum) {
        out.append(reinterpret_cast<const char*>(s.momentum->data()), s.momentum->size() * 4);
      }
    }
  }
  return out;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

class ReplicatorTest : public ::testing::Test {
 protected:
  Node& Add(int replica) {
    nodes_[replica] = std::make_unique<Node>(&link_, replica);
    link_.Add(absl::StrCat("r", replica), &nodes_[replica]->replicator);
    return *nodes_[replica];
  }
  void SetMap(const v1::ShardMap& map) {
    for (auto& [replica, node] : nodes_) node->replicator.SetMap(map);
  }
  // Waits until `from` acknowledged its state transfer to `to`.
  bool WaitCaughtUp(int from, int to) {
    for (absl::Time end = Soon(); absl::Now() < end; absl::SleepFor(absl::Milliseconds(2))) {
      if (nodes_[from]->replicator.caught_up().first == to) return true;
    }
    return false;
  }

  // Replicas 0 -> 1 in a chain (the successor caught up) holding job "j"
  // (`workers` workers) and its key "w" of 64 floats, made through the head.
  void ChainOfTwoWithAJob(int workers, Consistency consistency) {
    Node& head = Add(0);
    Add(1);
    SetMap(Map(1, {{0, kActive}, {1, kActive}}));
    ASSERT_TRUE(WaitCaughtUp(0, 1));
    ASSERT_TRUE(head.replicator.Submit(CreateJob(workers, consistency), Soon()).ok());
    ASSERT_TRUE(head.replicator.Submit(Init(64), Soon()).ok());
  }

  Link link_;
  std::map<int, std::unique_ptr<Node>> nodes_;
};

TEST_F(ReplicatorTest, EveryAcknowledgedWriteIsOnEveryReplicaInTheHeadsOrder) {
  Node& a = Add(0);
  Node& b = Add(1);
  Node& c = Add(2);
  SetMap(Map(1, {{0, kActive}, {1, kActive}, {2, kActive}}));
  // A new successor first gets the (here empty) state.
  ASSERT_TRUE(WaitCaughtUp(0, 1));
  ASSERT_TRUE(WaitCaughtUp(1, 2));
  ASSERT_TRUE(a.replicator.Submit(CreateJob(3, Consistency::kAsync), Soon()).ok());
  ASSERT_TRUE(a.replicator.Submit(Init(1000), Soon()).ok());
  // Three workers push concurrently: ASYNC applies each push on arrival,
  // so the values depend on the order (floating-point sums); every replica
  // must have applied them in the head's order.
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&, w] {
      for (int64_t round = 1; round <= 40; ++round) {
        absl::StatusOr<MutationResult> r = a.replicator.Submit(Push(w, round, 1000), Soon());
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->push.applied, 1);
      }
    });
  }
  for (std::thread& t : workers) t.join();
  // Acknowledged means applied on the tail already: no waiting here.
  const std::string head = Fingerprint(a.store);
  EXPECT_EQ(Fingerprint(b.store), head);
  EXPECT_EQ(Fingerprint(c.store), head);
  // (b may have sent c its state once more when a's transfer reached it
  // after b's own: that second transfer covers the job's creation.)
  EXPECT_GE(c.replicator.stats().received, 120);
  EXPECT_EQ(a.replicator.stats().forwarded, 2 + 120);
}

TEST_F(ReplicatorTest, WritesQueuedWhileABatchIsInFlightGoTogether) {
  ChainOfTwoWithAJob(8, Consistency::kAsync);
  ASSERT_FALSE(HasFatalFailure());
  Node& a = *nodes_[0];
  const int before = link_.batches();
  link_.Close();
  std::vector<std::thread> workers;
  for (int w = 0; w < 8; ++w) {
    workers.emplace_back([&, w] { EXPECT_TRUE(a.replicator.Submit(Push(w, 1, 64), Soon()).ok()); });
  }
  // Every push is applied at the head and queued; none is acknowledged.
  for (absl::Time end = Soon(); absl::Now() < end; absl::SleepFor(absl::Milliseconds(1))) {
    if (a.store.GetJob("j", 7, true)->slices[0].completed_round == 1) break;
  }
  EXPECT_EQ(a.replicator.stats().forwarded, 2);
  link_.Open();
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(a.replicator.stats().forwarded, 2 + 8);
  // The first push's batch was held at the gate; the other seven followed in
  // one more batch (or two, if the forwarder took the first before the
  // second was queued and one more arrived meanwhile).
  EXPECT_LE(link_.batches() - before, 3);
}

TEST_F(ReplicatorTest, TheThreadThatAppliesAWriteSendsItWhenNoBatchIsInFlight) {
  ChainOfTwoWithAJob(2, Consistency::kSync);
  ASSERT_FALSE(HasFatalFailure());
  Node& a = *nodes_[0];
  Node& b = *nodes_[1];
  // No hand-off to the forwarder: the batch left from this thread.
  EXPECT_EQ(link_.last_sender(), std::this_thread::get_id());
  Replicator::Ack ack;
  ASSERT_TRUE(a.replicator.Apply(Push(0, 1, 64), &ack).ok());
  EXPECT_EQ(link_.last_sender(), std::this_thread::get_id());
  EXPECT_TRUE(ack.Wait(absl::Now()).ok());  // acknowledged on the way
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
}

TEST_F(ReplicatorTest, AnAckAndAppliedSoFarCompleteOnlyOnceTheChainHoldsTheWrites) {
  ChainOfTwoWithAJob(2, Consistency::kSync);
  ASSERT_FALSE(HasFatalFailure());
  Node& a = *nodes_[0];
  Node& b = *nodes_[1];
  link_.Close();
  // Worker 0's push: its thread sends it and waits at the closed gate.
  std::thread first([&] { EXPECT_TRUE(a.replicator.Submit(Push(0, 1, 64), Soon()).ok()); });
  for (absl::Time end = Soon(); absl::Now() < end; absl::SleepFor(absl::Milliseconds(1))) {
    if (a.store.GetJob("j", 0, true)->slices[0].pushed_round == 1) break;
  }
  // Worker 1's push completes the round at the head; Apply returns with it
  // applied there (a batch is in flight, so it is only queued).
  Replicator::Ack ack;
  absl::StatusOr<MutationResult> applied = a.replicator.Apply(Push(1, 1, 64), &ack);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->push.applied, 1);
  EXPECT_EQ(a.store.GetJob("j", 1, true)->slices[0].completed_round, 1);
  // Neither the write nor a read of the round may be answered yet: the
  // successor lacks both pushes.
  const absl::Status early = ack.Wait(absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(early)) << early;
  const absl::Status read = a.replicator.AppliedSoFar().Wait(absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(read)) << read;
  EXPECT_EQ(b.store.GetJob("j", 1, true)->slices[0].completed_round, 0);
  link_.Open();
  first.join();
  EXPECT_TRUE(ack.Wait(Soon()).ok());
  EXPECT_TRUE(a.replicator.AppliedSoFar().Wait(Soon()).ok());
  EXPECT_EQ(b.store.GetJob("j", 1, true)->slices[0].completed_round, 1);
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
  // The tail holds only what every replica holds: its reads wait for
  // nothing.
  EXPECT_TRUE(b.replicator.AppliedSoFar().Wait(absl::Now()).ok());
}

// A push-pull's push that completes no round (Apply's
// hold_incomplete) waits at the head for the round's last push: the round
// reaches the successor in one batch. Reads do not wait for the held push
// (no read sees an incomplete round).
TEST_F(ReplicatorTest, AHeldPushGoesDownTheChainWithThePushThatCompletesItsRound) {
  ChainOfTwoWithAJob(2, Consistency::kSync);
  ASSERT_FALSE(HasFatalFailure());
  Node& a = *nodes_[0];
  Node& b = *nodes_[1];
  const int before = link_.batches();
  Replicator::Ack held;
  absl::StatusOr<MutationResult> first = a.replicator.Apply(Push(0, 1, 64), &held, {}, true);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->push.incomplete, 1);
  EXPECT_EQ(link_.batches(), before);  // not sent
  EXPECT_TRUE(absl::IsDeadlineExceeded(held.Wait(absl::Now() + absl::Milliseconds(1))));
  EXPECT_TRUE(a.replicator.AppliedSoFar().Wait(absl::Now()).ok());
  EXPECT_EQ(b.store.GetJob("j", 0, true)->slices[0].pushed_round, 0);
  // The round's last push sends the queue: both pushes, one batch.
  Replicator::Ack last;
  absl::StatusOr<MutationResult> second = a.replicator.Apply(Push(1, 1, 64), &last, {}, true);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->push.incomplete, 0);
  EXPECT_EQ(link_.batches(), before + 1);
  EXPECT_TRUE(held.Wait(absl::Now()).ok());
  EXPECT_TRUE(last.Wait(absl::Now()).ok());
  EXPECT_TRUE(a.replicator.WaitHeld(held, absl::Now()).ok());
  EXPECT_EQ(b.store.GetJob("j", 1, true)->slices[0].completed_round, 1);
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
}

// A push that completes one key's round and leaves another's incomplete is
// not held: the completed round's values must reach the chain before a read
// of them is answered.
TEST_F(ReplicatorTest, APushThatCompletesARoundIsNeverHeld) {
  ChainOfTwoWithAJob(2, Consistency::kSync);
  ASSERT_FALSE(HasFatalFailure());
  Node& a = *nodes_[0];
  Node& b = *nodes_[1];
  v1::Mutation init_v = Init(64);
  init_v.mutable_init()->mutable_slices(0)->set_key("v");
  ASSERT_TRUE(a.replicator.Submit(init_v, Soon()).ok());
  Replicator::Ack first;
  ASSERT_TRUE(a.replicator.Apply(Push(0, 1, 64), &first).ok());  // w, worker 0
  v1::Mutation both = Push(1, 1, 64);                            // w completes, v does not
  *both.mutable_push()->add_items() = both.push().items(0);
  both.mutable_push()->mutable_items(1)->set_key("v");
  *both.mutable_push()->add_data() = both.push().data(0);
  const int before = link_.batches();
  Replicator::Ack ack;
  absl::StatusOr<MutationResult> r = a.replicator.Apply(both, &ack, {}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->push.applied, 2);
  EXPECT_EQ(r->push.incomplete, 1);
  EXPECT_EQ(link_.batches(), before + 1);  // sent at once
  EXPECT_TRUE(ack.Wait(absl::Now()).ok());
  EXPECT_EQ(b.store.GetJob("j", 1, true)->slices[1].completed_round, 1);
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
}

// A round whose other workers never push: WaitHeld sends the held push
// itself once the hold ran out, and returns once the chain holds it.
TEST_F(ReplicatorTest, AHeldPushWhoseRoundDoesNotCompleteIsSentAfterTheHold) {
  ChainOfTwoWithAJob(3, Consistency::kSync);
  ASSERT_FALSE(HasFatalFailure());
  Node& a = *nodes_[0];
  Node& b = *nodes_[1];
  Replicator::Ack held;
  ASSERT_TRUE(a.replicator.Apply(Push(0, 1, 64), &held, {}, true).ok());
  const absl::Time start = absl::Now();
  const absl::Status s = a.replicator.WaitHeld(held, Soon());
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_GE(absl::Now() - start, ReplicatorOptions().round_hold);
  EXPECT_EQ(b.store.GetJob("j", 0, true)->slices[0].pushed_round, 1);
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
  // Without hold_incomplete a push goes at once, complete round or not.
  const int before = link_.batches();
  Replicator::Ack ack;
  absl::StatusOr<MutationResult> r = a.replicator.Apply(Push(1, 1, 64), &ack);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->push.incomplete, 1);  // worker 2 is still to push
  EXPECT_EQ(link_.batches(), before + 1);
  EXPECT_TRUE(ack.Wait(absl::Now()).ok());
}

// A push applied with referenced values (the data port's segment): Detach
// waits while its batch is being sent, and copies the values of one still
// queued, so the caller may reuse its buffer.
TEST_F(ReplicatorTest, DetachWaitsForTheSendAndCopiesWhatIsStillQueued) {
  ChainOfTwoWithAJob(2, Consistency::kAsync);
  ASSERT_FALSE(HasFatalFailure());
  Node& a = *nodes_[0];
  Node& b = *nodes_[1];
  auto by_reference = [](int worker, std::string* bytes) {
    v1::Mutation m = Push(worker, 1, 64);
    *bytes = m.push().data(0);
    m.mutable_push()->clear_data();
    m.mutable_push()->add_data_bytes(static_cast<int64_t>(bytes->size()));
    return m;
  };
  std::string first_bytes, second_bytes;
  v1::Mutation first = by_reference(0, &first_bytes);
  v1::Mutation second = by_reference(1, &second_bytes);
  link_.Close();
  // Worker 0's push: its thread sends it and waits at the closed gate.
  std::thread sender([&] {
    Replicator::Ack ack;
    EXPECT_TRUE(a.replicator.Apply(first, &ack, {first_bytes}).ok());
    EXPECT_TRUE(ack.Wait(Soon()).ok());
  });
  for (absl::Time end = Soon(); absl::Now() < end; absl::SleepFor(absl::Milliseconds(1))) {
    if (a.store.GetJob("j", 0, true)->slices[0].pushed_round == 1) break;
  }
  // Its values are being read: Detach waits.
  absl::Notification detached_first;
  const Replicator::Ack first_ack = a.replicator.AppliedSoFar();  // worker 0's push
  std::thread detacher([&] {
    a.replicator.Detach(first_ack);
    detached_first.Notify();
  });
  // Worker 1's push is only queued: Detach copies it at once.
  Replicator::Ack ack;
  ASSERT_TRUE(a.replicator.Apply(second, &ack, {second_bytes}).ok());
  a.replicator.Detach(ack);
  const std::string sent_second = second_bytes;
  second_bytes.assign(second_bytes.size(), '\xff');  // the caller reuses its buffer
  EXPECT_FALSE(detached_first.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  link_.Open();
  sender.join();
  detacher.join();
  EXPECT_TRUE(detached_first.HasBeenNotified());
  EXPECT_TRUE(ack.Wait(Soon()).ok());
  // The successor got the bytes as they were when applied.
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
}

TEST_F(ReplicatorTest, ABatchWhoseValuesDisagreeWithItsPushesIsRefusedWhole) {
  ChainOfTwoWithAJob(2, Consistency::kAsync);
  ASSERT_FALSE(HasFatalFailure());
  Node& a = *nodes_[0];
  Node& b = *nodes_[1];
  const std::string before = Fingerprint(b.store);
  // Two pushes whose values travel apart: 256 bytes each named.
  v1::ReplicateBatch batch;
  batch.set_map_version(1);
  batch.set_shard(0);
  batch.set_from_replica(0);
  batch.set_from_incarnation(100);
  for (int w = 0; w < 2; ++w) {
    v1::Mutation m = Push(w, 1, 64);
    m.mutable_push()->clear_data();
    m.mutable_push()->add_data_bytes(256);
    *batch.add_mutations() = m;
  }
  const std::string good(256, '\0'), short_value(128, '\0');
  for (const std::vector<absl::string_view>& values :
       {std::vector<absl::string_view>{good}, std::vector<absl::string_view>{good, short_value},
        std::vector<absl::string_view>{good, good, good}}) {
    absl::StatusOr<v1::ReplicateReply> r = b.replicator.Receive(batch, Soon(), values);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_TRUE(absl::IsInvalidArgument(InlineValues(batch.SerializeAsString(), values).status()));
  }
  EXPECT_EQ(Fingerprint(b.store), before);  // not even the first push
  // The right values: both applied, as if they had been inside the batch.
  absl::StatusOr<v1::ReplicateBatch> whole = InlineValues(batch.SerializeAsString(), {good, good});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->mutations(1).push().data(0), good);
  EXPECT_EQ(whole->mutations(1).push().data_bytes_size(), 0);
  absl::StatusOr<v1::ReplicateReply> r = b.replicator.Receive(batch, Soon(), {good, good});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->codes_size(), 2);
  EXPECT_EQ(r->codes(0), 0);
  EXPECT_EQ(r->codes(1), 0);
}

TEST_F(ReplicatorTest, OnlyTheHeadTakesWritesAndOnlyActiveMembersServeReads) {
  Node& a = Add(0);
  Node& b = Add(1);
  SetMap(Map(1, {{0, kActive}, {1, kJoining}}));
  absl::StatusOr<MutationResult> r = b.replicator.Submit(CreateJob(1, Consistency::kSync), Soon());
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("not the head"), std::string::npos) << r.status();
  EXPECT_TRUE(a.replicator.CheckServesReads().ok());
  EXPECT_TRUE(absl::IsUnavailable(b.replicator.CheckServesReads()));
  // A batch from a replica that is not the predecessor is refused.
  v1::ReplicateBatch forged;
  forged.set_map_version(1);
  forged.set_from_replica(7);
  *forged.add_mutations() = CreateJob(1, Consistency::kSync);
  EXPECT_TRUE(absl::IsUnavailable(b.replicator.Receive(forged, Soon()).status()));
  EXPECT_TRUE(b.store.JobNames().empty());
  // A replica that is not in the map (a restarted process: another
  // incarnation) serves nothing.
  v1::ShardMap other = Map(2, {{0, kActive}, {5, kActive}});
  other.mutable_chains(0)->mutable_members(1)->set_incarnation(999);
  Node restarted(&link_, 5);
  restarted.replicator.SetMap(other);
  EXPECT_TRUE(absl::IsUnavailable(restarted.replicator.CheckServesReads()));
}

TEST_F(ReplicatorTest, AJoiningReplicaGetsTheStateThenEveryLaterWrite) {
  Node& a = Add(0);
  SetMap(Map(1, {{0, kActive}}));
  ASSERT_TRUE(a.replicator.Submit(CreateJob(2, Consistency::kSync), Soon()).ok());
  ASSERT_TRUE(a.replicator.Submit(Init(4096), Soon()).ok());
  for (int64_t round = 1; round <= 3; ++round) {
    ASSERT_TRUE(a.replicator.Submit(Push(0, round, 4096), Soon()).ok());
    ASSERT_TRUE(a.replicator.Submit(Push(1, round, 4096), Soon()).ok());
  }
  ASSERT_TRUE(a.replicator.Submit(Push(0, 4, 4096), Soon()).ok());  // a round half done
  Node& b = Add(1);
  SetMap(Map(2, {{0, kActive}, {1, kJoining}}));
  ASSERT_TRUE(WaitCaughtUp(0, 1));
  EXPECT_EQ(a.replicator.caught_up().second, 101u);
  EXPECT_TRUE(b.replicator.has_state());
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
  EXPECT_EQ(a.replicator.stats().transfers, 1);
  EXPECT_GE(a.replicator.stats().transfer_bytes, 4096 * 4 * 2);  // values and momentum
  // Training goes on: later writes reach the joined replica.
  ASSERT_TRUE(a.replicator.Submit(Push(1, 4, 4096), Soon()).ok());
  SetMap(Map(3, {{0, kActive}, {1, kActive}}));
  ASSERT_TRUE(a.replicator.Submit(Push(0, 5, 4096), Soon()).ok());
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
  EXPECT_TRUE(b.replicator.CheckServesReads().ok());
}

TEST_F(ReplicatorTest, AWriteWaitsForADeadSuccessorUntilTheMapDropsIt) {
  Node& a = Add(0);
  Node& b = Add(1);
  SetMap(Map(1, {{0, kActive}, {1, kActive}}));
  ASSERT_TRUE(a.replicator.Submit(CreateJob(1, Consistency::kSync), Soon()).ok());
  ASSERT_TRUE(a.replicator.Submit(Init(16), Soon()).ok());
  link_.SetDown("r1", true);
  absl::StatusOr<MutationResult> pushed;
  absl::Notification done;
  std::thread writer([&] {
    pushed = a.replicator.Submit(Push(0, 1, 16), Soon());
    done.Notify();
  });
  // Not acknowledged while a live replica of the chain lacks it.
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  EXPECT_GT(a.replicator.stats().send_failures, 0);
  // The owner drops the dead replica: the head is the tail now.
  a.replicator.SetMap(Map(2, {{0, kActive}}));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  writer.join();
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->push.applied, 1);
  EXPECT_EQ(b.store.GetJob("j", 0, true)->slices[0].completed_round, 0);
  // It comes back (a new process would; here the same one rejoins): the
  // transfer brings it the push it missed.
  link_.SetDown("r1", false);
  SetMap(Map(3, {{0, kActive}, {1, kJoining}}));
  ASSERT_TRUE(WaitCaughtUp(0, 1));
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
}

TEST_F(ReplicatorTest, ARetriedPushAfterTheHeadDiedIsNotAppliedTwice) {
  Node& a = Add(0);
  Node& b = Add(1);
  SetMap(Map(1, {{0, kActive}, {1, kActive}}));
  ASSERT_TRUE(a.replicator.Submit(CreateJob(1, Consistency::kAsync), Soon()).ok());
  ASSERT_TRUE(a.replicator.Submit(Init(64), Soon()).ok());
  ASSERT_TRUE(a.replicator.Submit(Push(0, 1, 64), Soon()).ok());
  const std::string before = Fingerprint(b.store);
  // The head dies after the tail applied round 1 but (say) before its reply
  // reached the client, which retries round 1 at the new head.
  b.replicator.SetMap(Map(2, {{1, kActive}}));
  absl::StatusOr<MutationResult> retried = b.replicator.Submit(Push(0, 1, 64), Soon());
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->push.applied, 0);
  EXPECT_EQ(retried->push.duplicates, 1);
  EXPECT_EQ(Fingerprint(b.store), before);
  // The next round is applied once.
  ASSERT_TRUE(b.replicator.Submit(Push(0, 2, 64), Soon()).ok());
  EXPECT_EQ(b.store.GetJob("j", 0, true)->slices[0].completed_round, 2);
}

TEST_F(ReplicatorTest, ARefusedWriteChangesNothingAnywhere) {
  Node& a = Add(0);
  Node& b = Add(1);
  SetMap(Map(1, {{0, kActive}, {1, kActive}}));
  ASSERT_TRUE(WaitCaughtUp(0, 1));
  ASSERT_TRUE(a.replicator.Submit(CreateJob(1, Consistency::kSync), Soon()).ok());
  ASSERT_TRUE(a.replicator.Submit(Init(16), Soon()).ok());
  absl::StatusOr<MutationResult> r = a.replicator.Submit(Push(0, 3, 16), Soon());  // skips rounds
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
  EXPECT_EQ(a.replicator.stats().forwarded, 2);
  EXPECT_EQ(Fingerprint(b.store), Fingerprint(a.store));
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
