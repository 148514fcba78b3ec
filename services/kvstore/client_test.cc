// End-to-end tests of the gRPC client (libs/kvstore/client.h) against real
// shards on loopback ports.
#include "libs/kvstore/client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/sync_stream.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/kvstore/placement.h"
#include "libs/kvstore/proto_convert.h"
#include "libs/kvstore/wire.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"
#include "protos/kvstore.grpc.pb.h"
#include "services/kvstore/server.h"

namespace dtrain {
namespace kvstore {
namespace {

// n shards in this process, each on its own loopback port.
struct Cluster {
  explicit Cluster(int n, ServerOptions base = ServerOptions()) {
    for (int i = 0; i < n; ++i) {
      ServerOptions o = base;
      o.listen = "127.0.0.1:0";
      o.shard_index = i;
      auto s = KVStoreServer::Start(o);
      EXPECT_TRUE(s.ok()) << s.status();
      addresses.push_back((*s)->local_address());
      servers.push_back(std::move(*s));
    }
  }

  std::unique_ptr<RemoteParameterServer> Client(const std::string& job, int worker,
                                                ClientOptions options = ClientOptions()) {
    options.servers = addresses;
    options.job = job;
    options.worker = worker;
    auto c = RemoteParameterServer::Connect(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  std::vector<std::unique_ptr<KVStoreServer>> servers;
  std::vector<std::string> addresses;
};

// Deterministic gradient element for (worker, step, key, index).
float Grad(int worker, int step, int key, int64_t i) {
  uint32_t h = static_cast<uint32_t>(worker * 7919 + step * 104729 + key * 1299709 + i * 31);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return (static_cast<float>(h % 2001) - 1000.0f) / 1000.0f;
}

float Init(int key, int64_t i) { return std::sin(0.1f * static_cast<float>(i) + key); }

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// ---------------------------------------------------------------------------
// The sweep: shards x workers x consistency x optimizer, every worker doing
// K push-pulls on a few keys (one large enough to be sliced over all
// shards), checked against the same arithmetic done locally.

struct SweepCase {
  int shards;
  int workers;
  Consistency consistency;
  bool sgd;
};

std::string CaseName(const testing::TestParamInfo<SweepCase>& info) {
  const SweepCase& c = info.param;
  return absl::StrCat(c.shards, "shards_", c.workers, "workers_", ConsistencyName(c.consistency),
                      c.sgd ? "_sgd" : "_noopt");
}

class SweepTest : public testing::TestWithParam<SweepCase> {};

TEST_P(SweepTest, MatchesLocalArithmetic) {
  const SweepCase& c = GetParam();
  const int kSteps = 4;
  const std::vector<std::vector<int64_t>> shapes = {{300, 257}, {64}, {7, 3}};  // 300 KiB sliced
  Cluster cluster(c.shards);
  JobConfig config;
  config.job = "sweep";
  config.num_workers = c.workers;
  config.consistency = c.consistency;
  if (c.consistency == Consistency::kBoundedDelay) config.max_staleness = 1;
  if (c.sgd) {
    config.optimizer = OptimizerKind::kSgd;
    config.learning_rate = 0.1;
    // Momentum and weight decay make async results depend on arrival order,
    // so they are exercised under SYNC only (and in SgdEquivalence).
    if (c.consistency == Consistency::kSync) {
      config.momentum = 0.9;
      config.weight_decay = 0.01;
    }
  }
  std::vector<std::vector<float>> initial(shapes.size());
  for (size_t k = 0; k < shapes.size(); ++k) {
    int64_t n = 1;
    for (int64_t d : shapes[k]) n *= d;
    initial[k].resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) initial[k][static_cast<size_t>(i)] = Init(int(k), i);
  }

  // Every worker's view after its last push-pull.
  std::vector<std::vector<std::vector<float>>> seen(static_cast<size_t>(c.workers));
  std::vector<std::thread> threads;
  for (int w = 0; w < c.workers; ++w) {
    threads.emplace_back([&, w] {
      auto client = cluster.Client("sweep", w);
      ASSERT_TRUE(client->CreateJob(config).ok());
      std::vector<KeySpec> specs;
      for (size_t k = 0; k < shapes.size(); ++k) {
        specs.push_back({absl::StrCat("key", k), shapes[k], DType::kF32, initial[k].data()});
      }
      ASSERT_TRUE(client->Init(specs).ok());
      std::vector<std::vector<float>> grads(shapes.size()), values(shapes.size());
      for (int step = 1; step <= kSteps; ++step) {
        std::vector<PushPullItem> items;
        for (size_t k = 0; k < shapes.size(); ++k) {
          grads[k].resize(initial[k].size());
          values[k].resize(initial[k].size());
          for (size_t i = 0; i < grads[k].size(); ++i) {
            grads[k][i] = Grad(w, step, int(k), int64_t(i));
          }
          items.push_back({absl::StrCat("key", k), grads[k].data(), values[k].data()});
        }
        absl::Status s = client->PushPull(items);
        ASSERT_TRUE(s.ok()) << s;
      }
      if (c.consistency != Consistency::kSync) {
        // Everyone has pushed everything once all threads reach this point;
        // the final pull happens below after the join.
      }
      seen[static_cast<size_t>(w)] = values;
    });
  }
  for (auto& t : threads) t.join();
  if (HasFatalFailure()) return;

  // The final state, read by a fresh client at round 0 (no waiting).
  auto reader = cluster.Client("sweep", 0);
  std::vector<KeySpec> specs;
  for (size_t k = 0; k < shapes.size(); ++k) {
    specs.push_back({absl::StrCat("key", k), shapes[k], DType::kF32, nullptr});
  }
  ASSERT_TRUE(reader->Init(specs).ok());
  std::vector<std::vector<float>> final_values(shapes.size());
  std::vector<PullTarget> targets;
  for (size_t k = 0; k < shapes.size(); ++k) {
    final_values[k].resize(initial[k].size());
    targets.push_back({absl::StrCat("key", k), final_values[k].data(), 0});
  }
  ASSERT_TRUE(reader->Pull(targets).ok());

  // Local arithmetic.
  for (size_t k = 0; k < shapes.size(); ++k) {
    const size_t n = initial[k].size();
    std::vector<float> w = initial[k], v(n, 0.0f), last_sum(n, 0.0f);
    for (int step = 1; step <= kSteps; ++step) {
      std::vector<float> sum(n, 0.0f);
      for (int wk = 0; wk < c.workers; ++wk) {
        for (size_t i = 0; i < n; ++i) sum[i] += Grad(wk, step, int(k), int64_t(i));
      }
      last_sum = sum;
      if (c.sgd) {
        const float lr = static_cast<float>(config.learning_rate);
        const float mu = static_cast<float>(config.momentum);
        const float wd = static_cast<float>(config.weight_decay);
        for (size_t i = 0; i < n; ++i) {
          float d = sum[i] + wd * w[i];
          if (config.momentum != 0) {
            v[i] = mu * v[i] + d;
            d = v[i];
          }
          w[i] = w[i] - lr * d;
        }
      } else if (c.consistency != Consistency::kSync) {
        for (size_t i = 0; i < n; ++i) w[i] += sum[i];
      }
    }
    const std::vector<float>& expected =
        (!c.sgd && c.consistency == Consistency::kSync) ? last_sum : w;
    double tolerance = c.consistency == Consistency::kSync && c.workers <= 2 ? 0 : 2e-5;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(final_values[k][i], expected[i], tolerance * (1 + std::fabs(expected[i])))
          << "key" << k << "[" << i << "]";
    }
    if (c.consistency == Consistency::kSync) {
      // Every worker's push-pull of the last round returned that round's result.
      for (int wk = 0; wk < c.workers; ++wk) {
        ASSERT_EQ(Bytes(seen[static_cast<size_t>(wk)][k]), Bytes(final_values[k]))
            << "worker " << wk << " key" << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SweepTest,
                         testing::Values(SweepCase{1, 1, Consistency::kSync, false},
                                         SweepCase{1, 2, Consistency::kSync, true},
                                         SweepCase{2, 2, Consistency::kSync, false},
                                         SweepCase{2, 3, Consistency::kSync, true},
                                         SweepCase{3, 4, Consistency::kSync, true},
                                         SweepCase{4, 4, Consistency::kSync, false},
                                         SweepCase{4, 1, Consistency::kSync, true},
                                         SweepCase{1, 3, Consistency::kAsync, false},
                                         SweepCase{2, 2, Consistency::kAsync, true},
                                         SweepCase{4, 4, Consistency::kAsync, true},
                                         SweepCase{1, 2, Consistency::kBoundedDelay, true},
                                         SweepCase{3, 3, Consistency::kBoundedDelay, false},
                                         SweepCase{4, 4, Consistency::kBoundedDelay, true}),
                         CaseName);

// ---------------------------------------------------------------------------
// m workers pushing gradients for K steps with server-side SGD (momentum,
// weight decay) equals SGD applied locally to the summed gradients.

TEST(KVClientTest, ServerSideSgdEqualsLocalSgdOnSummedGradients) {
  for (auto [shards, workers] : {std::pair<int, int>{2, 3}, {4, 4}}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards, ", workers, " workers"));
    const int kSteps = 10;
    const std::vector<std::vector<int64_t>> shapes = {{256, 300}, {300}, {10, 30}};
    Cluster cluster(shards);
    JobConfig config;
    config.job = "sgd";
    config.num_workers = workers;
    config.optimizer = OptimizerKind::kSgd;
    config.learning_rate = 0.05;
    config.momentum = 0.9;
    config.weight_decay = 1e-4;
    std::vector<std::vector<float>> initial(shapes.size());
    for (size_t k = 0; k < shapes.size(); ++k) {
      int64_t n = 1;
      for (int64_t d : shapes[k]) n *= d;
      for (int64_t i = 0; i < n; ++i) initial[k].push_back(Init(int(k), i));
    }
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        auto client = cluster.Client("sgd", w);
        ASSERT_TRUE(client->CreateJob(config).ok());
        std::vector<KeySpec> specs;
        for (size_t k = 0; k < shapes.size(); ++k) {
          specs.push_back({absl::StrCat("p", k), shapes[k], DType::kF32, initial[k].data()});
        }
        ASSERT_TRUE(client->Init(specs).ok());
        std::vector<std::vector<float>> grads(shapes.size()), weights = initial;
        for (int step = 1; step <= kSteps; ++step) {
          // Gradients are pushed bucket by bucket as they become ready, then
          // the weights are pulled into the model's buffers.
          std::vector<Work> buckets;
          for (size_t k = 0; k < shapes.size(); ++k) {
            grads[k].resize(initial[k].size());
            for (size_t i = 0; i < grads[k].size(); ++i) {
              grads[k][i] = Grad(w, step, int(k), int64_t(i));
            }
            buckets.push_back(client->PushAsync({{absl::StrCat("p", k), grads[k].data()}}));
          }
          for (Work& p : buckets) ASSERT_TRUE(p.Wait().ok());
          std::vector<PullTarget> targets;
          for (size_t k = 0; k < shapes.size(); ++k) {
            targets.push_back({absl::StrCat("p", k), weights[k].data()});
          }
          absl::Status pulled = client->Pull(targets);
          ASSERT_TRUE(pulled.ok()) << pulled;
        }
        if (w == 0) {
          for (size_t k = 0; k < shapes.size(); ++k) {
            // The local reference.
            const size_t n = initial[k].size();
            std::vector<float> ref = initial[k], v(n, 0.0f);
            for (int step = 1; step <= kSteps; ++step) {
              for (size_t i = 0; i < n; ++i) {
                float g = 0;
                for (int wk = 0; wk < workers; ++wk) g += Grad(wk, step, int(k), int64_t(i));
                float d = g + float(config.weight_decay) * ref[i];
                v[i] = float(config.momentum) * v[i] + d;
                ref[i] = ref[i] - float(config.learning_rate) * v[i];
              }
            }
            // Relative to the weights' magnitude: the only difference is
            // the order in which the shard summed the workers' gradients
            // (arrival order), a rounding-level effect.
            double max_diff = 0, max_ref = 0;
            for (size_t i = 0; i < n; ++i) {
              max_diff = std::max(max_diff, std::fabs(double(weights[k][i]) - ref[i]));
              max_ref = std::max(max_ref, std::fabs(double(ref[i])));
            }
            EXPECT_LE(max_diff / max_ref, 1e-6) << "key p" << k;
            std::cerr << "key p" << k
                      << ": max |server - local| / max |local| = " << max_diff / max_ref << "\n";
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }
}

// ---------------------------------------------------------------------------
// A push retried after a timeout is applied once.

TEST(KVClientTest, PushRetriedAfterTimeoutIsAppliedOnce) {
  ServerOptions options;
  options.metrics_listen = "127.0.0.1:0";
  Cluster cluster(1, options);
  JobConfig config;
  config.job = "retry";
  config.num_workers = 2;
  ClientOptions impatient;
  impatient.pull_timeout = absl::Milliseconds(60);  // shorter than worker 1 takes
  impatient.max_attempts = 50;
  impatient.retry_backoff = absl::Milliseconds(1);
  auto w0 = cluster.Client("retry", 0, impatient);
  auto w1 = cluster.Client("retry", 1);
  ASSERT_TRUE(w0->CreateJob(config).ok());
  ASSERT_TRUE(w0->Init({{"k", {3}, DType::kF32, nullptr}}).ok());
  ASSERT_TRUE(w1->Init({{"k", {3}, DType::kF32, nullptr}}).ok());
  std::vector<float> g0 = {1, 2, 3}, g1 = {10, 20, 30}, out0(3), out1(3);
  // Worker 0's push-pull: the push lands, the pull times out waiting for
  // worker 1, and the client retries the whole call (same round).
  Work p0 = w0->PushPullAsync({{"k", g0.data(), out0.data()}});
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(w1->PushPull({{"k", g1.data(), out1.data()}}).ok());
  ASSERT_TRUE(p0.Wait().ok());
  EXPECT_EQ(out0, (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(out1, out0);
  EXPECT_EQ(*w0->PushedRound("k"), 1);
  absl::StatusOr<JobStatus> job = w0->GetJob(0, true);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->slices[0].completed_round, 1);
  EXPECT_EQ(job->slices[0].pushed_round, 1);
  // The server saw the retries as duplicates.
  auto text = metrics::Scrape(cluster.servers[0]->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<double> duplicates =
      metrics::SampleValue(*text, "dtrain_kvstore_duplicate_pushes_total");
  ASSERT_TRUE(duplicates.ok()) << *text;
  EXPECT_GE(*duplicates, 1);
  // (Over the data port, the default: the same metrics, method PushPull.)
  absl::StatusOr<double> timeouts = metrics::SampleValue(
      *text, "dtrain_kvstore_requests_total{code=\"DEADLINE_EXCEEDED\",method=\"PushPull\"}");
  EXPECT_TRUE(timeouts.ok() && *timeouts >= 1) << *text;
}

// ---------------------------------------------------------------------------
// Bad input over the wire: a clear status naming the problem, and every
// stored value and round left exactly as it was.

class RawStubs {
 public:
  explicit RawStubs(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channel_ = dtrain::rpc::NewChannel(address, args);
    data_ = v1::KVStoreData::NewStub(channel_);
    control_ = v1::KVStore::NewStub(channel_);
  }

  // A push with the generated (protobuf) stub, as any gRPC client would.
  absl::Status Push(const v1::PushRequest& request) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::PushResponse response;
    auto writer = data_->Push(&ctx, &response);
    writer->Write(request);
    writer->WritesDone();
    return FromGrpc(writer->Finish());
  }
  absl::Status PushStream(const std::vector<v1::PushRequest>& requests) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::PushResponse response;
    auto writer = data_->Push(&ctx, &response);
    for (const auto& r : requests) writer->Write(r);
    writer->WritesDone();
    return FromGrpc(writer->Finish());
  }
  absl::Status PushUnary(const v1::PushRequest& request) {
    grpc::ClientContext ctx;
    v1::PushResponse response;
    return FromGrpc(data_->PushUnary(&ctx, request, &response));
  }
  // A push of raw bytes (not necessarily a valid message).
  absl::Status PushBytes(const std::string& bytes) {
    grpc::ClientContext ctx;
    grpc::internal::RpcMethod method("/dtrain.kvstore.v1.KVStoreData/PushUnary",
                                     grpc::internal::RpcMethod::NORMAL_RPC);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    return FromGrpc(grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel_.get(), method, &ctx, request, &response));
  }
  absl::Status Pull(const v1::PullRequest& request) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::PullResponse response;
    return FromGrpc(data_->PullUnary(&ctx, request, &response));
  }
  absl::Status Init(const v1::InitRequest& request) {
    grpc::ClientContext ctx;
    v1::InitResponse response;
    auto writer = control_->Init(&ctx, &response);
    writer->Write(request);
    writer->WritesDone();
    return FromGrpc(writer->Finish());
  }
  absl::Status CreateJob(const v1::JobConfig& config) {
    grpc::ClientContext ctx;
    v1::CreateJobRequest request;
    *request.mutable_config() = config;
    v1::CreateJobResponse response;
    return FromGrpc(control_->CreateJob(&ctx, request, &response));
  }

 private:
  static absl::Status FromGrpc(const grpc::Status& s) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KVStoreData::Stub> data_;
  std::unique_ptr<v1::KVStore::Stub> control_;
};

v1::PushRequest GoodPush(const std::string& key, int64_t n, int32_t slice = 0) {
  v1::PushRequest r;
  r.set_job("safe");
  r.set_worker(0);
  v1::PushItem* item = r.add_items();
  item->set_key(key);
  item->set_slice(slice);
  item->set_round(1);
  item->set_dtype(0);
  item->add_shape(n);
  v1::Chunk* c = r.add_chunks();
  c->set_item(0);
  c->set_data(std::string(static_cast<size_t>(n) * 4, '\x01'));
  return r;
}

// Worker 1's top-k push (ratio 0.001) of round 2 of `key` (n elements)
// carrying the (index, value) pairs.
v1::PushRequest TopKPush(const std::string& key, int64_t n,
                         const std::vector<std::pair<uint32_t, float>>& pairs) {
  v1::PushRequest r = GoodPush(key, n);
  r.set_worker(1);
  r.set_compression(v1::COMPRESSION_TOPK);
  r.set_topk_ratio(0.001);
  r.mutable_items(0)->set_round(2);
  std::string bytes;
  for (const auto& [index, value] : pairs) {
    bytes.append(reinterpret_cast<const char*>(&index), 4);
    bytes.append(reinterpret_cast<const char*>(&value), 4);
  }
  r.mutable_chunks(0)->set_data(bytes);
  return r;
}

TEST(KVClientTest, BadInputGetsClearStatusAndLeavesValuesIntact) {
  ServerOptions options;
  options.quota_bytes_per_job = 1 << 20;
  options.max_message_bytes = 256 << 10;
  Cluster cluster(1, options);
  ClientOptions client_options;
  client_options.max_message_bytes = 256 << 10;
  client_options.chunk_bytes = 64 << 10;
  auto client = cluster.Client("safe", 0, client_options);
  JobConfig config;
  config.job = "safe";
  config.num_workers = 2;
  config.optimizer = OptimizerKind::kSgd;
  config.learning_rate = 0.1;
  config.momentum = 0.5;
  ASSERT_TRUE(client->CreateJob(config).ok());
  std::vector<float> a(8), b(3000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = Init(0, int64_t(i));
  for (size_t i = 0; i < b.size(); ++i) b[i] = Init(1, int64_t(i));
  ASSERT_TRUE(
      client->Init({{"a", {8}, DType::kF32, a.data()}, {"b", {3000}, DType::kF32, b.data()}}).ok());
  // One good round first, so optimizer state and rounds are not trivial.
  auto other = cluster.Client("safe", 1, client_options);
  ASSERT_TRUE(
      other->Init({{"a", {8}, DType::kF32, nullptr}, {"b", {3000}, DType::kF32, nullptr}}).ok());
  std::vector<float> ga(8, 0.5f), gb(3000, -0.25f);
  Work p1 = other->PushAsync({{"a", ga.data()}, {"b", gb.data()}});
  ASSERT_TRUE(client->Push({{"a", ga.data()}, {"b", gb.data()}}).ok());
  ASSERT_TRUE(p1.Wait().ok());
  // Worker 0 also pushes round 2 of "a" (pending), worker 1 does not.
  ASSERT_TRUE(client->Push({{"a", ga.data()}}).ok());

  auto snapshot = [&]() {
    std::vector<float> va(8), vb(3000);
    EXPECT_TRUE(client->Pull({{"a", va.data(), 0}, {"b", vb.data(), 0}}).ok());
    auto job = client->GetJob(0, true);
    std::string rounds;
    for (const SliceStatus& s : job->slices) {
      rounds += absl::StrCat(s.spec.key, ":", s.completed_round, "/", s.pushed_round, " ");
    }
    return Bytes(va) + Bytes(vb) + rounds + absl::StrCat(job->held_bytes);
  };
  const std::string before = snapshot();

  RawStubs raw(cluster.addresses[0]);
  struct Case {
    const char* name;
    std::function<absl::Status()> call;
    absl::StatusCode code;
    const char* message;  // must appear in the status message
  };
  std::vector<Case> cases = {
      {"unknown job",
       [&] {
         auto r = GoodPush("a", 8);
         r.set_job("nope");
         return raw.PushUnary(r);
       },
       absl::StatusCode::kNotFound, "job 'nope' not found"},
      {"unknown key", [&] { return raw.Push(GoodPush("zz", 8)); }, absl::StatusCode::kNotFound,
       "key 'zz'"},
      {"unknown slice", [&] { return raw.Push(GoodPush("a", 8, 3)); }, absl::StatusCode::kNotFound,
       "slice 3"},
      {"dtype",
       [&] {
         auto r = GoodPush("b", 3000);
         r.mutable_items(0)->set_dtype(1);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "dtype f16"},
      {"unknown dtype code",
       [&] {
         auto r = GoodPush("b", 3000);
         r.mutable_items(0)->set_dtype(42);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "dtype code 42"},
      {"shape",
       [&] {
         auto r = GoodPush("b", 3000);
         r.mutable_items(0)->clear_shape();
         r.mutable_items(0)->add_shape(1000);
         r.mutable_items(0)->add_shape(3);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "shape [1000, 3]"},
      {"worker id",
       [&] {
         auto r = GoodPush("b", 3000);
         r.set_worker(2);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "worker 2 is not a worker of job 'safe'"},
      {"negative worker id",
       [&] {
         auto r = GoodPush("b", 3000);
         r.set_worker(-7);
         return raw.PushUnary(r);
       },
       absl::StatusCode::kInvalidArgument, "worker -7"},
      {"round too far ahead",
       [&] {
         auto r = GoodPush("b", 3000);
         r.mutable_items(0)->set_round(3);
         return raw.Push(r);
       },
       absl::StatusCode::kOutOfRange, "round"},
      {"round ahead of the round in progress",
       [&] {
         auto r = GoodPush("a", 8);
         r.mutable_items(0)->set_round(3);
         return raw.Push(r);
       },
       absl::StatusCode::kOutOfRange, "too far ahead"},
      {"round zero",
       [&] {
         auto r = GoodPush("b", 3000);
         r.set_worker(1);
         r.mutable_items(0)->set_round(0);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "rounds start at 1"},
      {"value too short",
       [&] {
         auto r = GoodPush("b", 3000);
         r.mutable_chunks(0)->mutable_data()->resize(11996);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "expected 12000"},
      {"oversized value",
       [&] {
         auto r = GoodPush("a", 8);
         r.mutable_chunks(0)->mutable_data()->append("more");
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "larger than the 32 bytes"},
      {"oversized message",
       [&] {
         auto r = GoodPush("a", 8);
         r.mutable_chunks(0)->set_data(std::string(300 << 10, 'x'));
         return raw.Push(r);
       },
       absl::StatusCode::kResourceExhausted, ""},
      {"chunk for a missing item",
       [&] {
         auto r = GoodPush("a", 8);
         r.mutable_chunks(0)->set_item(5);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "chunk for item 5"},
      {"chunk out of order",
       [&] {
         auto r = GoodPush("a", 8);
         r.mutable_chunks(0)->set_offset(4);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "expected offset 0"},
      {"empty chunk",
       [&] {
         auto r = GoodPush("a", 8);
         r.add_chunks()->set_item(0);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "empty chunk"},
      {"malformed bytes", [&] { return raw.PushBytes(std::string("\x22\xff\xff\x01", 4)); },
       absl::StatusCode::kInvalidArgument, "malformed"},
      {"garbage tag", [&] { return raw.PushBytes(std::string("\x07\x01\x02", 3)); },
       absl::StatusCode::kInvalidArgument, "malformed"},
      {"unknown compression",
       [&] {
         auto r = GoodPush("a", 8);
         r.set_compression(static_cast<v1::Compression>(9));
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "compression 9"},
      {"top-k index past the slice",
       [&] {
         return raw.Push(TopKPush("b", 3000, {{0, 1.0f}, {1, 1.0f}, {3000, 1.0f}}));
       },
       absl::StatusCode::kInvalidArgument, "key 'b' slice 0: top-k pair 2 names index 3000"},
      {"top-k index 2^32 - 1",
       [&] {
         return raw.Push(TopKPush("b", 3000, {{0xffffffffu, 1.0f}, {1, 1.0f}, {2, 1.0f}}));
       },
       absl::StatusCode::kInvalidArgument, "top-k pair 0 names index 4294967295"},
      {"one bad top-k index spoils the batch",
       [&] {
         v1::PushRequest r = TopKPush("a", 8, {{7, 5.0f}});  // fine: k = 1 of 8
         v1::PushRequest b = TopKPush("b", 3000, {{0, 1.0f}, {5, 1.0f}, {99999, 1.0f}});
         *r.add_items() = b.items(0);
         v1::Chunk* c = r.add_chunks();
         *c = b.chunks(0);
         c->set_item(1);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "key 'b' slice 0: top-k pair 2 names index 99999"},
      {"top-k pairs of the wrong size",
       [&] {
         return raw.Push(TopKPush("b", 3000, {{0, 1.0f}, {1, 1.0f}}));
       },
       absl::StatusCode::kInvalidArgument, "expected 24"},
      {"top-k without a ratio",
       [&] {
         v1::PushRequest r = TopKPush("b", 3000, {{0, 1.0f}, {1, 1.0f}, {2, 1.0f}});
         r.set_topk_ratio(0);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "top-k ratio 0 is outside (0, 1]"},
      {"a ratio with f16",
       [&] {
         auto r = GoodPush("a", 8);
         r.set_compression(v1::COMPRESSION_F16);
         r.set_topk_ratio(0.5);
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "compression f16 takes no ratio"},
      {"same slice twice in one push",
       [&] {
         auto r = GoodPush("b", 3000);
         *r.add_items() = r.items(0);
         v1::Chunk* c = r.add_chunks();
         c->set_item(1);
         c->set_data(std::string(12000, '\x02'));
         return raw.Push(r);
       },
       absl::StatusCode::kInvalidArgument, "appears twice"},
      {"one bad item spoils the batch",
       [&] {
         auto r = GoodPush("b", 3000);
         r.set_worker(1);
         r.mutable_items(0)->set_round(2);  // fine for worker 1
         v1::PushItem* bad = r.add_items();
         *bad = r.items(0);
         bad->set_key("a");
         bad->clear_shape();
         bad->add_shape(8);
         bad->set_round(7);  // too far ahead
         v1::Chunk* c = r.add_chunks();
         c->set_item(1);
         c->set_data(std::string(32, '\x02'));
         return raw.Push(r);
       },
       absl::StatusCode::kOutOfRange, "key 'a'"},
      {"items in a later message",
       [&] {
         auto first = GoodPush("b", 3000);
         first.set_worker(1);
         first.mutable_items(0)->set_round(2);
         first.clear_chunks();
         return raw.PushStream({first, GoodPush("b", 3000)});
       },
       absl::StatusCode::kInvalidArgument, "only the first message"},
      {"pull of a round not pushed",
       [&] {
         v1::PullRequest r;
         r.set_job("safe");
         r.set_worker(1);
         v1::PullItem* item = r.add_items();
         item->set_key("a");
         item->set_round(2);
         return raw.Pull(r);
       },
       absl::StatusCode::kOutOfRange, "has pushed up to round 1"},
      {"pull of an unknown key",
       [&] {
         v1::PullRequest r;
         r.set_job("safe");
         r.add_items()->set_key("zz");
         return raw.Pull(r);
       },
       absl::StatusCode::kNotFound, "key 'zz'"},
      {"pull from a worker the job does not have",
       [&] {
         v1::PullRequest r;
         r.set_job("safe");
         r.set_worker(9);
         r.add_items()->set_key("a");
         return raw.Pull(r);
       },
       absl::StatusCode::kInvalidArgument, "worker 9"},
      {"Init with another shape",
       [&] {
         v1::InitRequest r;
         r.set_job("safe");
         v1::SliceSpec* s = r.add_slices();
         s->set_key("a");
         s->set_num_slices(1);
         s->add_shape(9);
         s->set_count(9);
         return raw.Init(r);
       },
       absl::StatusCode::kAlreadyExists, "key 'a'"},
      {"Init over quota",
       [&] {
         v1::InitRequest r;
         r.set_job("safe");
         v1::SliceSpec* s = r.add_slices();
         s->set_key("huge");
         s->set_num_slices(1);
         s->add_shape(1 << 20);
         s->set_count(1 << 20);
         return raw.Init(r);
       },
       absl::StatusCode::kResourceExhausted, "quota"},
      {"Init with a bad value size",
       [&] {
         v1::InitRequest r;
         r.set_job("safe");
         v1::SliceSpec* s = r.add_slices();
         s->set_key("new");
         s->set_num_slices(1);
         s->add_shape(4);
         s->set_count(4);
         v1::Chunk* c = r.add_chunks();
         c->set_data("short");
         return raw.Init(r);
       },
       absl::StatusCode::kInvalidArgument, "expected 16"},
      {"CreateJob with another config",
       [&] {
         v1::JobConfig c = ToProto(config);
         c.set_num_workers(5);
         return raw.CreateJob(c);
       },
       absl::StatusCode::kAlreadyExists, "exists with another configuration"},
      {"CreateJob with an unknown consistency",
       [&] {
         v1::JobConfig c = ToProto(config);
         c.set_job("fresh");
         c.set_consistency(static_cast<v1::Consistency>(17));
         return raw.CreateJob(c);
       },
       absl::StatusCode::kInvalidArgument, "consistency 17"},
  };
  // A long series: every case several times, interleaved.
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      absl::Status s = c.call();
      EXPECT_EQ(s.code(), c.code) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), c.message)) << s;
    }
  }
  EXPECT_EQ(snapshot(), before);  // bit for bit, rounds and usage included

  // The store still works: worker 1 completes round 2 of "a".
  ASSERT_TRUE(other->Push({{"a", ga.data()}}).ok());
  std::vector<float> after(8);
  ASSERT_TRUE(client->Pull({{"a", after.data()}}).ok());
  EXPECT_NE(Bytes(after), Bytes(a));
}

// ---------------------------------------------------------------------------
// Async API: several pushes of a key in flight run in order; large values
// stream in chunks under small message limits; compression; quota.

TEST(KVClientTest, AsyncPushesOfOneKeyRunInOrder) {
  Cluster cluster(2);
  JobConfig config;
  config.job = "async";
  config.consistency = Consistency::kAsync;
  auto client = cluster.Client("async", 0);
  ASSERT_TRUE(client->CreateJob(config).ok());
  std::vector<float> init(100000, 1.0f), g(100000, 0.5f), out(100000);
  ASSERT_TRUE(client->Init({{"w", {100000}, DType::kF32, init.data()}}).ok());
  std::vector<Work> pending;
  for (int i = 0; i < 6; ++i) pending.push_back(client->PushAsync({{"w", g.data()}}));
  Work pull = client->PullAsync({{"w", out.data()}});
  ASSERT_TRUE(pull.Wait().ok());
  for (Work& p : pending) EXPECT_TRUE(p.IsCompleted());
  for (float v : out) ASSERT_EQ(v, 4.0f);
  EXPECT_EQ(*client->PushedRound("w"), 6);
  // Errors come back through the handle.
  EXPECT_EQ(client->PushAsync({{"unknown", g.data()}}).Wait().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Pull({{"w", nullptr}}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KVClientTest, LargeValuesStreamInChunksUnderMessageLimits) {
  ServerOptions options;
  options.max_message_bytes = 256 << 10;
  options.chunk_bytes = 100 << 10;
  Cluster cluster(2, options);
  ClientOptions client_options;
  client_options.max_message_bytes = 256 << 10;
  client_options.chunk_bytes = 64 << 10;
  auto client = cluster.Client("big", 0, client_options);
  JobConfig config;
  config.job = "big";
  ASSERT_TRUE(client->CreateJob(config).ok());
  const int64_t n = 3 << 20;  // 12 MiB of f32, far over the message limit
  std::vector<float> init(n), g(n), out(n);
  for (int64_t i = 0; i < n; ++i) {
    init[i] = float(i % 1000);
    g[i] = float(i % 7);
  }
  ASSERT_TRUE(client->Init({{"w", {n}, DType::kF32, init.data()}}).ok());
  std::vector<float> first(n);
  ASSERT_TRUE(client->Pull({{"w", first.data(), 0}}).ok());
  EXPECT_EQ(Bytes(first), Bytes(init));
  ASSERT_TRUE(client->PushPull({{"w", g.data(), out.data()}}).ok());
  EXPECT_EQ(Bytes(out), Bytes(g));  // one worker, no optimizer: the round's sum
  EXPECT_EQ(client->Placement("w")->size(), 2u);
}

TEST(KVClientTest, CompressedPushes) {
  Cluster cluster(1);
  ClientOptions options;
  options.compression = Compression::kF16;
  auto client = cluster.Client("c", 0, options);
  JobConfig config;
  config.job = "c";
  ASSERT_TRUE(client->CreateJob(config).ok());
  std::vector<float> g = {0.1f, -2.5f, 1000.0f, 3e-3f}, out(4);
  ASSERT_TRUE(client->Init({{"w", {4}, DType::kF32, nullptr}}).ok());
  ASSERT_TRUE(client->PushPull({{"w", g.data(), out.data()}}).ok());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], g[i], 1e-3 * std::fabs(g[i]));
}

TEST(KVClientTest, ClientSideErrors) {
  Cluster cluster(1);
  ClientOptions bad;
  EXPECT_FALSE(RemoteParameterServer::Connect(bad).ok());  // no servers
  auto client = cluster.Client("j", 0);
  JobConfig other;
  other.job = "k";
  EXPECT_EQ(client->CreateJob(other).code(), absl::StatusCode::kInvalidArgument);
  JobConfig config;
  config.job = "j";
  ASSERT_TRUE(client->CreateJob(config).ok());
  ASSERT_TRUE(client->Init({{"w", {4}, DType::kF32, nullptr}}).ok());
  EXPECT_EQ(client->Init({{"w", {5}, DType::kF32, nullptr}}).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(client->PushedRound("x").status().code(), absl::StatusCode::kNotFound);
  std::vector<float> g(4);
  EXPECT_EQ(client->Push({{"w", g.data()}, {"w", g.data()}}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(client->DeleteJob().ok());
  // The shard no longer has the job this client Init'ed: ABORTED, transient,
  // so a trainer's attempt ends retryably (LostJobStateError).
  absl::Status gone = client->Push({{"w", g.data()}});
  EXPECT_EQ(gone.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(gone.message(), "DataPort.Push to 127.0.0.1:")) << gone;
  EXPECT_TRUE(absl::StrContains(gone.message(), "not found")) << gone;
  EXPECT_TRUE(absl::StrContains(gone.message(), "new attempt")) << gone;
}

// A round of a job's small keys (placement.h: under 64 KiB, on the job's
// home shard) is one request from each worker to one shard; the other
// shard holds none of them and serves no data request. With co-location
// off the same keys are placed by their names, over both shards, and each
// shard serves every worker's round.
TEST(KVClientTest, ARoundOfSmallKeysIsOneRequestToTheJobsHomeShard) {
  constexpr int kKeys = 8, kRounds = 3;
  constexpr int64_t kElements = 128;  // 512 B
  for (const bool colocate : {true, false}) {
    SCOPED_TRACE(colocate ? "colocated" : "spread");
    ServerOptions server_options;
    server_options.metrics_listen = "127.0.0.1:0";
    Cluster cluster(2, server_options);
    const std::string job = colocate ? "fused" : "spread";
    JobConfig config;
    config.job = job;
    config.num_workers = 2;
    ClientOptions options;
    if (!colocate) options.placement.colocate_below_bytes = 0;
    std::vector<std::unique_ptr<RemoteParameterServer>> workers;
    std::vector<KeySpec> specs;
    for (int k = 0; k < kKeys; ++k) {
      specs.push_back({absl::StrCat("layer", k, ".bias"), {kElements}, DType::kF32, nullptr});
    }
    for (int w = 0; w < 2; ++w) {
      workers.push_back(cluster.Client(job, w, options));
      ASSERT_TRUE(workers.back()->CreateJob(config).ok());
      ASSERT_TRUE(workers.back()->Init(specs).ok());
    }
    std::set<int> used;
    for (const KeySpec& spec : specs) {
      auto placed = workers[0]->Placement(spec.key);
      ASSERT_TRUE(placed.ok());
      ASSERT_EQ(placed->size(), 1u);
      used.insert((*placed)[0].server);
    }
    const int home = HomeShard(job, 2);
    if (colocate) {
      EXPECT_EQ(used, std::set<int>{home});
    } else {
      EXPECT_EQ(used.size(), 2u);  // these 8 names happen to hash to both shards
    }

    std::vector<std::vector<std::vector<float>>> grads(2), outs(2);
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::thread> threads;
      for (int w = 0; w < 2; ++w) {
        grads[w].assign(kKeys, std::vector<float>(kElements));
        outs[w].assign(kKeys, std::vector<float>(kElements));
        std::vector<PushPullItem> items;
        for (int k = 0; k < kKeys; ++k) {
          for (int64_t i = 0; i < kElements; ++i) grads[w][k][i] = Grad(w, round, k, i);
          items.push_back({specs[k].key, grads[w][k].data(), outs[w][k].data()});
        }
        threads.emplace_back([&, w, items] { EXPECT_TRUE(workers[w]->PushPull(items).ok()); });
      }
      for (auto& t : threads) t.join();
      for (int k = 0; k < kKeys; ++k) {
        for (int64_t i = 0; i < kElements; ++i) {
          ASSERT_EQ(outs[0][k][i], grads[0][k][i] + grads[1][k][i]) << round << " " << k;
        }
        ASSERT_EQ(outs[1][k], outs[0][k]);
      }
    }
    // Where the slices are, and how many data requests each shard served.
    for (int shard = 0; shard < 2; ++shard) {
      absl::StatusOr<JobStatus> held = cluster.servers[shard]->store().GetJob(job, 0, true);
      ASSERT_TRUE(held.ok()) << held.status();
      auto text = metrics::Scrape(cluster.servers[shard]->metrics_port());
      ASSERT_TRUE(text.ok()) << text.status();
      absl::StatusOr<double> pushpulls = metrics::SampleValue(
          *text, "dtrain_kvstore_requests_total{code=\"OK\",method=\"PushPull\"}");
      if (colocate && shard != home) {
        EXPECT_EQ(held->num_slices, 0) << "shard " << shard;
        EXPECT_EQ(pushpulls.ok() ? *pushpulls : 0.0, 0.0) << "shard " << shard;
      } else {
        EXPECT_GT(held->num_slices, 0) << "shard " << shard;
        // One request per worker and round, whatever the number of keys.
        ASSERT_TRUE(pushpulls.ok()) << *text;
        EXPECT_EQ(*pushpulls, 2 * kRounds) << "shard " << shard;
      }
    }
    if (colocate) {
      EXPECT_EQ(cluster.servers[home]->store().GetJob(job, 0, true)->num_slices, kKeys);
    }
  }
}

// Workers that would place the job's keys differently never meet in a
// round (their small keys on different shards), so the second one's
// CreateJob is refused with a status naming both placements; the first
// goes on. A config stating a placement the client does not use is refused
// by the client.
TEST(KVClientTest, AWorkerThatPlacesKeysOtherwiseIsRefusedAtCreateJob) {
  Cluster cluster(2);
  JobConfig config;
  config.job = "mixed";
  config.num_workers = 2;
  auto w0 = cluster.Client("mixed", 0);
  ASSERT_TRUE(w0->CreateJob(config).ok());
  ClientOptions spread;
  spread.placement.colocate_below_bytes = 0;
  auto w1 = cluster.Client("mixed", 1, spread);
  absl::Status s = w1->CreateJob(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "colocate_below_bytes=65536")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "colocate_below_bytes=0")) << s;
  // The same placement is the same job (CreateJob is idempotent).
  auto again = cluster.Client("mixed", 1);
  EXPECT_TRUE(again->CreateJob(config).ok());

  JobConfig foreign = config;
  foreign.placement = DescribePlacement(spread.placement);
  s = w0->CreateJob(foreign);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "this client places keys by")) << s;
  for (int shard = 0; shard < 2; ++shard) {
    auto held = cluster.servers[shard]->store().GetJob("mixed", 0, false);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(held->config.placement, DescribePlacement(PlacementOptions()));
  }
}

// A shard that dies fails the operations that need it within
// unavailable_timeout (UNAVAILABLE, naming the shard), instead of waiting
// for it up to rpc_timeout / pull_timeout per attempt; the live shard is
// unaffected.
TEST(KVClientTest, DeadShardFailsOperationsWithinUnavailableTimeout) {
  Cluster cluster(2);
  JobConfig config;
  config.job = "dead";
  config.num_workers = 1;
  ClientOptions options;
  options.unavailable_timeout = absl::Seconds(1);
  options.pull_timeout = absl::Minutes(5);
  auto w = cluster.Client("dead", 0, options);
  ASSERT_TRUE(w->CreateJob(config).ok());
  // 512 KiB: sliced over both shards.
  const int64_t n = 128 << 10;
  ASSERT_TRUE(w->Init({{"big", {n}, DType::kF32, nullptr}}).ok());
  std::vector<float> g(static_cast<size_t>(n), 1.0f);
  ASSERT_TRUE(w->PushPull({{"big", g.data(), g.data()}}).ok());
  const std::string dead = cluster.addresses[1];
  cluster.servers[1].reset();  // shut down: connections closed, port refused

  for (int op = 0; op < 3; ++op) {
    const absl::Time start = absl::Now();
    absl::Status s;
    if (op == 0) s = w->PushPull({{"big", g.data(), g.data()}});
    if (op == 1) s = w->Pull({{"big", g.data(), 0}});
    if (op == 2) s = w->GetJob(1, false).status();
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << op << ": " << s;
    EXPECT_NE(s.message().find(dead), absl::string_view::npos) << s;
    // Retried for the timeout (a shard restarting within it is waited
    // for), then given up: far below rpc_timeout (60 s).
    EXPECT_GE(took, absl::Milliseconds(900)) << op;
    EXPECT_LE(took, absl::Seconds(3)) << op;
  }
  absl::StatusOr<JobStatus> live = w->GetJob(0, false);
  EXPECT_TRUE(live.ok()) << live.status();
  // Cleanup reaches the live shard even though the dead one fails.
  EXPECT_EQ(w->DeleteJob().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::IsNotFound(cluster.servers[0]->store().GetJob("dead", 0, false).status()));
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
