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
//
// With --model_file=net.onnx the same run also trains the ONNX model imported
// from that file (libs/onnx; e.g. the PyTorch export of --model's twin, made
// by tests/reference/export_onnx.py) with the same settings and weights
// initialized the same way, in --rounds rounds that each build both models
// afresh in alternating order and time a block of steps of each (ABBA), so
// neither the order of construction nor machine load favors one (within a
// round the two models' steps alternate one by one, ABBA), and prints
// imported_* figures, imported_vs_builtin_ratio= (imported samples/s over
// built-in samples/s, all rounds together), and each round's ratio with
// their median, minimum and maximum (round_ratios=, round_ratio_median=).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "libs/autograd/functions.h"
#include "libs/graph/autodiff.h"
#include "libs/graph/flops.h"
#include "libs/graph/hybridize.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/onnx/model.h"
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
ABSL_FLAG(std::string, model_file, "",
          "also train this ONNX model (same input shape and classes as --model) in the same "
          "run and compare");
ABSL_FLAG(int, rounds, 6,
          "with --model_file: rounds, each building both models afresh (alternating which "
          "first) and timing a block of steps of each");

namespace {

using namespace dtrain;  // NOLINT: a small program

double PeakRssMb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

// One model under training: plain (eager autograd + nn::Sgd), hybridized, or
// data-parallel, as the flags say.
struct Contender {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<nn::Sgd> opt;
  std::unique_ptr<train::DataParallelTrainer> dp;
  std::unique_ptr<graph::TrainStep> hybrid;
  float last_loss = 0;
  double secs = 0;  // timed steps so far

  void Step(int i, const std::vector<Tensor>& xs, const std::vector<Tensor>& ys) {
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
    autograd::Variable logits = model->Forward(autograd::Variable(xs[i % 8]));
    autograd::Variable loss = autograd::SoftmaxCrossEntropy(logits, ys[i % 8]);
    opt->ZeroGrad();
    loss.Backward();
    opt->Step();
    last_loss = ops::ScalarValue(loss.value());
  }
  void Time(int begin, int end, const std::vector<Tensor>& xs, const std::vector<Tensor>& ys) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = begin; i < end; ++i) Step(i, xs, ys);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

using ModelFactory = std::function<absl::StatusOr<std::shared_ptr<nn::Module>>()>;

absl::StatusOr<Contender> MakeContender(const ModelFactory& factory, const Shape& shape,
                                        int64_t classes, const std::string& devices, uint64_t seed,
                                        float lr) {
  Contender c;
  absl::StatusOr<std::shared_ptr<nn::Module>> m = factory();
  if (!m.ok()) return m.status();
  c.model = *m;
  nn::InitParameters(c.model.get(), nn::Init::kNormal, seed, 0.01f);
  c.opt = std::make_unique<nn::Sgd>(c.model->NamedParameters(), ops::SgdParams{.lr = lr});
  if (!devices.empty()) {
    train::DataParallelOptions o;
    o.model_factory = factory;
    o.devices.clear();
    for (absl::string_view d : absl::StrSplit(devices, ',')) {
      absl::StatusOr<Device> dev = Device::Parse(d);
      if (!dev.ok()) return dev.status();
      o.devices.push_back(*dev);
    }
    o.threads_per_device = absl::GetFlag(FLAGS_threads);
    o.sgd = {.lr = lr};
    o.seed = seed;
    absl::StatusOr<std::unique_ptr<train::DataParallelTrainer>> t =
        train::DataParallelTrainer::Create(o);
    if (!t.ok()) return t.status();
    c.dp = std::move(*t);
  }
  if (absl::GetFlag(FLAGS_hybridize)) {
    if (c.dp) {
      return absl::InvalidArgumentError("--hybridize and --devices cannot be combined yet");
    }
    absl::StatusOr<std::unique_ptr<graph::TrainStep>> h =
        graph::HybridizeTrainingStep(c.model.get(), shape, classes, {.lr = lr});
    if (!h.ok()) return h.status();
    c.hybrid = std::move(*h);
  }
  return c;
}

// graph::TrainingFlopsPerSample for a module rather than a built-in name.
absl::StatusOr<graph::TrainingFlops> ModuleFlopsPerSample(nn::Module* m, const Shape& sample) {
  constexpr int64_t kBatch = 2;
  Shape input = {kBatch};
  input.insert(input.end(), sample.begin(), sample.end());
  absl::StatusOr<graph::Graph> g = graph::TraceModule(m, input, /*training=*/true);
  if (!g.ok()) return g.status();
  absl::Status s = graph::BuildTrainingStep(&*g, {.lr = 0.1f});
  if (!s.ok()) return s;
  graph::TrainingFlops f = graph::CountMatrixFlops(*g);
  f.forward /= kBatch;
  f.backward /= kBatch;
  return f;
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
  absl::StatusOr<Shape> sample = nn::ModelInputShape(model_name);
  if (!sample.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", std::string(sample.status().message()).c_str());
    return 2;
  }
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  const float lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
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
  const std::string devices = absl::GetFlag(FLAGS_devices);
  const std::string model_file = absl::GetFlag(FLAGS_model_file);
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "train_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  };
  const ModelFactory make_builtin = [&] { return nn::MakeModel(model_name); };
  onnx::ImportOptions io;
  io.input_shape = *sample;
  io.num_classes = classes;
  io.from_model = false;
  const ModelFactory make_imported = [&]() -> absl::StatusOr<std::shared_ptr<nn::Module>> {
    auto m = onnx::ImportModelFile(model_file, io);
    if (!m.ok()) return m.status();
    return std::shared_ptr<nn::Module>(*m);
  };
  absl::StatusOr<Contender> builtin, imported;
  double warm_s = 0, builtin_secs = 0, imported_secs = 0;
  std::vector<double> round_ratios;  // imported over built-in samples/s, each round
  if (model_file.empty()) {
    builtin = MakeContender(make_builtin, shape, classes, devices, seed, lr);
    if (!builtin.ok()) return fail(builtin.status());
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < warmup; ++i) builtin->Step(i, xs, ys);
    warm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    builtin->Time(0, steps, xs, ys);
    builtin_secs = builtin->secs;
  } else {
    // Each round builds both models afresh, in alternating order, warms both
    // up (untimed) and times its share of the steps in ABBA order. The order
    // of construction matters on its own: with two identical built-in models
    // (an A/A run) the one built second was 5% slower, and built first the
    // imported LeNet came out 9% faster; alternating cancels that.
    const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
    for (int r = 0; r < rounds; ++r) {
      builtin = absl::StatusOr<Contender>();
      imported = absl::StatusOr<Contender>();
      const bool builtin_first = r % 2 == 0;
      for (int k = 0; k < 2; ++k) {
        if ((k == 0) == builtin_first) {
          builtin = MakeContender(make_builtin, shape, classes, devices, seed, lr);
          if (!builtin.ok()) return fail(builtin.status());
        } else {
          imported = MakeContender(make_imported, shape, classes, devices, seed, lr);
          if (!imported.ok()) return fail(imported.status());
        }
      }
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < warmup; ++i) builtin->Step(i, xs, ys);
      warm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (int i = 0; i < warmup; ++i) imported->Step(i, xs, ys);
      const int begin = steps * r / rounds, end = steps * (r + 1) / rounds;
      // Step by step, ABBA (the model that goes first alternates), so that
      // a change of the machine's load within the round hits both alike.
      for (int i = begin; i < end; ++i) {
        const bool b_first = ((i - begin) % 2 == 0) == builtin_first;
        Contender& first = b_first ? *builtin : *imported;
        Contender& second = b_first ? *imported : *builtin;
        first.Time(i, i + 1, xs, ys);
        second.Time(i, i + 1, xs, ys);
      }
      builtin_secs += builtin->secs;
      imported_secs += imported->secs;
      if (end > begin && imported->secs > 0) round_ratios.push_back(builtin->secs / imported->secs);
    }
  }
  const double secs = builtin_secs;
  AllocatorStats stats = (*GetAllocator(Device::Cpu()))->stats();
  std::printf("framework=dtrain model=%s batch_size=%lld threads=%d devices=%s hybridize=%d\n",
              model_name.c_str(), static_cast<long long>(batch), absl::GetFlag(FLAGS_threads),
              devices.empty() ? "cpu" : devices.c_str(), builtin->hybrid ? 1 : 0);
  std::printf("params=%lld\n", static_cast<long long>(builtin->model->NumParameters()));
  std::printf("warmup_steps=%d warmup_seconds=%.3f\n", warmup, warm_s);
  std::printf("steps=%d seconds=%.3f ms_per_step=%.3f last_loss=%.4f\n", steps, secs,
              1000 * secs / steps, builtin->last_loss);
  std::printf("peak_tensor_mb=%.1f\n", stats.peak_bytes_in_use / 1048576.0);
  std::printf("peak_rss_mb=%.1f\n", PeakRssMb());
  // MFU, measured after the timed steps (so it does not warm them up).
  const double sps = batch * steps / secs;
  absl::StatusOr<graph::TrainingFlops> flops = graph::TrainingFlopsPerSample(model_name);
  absl::StatusOr<double> per_thread = ops::MeasureGemmPeakFlops({.threads = 1});
  const int total_threads =
      absl::GetFlag(FLAGS_threads) * (builtin->dp ? builtin->dp->num_devices() : 1);
  if (flops.ok() && per_thread.ok()) {
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
  if (!model_file.empty()) {
    const double isps = batch * steps / imported_secs;
    std::printf("imported_model_file=%s imported_params=%lld\n", model_file.c_str(),
                static_cast<long long>(imported->model->NumParameters()));
    std::printf("imported_seconds=%.3f imported_ms_per_step=%.3f imported_last_loss=%.4f\n",
                imported_secs, 1000 * imported_secs / steps, imported->last_loss);
    // FLOPs counted from the imported model's own traced graph.
    absl::StatusOr<graph::TrainingFlops> iflops =
        ModuleFlopsPerSample(imported->model.get(), *sample);
    if (iflops.ok() && per_thread.ok()) {
      std::printf("imported_flops_per_sample=%.0f imported_mfu=%.4f\n", iflops->total(),
                  iflops->total() * isps / (*per_thread * total_threads));
    } else {
      std::fprintf(stderr, "train_bench: no imported MFU: %s\n",
                   (iflops.ok() ? per_thread.status() : iflops.status()).ToString().c_str());
    }
    std::printf("imported_samples_per_second=%.1f\n", isps);
    std::printf("imported_vs_builtin_ratio=%.3f\n", isps / sps);
    // Each round's ratio: the spread says how much the machine's load moved
    // the figures; the median is robust to a round that a burst of load hit.
    if (!round_ratios.empty()) {
      std::vector<double> sorted = round_ratios;
      std::sort(sorted.begin(), sorted.end());
      const size_t n = sorted.size();
      const double median = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
      std::string each;
      for (double v : round_ratios) each += absl::StrFormat("%s%.3f", each.empty() ? "" : ",", v);
      std::printf("round_ratios=%s\n", each.c_str());
      std::printf("round_ratio_median=%.3f round_ratio_min=%.3f round_ratio_max=%.3f\n", median,
                  sorted.front(), sorted.back());
    }
  }
  return 0;
}
