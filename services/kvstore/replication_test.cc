// Replicated shards over real gRPC on loopback: two KVStoreServers as the
// replicas of one shard, KVClients with replicas = 2, and a stand-in for the
// scheduler's ClusterService that publishes the shard map this test writes
// (the map's real owner, libs/scheduler/kvstore_map.h, is tested on its own
// and with real processes in tests/e2e). Checks: every value equals an
// unreplicated run's bit for bit; the head's loss mid-job is survived with
// no push lost or applied twice; a new replica catches up while training
// goes on. With security on: a chain on one host replicates over the
// successor's Unix socket (its replica ticket lets the predecessor in).
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/kvstore/client.h"
#include "libs/kvstore/data_port.h"
#include "libs/kvstore/shard_map.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"
#include "libs/security/certs.h"
#include "protos/scheduler.grpc.pb.h"
#include "services/kvstore/server.h"

namespace dtrain {
namespace kvstore {
namespace {

// The scheduler's side of the map, reduced to what the test says.
class MapOwner final : public scheduler::v1::ClusterService::Service {
 public:
  grpc::Status KvstoreHeartbeat(grpc::ServerContext*, const v1::KvstoreHeartbeatRequest* request,
                                v1::KvstoreHeartbeatReply* reply) override {
    absl::MutexLock lock(&mu_);
    last_[request->replica()] = *request;
    auto held = held_.find(request->replica());
    *reply->mutable_map() = held != held_.end() ? held->second : map_;
    reply->set_heartbeat_interval_ms(interval_ms_);
    return grpc::Status::OK;
  }
  // The heartbeat interval the next replies give (50 ms at first).
  void SetInterval(absl::Duration interval) {
    absl::MutexLock lock(&mu_);
    interval_ms_ = absl::ToInt64Milliseconds(interval);
  }
  void Publish(v1::ShardMap map) {
    absl::MutexLock lock(&mu_);
    map.set_version(map_.version() + 1);
    map.set_num_shards(1);
    map_ = std::move(map);
  }
  // Until Release, `replica`'s heartbeats get the map as it is now, not
  // later ones: a test decides which replica learns a new map first.
  void Hold(int replica) {
    absl::MutexLock lock(&mu_);
    held_[replica] = map_;
  }
  void Release(int replica) {
    absl::MutexLock lock(&mu_);
    held_.erase(replica);
  }
  // The replica's latest heartbeat, waiting for one that satisfies `done`.
  v1::KvstoreHeartbeatRequest Await(
      int replica, const std::function<bool(const v1::KvstoreHeartbeatRequest&)>& done) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = last_.find(replica);
      return it != last_.end() && done(it->second);
    };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(20)))
        << "replica " << replica;
    return last_[replica];
  }

 private:
  absl::Mutex mu_;
  v1::ShardMap map_;
  std::map<int, v1::ShardMap> held_;  // by replica
  std::map<int, v1::KvstoreHeartbeatRequest> last_;
  int64_t interval_ms_ ABSL_GUARDED_BY(mu_) = 50;
};

v1::ChainMember Member(const v1::KvstoreHeartbeatRequest& hb, v1::ReplicaState state) {
  v1::ChainMember m;
  m.set_replica(hb.replica());
  m.set_address(hb.address());
  m.set_incarnation(hb.incarnation());
  m.set_state(state);
  return m;
}

v1::ShardMap Chain(std::vector<v1::ChainMember> members) {
  v1::ShardMap map;
  v1::Chain* c = map.add_chains();
  c->set_shard(0);
  for (v1::ChainMember& m : members) *c->add_members() = std::move(m);
  return map;
}

constexpr int64_t kSmall = 1000;
constexpr int64_t kLarge = 400000;  // 1.6 MB: streamed in chunks

float Grad(int worker, int round, int64_t i) {
  return 0.001f * static_cast<float>((worker * 131 + round * 17 + i) % 97) - 0.04f;
}

// The tail's count of push-pulls it answered (v1::AnswerAt), by result,
// once it reached `at_least` (within 5 s: the count follows the answer).
double TailAnswers(const KVStoreServer& server, const std::string& result, double at_least = 0) {
  double n = -1;
  for (absl::Time end = absl::Now() + absl::Seconds(5);;) {
    auto m = metrics::Scrape(server.metrics_port());
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return -1;
    n = metrics::SampleValue(
            *m, absl::StrCat("dtrain_kvstore_tail_answers_total{result=\"", result, "\"}"))
            .value_or(0);
    if (n >= at_least || absl::Now() > end) return n;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", rpc::DefaultCredentials()->ServerCredentials(), &owner_port_);
    b.RegisterService(&owner_);
    owner_server_ = b.BuildAndStart();
    ASSERT_NE(owner_server_, nullptr);
  }
  void TearDown() override {
    for (auto& s : replicas_) s.reset();
    owner_server_->Shutdown();
  }

  std::unique_ptr<KVStoreServer> StartReplica(int replica) {
    ServerOptions o;
    o.listen = listen_;
    o.data_socket = data_socket_;
    o.scheduler = absl::StrCat("127.0.0.1:", owner_port_);
    o.shard_index = 0;
    o.num_shards = 1;
    o.replica_index = replica;
    o.job_ttl = absl::ZeroDuration();
    o.metrics_listen = "127.0.0.1:0";
    o.callback_data = callback_data_;
    o.replica_round_hold = round_hold_;
    auto s = KVStoreServer::Start(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok() && unusable_socket_) {
      // As for a successor in another mount namespace (a pod on this node).
      std::filesystem::remove((*s)->data_socket());
    }
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<RemoteParameterServer> Client(const std::vector<std::string>& servers,
                                                int replicas, int worker,
                                                CompressionSpec compression = {}) const {
    ClientOptions o;
    o.data_path = client_data_path_;
    o.compression = compression;
    o.servers = servers;
    o.replicas = replicas;
    o.job = "job";
    o.worker = worker;
    o.unavailable_timeout = absl::Seconds(20);
    o.answer_at_tail = answer_at_tail_;
    auto c = RemoteParameterServer::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  // Creates the job and keys through `clients`, then runs rounds
  // [first, last] of both workers' push-pulls, concurrently.
  static void Setup(const std::vector<std::unique_ptr<RemoteParameterServer>>& clients) {
    JobConfig c;
    c.job = "job";
    c.num_workers = 2;
    c.consistency = Consistency::kSync;
    c.optimizer = OptimizerKind::kSgd;
    c.learning_rate = 0.1;
    c.momentum = 0.9;
    c.gradient_scale = 0.5;
    std::vector<float> small(kSmall), large(kLarge);
    for (int64_t i = 0; i < kSmall; ++i) small[i] = 0.01f * static_cast<float>(i % 13);
    for (int64_t i = 0; i < kLarge; ++i) large[i] = 0.001f * static_cast<float>(i % 29);
    for (const auto& client : clients) {
      ASSERT_TRUE(client->CreateJob(c).ok());
      ASSERT_TRUE(client
                      ->Init({{"small", {kSmall}, DType::kF32, small.data()},
                              {"large", {kLarge}, DType::kF32, large.data()}})
                      .ok());
    }
  }
  // `small_only`: each round pushes and pulls only the small key (a
  // PushPull small enough that a worker's pull waits parked on the data
  // port, its push held for the round's batch); `late`: worker 1 sleeps
  // that long before each round's push (past the hold).
  static void Rounds(const std::vector<std::unique_ptr<RemoteParameterServer>>& clients, int first,
                     int last, std::vector<std::vector<float>>* out, bool small_only = false,
                     absl::Duration late = absl::ZeroDuration()) {
    out->assign(4, {});
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        std::vector<float> small(kSmall), large(kLarge), gs(kSmall), gl(kLarge);
        for (int r = first; r <= last; ++r) {
          for (int64_t i = 0; i < kSmall; ++i) gs[i] = Grad(w, r, i);
          for (int64_t i = 0; i < kLarge; ++i) gl[i] = Grad(w, r, i);
          if (w == 1) absl::SleepFor(late);
          absl::Status s = small_only ? clients[w]->PushPull({{"small", gs.data(), small.data()}})
                                      : clients[w]->PushPull({{"small", gs.data(), small.data()},
                                                              {"large", gl.data(), large.data()}});
          ASSERT_TRUE(s.ok()) << "worker " << w << " round " << r << ": " << s;
        }
        (*out)[2 * w] = small;
        (*out)[2 * w + 1] = large;
      });
    }
    for (std::thread& t : threads) t.join();
  }

  // The same job on one unreplicated shard.
  std::vector<std::vector<float>> Reference(int rounds, CompressionSpec compression = {},
                                            bool small_only = false) {
    ServerOptions o;
    o.job_ttl = absl::ZeroDuration();
    auto server = KVStoreServer::Start(o);
    EXPECT_TRUE(server.ok());
    std::vector<std::unique_ptr<RemoteParameterServer>> clients;
    for (int w = 0; w < 2; ++w) {
      clients.push_back(Client({(*server)->local_address()}, 1, w, compression));
    }
    Setup(clients);
    std::vector<std::vector<float>> out;
    Rounds(clients, 1, rounds, &out, small_only);
    return out;
  }

  // Publishes [r0 ACTIVE, r1 JOINING], waits for r0's transfer to r1, then
  // makes both ACTIVE.
  void FormChain() {
    v1::KvstoreHeartbeatRequest a = owner_.Await(0, [](auto&) { return true; });
    v1::KvstoreHeartbeatRequest b = owner_.Await(1, [](auto&) { return true; });
    owner_.Publish(Chain({Member(a, v1::REPLICA_ACTIVE), Member(b, v1::REPLICA_JOINING)}));
    owner_.Await(0, [&](const v1::KvstoreHeartbeatRequest& hb) {
      return hb.caught_up_replica() == 1 && hb.caught_up_incarnation() == b.incarnation();
    });
    owner_.Publish(Chain({Member(a, v1::REPLICA_ACTIVE), Member(b, v1::REPLICA_ACTIVE)}));
    owner_.Await(1, [&](const v1::KvstoreHeartbeatRequest& hb) {
      return hb.map().version() >= 2 && hb.has_state();
    });
    a_ = a;
    b_ = b;
  }

  // Two replicas of one shard in a chain, and two workers' clients
  // (compression `compression`) that set the job up.
  std::vector<std::unique_ptr<RemoteParameterServer>> StartChainOfTwo(
      const CompressionSpec& compression = {}) {
    replicas_.push_back(StartReplica(0));
    replicas_.push_back(StartReplica(1));
    FormChain();
    const std::vector<std::string> servers = {replicas_[0]->local_address(),
                                              replicas_[1]->local_address()};
    std::vector<std::unique_ptr<RemoteParameterServer>> clients;
    for (int w = 0; w < 2; ++w) clients.push_back(Client(servers, 2, w, compression));
    Setup(clients);
    return clients;
  }

  // Two replicas of one shard in a chain; two workers (compression
  // `compression`) set the job up and run rounds 1..rounds, the values
  // pulled after each in `got` (as Rounds).
  void RunRoundsOnAChainOfTwo(int rounds, const CompressionSpec& compression,
                              std::vector<std::vector<float>>* got) {
    std::vector<std::unique_ptr<RemoteParameterServer>> clients = StartChainOfTwo(compression);
    Rounds(clients, 1, rounds, got);
  }

  // The head's count of writes the chain acknowledged, once it reached
  // `n` (within 5 s): a client the tail answered may return before the
  // head has the acknowledgement.
  int64_t AwaitForwarded(int64_t n) {
    int64_t forwarded = replicas_[0]->replicator()->stats().forwarded;
    for (absl::Time end = absl::Now() + absl::Seconds(5); forwarded < n && absl::Now() < end;) {
      absl::SleepFor(absl::Milliseconds(1));
      forwarded = replicas_[0]->replicator()->stats().forwarded;
    }
    return forwarded;
  }

  // The round worker 0 last pushed of key "small" on `server` (-1: no
  // such key), once it reached `round` or `within` passed.
  static int64_t AwaitPushedSmall(KVStoreServer& server, int64_t round, absl::Duration within) {
    int64_t pushed = -1;
    for (absl::Time end = absl::Now() + within;;) {
      absl::StatusOr<JobStatus> job = server.store().GetJob("job", 0, true);
      EXPECT_TRUE(job.ok()) << job.status();
      if (!job.ok()) return -1;
      for (const SliceStatus& slice : job->slices) {
        if (slice.spec.key == "small") pushed = slice.pushed_round;
      }
      if (pushed >= round || absl::Now() >= end) return pushed;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  // Worker 0's client of job "job" on the chain, whose pulls give up
  // after `pull_timeout` on their first attempt; "small" Init'ed.
  std::unique_ptr<RemoteParameterServer> ImpatientWorker0(absl::Duration pull_timeout) {
    ClientOptions o;
    o.servers = {replicas_[0]->local_address(), replicas_[1]->local_address()};
    o.replicas = 2;
    o.job = "job";
    o.worker = 0;
    o.pull_timeout = pull_timeout;
    o.max_attempts = 1;
    auto client = RemoteParameterServer::Connect(o);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    EXPECT_TRUE((*client)->Init({{"small", {kSmall}}}).ok());
    EXPECT_TRUE((*client)->Resync().ok());
    return std::move(*client);
  }

  // A chain of two and its two workers (`*clients`) run 8 rounds of the
  // small key only, 4 on time and 4 with worker 1 late past the hold; the
  // values equal an unreplicated run's bit for bit, on both replicas.
  void SmallRoundsBitForBit(std::vector<std::unique_ptr<RemoteParameterServer>>* clients) {
    const std::vector<std::vector<float>> ref = Reference(8, {}, /*small_only=*/true);
    *clients = StartChainOfTwo();
    std::vector<std::vector<float>> got;
    Rounds(*clients, 1, 4, &got, /*small_only=*/true);
    Rounds(*clients, 5, 8, &got, /*small_only=*/true, /*late=*/absl::Milliseconds(20));
    for (int w = 0; w < 2; ++w) {
      ASSERT_EQ(got[2 * w].size(), ref[2 * w].size());
      EXPECT_EQ(std::memcmp(got[2 * w].data(), ref[2 * w].data(), ref[2 * w].size() * 4), 0) << w;
    }
    ASSERT_NO_FATAL_FAILURE(ExpectReplicasHoldTheSameValues());
  }

  // Head and tail hold the same bytes for every key.
  void ExpectReplicasHoldTheSameValues() {
    for (const std::string& key : {"small", "large"}) {
      auto head = replicas_[0]->store().Pull("job", 0, {{key, 0, 0}}, PullOptions());
      auto tail = replicas_[1]->store().Pull("job", 0, {{key, 0, 0}}, PullOptions());
      ASSERT_TRUE(head.ok() && tail.ok());
      EXPECT_EQ((*head)[0].bytes.view(), (*tail)[0].bytes.view()) << key;
    }
  }

  MapOwner owner_;
  int owner_port_ = 0;
  std::unique_ptr<grpc::Server> owner_server_;
  std::vector<std::unique_ptr<KVStoreServer>> replicas_;
  std::string listen_ = "127.0.0.1:0";                 // the replicas' ServerOptions.listen
  std::string data_socket_ = "auto";                   // the replicas' ServerOptions.data_socket
  bool unusable_socket_ = false;                       // their socket files removed after start
  bool callback_data_ = false;                         // their ServerOptions.callback_data
  absl::Duration round_hold_ = absl::Milliseconds(2);  // their replica_round_hold
  DataPath client_data_path_ = DataPath::kAuto;
  bool answer_at_tail_ = true;  // the clients' ClientOptions.answer_at_tail
  v1::KvstoreHeartbeatRequest a_, b_;
};

TEST_F(ReplicationTest, ReplicatedValuesEqualAnUnreplicatedRunBitForBit) {
  const std::vector<std::vector<float>> ref = Reference(6);
  std::vector<std::vector<float>> got;
  ASSERT_NO_FATAL_FAILURE(RunRoundsOnAChainOfTwo(6, {}, &got));
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i].size(), ref[i].size());
    EXPECT_EQ(std::memcmp(got[i].data(), ref[i].data(), ref[i].size() * 4), 0) << i;
  }
  // Both replicas hold the same state; the tail served the reads.
  ASSERT_NO_FATAL_FAILURE(ExpectReplicasHoldTheSameValues());
  EXPECT_EQ(replicas_[0]->replicator()->Role(), "head");
  EXPECT_EQ(replicas_[1]->replicator()->Role(), "tail");
  EXPECT_GE(AwaitForwarded(2 * 2 + 2 * 6), 2 * 2 + 2 * 6);
}

// Small PushPulls: the first worker's pull of a round waits parked on the
// data port (no thread) and its push is held, then both go down the chain
// with the round's last push, whose request answers the parked pull. With
// worker 1 late (past the hold), the held push goes alone when the hold
// runs out. Both equal an unreplicated run bit for bit, on both replicas.
// (Clients whose tail does not answer: answer_at_tail off.)
TEST_F(ReplicationTest, ParkedPullsAndHeldPushesReplicateBitForBit) {
  answer_at_tail_ = false;
  std::vector<std::unique_ptr<RemoteParameterServer>> clients;
  ASSERT_NO_FATAL_FAILURE(SmallRoundsBitForBit(&clients));
  EXPECT_EQ(TailAnswers(*replicas_[1], "ok"), 0);
  // Every push went down the chain: 2 Inits and 8 rounds of 2 workers (in
  // one batch per round when on time).
  EXPECT_GE(AwaitForwarded(2 * 2 + 2 * 8), 2 * 2 + 2 * 8);
}

// Small push-pulls are answered by the tail (ClientOptions.answer_at_tail,
// the default), on time and with a worker late past the hold; the values
// equal an unreplicated run's bit for bit, and the head answered none of
// the pulls. Large ones (over 64 KiB) are still answered by the head.
TEST_F(ReplicationTest, TheTailAnswersSmallPushPullsBitForBit) {
  std::vector<std::unique_ptr<RemoteParameterServer>> clients;
  ASSERT_NO_FATAL_FAILURE(SmallRoundsBitForBit(&clients));
  std::vector<std::vector<float>> got;
  EXPECT_EQ(TailAnswers(*replicas_[1], "ok", 2 * 8), 2 * 8);
  EXPECT_EQ(TailAnswers(*replicas_[1], "refused"), 0);
  EXPECT_EQ(TailAnswers(*replicas_[0], "ok"), 0);
  // A round with the large key (one push over 64 KiB): the head answers.
  Rounds(clients, 9, 9, &got);
  EXPECT_EQ(TailAnswers(*replicas_[1], "ok"), 2 * 8);
}

// A round that never completes: the held push reaches the tail once the
// hold ran out (well before the pull's deadline), and the parked pull ends
// at its deadline.
TEST_F(ReplicationTest, AHeldPushWhoseRoundNeverCompletesStillReachesTheTail) {
  std::vector<std::unique_ptr<RemoteParameterServer>> clients = StartChainOfTwo();
  // Heartbeats (whose work on the chain would also send a held push) every
  // 10 s from the next one on: what sends it is the hold's end (2 ms).
  owner_.SetInterval(absl::Seconds(10));
  absl::SleepFor(absl::Milliseconds(150));
  std::unique_ptr<RemoteParameterServer> impatient = ImpatientWorker0(absl::Seconds(3));
  ASSERT_NE(impatient, nullptr);
  std::vector<float> g(kSmall, 1.0f), out(kSmall);
  absl::Status s;
  const absl::Time start = absl::Now();
  std::thread pushing([&] { s = impatient->PushPull({{"small", g.data(), out.data()}}); });
  // Worker 0's round-1 push reaches the tail, long before the pull's 3 s
  // deadline (which would send it too) and the next heartbeat.
  EXPECT_EQ(AwaitPushedSmall(*replicas_[1], 1, absl::Seconds(1)), 1);
  pushing.join();
  // The head answers the pull (which the tail would have) at its deadline,
  // naming what it waits for, before the client's own timeout (1 s later).
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("waiting for workers [1]"), std::string::npos) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(2900));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(3900));
  // Worker 1 completes the round: the job goes on.
  std::vector<float> out1(kSmall);
  ASSERT_TRUE(clients[1]->PushPull({{"small", g.data(), out1.data()}}).ok());
}

// Without holding (replica_round_hold 0) a push that leaves its round
// incomplete goes down the chain at once, and its pull, which the tail
// would answer, still gets the head's answer at its deadline naming the
// worker the round waits for (not the client's bare timeout a second
// later).
TEST_F(ReplicationTest, WithoutAHoldARoundThatNeverCompletesIsAnsweredAtItsDeadline) {
  round_hold_ = absl::ZeroDuration();
  std::vector<std::unique_ptr<RemoteParameterServer>> clients = StartChainOfTwo();
  std::unique_ptr<RemoteParameterServer> impatient = ImpatientWorker0(absl::Seconds(1));
  ASSERT_NE(impatient, nullptr);
  std::vector<float> g(kSmall, 1.0f), out(kSmall);
  const absl::Time start = absl::Now();
  absl::Status s = impatient->PushPull({{"small", g.data(), out.data()}});
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("waiting for workers [1]"), std::string::npos) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1900));
  // Worker 1 completes the round: the job goes on.
  std::vector<float> out1(kSmall);
  ASSERT_TRUE(clients[1]->PushPull({{"small", g.data(), out1.data()}}).ok());
}

// Top-k pushes travel down the chain as received: the replicas end equal to
// an unreplicated run with the same compression (and unlike a dense one).
// Replicated shards started with callback_data ignore it: a replicated
// pull waits for the chain, which the callback path's continuations (run
// inside the push that completes the round, under the replicator) cannot.
// Small push-pulls over gRPC (unary calls, the callback path's) of two
// workers, every round one waiting for the other: they complete, and the
// replicas agree.
TEST_F(ReplicationTest, CallbackDataOnAReplicatedShardServesTheSyncPath) {
  callback_data_ = true;
  client_data_path_ = DataPath::kGrpc;
  std::vector<std::unique_ptr<RemoteParameterServer>> clients = StartChainOfTwo();
  std::vector<std::vector<float>> got(2, std::vector<float>(kSmall));
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      std::vector<float> g(kSmall);
      for (int r = 1; r <= 20; ++r) {
        for (int64_t i = 0; i < kSmall; ++i) g[i] = Grad(w, r, i);
        absl::Status s = clients[w]->PushPull({{"small", g.data(), got[w].data()}});
        ASSERT_TRUE(s.ok()) << "worker " << w << " round " << r << ": " << s;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(got[0], got[1]);
  ExpectReplicasHoldTheSameValues();
}

TEST_F(ReplicationTest, TopKPushesReplicateBitForBit) {
  const CompressionSpec topk(Compression::kTopK, 0.05);
  const std::vector<std::vector<float>> ref = Reference(6, topk);
  const std::vector<std::vector<float>> dense = Reference(6);
  std::vector<std::vector<float>> got;
  ASSERT_NO_FATAL_FAILURE(RunRoundsOnAChainOfTwo(6, topk, &got));
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i].size(), ref[i].size());
    EXPECT_EQ(std::memcmp(got[i].data(), ref[i].data(), ref[i].size() * 4), 0) << i;
    EXPECT_NE(std::memcmp(got[i].data(), dense[i].data(), ref[i].size() * 4), 0) << i;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectReplicasHoldTheSameValues());
}

TEST_F(ReplicationTest, TheHeadDiesMidJobAndNoPushIsLostOrAppliedTwice) {
  const std::vector<std::vector<float>> ref = Reference(10);
  std::vector<std::unique_ptr<RemoteParameterServer>> clients = StartChainOfTwo();
  std::vector<std::vector<float>> got;
  Rounds(clients, 1, 4, &got);
  // The head goes away mid-job; the owner notices and drops it from the
  // chain a moment later (here: when the test says so).
  std::thread owner([&] {
    absl::SleepFor(absl::Milliseconds(300));
    owner_.Publish(Chain({Member(b_, v1::REPLICA_ACTIVE)}));
  });
  replicas_[0].reset();
  const absl::Time killed = absl::Now();
  Rounds(clients, 5, 10, &got);
  owner.join();
  const absl::Duration failover = absl::Now() - killed;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(std::memcmp(got[i].data(), ref[i].data(), ref[i].size() * 4), 0) << i;
  }
  EXPECT_LT(failover, absl::Seconds(15));
  // A new replica (a new process: another incarnation) joins and catches up
  // while training goes on.
  replicas_[0] = StartReplica(0);
  v1::KvstoreHeartbeatRequest c = owner_.Await(0, [&](const v1::KvstoreHeartbeatRequest& hb) {
    return hb.incarnation() != a_.incarnation();
  });
  owner_.Publish(Chain({Member(b_, v1::REPLICA_ACTIVE), Member(c, v1::REPLICA_JOINING)}));
  std::vector<std::vector<float>> more;
  std::thread training([&] { Rounds(clients, 11, 14, &more); });
  owner_.Await(1, [&](const v1::KvstoreHeartbeatRequest& hb) {
    return hb.caught_up_replica() == 0 && hb.caught_up_incarnation() == c.incarnation();
  });
  training.join();
  auto head = replicas_[1]->store().Pull("job", 0, {{"large", 0, 0}}, PullOptions());
  auto joined = replicas_[0]->store().Pull("job", 0, {{"large", 0, 0}}, PullOptions());
  ASSERT_TRUE(head.ok() && joined.ok()) << joined.status();
  EXPECT_EQ((*head)[0].round, 14);
  EXPECT_EQ((*joined)[0].bytes.view(), (*head)[0].bytes.view());
  std::fprintf(stderr, "failover: rounds 5-10 took %s after the head went away\n",
               absl::FormatDuration(failover).c_str());
}

// The head goes away while worker 0's push is held there (worker 1 is
// late; worker 0 waits for the tail's answer): that push never reached the
// tail. The client sees the head's connection close, and its retry at the
// new head applies the push; no push is lost or applied twice.
TEST_F(ReplicationTest, AHeadThatDiesWithAParkedPullAndAHeldPushLosesNoPush) {
  round_hold_ = absl::Seconds(5);  // held until worker 1 pushes, 400 ms late
  const std::vector<std::vector<float>> ref = Reference(8, {}, /*small_only=*/true);
  std::vector<std::unique_ptr<RemoteParameterServer>> clients = StartChainOfTwo();
  std::vector<std::vector<float>> got;
  Rounds(clients, 1, 4, &got, /*small_only=*/true);
  const int64_t forwarded = AwaitForwarded(2 * 2 + 2 * 4);
  EXPECT_EQ(forwarded, 2 * 2 + 2 * 4);
  std::thread training(
      [&] { Rounds(clients, 5, 8, &got, /*small_only=*/true, absl::Milliseconds(400)); });
  // Worker 0's round-5 push is in at the head (and held: not forwarded),
  // worker 1 sleeps.
  EXPECT_EQ(AwaitPushedSmall(*replicas_[0], 5, absl::Seconds(5)), 5);
  EXPECT_EQ(replicas_[0]->replicator()->stats().forwarded, forwarded);  // held
  replicas_[0].reset();
  owner_.Publish(Chain({Member(b_, v1::REPLICA_ACTIVE)}));
  training.join();
  for (int w = 0; w < 2; ++w) {
    ASSERT_EQ(got[2 * w].size(), ref[2 * w].size());
    EXPECT_EQ(std::memcmp(got[2 * w].data(), ref[2 * w].data(), ref[2 * w].size() * 4), 0) << w;
  }
}

// The tail dies while worker 0 waits for its answer there (its push held
// at the head, worker 1 late): the client sees its answers connection
// close, refreshes the map and asks the head, now alone, where the push is
// a duplicate; no push is lost or applied twice.
TEST_F(ReplicationTest, ATailThatDiesWhileAPullWaitsForItsAnswerLosesNoPush) {
  round_hold_ = absl::Seconds(5);  // held until worker 1 pushes, 400 ms late
  const std::vector<std::vector<float>> ref = Reference(8, {}, /*small_only=*/true);
  std::vector<std::unique_ptr<RemoteParameterServer>> clients = StartChainOfTwo();
  std::vector<std::vector<float>> got;
  Rounds(clients, 1, 4, &got, /*small_only=*/true);
  EXPECT_EQ(TailAnswers(*replicas_[1], "ok", 2 * 4), 2 * 4);
  std::thread training(
      [&] { Rounds(clients, 5, 8, &got, /*small_only=*/true, absl::Milliseconds(400)); });
  EXPECT_EQ(AwaitPushedSmall(*replicas_[0], 5, absl::Seconds(5)), 5);
  replicas_[1].reset();
  owner_.Publish(Chain({Member(a_, v1::REPLICA_ACTIVE)}));
  training.join();
  for (int w = 0; w < 2; ++w) {
    ASSERT_EQ(got[2 * w].size(), ref[2 * w].size());
    EXPECT_EQ(std::memcmp(got[2 * w].data(), ref[2 * w].data(), ref[2 * w].size() * 4), 0) << w;
  }
}

// A successor restarted at the same address (a new process: another
// incarnation, data port and socket) gets the head's state on the first
// try: the link drops the idle connections the old process closed and asks
// the address for its data port again, instead of failing a batch on them.
TEST_F(ReplicationTest, ASuccessorRestartedAtTheSameAddressTakesTheStateOnTheFirstTry) {
  const std::vector<std::vector<float>> ref = Reference(4);
  std::vector<std::unique_ptr<RemoteParameterServer>> clients = StartChainOfTwo();
  std::vector<std::vector<float>> got;
  Rounds(clients, 1, 2, &got);
  ASSERT_FALSE(HasFatalFailure());
  // The chain's start may have cost a failed batch (on a loaded machine the
  // head can learn the first map before the tail does, which refuses it
  // and the head retries); the restart below must cost none.
  const int64_t failures_before = replicas_[0]->replicator()->stats().send_failures;
  listen_ = replicas_[1]->local_address();
  replicas_[1].reset();  // closes its connections, the head's idle link among them
  replicas_[1] = StartReplica(1);
  ASSERT_NE(replicas_[1], nullptr);
  ASSERT_EQ(replicas_[1]->local_address(), listen_);
  v1::KvstoreHeartbeatRequest b = owner_.Await(1, [&](const v1::KvstoreHeartbeatRequest& hb) {
    return hb.incarnation() != b_.incarnation();
  });
  // The new replica learns the new map before the head does, so the head's
  // transfer is not refused for coming from a newer map than its own (a
  // failed batch of another kind).
  owner_.Hold(0);
  owner_.Publish(Chain({Member(a_, v1::REPLICA_ACTIVE), Member(b, v1::REPLICA_JOINING)}));
  const uint64_t version =
      owner_.Await(1, [](const v1::KvstoreHeartbeatRequest& hb) { return hb.map().version() >= 3; })
          .map()
          .version();
  owner_.Release(0);
  owner_.Await(0, [&](const v1::KvstoreHeartbeatRequest& hb) {
    return hb.caught_up_replica() == 1 && hb.caught_up_incarnation() == b.incarnation();
  });
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(replicas_[0]->replicator()->stats().send_failures, failures_before);
  owner_.Publish(Chain({Member(a_, v1::REPLICA_ACTIVE), Member(b, v1::REPLICA_ACTIVE)}));
  Rounds(clients, 3, 4, &got);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(std::memcmp(got[i].data(), ref[i].data(), ref[i].size() * 4), 0) << i;
  }
  ExpectReplicasHoldTheSameValues();
}

TEST_F(ReplicationTest, AHeadWaitingForADeadSuccessorStillShutsDownInTime) {
  std::vector<std::unique_ptr<RemoteParameterServer>> clients = StartChainOfTwo();
  // The tail goes away and the map never changes (the owner says nothing):
  // the head's next write waits for the chain.
  replicas_[1].reset();
  std::vector<float> g(kSmall, 0.5f);
  absl::Notification pushed;
  absl::Status push;
  std::thread pusher([&] {
    push = clients[0]->Push({{"small", g.data()}});
    pushed.Notify();
  });
  EXPECT_FALSE(pushed.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  // SIGTERM's path: the head stops within its grace period (plus a little),
  // not after the replication timeout (30 s).
  const absl::Time start = absl::Now();
  EXPECT_TRUE(replicas_[0]->Shutdown(absl::Milliseconds(500)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  replicas_[0].reset();
  clients[0]->Cancel("test over");
  pusher.join();
  EXPECT_FALSE(push.ok());
}

// The fixture for the replica link's transports: security on (mutual TLS
// everywhere, every process here holding the certificate GetParam() names,
// the map owner too: kvstore as in a cluster, or admin, which may do
// everything, as in kvstore_bench), or off ("": --insecure).
class ReplicaLinkTest : public ReplicationTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    if (!GetParam().empty()) {
      const char* tmp = std::getenv("TEST_TMPDIR");
      const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/replication_certs";
      std::filesystem::remove_all(dir);
      ASSERT_TRUE(security::InitCertDir(dir, {}).ok());
      auto creds = rpc::Credentials::Load(
          {dir + "/ca.pem", dir + "/" + GetParam() + ".pem", dir + "/" + GetParam() + ".key"});
      ASSERT_TRUE(creds.ok()) << creds.status();
      rpc::SetDefaultCredentials(*creds);
    }
    ReplicationTest::SetUp();
  }
  void TearDown() override {
    ReplicationTest::TearDown();
    rpc::SetDefaultCredentials(rpc::Credentials::Insecure());
  }

  // Runs 4 rounds on a chain of two, checks the values against an
  // unreplicated run, and returns the batches the head sent, by transport.
  std::map<std::string, double> RunAndCountFrames() {
    std::map<std::string, double> out;
    const std::vector<std::vector<float>> ref = Reference(4);
    std::vector<std::vector<float>> got;
    RunRoundsOnAChainOfTwo(4, {}, &got);
    if (HasFatalFailure()) return out;
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(got[i].size(), ref[i].size());
      if (got[i].size() != ref[i].size()) continue;
      EXPECT_EQ(std::memcmp(got[i].data(), ref[i].data(), ref[i].size() * 4), 0) << i;
    }
    ExpectReplicasHoldTheSameValues();
    absl::StatusOr<std::string> text = metrics::Scrape(replicas_[0]->metrics_port());
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok()) return out;
    for (const char* kind : {"unix", "tls", "tcp", "grpc"}) {
      absl::StatusOr<double> n = metrics::SampleValue(
          *text, absl::StrCat("dtrain_kvstore_replicate_frames_total{kind=\"", kind, "\"}"));
      EXPECT_TRUE(n.ok()) << kind << ": " << *text;
      out[kind] = n.value_or(-1);
    }
    return out;
  }

  // Runs the rounds; the head's batches went over TCP (TLS when on), none
  // over the socket or gRPC.
  void ExpectBatchesOverTcpOnly() {
    std::map<std::string, double> frames = RunAndCountFrames();
    const std::string tcp = GetParam().empty() ? "tcp" : "tls";
    EXPECT_GE(frames[tcp], 4);
    EXPECT_EQ(frames["unix"], 0);
    EXPECT_EQ(frames["grpc"], 0);
  }
};

// Both replicas on this host: the head's link takes the tail's Unix socket
// (its batches in shared memory, no TLS) and the chain computes what an
// unreplicated run does.
TEST_P(ReplicaLinkTest, ASameHostChainReplicatesOverTheUnixSocket) {
  std::map<std::string, double> frames = RunAndCountFrames();
  EXPECT_GE(frames["unix"], 4);  // at least one batch a round
  EXPECT_EQ(frames["tls"], 0);
  EXPECT_EQ(frames["tcp"], 0);
  EXPECT_EQ(frames["grpc"], 0);
}

// A successor without a socket is reached over TCP (mutual TLS when on).
TEST_P(ReplicaLinkTest, WithoutASocketTheLinkUsesTcp) {
  data_socket_ = "";
  ExpectBatchesOverTcpOnly();
}

// A socket this host's boot id points to but the link cannot reach: TCP.
TEST_P(ReplicaLinkTest, AnUnreachableSocketFallsBackToTcp) {
  unusable_socket_ = true;
  ExpectBatchesOverTcpOnly();
}

// A REPLICATE frame whose payload is not the bytes its batch's pushes name
// (ReplicatedPush.data_bytes), or whose batch does not parse, is refused
// whole with a reason; the successor keeps what it held.
TEST_P(ReplicaLinkTest, AReplicateFrameWhoseValuesDisagreeWithItsBatchIsRefused) {
  RunAndCountFrames();
  if (HasFatalFailure()) return;
  std::shared_ptr<const rpc::Credentials> c = rpc::DefaultCredentials();
  DataPortTls tls;
  if (!c->insecure()) tls = {true, c->files().ca, c->files().cert, c->files().key};
  DataPortAddress tail;
  tail.host = "127.0.0.1";
  tail.tcp_port = replicas_[1]->data_port();
  tail.tls = tls.enabled;
  v1::ReplicateBatch batch;
  batch.set_shard(0);
  v1::ReplicatedPush* push = batch.add_mutations()->mutable_push();
  push->set_job("job");
  push->add_items()->set_key("small");
  push->add_data_bytes(100);
  const std::string short_payload(50, 'x');
  struct Case {
    std::string header;
    std::string want;
  };
  for (const Case& bad :
       {Case{batch.SerializeAsString(), "payload of 50 bytes, the batch's pushes name 100"},
        Case{"\xff\xff not a batch", "the batch does not parse"}}) {
    auto conn = DataPortConnection::Dial(tail, v1::DataHello(), tls, absl::Seconds(5));
    ASSERT_TRUE(conn.ok()) << conn.status();
    ASSERT_TRUE(
        (*conn)->Send(DataOp::kReplicate, bad.header, {short_payload}, 0, absl::Seconds(5)).ok());
    absl::StatusOr<std::string> reply = (*conn)->ReceiveHeader();
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument) << reply.status();
    EXPECT_NE(reply.status().message().find(bad.want), std::string::npos) << reply.status();
  }
  ExpectReplicasHoldTheSameValues();
}

INSTANTIATE_TEST_SUITE_P(Identities, ReplicaLinkTest, ::testing::Values("kvstore", "admin", ""),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.empty() ? std::string("insecure") : info.param;
                         });

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
