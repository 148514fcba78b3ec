#include "libs/kvstore/parameter_server_contract.h"

#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dtrain {
namespace kvstore {

void ParameterServerContractTest::SetUp() {
  kvstore_ = GetParam().make();
  ASSERT_NE(kvstore_, nullptr);
}

std::unique_ptr<ParameterServer> ParameterServerContractTest::Connect(const std::string& job,
                                                                      int worker) {
  absl::StatusOr<std::unique_ptr<ParameterServer>> ps = kvstore_->Connect(job, worker);
  EXPECT_TRUE(ps.ok()) << ps.status();
  if (!ps.ok()) return nullptr;
  EXPECT_EQ((*ps)->job(), job);
  EXPECT_EQ((*ps)->worker(), worker);
  return std::move(*ps);
}

namespace {

// 512 KiB of f32: above the placement's slice threshold, so sliced over
// every shard.
constexpr int64_t kSlicedElements = 128 << 10;

JobConfig Config(const std::string& job, int workers, Consistency consistency) {
  JobConfig c;
  c.job = job;
  c.num_workers = workers;
  c.consistency = consistency;
  return c;
}

JobConfig Sgd(JobConfig c, double learning_rate) {
  c.optimizer = OptimizerKind::kSgd;
  c.learning_rate = learning_rate;
  return c;
}

// Polls `pending` until it is done or `timeout` passed.
bool DoneWithin(const Work& pending, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (!pending.IsCompleted()) {
    if (absl::Now() >= end) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

std::vector<float> Filled(int64_t n, float value) {
  return std::vector<float>(static_cast<size_t>(n), value);
}

// Runs CreateJob and Init of `keys` (all f32, no initial value) for every
// worker; false (with a failure) if one fails.
bool CreateJobAndInit(const std::vector<std::unique_ptr<ParameterServer>>& workers,
                      const JobConfig& config, const std::vector<KeySpec>& keys) {
  for (const auto& w : workers) {
    if (w == nullptr) return false;
    absl::Status created = w->CreateJob(config);
    EXPECT_TRUE(created.ok()) << "worker " << w->worker() << ": " << created;
    absl::Status inited = w->Init(keys);
    EXPECT_TRUE(inited.ok()) << "worker " << w->worker() << ": " << inited;
    if (!created.ok() || !inited.ok()) return false;
  }
  return true;
}

}  // namespace

// Worker 0's SYNC push-pull waits for worker 1's push of the same round,
// without blocking its caller or worker 1, and both get the mean
// (gradient_scale 1/2) of the two gradients, on a small key and on a key
// sliced over the shards.
TEST_P(ParameterServerContractTest, SyncRoundOfTwoWorkersIsTheirMean) {
  JobConfig config = Config("sync-mean", 2, Consistency::kSync);
  config.gradient_scale = 0.5;
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_TRUE(CreateJobAndInit(w, config, {{"small", {10}}, {"big", {kSlicedElements}}}));

  std::vector<std::vector<float>> small(2), big(2), small_out(2), big_out(2);
  for (int r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < 10; ++i) small[r].push_back(static_cast<float>((2 * r + 1) * i + r));
    for (int64_t i = 0; i < kSlicedElements; ++i) {
      big[r].push_back(static_cast<float>((r + 1) * (i % 1000)));
    }
    small_out[r] = Filled(10, -1);
    big_out[r] = Filled(kSlicedElements, -1);
  }
  Work first;
  absl::Notification issued;
  std::thread worker0([&] {
    first = w[0]->PushPullAsync({{"small", small[0].data(), small_out[0].data()},
                                 {"big", big[0].data(), big_out[0].data()}});
    issued.Notify();
  });
  const bool returned = issued.WaitForNotificationWithTimeout(absl::Seconds(10));
  EXPECT_TRUE(returned) << "PushPullAsync blocked its caller until the round completed";
  if (returned) {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_FALSE(first.IsCompleted()) << "a SYNC round completed without worker 1's push";
  }
  // Worker 1 on this thread: not blocked by worker 0's waiting push-pull.
  absl::Status second = w[1]->PushPull(
      {{"small", small[1].data(), small_out[1].data()}, {"big", big[1].data(), big_out[1].data()}});
  worker0.join();
  ASSERT_TRUE(second.ok()) << second;
  ASSERT_TRUE(first.Wait().ok()) << first.Wait();
  for (int r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < 10; ++i) {
      ASSERT_EQ(small_out[r][i], 2 * i + 0.5f) << "worker " << r << " element " << i;
    }
    for (int64_t i = 0; i < kSlicedElements; ++i) {
      ASSERT_EQ(big_out[r][i], 1.5f * static_cast<float>(i % 1000))
          << "worker " << r << " element " << i;
    }
  }
}

// Three SYNC rounds by two workers (threads): each push-pull returns its own
// round's sum; a pull of the last pushed round returns the last one; a pull
// of a round this worker has not pushed is kOutOfRange.
TEST_P(ParameterServerContractTest, SyncRoundsCompleteInOrder) {
  constexpr int kRounds = 3;
  constexpr int64_t kN = 64;
  const JobConfig config = Config("sync-rounds", 2, Consistency::kSync);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_TRUE(CreateJobAndInit(w, config, {{"w", {kN}}}));

  // got[worker][round - 1]
  std::vector<std::vector<std::vector<float>>> got(2);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int worker = 0; worker < 2; ++worker) {
    threads.emplace_back([&, worker] {
      for (int round = 1; round <= kRounds; ++round) {
        std::vector<float> g;
        for (int64_t i = 0; i < kN; ++i) {
          g.push_back(static_cast<float>(round * (worker + 1)) + 0.5f * static_cast<float>(i));
        }
        std::vector<float> out = Filled(kN, -1);
        status[worker] = w[worker]->PushPull({{"w", g.data(), out.data()}});
        if (!status[worker].ok()) return;
        got[worker].push_back(std::move(out));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int worker = 0; worker < 2; ++worker) {
    ASSERT_TRUE(status[worker].ok()) << "worker " << worker << ": " << status[worker];
    ASSERT_EQ(got[worker].size(), static_cast<size_t>(kRounds));
    for (int round = 1; round <= kRounds; ++round) {
      for (int64_t i = 0; i < kN; ++i) {
        ASSERT_EQ(got[worker][round - 1][i], static_cast<float>(3 * round + i))
            << "worker " << worker << " round " << round << " element " << i;
      }
    }
  }
  std::vector<float> last = Filled(kN, -1);
  ASSERT_TRUE(w[0]->Pull({{"w", last.data()}}).ok());  // kLastPushedRound
  EXPECT_EQ(last, got[0][kRounds - 1]);
  std::vector<float> ahead = Filled(kN, -1);
  EXPECT_EQ(w[1]->Pull({{"w", ahead.data(), kRounds + 1}}).code(), absl::StatusCode::kOutOfRange);
}

// Push compression: each worker's pushes travel as the encoding it set (f16
// rounds 1 + 2^-9 + 2^-12 to 1 + 2^-9, bf16 to 1), the shards sum them in
// f32 and the pull is f32; a worker can change its encoding between rounds.
TEST_P(ParameterServerContractTest, PushCompressionRoundsEachWorkersPushesToItsEncoding) {
  constexpr int64_t kN = 16;
  const JobConfig config = Config("compressed", 2, Consistency::kSync);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_TRUE(CreateJobAndInit(w, config, {{"w", {kN}}}));
  ASSERT_TRUE(w[0]->SetPushCompression(Compression::kF16).ok());
  ASSERT_TRUE(w[1]->SetPushCompression(Compression::kBF16).ok());
  const float x = 1.0f + 1.0f / 512 + 1.0f / 4096;
  auto round = [&](float want) {
    std::vector<std::vector<float>> g(2, Filled(kN, x)), out(2, Filled(kN, -1));
    std::vector<absl::Status> status(2);
    std::thread other([&] { status[1] = w[1]->PushPull({{"w", g[1].data(), out[1].data()}}); });
    status[0] = w[0]->PushPull({{"w", g[0].data(), out[0].data()}});
    other.join();
    for (int worker = 0; worker < 2; ++worker) {
      ASSERT_TRUE(status[worker].ok()) << "worker " << worker << ": " << status[worker];
      EXPECT_EQ(out[worker], Filled(kN, want)) << "worker " << worker;
    }
  };
  round(2.0f + 1.0f / 512);  // f16 + bf16
  ASSERT_TRUE(w[0]->SetPushCompression(Compression::kNone).ok());
  ASSERT_TRUE(w[1]->SetPushCompression(Compression::kNone).ok());
  round(2 * x);  // exact
}

// Top-k with error feedback: a round's sum is the sum of what the workers
// sent (each slice's k largest entries of gradient + residual), and what a
// worker did not send reaches the shards in its later rounds.
TEST_P(ParameterServerContractTest, TopKPushSendsTheLargestEntriesAndCarriesTheRest) {
  constexpr int64_t kN = 16;  // one slice; k = 4
  const JobConfig config = Config("topk", 2, Consistency::kSync);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_TRUE(CreateJobAndInit(w, config, {{"w", {kN}}}));
  for (const auto& worker : w) {
    ASSERT_TRUE(worker->SetPushCompression({Compression::kTopK, 0.25}).ok());
  }
  // Worker 0's largest entries are at the top, worker 1's at the bottom.
  std::vector<std::vector<float>> first(2, Filled(kN, 0));
  for (int64_t i = 0; i < kN; ++i) {
    first[0][static_cast<size_t>(i)] = static_cast<float>(i + 1);
    first[1][static_cast<size_t>(i)] = -static_cast<float>(kN - i);
  }
  auto round = [&](const std::vector<std::vector<float>>& g) {
    std::vector<std::vector<float>> out(2, Filled(kN, -99));
    std::vector<absl::Status> status(2);
    std::thread other([&] { status[1] = w[1]->PushPull({{"w", g[1].data(), out[1].data()}}); });
    status[0] = w[0]->PushPull({{"w", g[0].data(), out[0].data()}});
    other.join();
    EXPECT_TRUE(status[0].ok()) << status[0];
    EXPECT_TRUE(status[1].ok()) << status[1];
    EXPECT_EQ(out[0], out[1]);
    return out[0];
  };
  std::vector<float> sum1 = round(first);
  std::vector<float> want1 = Filled(kN, 0);
  for (int64_t i : {0, 1, 2, 3}) want1[static_cast<size_t>(i)] = first[1][static_cast<size_t>(i)];
  for (int64_t i : {12, 13, 14, 15}) {
    want1[static_cast<size_t>(i)] = first[0][static_cast<size_t>(i)];
  }
  EXPECT_EQ(sum1, want1);
  // No new gradient: round 2 sends the next largest of what was held back.
  const std::vector<std::vector<float>> zero(2, Filled(kN, 0));
  std::vector<float> sum2 = round(zero);
  std::vector<float> want2 = Filled(kN, 0);
  for (int64_t i : {4, 5, 6, 7}) want2[static_cast<size_t>(i)] = first[1][static_cast<size_t>(i)];
  for (int64_t i : {8, 9, 10, 11}) {
    want2[static_cast<size_t>(i)] = first[0][static_cast<size_t>(i)];
  }
  EXPECT_EQ(sum2, want2);
  // Two more rounds drain the residuals: every entry arrived once.
  std::vector<float> total = sum1;
  for (int r = 0; r < 3; ++r) {
    std::vector<float> sum = r == 0 ? sum2 : round(zero);
    for (int64_t i = 0; i < kN; ++i) total[static_cast<size_t>(i)] += sum[static_cast<size_t>(i)];
  }
  for (int64_t i = 0; i < kN; ++i) {
    const size_t j = static_cast<size_t>(i);
    EXPECT_EQ(total[j], first[0][j] + first[1][j]) << i;
  }
  EXPECT_EQ(round(zero), Filled(kN, 0)) << "nothing is left to send";

  // An invalid ratio is refused; the compression in force stays.
  EXPECT_EQ(w[0]->SetPushCompression({Compression::kTopK, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w[0]->SetPushCompression({Compression::kTopK, 2}).code(),
            absl::StatusCode::kInvalidArgument);
}

// A sliced key: each slice sends its own k entries with indices within the
// slice, and they land at their places in the key.
TEST_P(ParameterServerContractTest, TopKPushOfASlicedKeyLandsEachEntryInPlace) {
  const JobConfig config = Config("topk-sliced", 2, Consistency::kSync);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_TRUE(CreateJobAndInit(w, config, {{"w", {kSlicedElements}}}));
  for (const auto& worker : w) {
    ASSERT_TRUE(worker->SetPushCompression({Compression::kTopK, 0.5}).ok());
  }
  std::vector<std::vector<float>> g(2, Filled(kSlicedElements, 0));
  for (int64_t i = 0; i < kSlicedElements; ++i) {
    g[0][static_cast<size_t>(i)] = static_cast<float>(i % 1000 + 1);
    g[1][static_cast<size_t>(i)] = -static_cast<float>((i * 7) % 1000 + 1);
  }
  const std::vector<std::vector<float>> zero(2, Filled(kSlicedElements, 0));
  std::vector<float> total = Filled(kSlicedElements, 0);
  int64_t nonzero_first = 0;
  for (int r = 0; r < 2; ++r) {  // ratio 0.5: two rounds send everything
    const auto& grad = r == 0 ? g : zero;
    std::vector<std::vector<float>> out(2, Filled(kSlicedElements, -99));
    std::vector<absl::Status> status(2);
    std::thread other([&] { status[1] = w[1]->PushPull({{"w", grad[1].data(), out[1].data()}}); });
    status[0] = w[0]->PushPull({{"w", grad[0].data(), out[0].data()}});
    other.join();
    ASSERT_TRUE(status[0].ok()) << status[0];
    ASSERT_TRUE(status[1].ok()) << status[1];
    for (int64_t i = 0; i < kSlicedElements; ++i) {
      const float v = out[0][static_cast<size_t>(i)];
      if (r == 0 && v != 0) ++nonzero_first;
      total[static_cast<size_t>(i)] += v;
    }
  }
  // Each worker sent half of each slice in round 1: their union is more
  // than half of the key and (their largest entries lie apart) not all.
  EXPECT_GE(nonzero_first, kSlicedElements / 2);
  EXPECT_LT(nonzero_first, kSlicedElements);
  for (int64_t i = 0; i < kSlicedElements; ++i) {
    const size_t j = static_cast<size_t>(i);
    ASSERT_EQ(total[j], g[0][j] + g[1][j]) << "element " << i;
  }
}

// ASYNC with SGD on the server: every push is applied on arrival, whichever
// worker sends it, and a pull returns the weights at once.
TEST_P(ParameterServerContractTest, AsyncServerSideSgdAppliesEachPush) {
  constexpr int64_t kN = 8;
  const JobConfig config = Sgd(Config("async-sgd", 2, Consistency::kAsync), 0.5);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_NE(w[0], nullptr);
  ASSERT_NE(w[1], nullptr);
  const std::vector<float> initial = Filled(kN, 1);
  for (const auto& worker : w) {
    ASSERT_TRUE(worker->CreateJob(config).ok());
    ASSERT_TRUE(worker->Init({{"w", {kN}, DType::kF32, initial.data()}}).ok());
  }
  std::vector<float> g0 = Filled(kN, 1), g1 = Filled(kN, 0.25f), out = Filled(kN, -1);
  ASSERT_TRUE(w[0]->Push({{"w", g0.data()}}).ok());
  ASSERT_TRUE(w[0]->Pull({{"w", out.data()}}).ok());  // worker 1 has pushed nothing
  EXPECT_EQ(out, Filled(kN, 0.5f));                   // 1 - 0.5 * 1
  ASSERT_TRUE(w[1]->Push({{"w", g1.data()}}).ok());
  out = Filled(kN, -1);
  ASSERT_TRUE(w[1]->Pull({{"w", out.data()}}).ok());
  EXPECT_EQ(out, Filled(kN, 0.375f));  // 0.5 - 0.5 * 0.25
  out = Filled(kN, -1);
  ASSERT_TRUE(w[0]->PushPull({{"w", g1.data(), out.data()}}).ok());
  EXPECT_EQ(out, Filled(kN, 0.25f));  // 0.375 - 0.5 * 0.25
}

// BOUNDED_DELAY with max_staleness 1: worker 0 may run one round ahead of worker
// 1; its push-pull of round 2 waits until worker 1 pushed round 1, and then
// returns weights with all three pushes applied.
TEST_P(ParameterServerContractTest, BoundedDelayHoldsBackAWorkerTooFarAhead) {
  constexpr int64_t kN = 16;
  JobConfig config = Sgd(Config("bounded", 2, Consistency::kBoundedDelay), 1.0);
  config.max_staleness = 1;
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_TRUE(CreateJobAndInit(w, config, {{"w", {kN}}}));
  const std::vector<float> g = Filled(kN, 1);
  std::vector<float> out = Filled(kN, 0);
  ASSERT_TRUE(w[0]->PushPull({{"w", g.data(), out.data()}}).ok());  // round 1: within the bound
  EXPECT_EQ(out, Filled(kN, -1));
  Work ahead = w[0]->PushPullAsync({{"w", g.data(), out.data()}});  // round 2
  EXPECT_FALSE(DoneWithin(ahead, absl::Milliseconds(200)))
      << "round 2 of worker 0 did not wait for worker 1's round 1";
  ASSERT_TRUE(w[1]->Push({{"w", g.data()}}).ok());
  ASSERT_TRUE(DoneWithin(ahead, absl::Seconds(30))) << "worker 0 stayed blocked";
  ASSERT_TRUE(ahead.Wait().ok()) << ahead.Wait();
  EXPECT_EQ(out, Filled(kN, -3));
}

// CreateJob and Init may be repeated, by any worker: an existing key keeps
// its value (the second Init's initial value is ignored).
TEST_P(ParameterServerContractTest, CreateJobAndInitAreIdempotent) {
  constexpr int64_t kN = 4;
  const JobConfig config = Config("idempotent", 2, Consistency::kAsync);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_NE(w[0], nullptr);
  ASSERT_NE(w[1], nullptr);
  const std::vector<float> initial = {1, 2, 3, 4}, other = Filled(kN, 9), g = Filled(kN, 1);
  ASSERT_TRUE(w[0]->CreateJob(config).ok());
  EXPECT_TRUE(w[0]->CreateJob(config).ok());
  EXPECT_TRUE(w[1]->CreateJob(config).ok());
  ASSERT_TRUE(w[0]->Init({{"w", {kN}, DType::kF32, initial.data()}}).ok());
  EXPECT_TRUE(w[0]->Init({{"w", {kN}, DType::kF32, initial.data()}}).ok());
  ASSERT_TRUE(w[0]->Push({{"w", g.data()}}).ok());  // no optimizer: the value adds the gradient
  EXPECT_TRUE(w[1]->Init({{"w", {kN}, DType::kF32, other.data()}}).ok());
  std::vector<float> out = Filled(kN, -1);
  ASSERT_TRUE(w[1]->Pull({{"w", out.data()}}).ok());
  EXPECT_EQ(out, std::vector<float>({2, 3, 4, 5}));
}

// A job or key that exists with another configuration or spec is
// kAlreadyExists, from the worker that knows it and from one that does not.
TEST_P(ParameterServerContractTest, ConflictingJobOrKeyIsAlreadyExists) {
  const JobConfig config = Config("conflict", 2, Consistency::kSync);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_NE(w[0], nullptr);
  ASSERT_NE(w[1], nullptr);
  ASSERT_TRUE(w[0]->CreateJob(config).ok());
  JobConfig more_workers = config;
  more_workers.num_workers = 3;
  EXPECT_EQ(w[1]->CreateJob(more_workers).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(w[0]->CreateJob(Config(config.job, 2, Consistency::kAsync)).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(w[0]->Init({{"w", {4}}}).ok());
  EXPECT_EQ(w[0]->Init({{"w", {5}}}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(w[1]->Init({{"w", {2, 2}}}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(w[1]->Init({{"w", {4}, DType::kF16}}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(w[1]->Init({{"w", {4}}}).ok());
}

// Unknown jobs and keys are kNotFound: a key counts as known to a worker
// once that worker Init'ed it.
TEST_P(ParameterServerContractTest, UnknownJobOrKeyIsNotFound) {
  const JobConfig config = Config("unknown", 2, Consistency::kAsync);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_NE(w[0], nullptr);
  ASSERT_NE(w[1], nullptr);
  EXPECT_EQ(w[0]->Init({{"w", {4}}}).code(), absl::StatusCode::kNotFound);  // no job yet
  EXPECT_EQ(w[0]->DeleteJob().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(w[0]->CreateJob(config).ok());
  ASSERT_TRUE(w[0]->Init({{"w", {4}}}).ok());
  std::vector<float> buffer = Filled(4, 1);
  EXPECT_EQ(w[0]->Push({{"nope", buffer.data()}}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(w[0]->Pull({{"nope", buffer.data()}}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(w[0]->PushPull({{"nope", buffer.data(), buffer.data()}}).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(w[0]->PushAsync({{"w", buffer.data()}, {"nope", buffer.data()}}).Wait().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(w[1]->Push({{"w", buffer.data()}}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(w[0]->DeleteJob().ok());
  EXPECT_EQ(w[1]->Init({{"w", {4}}}).code(), absl::StatusCode::kNotFound);
}

// Calls that cannot be right are kInvalidArgument, and change nothing.
TEST_P(ParameterServerContractTest, BadCallsAreInvalidArgument) {
  const JobConfig config = Config("bad-calls", 1, Consistency::kSync);
  std::unique_ptr<ParameterServer> w = Connect(config.job, 0);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->CreateJob(Config("another-job", 1, Consistency::kSync)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->CreateJob(Config(config.job, 0, Consistency::kSync)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(w->CreateJob(config).ok());
  EXPECT_EQ(w->Init({{"w", {4}}, {"w", {4}}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Init({{"i", {4}, DType::kI32}}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(w->Init({{"w", {4}}}).ok());
  std::vector<float> buffer = Filled(4, 1);
  EXPECT_EQ(w->Push({{"w", nullptr}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Pull({{"w", nullptr}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Pull({{"w", buffer.data(), -2}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->PushPull({{"w", buffer.data(), nullptr}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Push({{"w", buffer.data()}, {"w", buffer.data()}}).code(),
            absl::StatusCode::kInvalidArgument);
  // None of them counted as a round: the next push is round 1.
  std::vector<float> out = Filled(4, -1);
  ASSERT_TRUE(w->PushPull({{"w", buffer.data(), out.data()}}).ok());
  EXPECT_EQ(out, buffer);
  EXPECT_EQ(w->Pull({{"w", out.data(), 2}}).code(), absl::StatusCode::kOutOfRange);
}

// Operations on one key run in the order they were issued: pushes issued
// without waiting are rounds 1, 2, ... (a SYNC shard refuses a round
// before the previous one), and a pull issued after them returns the last.
TEST_P(ParameterServerContractTest, OperationsOnOneKeyRunInIssueOrder) {
  constexpr int kPushes = 20;
  const JobConfig config = Config("order", 1, Consistency::kSync);
  std::unique_ptr<ParameterServer> w = Connect(config.job, 0);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->CreateJob(config).ok());
  ASSERT_TRUE(w->Init({{"big", {kSlicedElements}}, {"small", {3}}}).ok());
  std::vector<std::vector<float>> grads;
  for (int p = 1; p <= kPushes; ++p) {
    std::vector<float> g;
    for (int64_t i = 0; i < kSlicedElements; ++i) g.push_back(static_cast<float>(p * 1000 + i % 7));
    grads.push_back(std::move(g));
  }
  const std::vector<float> small = {1, 2, 3};
  std::vector<Work> pushes;
  for (int p = 0; p < kPushes; ++p) {
    pushes.push_back(w->PushAsync({{"big", grads[p].data()}, {"small", small.data()}}));
  }
  std::vector<float> out = Filled(kSlicedElements, -1);
  Work pull = w->PullAsync({{"big", out.data()}});
  ASSERT_TRUE(pull.Wait().ok()) << pull.Wait();
  for (int p = 0; p < kPushes; ++p) {
    EXPECT_TRUE(pushes[p].Wait().ok()) << "push " << p << ": " << pushes[p].Wait();
  }
  EXPECT_EQ(out, grads.back());
  std::vector<float> small_out = Filled(3, -1);
  ASSERT_TRUE(w->Pull({{"small", small_out.data(), kPushes}}).ok());
  EXPECT_EQ(small_out, small);
}

// An operation waits for the one before it on its key, even when that one
// waits for other workers: worker 0's push of round 2, issued while its
// round-1 push-pull waits for worker 1, is sent only after round 1 completed
// (a SYNC shard would refuse it before).
TEST_P(ParameterServerContractTest, AnOperationWaitsForTheOneBeforeItOnItsKey) {
  constexpr int64_t kN = 32;
  const JobConfig config = Config("waits", 2, Consistency::kSync);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_TRUE(CreateJobAndInit(w, config, {{"w", {kN}}}));
  const std::vector<float> g1 = Filled(kN, 1), g2 = Filled(kN, 2), h1 = Filled(kN, 10),
                           h2 = Filled(kN, 20);
  std::vector<float> round1 = Filled(kN, -1), round2 = Filled(kN, -1);
  Work first = w[0]->PushPullAsync({{"w", g1.data(), round1.data()}});
  Work second = w[0]->PushAsync({{"w", g2.data()}});
  EXPECT_FALSE(DoneWithin(second, absl::Milliseconds(200)))
      << "the push of round 2 did not wait for round 1";
  ASSERT_TRUE(w[1]->Push({{"w", h1.data()}}).ok());
  ASSERT_TRUE(first.Wait().ok()) << first.Wait();
  ASSERT_TRUE(second.Wait().ok()) << second.Wait();
  ASSERT_TRUE(w[1]->PushPull({{"w", h2.data(), round2.data()}}).ok());
  EXPECT_EQ(round1, Filled(kN, 11));
  EXPECT_EQ(round2, Filled(kN, 22));
}

// LeaveJob: the job stays while any worker has not left (a worker reading
// its last round is not cut off), and is gone once every worker left.
TEST_P(ParameterServerContractTest, LeaveJobDropsTheJobOnceEveryWorkerLeft) {
  const JobConfig config = Config("leave", 2, Consistency::kSync);
  std::vector<std::unique_ptr<ParameterServer>> w;
  w.push_back(Connect(config.job, 0));
  w.push_back(Connect(config.job, 1));
  ASSERT_NE(w[0], nullptr);
  ASSERT_NE(w[1], nullptr);
  ASSERT_TRUE(w[0]->CreateJob(config).ok());
  for (auto& ps : w) ASSERT_TRUE(ps->Init({{"w", {kSlicedElements}}}).ok());
  std::vector<float> g0 = Filled(kSlicedElements, 1), g1 = Filled(kSlicedElements, 3);
  Work round0 = w[0]->PushPullAsync({{"w", g0.data(), g0.data()}});
  ASSERT_TRUE(w[1]->Push({{"w", g1.data()}}).ok());
  ASSERT_TRUE(round0.Wait().ok());
  ASSERT_TRUE(w[0]->LeaveJob().ok());
  ASSERT_TRUE(w[0]->LeaveJob().ok());  // twice: harmless
  // Worker 1 still pulls its last round after worker 0 left.
  std::vector<float> out(static_cast<size_t>(kSlicedElements), 0);
  ASSERT_TRUE(w[1]->Pull({{"w", out.data()}}).ok());
  EXPECT_EQ(out, Filled(kSlicedElements, 4));  // the sum of 1 and 3
  ASSERT_TRUE(w[1]->LeaveJob().ok());
  // The job is gone under the worker: ABORTED (LostJobStateError).
  EXPECT_EQ(w[1]->Pull({{"w", out.data()}}).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(w[0]->DeleteJob().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(w[1]->LeaveJob().code(), absl::StatusCode::kNotFound);
}

// Cancel ends a pull that waits for a round no one will complete, at once
// and with the reason; later calls fail the same way; DeleteJob still works.
TEST_P(ParameterServerContractTest, CancelEndsAWaitingPullAndLaterCalls) {
  const JobConfig config = Config("cancel", 2, Consistency::kSync);
  std::unique_ptr<ParameterServer> w0 = Connect(config.job, 0);
  std::unique_ptr<ParameterServer> w1 = Connect(config.job, 1);
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  ASSERT_TRUE(w0->CreateJob(config).ok());
  ASSERT_TRUE(w0->Init({{"w", {4}}}).ok());
  std::vector<float> g = Filled(4, 1);
  Work waiting = w0->PushPullAsync({{"w", g.data(), g.data()}});  // worker 1 never pushes
  EXPECT_FALSE(DoneWithin(waiting, absl::Milliseconds(200)));
  const absl::Time cancelled = absl::Now();
  w0->Cancel("peer rank 1 failed");
  ASSERT_TRUE(DoneWithin(waiting, absl::Seconds(2)));
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(2));
  const absl::Status s = waiting.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_NE(s.message().find("peer rank 1 failed"), absl::string_view::npos) << s;
  EXPECT_EQ(w0->Push({{"w", g.data()}}).code(), absl::StatusCode::kCancelled);
  // The other worker is not affected; cleanup still works.
  ASSERT_TRUE(w1->Init({{"w", {4}}}).ok());
  ASSERT_TRUE(w0->DeleteJob().ok());
  EXPECT_EQ(w1->Init({{"w", {4}}}).code(), absl::StatusCode::kNotFound);
}

}  // namespace kvstore
}  // namespace dtrain
