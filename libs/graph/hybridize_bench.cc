// hybridize_bench: imperative vs hybridized execution.
//
//   bazel run --config=bench //libs/graph:hybridize_bench            # forward
//   bazel run --config=bench //libs/graph:hybridize_bench -- --memory
//   bazel run --config=bench //libs/graph:hybridize_bench -- --train
//
// Default: the chapter's experiment. mlp_chapter (Linear(512,256), ReLU,
// Linear(256,128), ReLU, Linear(128,2)) on one input of batch 1, one
// thread; --reps repetitions of --iters forward passes each for the eager
// (imperative, no-grad, eval) model and its hybridized plan, alternating;
// prints the best repetition of each in microseconds per forward:
//   eager_us_per_forward=<n>
//   hybridized_us_per_forward=<n>
//
// --memory: one resnet18 training step at --batch_size (default 32):
//   imperative_peak_bytes=<n>  the allocator's peak during the step above
//                              what was in use before it (parameters, batch)
//   planned_peak_bytes=<n>     the hybridized plan's arena (all intermediates)
//
// --train: training throughput of --model (default lenet) at --batch_size
// (default 256) with --threads (default 2): an imperative step (forward,
// cross-entropy, backward, SGD) and a hybridized step, alternating, --reps
// rounds of --steps each; prints samples/s of each, their ratio, and the
// ratios of the best round and of the fastest single steps (the latter are
// robust to other load on a shared machine).
//
// --profile prints the hybridized plan's time per node (with --train: the
// training step); --dump prints the optimized graph; --save=PATH (forward
// mode) writes the hybridized model to PATH (serialize.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "libs/autograd/functions.h"
#include "libs/graph/hybridize.h"
#include "libs/graph/serialize.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/ops/ops.h"

ABSL_FLAG(bool, memory, false, "compare peak memory of a resnet18 training step");
ABSL_FLAG(bool, train, false, "compare training throughput");
ABSL_FLAG(bool, profile, false, "print time per node of the hybridized plan");
ABSL_FLAG(bool, dump, false, "print the optimized graph");
ABSL_FLAG(std::string, model, "", "model (default: mlp_chapter, resnet18 --memory, lenet --train)");
ABSL_FLAG(int64_t, batch_size, 0, "batch (default: 1, 32 --memory, 256 --train)");
ABSL_FLAG(int, threads, 0, "CPU threads (default: 1, 2 --memory and --train)");
ABSL_FLAG(int, iters, 1000, "forward passes per repetition");
ABSL_FLAG(int, reps, 5, "repetitions (forward) or rounds (--train)");
ABSL_FLAG(int, steps, 10, "--train: steps per round and variant");
ABSL_FLAG(bool, small_conv, true, "let the plan use libs/graph's direct first-layer convolution");
ABSL_FLAG(bool, fuse, true, "run the fusion passes");
ABSL_FLAG(std::string, save, "", "forward mode: also save the hybridized model to this file");

namespace {

using namespace dtrain;  // NOLINT: a small program
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::shared_ptr<nn::Module> MakeModel(const std::string& name) {
  absl::StatusOr<std::shared_ptr<nn::Module>> m = nn::MakeModel(name);
  if (!m.ok()) {
    std::fprintf(stderr, "hybridize_bench: %s\n", std::string(m.status().message()).c_str());
    std::exit(2);
  }
  nn::InitParameters(m->get(), nn::Init::kKaiming, 0);
  return *m;
}

Shape BatchShape(const std::string& name, int64_t batch) {
  Shape s = {batch};
  absl::StatusOr<Shape> sample = nn::ModelInputShape(name);
  s.insert(s.end(), sample->begin(), sample->end());
  return s;
}

template <typename T>
T OrDie(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "hybridize_bench: %s\n", v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*v);
}

void PrintProfile(graph::Executable& exe, const std::vector<Tensor>& inputs, int iters) {
  std::vector<graph::NodeProfile> prof = OrDie(exe.Profile(inputs, iters));
  double total = 0, total_min = 0;
  for (const auto& p : prof) {
    total += p.total_ms;
    total_min += p.min_ms;
  }
  for (const auto& p : prof) {
    std::printf("profile op=%s shape=%s mean_ms=%.3f min_ms=%.3f share=%.1f%%\n", p.op.c_str(),
                p.shape.c_str(), p.total_ms / iters, p.min_ms, 100 * p.total_ms / total);
  }
  std::printf("profile total_mean_ms=%.3f total_min_ms=%.3f\n", total / iters, total_min);
}

int Forward() {
  const std::string name =
      absl::GetFlag(FLAGS_model).empty() ? "mlp_chapter" : absl::GetFlag(FLAGS_model);
  const int64_t batch = absl::GetFlag(FLAGS_batch_size) > 0 ? absl::GetFlag(FLAGS_batch_size) : 1;
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : 1;
  const int iters = absl::GetFlag(FLAGS_iters), reps = absl::GetFlag(FLAGS_reps);
  ops::SetCpuThreads(threads);
  std::shared_ptr<nn::Module> net = MakeModel(name);
  net->Eval();
  const Shape shape = BatchShape(name, batch);
  Tensor x = Tensor::Empty(shape);
  ops::RandomNormal(&x, 0.0f, 1.0f, 1);
  std::unique_ptr<graph::HybridModule> h = OrDie(graph::HybridModule::Create(net.get(), shape));
  if (absl::GetFlag(FLAGS_dump)) std::printf("%s", h->graph().ToString().c_str());
  if (!absl::GetFlag(FLAGS_save).empty()) {
    absl::Status s = graph::SaveGraph(h->graph(), absl::GetFlag(FLAGS_save));
    if (!s.ok()) {
      std::fprintf(stderr, "hybridize_bench: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("saved=%s\n", absl::GetFlag(FLAGS_save).c_str());
  }

  autograd::NoGradGuard no_grad;
  Tensor eager_y, hybrid_y;
  auto eager = [&] {
    for (int i = 0; i < iters; ++i) eager_y = net->Forward(autograd::Variable(x)).value();
  };
  auto hybrid = [&] {
    for (int i = 0; i < iters; ++i) hybrid_y = OrDie(h->Forward(x));
  };
  for (int i = 0; i < 20; ++i) {
    eager_y = net->Forward(autograd::Variable(x)).value();
    hybrid_y = OrDie(h->Forward(x));
  }
  std::vector<double> e_us, h_us;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    eager();
    auto t1 = Clock::now();
    hybrid();
    auto t2 = Clock::now();
    e_us.push_back(1e6 * Seconds(t0, t1) / iters);
    h_us.push_back(1e6 * Seconds(t1, t2) / iters);
  }
  double max_diff = 0;
  std::vector<float> a = eager_y.ToVector<float>(), b = hybrid_y.ToVector<float>();
  for (size_t i = 0; i < a.size(); ++i)
    max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
  std::printf("framework=dtrain model=%s batch_size=%lld threads=%d iters=%d reps=%d\n",
              name.c_str(), static_cast<long long>(batch), threads, iters, reps);
  std::printf("small_linear_kernels=%d max_abs_diff=%.3g\n", h->executable().num_small_linear(),
              max_diff);
  std::string all;
  for (double v : e_us) all += (all.empty() ? "" : ",") + std::to_string(v);
  std::printf("eager_us_all=%s\n", all.c_str());
  all.clear();
  for (double v : h_us) all += (all.empty() ? "" : ",") + std::to_string(v);
  std::printf("hybridized_us_all=%s\n", all.c_str());
  const double e = *std::min_element(e_us.begin(), e_us.end());
  const double hy = *std::min_element(h_us.begin(), h_us.end());
  std::printf("speedup=%.2f\n", e / hy);
  std::printf("eager_us_per_forward=%.2f\n", e);
  std::printf("hybridized_us_per_forward=%.2f\n", hy);
  if (absl::GetFlag(FLAGS_profile)) PrintProfile(h->executable(), {x}, iters);
  return 0;
}

struct Batch {
  Tensor x, labels;
};

std::vector<Batch> MakeBatches(const Shape& shape, int64_t classes) {
  std::vector<Batch> out;
  for (int i = 0; i < 8; ++i) {
    Batch b;
    b.x = Tensor::Empty(shape);
    ops::RandomUniform(&b.x, 0.0f, 1.0f, 11, static_cast<uint64_t>(i) << 32);
    std::vector<int32_t> lv(shape[0]);
    for (int64_t j = 0; j < shape[0]; ++j) lv[j] = static_cast<int32_t>((j * 7 + i) % classes);
    b.labels = Tensor::FromVector(lv, {shape[0]});
    out.push_back(b);
  }
  return out;
}

float ImperativeStep(nn::Module* net, nn::Sgd* opt, const Batch& b) {
  autograd::Variable logits = net->Forward(autograd::Variable(b.x));
  autograd::Variable loss = autograd::SoftmaxCrossEntropy(logits, b.labels);
  opt->ZeroGrad();
  loss.Backward();
  opt->Step();
  return ops::ScalarValue(loss.value());
}

int Memory() {
  const std::string name =
      absl::GetFlag(FLAGS_model).empty() ? "resnet18" : absl::GetFlag(FLAGS_model);
  const int64_t batch = absl::GetFlag(FLAGS_batch_size) > 0 ? absl::GetFlag(FLAGS_batch_size) : 32;
  ops::SetCpuThreads(absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : 2);
  const Shape shape = BatchShape(name, batch);
  const int64_t classes = name == "mlp_chapter" ? 2 : 10;
  std::vector<Batch> batches = MakeBatches(shape, classes);
  Allocator* alloc = OrDie(GetAllocator(Device::Cpu()));

  std::shared_ptr<nn::Module> net = MakeModel(name);
  nn::Sgd opt(net->NamedParameters(), {.lr = 0.01f});
  ImperativeStep(net.get(), &opt, batches[0]);  // kernels' first-call setup
  opt.ZeroGrad();
  const int64_t before = alloc->stats().bytes_in_use;
  alloc->ResetPeak();
  ImperativeStep(net.get(), &opt, batches[1]);
  const int64_t imperative = alloc->stats().peak_bytes_in_use - before;

  std::shared_ptr<nn::Module> net2 = MakeModel(name);
  std::unique_ptr<graph::TrainStep> step =
      OrDie(graph::HybridizeTrainingStep(net2.get(), shape, classes, {.lr = 0.01f}));
  step->Run(batches[1].x, batches[1].labels);
  const graph::MemoryPlan& plan = step->module().executable().memory_plan();
  int64_t params = 0;
  for (auto& [n, p] : net->NamedParameters()) params += p.value().nbytes();
  std::printf("framework=dtrain model=%s batch_size=%lld\n", name.c_str(),
              static_cast<long long>(batch));
  std::printf("parameter_bytes=%lld\n", static_cast<long long>(params));
  std::printf("planned_unshared_bytes=%lld planned_lower_bound_bytes=%lld\n",
              static_cast<long long>(plan.unshared_bytes),
              static_cast<long long>(plan.lower_bound_bytes));
  std::printf("imperative_peak_bytes=%lld\n", static_cast<long long>(imperative));
  std::printf("planned_peak_bytes=%lld\n", static_cast<long long>(plan.total_bytes));
  std::printf("planned_vs_imperative=%.3f\n",
              static_cast<double>(plan.total_bytes) / static_cast<double>(imperative));
  return 0;
}

int Train() {
  const std::string name =
      absl::GetFlag(FLAGS_model).empty() ? "lenet" : absl::GetFlag(FLAGS_model);
  const int64_t batch = absl::GetFlag(FLAGS_batch_size) > 0 ? absl::GetFlag(FLAGS_batch_size) : 256;
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : 2;
  const int rounds = absl::GetFlag(FLAGS_reps), steps = absl::GetFlag(FLAGS_steps);
  ops::SetCpuThreads(threads);
  const Shape shape = BatchShape(name, batch);
  const int64_t classes = name == "mlp_chapter" ? 2 : 10;
  std::vector<Batch> batches = MakeBatches(shape, classes);
  const ops::SgdParams sgd{.lr = 0.1f};

  std::shared_ptr<nn::Module> a = MakeModel(name);
  nn::Sgd opt(a->NamedParameters(), sgd);
  std::shared_ptr<nn::Module> b = MakeModel(name);
  graph::HybridizeOptions options;
  options.mode = graph::HybridizeMode::kTrainingStep;
  options.sgd = sgd;
  options.executor.small_conv = absl::GetFlag(FLAGS_small_conv);
  if (!absl::GetFlag(FLAGS_fuse)) {
    options.optimize.fuse_conv_linear_relu = false;
    options.optimize.fuse_elementwise = false;
    options.optimize.fuse_pool_relu_backward = false;
  }
  auto step = std::make_unique<graph::TrainStep>(
      OrDie(graph::HybridModule::Create(b.get(), shape, options)));
  if (absl::GetFlag(FLAGS_dump)) std::printf("%s", step->module().graph().ToString().c_str());
  float la = 0, lb = 0;
  for (int i = 0; i < 3; ++i) {
    la = ImperativeStep(a.get(), &opt, batches[i % 8]);
    lb = step->Run(batches[i % 8].x, batches[i % 8].labels);
  }
  double ta = 0, tb = 0, best_a = 1e30, best_b = 1e30, min_a = 1e30, min_b = 1e30;
  int k = 3;
  for (int r = 0; r < rounds; ++r) {
    double ra = 0, rb = 0;
    for (int i = 0; i < steps; ++i) {
      const Batch& bt = batches[(k + i) % 8];
      auto t0 = Clock::now();
      la = ImperativeStep(a.get(), &opt, bt);
      auto t1 = Clock::now();
      lb = step->Run(bt.x, bt.labels);
      auto t2 = Clock::now();
      ra += Seconds(t0, t1);
      rb += Seconds(t1, t2);
      min_a = std::min(min_a, Seconds(t0, t1));
      min_b = std::min(min_b, Seconds(t1, t2));
    }
    k += steps;
    ta += ra;
    tb += rb;
    best_a = std::min(best_a, ra);
    best_b = std::min(best_b, rb);
  }
  const double n = static_cast<double>(batch) * steps;
  std::printf("framework=dtrain model=%s batch_size=%lld threads=%d rounds=%d steps=%d\n",
              name.c_str(), static_cast<long long>(batch), threads, rounds, steps);
  std::printf("last_loss_imperative=%.5f last_loss_hybridized=%.5f\n", la, lb);
  std::printf("imperative_ms_per_step=%.3f hybridized_ms_per_step=%.3f\n",
              1e3 * ta / (rounds * steps), 1e3 * tb / (rounds * steps));
  std::printf("imperative_samples_per_second=%.1f\n", n * rounds / ta);
  std::printf("hybridized_samples_per_second=%.1f\n", n * rounds / tb);
  std::printf("best_round_imperative_samples_per_second=%.1f\n", n / best_a);
  std::printf("best_round_hybridized_samples_per_second=%.1f\n", n / best_b);
  std::printf("fastest_step_ms_imperative=%.3f fastest_step_ms_hybridized=%.3f\n", 1e3 * min_a,
              1e3 * min_b);
  std::printf("speedup=%.3f best_round_speedup=%.3f fastest_step_speedup=%.3f\n", ta / tb,
              best_a / best_b, min_a / min_b);
  if (absl::GetFlag(FLAGS_profile)) {
    PrintProfile(step->module().executable(), {batches[0].x, batches[0].labels}, 20);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_iters) <= 0 || absl::GetFlag(FLAGS_reps) <= 0 ||
      absl::GetFlag(FLAGS_steps) <= 0) {
    std::fprintf(stderr, "hybridize_bench: --iters, --reps and --steps must be positive\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_memory)) return Memory();
  if (absl::GetFlag(FLAGS_train)) return Train();
  return Forward();
}
