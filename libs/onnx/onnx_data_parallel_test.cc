// An imported ONNX model trains through DataParallelTrainer exactly like the
// built-in model it mirrors: the PyTorch-exported LeNet
// (tests/reference/export_onnx.py) against the built-in "lenet", with every
// way trainers meet (one trainer on two devices, two trainers over a TCP
// allreduce, two trainers through a synchronous kvstore, one trainer through
// an asynchronous kvstore). The model reaches the trainer only through
// DataParallelOptions::model_factory; `init: from_model` is the restore hook.
#include <map>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/status.h"
#include "libs/base/testing.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/kvstore/in_process.h"
#include "libs/onnx/model.h"
#include "libs/train/data_parallel.h"

namespace dtrain {
namespace onnx {
namespace {

using train::DataParallelOptions;
using train::DataParallelTrainer;

constexpr int kSteps = 20;
constexpr int64_t kGlobalBatch = 32;

std::string LenetFile() { return RunfilePath("libs/onnx/testdata/lenet.onnx"); }

absl::StatusOr<std::shared_ptr<nn::Module>> ImportLenet(bool from_model) {
  ImportOptions o;
  o.input_shape = {1, 28, 28};
  o.num_classes = 10;
  o.from_model = from_model;
  auto m = ImportModelFile(LenetFile(), o);
  if (!m.ok()) return m.status();
  return std::shared_ptr<nn::Module>(*m);
}

void Batch(int step, Tensor* x, Tensor* y) {
  *x = Tensor::Empty({kGlobalBatch, 1, 28, 28});
  ops::RandomUniform(x, 0.0f, 1.0f, 99, static_cast<uint64_t>(step % 3) << 32);
  std::vector<int32_t> labels(kGlobalBatch);
  for (int64_t i = 0; i < kGlobalBatch; ++i)
    labels[i] = static_cast<int32_t>((i * 3 + step % 3) % 10);
  *y = Tensor::FromVector(labels, {kGlobalBatch});
}

enum class Mode { kLocalTwoDevices, kAllreduce, kKvstoreSync, kKvstoreAsync };

struct Run {
  bool imported = false;
  bool from_model = false;
};

// The losses of trainer 0 over kSteps steps.
std::vector<float> Train(Mode mode, Run run) {
  const int trainers = mode == Mode::kAllreduce || mode == Mode::kKvstoreSync ? 2 : 1;
  collective::InMemoryStore store;
  std::unique_ptr<kvstore::InProcessKVStore> kv;
  if (mode == Mode::kKvstoreSync || mode == Mode::kKvstoreAsync) {
    kvstore::InProcessOptions ko;
    ko.num_shards = 2;
    auto made = kvstore::InProcessKVStore::Create(ko);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return {};
    kv = std::move(*made);
  }
  // The file's weights, for the restore hook of `init: from_model` runs.
  std::map<std::string, Tensor> file_weights;
  if (run.from_model) {
    auto m = ImportLenet(true);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    for (auto& [name, p] : (*m)->NamedParameters()) file_weights[name] = p.value().Clone();
  }
  std::vector<std::vector<float>> losses(trainers);
  std::vector<absl::Status> status(trainers);
  std::vector<std::thread> threads;
  static int job = 0;
  const std::string job_name = absl::StrCat("onnx_dp_", job++);
  for (int rank = 0; rank < trainers; ++rank) {
    threads.emplace_back([&, rank] {
      auto fail = [&](const absl::Status& s) { status[rank] = s; };
      DataParallelOptions o;
      if (run.imported) {
        o.model_factory = [] { return ImportLenet(false); };
      } else {
        o.model = "lenet";
      }
      if (run.from_model) {
        o.restore = [&](nn::Module* m, nn::Sgd*) -> absl::Status {
          for (auto& [name, p] : m->NamedParameters()) {
            auto it = file_weights.find(name);
            if (it == file_weights.end()) return absl::NotFoundError(name);
            DT_RETURN_IF_ERROR(p.mutable_value().CopyFrom(it->second));
          }
          return absl::OkStatus();
        };
      }
      o.devices = mode == Mode::kLocalTwoDevices
                      ? std::vector<Device>{Device::Cpu(0), Device::Cpu(1)}
                      : std::vector<Device>{Device::Cpu(rank)};
      o.sgd = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
      o.init = nn::Init::kKaiming;
      o.seed = 5;
      o.bucket_bytes = 64 << 10;
      std::unique_ptr<collective::Communicator> comm;
      std::unique_ptr<kvstore::InProcessParameterServer> ps;
      if (mode == Mode::kAllreduce) {
        collective::CommunicatorOptions co;
        co.transport = collective::TransportKind::kTcp;
        co.timeout = absl::Seconds(60);
        auto c = collective::Communicator::Create(rank, trainers, &store, co);
        if (!c.ok()) return fail(c.status());
        comm = std::move(*c);
        o.communicator = comm.get();
      } else if (kv != nullptr) {
        auto p = kv->Connect(job_name, rank);
        if (!p.ok()) return fail(p.status());
        ps = std::move(*p);
        o.kvstore = ps.get();
        o.kvstore_workers = trainers;
        o.kvstore_consistency =
            mode == Mode::kKvstoreSync ? kvstore::Consistency::kSync : kvstore::Consistency::kAsync;
      }
      auto t = DataParallelTrainer::Create(o);
      if (!t.ok()) return fail(t.status());
      const int64_t share = kGlobalBatch / trainers;
      for (int s = 0; s < kSteps; ++s) {
        Tensor x, y;
        Batch(s, &x, &y);
        auto loss = (*t)->Step(x.Slice(rank * share, (rank + 1) * share).Clone(),
                               y.Slice(rank * share, (rank + 1) * share).Clone());
        if (!loss.ok()) return fail(loss.status());
        losses[rank].push_back(*loss);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < trainers; ++r)
    EXPECT_TRUE(status[r].ok()) << "trainer " << r << ": " << status[r];
  return losses[0];
}

void ExpectSame(const std::vector<float>& builtin, const std::vector<float>& imported) {
  ASSERT_EQ(builtin.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(imported.size(), builtin.size());
  for (size_t i = 0; i < builtin.size(); ++i) {
    EXPECT_NEAR(imported[i], builtin[i], 1e-5 * std::abs(builtin[i])) << "step " << i;
  }
  EXPECT_LT(builtin.back(), builtin.front()) << "the loss falls";
}

class OnnxDataParallelTest : public ::testing::TestWithParam<Mode> {};

TEST_P(OnnxDataParallelTest, ImportedLeNetLossesEqualTheBuiltinLeNets) {
  ExpectSame(Train(GetParam(), {.imported = false}), Train(GetParam(), {.imported = true}));
}

INSTANTIATE_TEST_SUITE_P(Modes, OnnxDataParallelTest,
                         ::testing::Values(Mode::kLocalTwoDevices, Mode::kAllreduce,
                                           Mode::kKvstoreSync, Mode::kKvstoreAsync),
                         [](const ::testing::TestParamInfo<Mode>& info) -> std::string {
                           switch (info.param) {
                             case Mode::kLocalTwoDevices:
                               return "LocalTwoDevices";
                             case Mode::kAllreduce:
                               return "TwoTrainersAllreduce";
                             case Mode::kKvstoreSync:
                               return "TwoTrainersKvstoreSync";
                             case Mode::kKvstoreAsync:
                               return "KvstoreAsync";
                           }
                           return "unknown";
                         });

// `init: from_model`: both start from the PyTorch file's weights.
TEST(OnnxDataParallel, FromModelWeightsTrainLikeTheBuiltinFromTheSameWeights) {
  auto builtin = Train(Mode::kAllreduce, {.imported = false, .from_model = true});
  auto imported = Train(Mode::kAllreduce, {.imported = true, .from_model = true});
  ExpectSame(builtin, imported);
  // And they did not start from our initializer's weights.
  auto ours = Train(Mode::kAllreduce, {.imported = true, .from_model = false});
  ASSERT_FALSE(ours.empty());
  EXPECT_GT(std::abs(ours[0] - imported[0]), 1e-4 * std::abs(imported[0]));
}

}  // namespace
}  // namespace onnx
}  // namespace dtrain
