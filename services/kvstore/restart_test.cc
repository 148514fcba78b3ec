// Real kvstore_server processes: a shard killed with SIGKILL comes back from
// its snapshot and training continues; SIGTERM shuts down cleanly with a
// final snapshot.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/kvstore/client.h"
#include "services/kvstore/testing/server_process.h"

namespace dtrain {
namespace kvstore {
namespace {

float Grad(int worker, int step, int key, int64_t i) {
  return 0.01f * static_cast<float>((worker + 1) * ((i * 7 + step * 13 + key) % 11) - 5);
}

const std::vector<std::vector<int64_t>>& Shapes() {
  static const auto* shapes =
      new std::vector<std::vector<int64_t>>{{200000}, {100}, {30, 4}, {64}, {7}};
  return *shapes;
}

std::string KeyName(size_t k) { return absl::StrCat("param", k); }

JobConfig Config() {
  JobConfig config;
  config.job = "train";
  config.num_workers = 2;
  config.optimizer = OptimizerKind::kSgd;
  config.learning_rate = 0.1;
  config.momentum = 0.9;
  config.weight_decay = 0.01;
  return config;
}

// Local SGD state of one element.
struct Sim {
  float w = 0, v = 0;
  void Step(float g) {
    const JobConfig c = Config();
    float d = g + float(c.weight_decay) * w;
    v = float(c.momentum) * v + d;
    w = w - float(c.learning_rate) * v;
  }
};

class Workers {
 public:
  explicit Workers(const std::vector<std::string>& servers) {
    for (int w = 0; w < 2; ++w) {
      ClientOptions o;
      o.servers = servers;
      o.job = "train";
      o.worker = w;
      o.pull_timeout = absl::Seconds(20);
      o.max_attempts = 10;
      auto c = RemoteParameterServer::Connect(o);
      EXPECT_TRUE(c.ok()) << c.status();
      clients_.push_back(std::move(*c));
    }
    values_.resize(Shapes().size());
    grads_.resize(2, std::vector<std::vector<float>>(Shapes().size()));
    for (size_t k = 0; k < Shapes().size(); ++k) {
      int64_t n = 1;
      for (int64_t d : Shapes()[k]) n *= d;
      values_[k].resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) values_[k][static_cast<size_t>(i)] = 0.001f * float(i % 97);
      for (auto& g : grads_) g[k].resize(static_cast<size_t>(n));
    }
  }

  void Setup() {
    ASSERT_TRUE(clients_[0]->CreateJob(Config()).ok());
    for (auto& c : clients_) {
      std::vector<KeySpec> specs;
      for (size_t k = 0; k < Shapes().size(); ++k) {
        specs.push_back({KeyName(k), Shapes()[k], DType::kF32, values_[k].data()});
      }
      absl::Status s = c->Init(specs);
      ASSERT_TRUE(s.ok()) << s;
    }
  }

  // One training step: both workers push-pull every key.
  void Step(int step) {
    std::vector<std::vector<std::vector<float>>> out(2, values_);
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        std::vector<PushPullItem> items;
        for (size_t k = 0; k < Shapes().size(); ++k) {
          auto& g = grads_[w][k];
          for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(w, step, int(k), int64_t(i));
          items.push_back({KeyName(k), g.data(), out[w][k].data()});
        }
        absl::Status s = clients_[w]->PushPull(items);
        EXPECT_TRUE(s.ok()) << "step " << step << " worker " << w << ": " << s;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(out[0], out[1]);
    values_ = out[0];
  }

  // The current values, read without waiting.
  std::vector<std::vector<float>> Read() {
    std::vector<std::vector<float>> v = values_;
    std::vector<PullTarget> targets;
    for (size_t k = 0; k < Shapes().size(); ++k) targets.push_back({KeyName(k), v[k].data(), 0});
    absl::Status s = clients_[0]->Pull(targets);
    EXPECT_TRUE(s.ok()) << s;
    return v;
  }

  RemoteParameterServer& client(int w) { return *clients_[w]; }

 private:
  std::vector<std::unique_ptr<RemoteParameterServer>> clients_;
  std::vector<std::vector<float>> values_;
  std::vector<std::vector<std::vector<float>>> grads_;
};

TEST(RestartTest, ShardKilledWithSigkillResumesFromSnapshotAndTrainingContinues) {
  absl::StatusOr<std::string> binary = KVStoreServerBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  const std::string dir0 = FreshTestDir("shard0"), dir1 = FreshTestDir("shard1");
  ServerProcess shard0, shard1;
  ASSERT_TRUE(
      shard0.Start(*binary, {"--shard_index=0", "--data_dir=" + dir0, "--snapshot_interval_s=0"})
          .ok());
  ASSERT_TRUE(
      shard1.Start(*binary, {"--shard_index=1", "--data_dir=" + dir1, "--snapshot_interval_s=0"})
          .ok());
  Workers workers({shard0.address(), shard1.address()});
  workers.Setup();
  if (HasFatalFailure()) return;
  for (int step = 1; step <= 3; ++step) workers.Step(step);
  absl::StatusOr<std::vector<std::string>> files = workers.client(0).Snapshot();
  ASSERT_TRUE(files.ok()) << files.status();
  const std::vector<std::vector<float>> at_snapshot = workers.Read();
  for (int step = 4; step <= 5; ++step) workers.Step(step);
  const std::vector<std::vector<float>> before_kill = workers.Read();
  ASSERT_NE(before_kill, at_snapshot);

  // SIGKILL shard 1 and restart it from its directory, on the same port.
  ASSERT_TRUE(shard1.Kill(SIGKILL).ok());
  absl::StatusOr<int> status = shard1.Wait();
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << "wait status " << *status;
  ASSERT_TRUE(shard1.Restart().ok());
  for (int w = 0; w < 2; ++w) {
    absl::Status resynced = workers.client(w).Resync();
    ASSERT_TRUE(resynced.ok()) << resynced;
  }

  // Slices on shard 1 are as of the snapshot; slices on shard 0 kept going.
  const std::vector<std::vector<float>> after = workers.Read();
  std::map<int, int> slices_per_server;
  for (size_t k = 0; k < Shapes().size(); ++k) {
    const std::vector<PlacedSlice> placement = *workers.client(0).Placement(KeyName(k));
    for (const PlacedSlice& p : placement) {
      ++slices_per_server[p.server];
      const auto& expected = p.server == 1 ? at_snapshot[k] : before_kill[k];
      for (int64_t i = p.spec.offset; i < p.spec.offset + p.spec.count; ++i) {
        ASSERT_EQ(after[k][static_cast<size_t>(i)], expected[static_cast<size_t>(i)])
            << KeyName(k) << "[" << i << "] on shard " << p.server;
      }
    }
  }
  ASSERT_GT(slices_per_server[1], 0);
  ASSERT_GT(slices_per_server[0], 0);

  // Training continues: two more steps. Shard 1's slices resume at round 4
  // from the snapshot's weights and momentum; shard 0's are at round 6.
  for (int step = 6; step <= 7; ++step) workers.Step(step);
  const std::vector<std::vector<float>> final_values = workers.Read();
  for (size_t k = 0; k < Shapes().size(); ++k) {
    const std::vector<PlacedSlice> placement = *workers.client(0).Placement(KeyName(k));
    for (const PlacedSlice& p : placement) {
      for (int64_t i = p.spec.offset; i < p.spec.offset + p.spec.count; i += 97) {
        Sim sim;
        sim.w = 0.001f * float(i % 97);
        std::vector<int> steps = {1, 2, 3};
        if (p.server == 0) steps.insert(steps.end(), {4, 5});
        steps.insert(steps.end(), {6, 7});
        for (int s : steps) sim.Step(Grad(0, s, int(k), i) + Grad(1, s, int(k), i));
        ASSERT_EQ(final_values[k][static_cast<size_t>(i)], sim.w)
            << KeyName(k) << "[" << i << "] on shard " << p.server;
      }
    }
  }
  absl::StatusOr<JobStatus> job1 = workers.client(0).GetJob(1, true);
  ASSERT_TRUE(job1.ok());
  for (const SliceStatus& s : job1->slices) EXPECT_EQ(s.completed_round, 5) << s.spec.key;
  absl::StatusOr<JobStatus> job0 = workers.client(0).GetJob(0, true);
  for (const SliceStatus& s : job0->slices) EXPECT_EQ(s.completed_round, 7) << s.spec.key;
}

TEST(RestartTest, SigtermShutsDownCleanlyWithAFinalSnapshot) {
  absl::StatusOr<std::string> binary = KVStoreServerBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  const std::string dir = FreshTestDir("sigterm");
  ServerProcess shard;
  // No periodic snapshots: only the one written at shutdown.
  ASSERT_TRUE(shard
                  .Start(*binary, {"--data_dir=" + dir, "--snapshot_interval_s=0",
                                   "--metrics_listen=127.0.0.1:0"})
                  .ok());
  Workers workers({shard.address()});
  workers.Setup();
  if (HasFatalFailure()) return;
  for (int step = 1; step <= 2; ++step) workers.Step(step);
  const std::vector<std::vector<float>> before = workers.Read();

  ASSERT_TRUE(shard.Kill(SIGTERM).ok());
  absl::StatusOr<int> status = shard.Wait();
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;

  ASSERT_TRUE(shard.Restart().ok());
  for (int w = 0; w < 2; ++w) {
    absl::Status resynced = workers.client(w).Resync();
    ASSERT_TRUE(resynced.ok()) << resynced;
  }
  EXPECT_EQ(workers.Read(), before);
  EXPECT_EQ(*workers.client(1).PushedRound(KeyName(0)), 2);
  workers.Step(3);
  EXPECT_NE(workers.Read(), before);
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
