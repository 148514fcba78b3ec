// train_bench: training-step throughput of one model on one device.
//
//   bazel run -c opt //tests/bench:train_bench -- --model=lenet \
//       --batch_size=256 --steps=100 --threads=2
//
// Times --steps full training steps (forward, mean cross-entropy, backward,
// SGD update) after --warmup untimed ones, on a pool of 8 random batches of
// the model's input shape (as tests/bench/torch_train_bench.py does), and
// prints key=value lines ending with samples_per_second=<n> and the model
// FLOPs utilization: flops_per_sample= (a training step's matrix-product
// FLOPs per sample, from the model's graph: libs/graph/flops.h),
// peak_gflops= (the measured f32 GEMM peak of one kernel thread,
// libs/ops/peak.h, times the threads in use), achieved_gflops= and mfu=.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "libs/autograd/functions.h"
#include "libs/graph/flops.h"
#include "libs/graph/hybridize.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/ops/ops.h"
#include "libs/ops/peak.h"
#include "libs/train/data_parallel.h"

ABSL_FLAG(std::string, model, "lenet", "mlp, lenet or resnet18");
ABSL_FLAG(int64_t, batch_size, 256, "minibatch size");
ABSL_FLAG(int, steps, 100, "timed steps");
ABSL_FLAG(int, warmup, 5, "untimed steps first");
ABSL_FLAG(int, threads, 2, "CPU threads for kernels");
ABSL_FLAG(double, lr, 0.1, "learning rate");
ABSL_FLAG(uint64_t, seed, 0, "seed");
ABSL_FLAG(bool, hybridize, false,
          "compile the whole training step (forward, backward, SGD) into one planned graph");
ABSL_FLAG(std::string, devices, "",
          "data-parallel over these devices, e.g. cpu:0,cpu:1 (each replica uses --threads "
          "threads); empty: one device, no data-parallel machinery");

namespace {

using namespace dtrain;  // NOLINT: a small program

double PeakRssMb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string model_name = absl::GetFlag(FLAGS_model);
  const int64_t batch = absl::GetFlag(FLAGS_batch_size);
  const int steps = absl::GetFlag(FLAGS_steps), warmup = absl::GetFlag(FLAGS_warmup);
  if (batch <= 0 || steps <= 0 || warmup < 0 || absl::GetFlag(FLAGS_threads) <= 0) {
    std::fprintf(stderr, "train_bench: --batch_size, --steps and --threads must be positive\n");
    return 2;
  }
  ops::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  absl::StatusOr<std::shared_ptr<nn::Module>> model = nn::MakeModel(model_name);
  absl::StatusOr<Shape> sample = nn::ModelInputShape(model_name);
  if (!model.ok() || !sample.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", std::string(model.status().message()).c_str());
    return 2;
  }
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  nn::InitParameters(model->get(), nn::Init::kNormal, seed, 0.01f);
  nn::Sgd opt((*model)->NamedParameters(), {.lr = static_cast<float>(absl::GetFlag(FLAGS_lr))});
  int64_t classes = model_name == "mlp_chapter" ? 2 : 10;

  Shape shape = {batch};
  shape.insert(shape.end(), sample->begin(), sample->end());
  std::vector<Tensor> xs, ys;
  for (int i = 0; i < 8; ++i) {
    Tensor x = Tensor::Empty(shape);
    ops::RandomUniform(&x, 0.0f, 1.0f, seed + 1, static_cast<uint64_t>(i) << 32);
    std::vector<int32_t> labels(batch);
    for (int64_t j = 0; j < batch; ++j) labels[j] = static_cast<int32_t>((j * 7 + i) % classes);
    xs.push_back(x);
    ys.push_back(Tensor::FromVector(labels, {batch}));
  }
  float last_loss = 0;
  std::unique_ptr<train::DataParallelTrainer> dp;
  std::string devices = absl::GetFlag(FLAGS_devices);
  if (!devices.empty()) {
    train::DataParallelOptions o;
    o.model = model_name;
    o.devices.clear();
    for (absl::string_view d : absl::StrSplit(devices, ',')) {
      absl::StatusOr<Device> dev = Device::Parse(d);
      if (!dev.ok()) {
        std::fprintf(stderr, "train_bench: %s\n", std::string(dev.status().message()).c_str());
        return 2;
      }
      o.devices.push_back(*dev);
    }
    o.threads_per_device = absl::GetFlag(FLAGS_threads);
    o.sgd = {.lr = static_cast<float>(absl::GetFlag(FLAGS_lr))};
    o.seed = seed;
    absl::StatusOr<std::unique_ptr<train::DataParallelTrainer>> t =
        train::DataParallelTrainer::Create(o);
    if (!t.ok()) {
      std::fprintf(stderr, "train_bench: %s\n", std::string(t.status().message()).c_str());
      return 2;
    }
    dp = std::move(*t);
  }
  std::unique_ptr<graph::TrainStep> hybrid;
  if (absl::GetFlag(FLAGS_hybridize)) {
    if (dp) {
      std::fprintf(stderr, "train_bench: --hybridize and --devices cannot be combined yet\n");
      return 2;
    }
    absl::StatusOr<std::unique_ptr<graph::TrainStep>> h = graph::HybridizeTrainingStep(
        model->get(), shape, classes, {.lr = static_cast<float>(absl::GetFlag(FLAGS_lr))});
    if (!h.ok()) {
      std::fprintf(stderr, "train_bench: %s\n", std::string(h.status().message()).c_str());
      return 2;
    }
    hybrid = std::move(*h);
  }
  auto step = [&](int i) {
    if (hybrid) {
      last_loss = hybrid->Run(xs[i % 8], ys[i % 8]);
      return;
    }
    if (dp) {
      absl::StatusOr<float> l = dp->Step(xs[i % 8], ys[i % 8]);
      if (!l.ok()) {
        std::fprintf(stderr, "train_bench: %s\n", std::string(l.status().message()).c_str());
        std::exit(1);
      }
      last_loss = *l;
      return;
    }
    autograd::Variable logits = (*model)->Forward(autograd::Variable(xs[i % 8]));
    autograd::Variable loss = autograd::SoftmaxCrossEntropy(logits, ys[i % 8]);
    opt.ZeroGrad();
    loss.Backward();
    opt.Step();
    last_loss = ops::ScalarValue(loss.value());
  };
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < warmup; ++i) step(i);
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step(i);
  auto t2 = std::chrono::steady_clock::now();
  double warm_s = std::chrono::duration<double>(t1 - t0).count();
  double secs = std::chrono::duration<double>(t2 - t1).count();
  AllocatorStats stats = (*GetAllocator(Device::Cpu()))->stats();
  std::printf("framework=dtrain model=%s batch_size=%lld threads=%d devices=%s hybridize=%d\n",
              model_name.c_str(), static_cast<long long>(batch), absl::GetFlag(FLAGS_threads),
              devices.empty() ? "cpu" : devices.c_str(), hybrid ? 1 : 0);
  std::printf("params=%lld\n", static_cast<long long>((*model)->NumParameters()));
  std::printf("warmup_steps=%d warmup_seconds=%.3f\n", warmup, warm_s);
  std::printf("steps=%d seconds=%.3f ms_per_step=%.3f last_loss=%.4f\n", steps, secs,
              1000 * secs / steps, last_loss);
  std::printf("peak_tensor_mb=%.1f\n", stats.peak_bytes_in_use / 1048576.0);
  std::printf("peak_rss_mb=%.1f\n", PeakRssMb());
  // MFU, measured after the timed steps (so it does not warm them up).
  const double sps = batch * steps / secs;
  absl::StatusOr<graph::TrainingFlops> flops = graph::TrainingFlopsPerSample(model_name);
  absl::StatusOr<double> per_thread = ops::MeasureGemmPeakFlops({.threads = 1});
  if (flops.ok() && per_thread.ok()) {
    const int total_threads = absl::GetFlag(FLAGS_threads) * (dp ? dp->num_devices() : 1);
    const double peak = *per_thread * total_threads;
    std::printf("flops_per_sample=%.0f peak_gflops_per_thread=%.2f peak_gflops=%.2f\n",
                flops->total(), *per_thread / 1e9, peak / 1e9);
    std::printf("achieved_gflops=%.2f mfu=%.4f\n", flops->total() * sps / 1e9,
                flops->total() * sps / peak);
  } else {
    std::fprintf(stderr, "train_bench: no MFU: %s\n",
                 (flops.ok() ? per_thread.status() : flops.status()).ToString().c_str());
  }
  std::printf("samples_per_second=%.1f\n", sps);
  return 0;
}
