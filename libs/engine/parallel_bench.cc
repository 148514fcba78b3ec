// The automatic-parallelism experiments of D2L's "Computational Performance"
// chapter (12.3), run by the dependency engine with real CPU kernels. The
// two "devices" are two engine queues of one thread each, whose kernels use
// one core each (ops::SetCpuThreads(1)); copies run on a "copy" queue.
//
//   bazel run --config=bench //libs/engine:parallel_bench
//   bazel run --config=bench //libs/engine:parallel_bench -- --n=512 --matmuls=20
//
// Each experiment prints one machine-readable line of key=value figures
// ending in a verdict, PASS or FAIL, or INCONCLUSIVE_BUSY_MACHINE when a run
// was not fast enough but this process did not get two cores at the time
// (machine_parallelism, measured with plain threads around the experiment,
// below 1.5): the figure then says nothing about the engine. Wrong results
// always FAIL. Exit status 1 if any experiment failed.
//
//  two_devices       50 matrix products on cpu:0, then 50 on cpu:1, each
//                    waited for (serial_ms = the sum), against both pushed at
//                    once (parallel_ms). PASS: parallel_ms < 0.8 * serial_ms.
//  compute_copy      `steps` products of 64 MB results on cpu:0, each copied
//                    to a cpu:1 buffer on the copy queue: all computes then
//                    all copies (no_overlap_ms) against copy i pushed right
//                    after compute i, so it runs while compute i+1 does
//                    (overlap_ms). PASS: overlap_ms < 0.9 * no_overlap_ms.
//  dependency_graph  the study notes' graph A->B->C, D->E->F with A->D and
//                    B->E (A; then B and D; then C and E; then F), branch
//                    A,B,C on cpu:0 and D,E,F on cpu:1, against serial
//                    execution on one thread. PASS: results bit-identical to
//                    serial, B overlapped D and C overlapped E in time, and
//                    speedup > 1.2 (at most 6/4 = 1.5 with equal tasks).
//  overhead          the engine's own cost per empty operation (no verdict).
//
// Times are the best of --trials runs after a warm-up.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/base/logging.h"
#include "libs/engine/engine.h"
#include "libs/ops/ops.h"
#include "libs/tensor/tensor.h"

ABSL_FLAG(int, n, 1024, "matrix size of the products (two_devices, dependency_graph)");
ABSL_FLAG(int, matmuls, 50, "products per device in two_devices");
ABSL_FLAG(int, copy_mb, 64, "size of each result copied in compute_copy, in MB");
ABSL_FLAG(int, inner, 64, "inner dimension of compute_copy's products (sets compute time)");
ABSL_FLAG(int, steps, 10, "compute+copy steps in compute_copy");
ABSL_FLAG(int, task_matmuls, 4, "products per task in dependency_graph");
ABSL_FLAG(int, trials, 3, "runs per configuration; the best time counts");
ABSL_FLAG(std::string, only, "", "run only this experiment");
ABSL_FLAG(bool, verbose, false, "also print when each task of dependency_graph ran");

namespace dtrain {
namespace {

using engine::Engine;
using engine::QueueId;
using engine::VarHandle;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Runs `body` `trials` times and returns the shortest wall time.
absl::Duration Best(int trials, const std::function<void()>& body) {
  absl::Duration best = absl::InfiniteDuration();
  for (int i = 0; i < trials; ++i) {
    const absl::Time start = absl::Now();
    body();
    best = std::min(best, absl::Now() - start);
  }
  return best;
}

void CheckOk(const absl::Status& s) { DT_CHECK(s.ok()) << s; }

Tensor Random(const Shape& shape, uint64_t seed, const Device& device = Device::Cpu()) {
  Tensor t = Tensor::Empty(shape, DType::kF32, device);
  ops::RandomUniform(&t, -1.0f, 1.0f, seed);
  return t;
}

// An engine with two one-core "devices" and a copy queue.
struct Machine {
  std::unique_ptr<Engine> engine = Engine::Create({});
  QueueId cpu0 = engine->AddQueue("cpu:0", 1, [] { ops::SetCpuThreads(1); });
  QueueId cpu1 = engine->AddQueue("cpu:1", 1, [] { ops::SetCpuThreads(1); });
  QueueId copy = engine->AddQueue("copy", 1, [] { ops::SetCpuThreads(1); });
};

// How many cores this process gets now: two plain threads each doing `reps`
// products of `x` against one thread doing them alone (2.0 on an idle
// two-core machine, ~1.0 when another process holds a core).
double MachineParallelism(const Tensor& x, int reps) {
  auto work = [&x, reps] {
    ops::SetCpuThreads(1);
    for (int i = 0; i < reps; ++i) ops::MatMul(x, x);
  };
  auto timed = [&](int threads) {
    const absl::Time start = absl::Now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(work);
    for (std::thread& t : pool) t.join();
    return Ms(absl::Now() - start);
  };
  timed(2);  // warm-up
  return 2 * timed(1) / timed(2);
}

enum class Verdict { kPass, kFail, kInconclusive };

// Wrong results always fail. A parallel run that is not fast enough fails
// only if the machine had two cores to give (`machine` is the lower of the
// MachineParallelism figures taken around the experiment); otherwise the
// figure says nothing about the engine.
Verdict Judge(bool correct, bool fast, double machine) {
  if (!correct) return Verdict::kFail;
  if (fast) return Verdict::kPass;
  return machine < 1.5 ? Verdict::kInconclusive : Verdict::kFail;
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kFail:
      return "FAIL";
    case Verdict::kInconclusive:
      return "INCONCLUSIVE_BUSY_MACHINE";
  }
  return "?";
}

// ---- two_devices ----

Verdict TwoDevices() {
  const int n = absl::GetFlag(FLAGS_n), k = absl::GetFlag(FLAGS_matmuls);
  const int trials = absl::GetFlag(FLAGS_trials);
  Machine m;
  Engine& eng = *m.engine;
  struct DeviceWork {
    QueueId queue;
    Tensor x;
    VarHandle vx;
    std::vector<Tensor> y;
    std::vector<VarHandle> vy;
  };
  DeviceWork dev[2];
  for (int d = 0; d < 2; ++d) {
    dev[d].queue = d == 0 ? m.cpu0 : m.cpu1;
    dev[d].x = Random({n, n}, 1 + d, Device::Cpu(d));
    dev[d].vx = eng.NewVar(absl::StrCat("x", d));
    dev[d].y.resize(k);
    for (int i = 0; i < k; ++i) dev[d].vy.push_back(eng.NewVar(absl::StrCat("y", d, "_", i)));
  }
  double machine = MachineParallelism(dev[0].x, 10);
  // The chapter's run(x): k independent products x*x on one device.
  auto run = [&](DeviceWork& w) {
    for (int i = 0; i < k; ++i) {
      eng.Push(
          [&w, i] {
            w.y[i] = ops::MatMul(w.x, w.x);
            return absl::OkStatus();
          },
          {w.vx}, {w.vy[i]}, w.queue, "matmul");
    }
  };
  run(dev[0]);  // warm up both devices
  run(dev[1]);
  CheckOk(eng.WaitAll());

  const absl::Duration t0 = Best(trials, [&] {
    run(dev[0]);
    CheckOk(eng.WaitAll());
  });
  const absl::Duration t1 = Best(trials, [&] {
    run(dev[1]);
    CheckOk(eng.WaitAll());
  });
  const absl::Duration both = Best(trials, [&] {
    run(dev[0]);
    run(dev[1]);
    CheckOk(eng.WaitAll());
  });
  const double serial = Ms(t0) + Ms(t1), parallel = Ms(both);
  machine = std::min(machine, MachineParallelism(dev[0].x, 10));
  const Verdict verdict = Judge(true, parallel < 0.8 * serial, machine);
  std::printf(
      "experiment=two_devices n=%d matmuls_per_device=%d cpu0_ms=%.1f cpu1_ms=%.1f "
      "serial_ms=%.1f parallel_ms=%.1f speedup=%.2f machine_parallelism=%.2f verdict=%s\n",
      n, k, Ms(t0), Ms(t1), serial, parallel, serial / parallel, machine, VerdictName(verdict));
  return verdict;
}

// ---- compute_copy ----

Verdict ComputeCopy() {
  const int steps = absl::GetFlag(FLAGS_steps), inner = absl::GetFlag(FLAGS_inner);
  const int trials = absl::GetFlag(FLAGS_trials);
  // Results of rows x rows floats = copy_mb MB.
  const int64_t rows =
      static_cast<int64_t>(std::sqrt(absl::GetFlag(FLAGS_copy_mb) * 1024.0 * 1024.0 / 4));
  const Tensor calibration = Random({512, 512}, 6);
  double machine = MachineParallelism(calibration, 10);
  Machine m;
  Engine& eng = *m.engine;
  Tensor a = Random({rows, inner}, 3), b = Random({inner, rows}, 4);
  VarHandle va = eng.NewVar("a"), vb = eng.NewVar("b");
  std::vector<Tensor> y(steps), host(steps);
  std::vector<VarHandle> vy, vhost;
  for (int i = 0; i < steps; ++i) {
    host[i] = Tensor::Zeros({rows, rows}, DType::kF32, Device::Cpu(1));  // touched now
    vy.push_back(eng.NewVar(absl::StrCat("y", i)));
    vhost.push_back(eng.NewVar(absl::StrCat("host", i)));
  }
  auto compute = [&](int i) {
    eng.Push(
        [&, i] {
          y[i] = ops::MatMul(a, b);
          return absl::OkStatus();
        },
        {va, vb}, {vy[i]}, m.cpu0, "compute");
  };
  auto copy = [&](int i) {
    eng.Push([&, i] { return host[i].CopyFrom(y[i]); }, {vy[i]}, {vhost[i]}, m.copy,
             "copy_to_cpu1");
  };
  // Warm-up: the allocator caches the result blocks, so later runs reuse
  // memory that is already paged in.
  for (int i = 0; i < steps; ++i) {
    compute(i);
    copy(i);
  }
  CheckOk(eng.WaitAll());

  absl::Duration compute_only = absl::InfiniteDuration(), copy_only = absl::InfiniteDuration();
  const absl::Duration no_overlap = Best(trials, [&] {
    const absl::Time start = absl::Now();
    for (int i = 0; i < steps; ++i) compute(i);
    CheckOk(eng.WaitAll());  // the chapter's synchronize() between the two
    const absl::Time mid = absl::Now();
    for (int i = 0; i < steps; ++i) copy(i);
    CheckOk(eng.WaitAll());
    compute_only = std::min(compute_only, mid - start);
    copy_only = std::min(copy_only, absl::Now() - mid);
  });
  const absl::Duration overlap = Best(trials, [&] {
    for (int i = 0; i < steps; ++i) {
      compute(i);
      copy(i);  // waits for compute i only
    }
    CheckOk(eng.WaitAll());
  });
  // Spot-check a copy against its source.
  const std::vector<float> src = y[steps - 1].ToVector<float>();
  const std::vector<float> dst = host[steps - 1].ToVector<float>();
  const bool equal = src == dst;
  machine = std::min(machine, MachineParallelism(calibration, 10));
  const Verdict verdict = Judge(equal, Ms(overlap) < 0.9 * Ms(no_overlap), machine);
  std::printf(
      "experiment=compute_copy steps=%d result_mb=%.1f compute_ms=%.1f copy_ms=%.1f "
      "no_overlap_ms=%.1f overlap_ms=%.1f speedup=%.2f copies_equal=%d "
      "machine_parallelism=%.2f verdict=%s\n",
      steps, rows * rows * 4 / (1024.0 * 1024.0), Ms(compute_only), Ms(copy_only), Ms(no_overlap),
      Ms(overlap), Ms(no_overlap) / Ms(overlap), equal, machine, VerdictName(verdict));
  return verdict;
}

// ---- dependency_graph ----

// One task of the graph: `reps` products with the input, rescaled so values
// stay near unit size (x is uniform in [-1, 1], variance 1/3).
Tensor Task(const Tensor& in, const Tensor& x, int reps, bool transpose) {
  const float scale = std::sqrt(3.0f / static_cast<float>(x.dim(0)));
  Tensor t = in;
  for (int r = 0; r < reps; ++r) t = ops::Scale(ops::MatMul(t, x, false, transpose), scale);
  return t;
}

struct GraphResult {
  Tensor a, b, c, d, e, f;
};

// The notes' serial_execution: a, b, d, c, e, f in dependency order.
void SerialGraph(const Tensor& x, int reps, GraphResult* r) {
  r->a = Task(x, x, reps, true);
  r->b = Task(r->a, x, reps, false);
  r->d = Task(r->a, x, reps, true);
  r->c = Task(r->b, x, reps, false);
  r->e = Task(ops::Add(r->b, r->d), x, reps, false);
  r->f = Task(r->e, x, reps, true);
}

struct Interval {
  std::atomic<int64_t> start_ns{0}, end_ns{0};
};

bool Overlap(const Interval& p, const Interval& q) {
  return p.start_ns < q.end_ns && q.start_ns < p.end_ns;
}

Verdict DependencyGraph() {
  const int n = absl::GetFlag(FLAGS_n), reps = absl::GetFlag(FLAGS_task_matmuls);
  const int trials = absl::GetFlag(FLAGS_trials);
  const Tensor x = Random({n, n}, 5);
  double machine = MachineParallelism(x, 10);

  // Serial: one thread, one core, no engine.
  const int frontend_threads = ops::CpuThreads();
  ops::SetCpuThreads(1);
  GraphResult serial;
  SerialGraph(x, reps, &serial);  // warm-up
  const absl::Duration serial_time = Best(trials, [&] { SerialGraph(x, reps, &serial); });
  ops::SetCpuThreads(frontend_threads);

  Machine m;
  Engine& eng = *m.engine;
  VarHandle vx = eng.NewVar("x"), va = eng.NewVar("a"), vb = eng.NewVar("b"), vc = eng.NewVar("c"),
            vd = eng.NewVar("d"), ve = eng.NewVar("e"), vf = eng.NewVar("f");
  GraphResult par;
  Interval span[6];  // A..F
  auto timed = [&](int node, std::function<void()> body) {
    return [&, node, body = std::move(body)] {
      span[node].start_ns = absl::GetCurrentTimeNanos();
      body();
      span[node].end_ns = absl::GetCurrentTimeNanos();
      return absl::OkStatus();
    };
  };
  // Pushed in the notes' serial order; the engine finds the parallelism.
  auto run = [&] {
    eng.Push(timed(0, [&] { par.a = Task(x, x, reps, true); }), {vx}, {va}, m.cpu0, "A");
    eng.Push(timed(1, [&] { par.b = Task(par.a, x, reps, false); }), {vx, va}, {vb}, m.cpu0, "B");
    eng.Push(timed(3, [&] { par.d = Task(par.a, x, reps, true); }), {vx, va}, {vd}, m.cpu1, "D");
    eng.Push(timed(2, [&] { par.c = Task(par.b, x, reps, false); }), {vx, vb}, {vc}, m.cpu0, "C");
    eng.Push(timed(4, [&] { par.e = Task(ops::Add(par.b, par.d), x, reps, false); }), {vx, vb, vd},
             {ve}, m.cpu1, "E");
    eng.Push(timed(5, [&] { par.f = Task(par.e, x, reps, true); }), {vx, ve}, {vf}, m.cpu1, "F");
    CheckOk(eng.WaitAll());
  };
  run();  // warm-up
  bool overlapped = true;
  const absl::Duration parallel_time = Best(trials, [&] {
    run();
    overlapped = overlapped && Overlap(span[1], span[3]) && Overlap(span[2], span[4]);
  });

  if (absl::GetFlag(FLAGS_verbose)) {
    const int64_t t0 = span[0].start_ns;
    for (int i = 0; i < 6; ++i) {
      std::printf("  node=%c start_ms=%.1f end_ms=%.1f\n", "ABCDEF"[i],
                  (span[i].start_ns - t0) / 1e6, (span[i].end_ns - t0) / 1e6);
    }
  }
  auto same = [](const Tensor& p, const Tensor& q) {
    return p.ToVector<float>() == q.ToVector<float>();
  };
  const bool equal = same(par.c, serial.c) && same(par.d, serial.d) && same(par.f, serial.f);
  const double speedup = Ms(serial_time) / Ms(parallel_time);
  machine = std::min(machine, MachineParallelism(x, 10));
  const Verdict verdict = Judge(equal, overlapped && speedup > 1.2, machine);
  std::printf(
      "experiment=dependency_graph n=%d matmuls_per_task=%d serial_ms=%.1f parallel_ms=%.1f "
      "speedup=%.2f ideal_speedup=1.50 branches_overlapped=%d results_equal=%d "
      "machine_parallelism=%.2f verdict=%s\n",
      n, reps, Ms(serial_time), Ms(parallel_time), speedup, overlapped, equal, machine,
      VerdictName(verdict));
  return verdict;
}

// ---- overhead (informational) ----

// Cost of the engine itself: empty operations, as a dependent chain on one
// variable and as independent operations over 64 variables.
Verdict Overhead() {
  constexpr int kOps = 200000;
  Machine m;
  Engine& eng = *m.engine;
  VarHandle chain = eng.NewVar("chain");
  std::vector<VarHandle> vars;
  for (int i = 0; i < 64; ++i) vars.push_back(eng.NewVar());
  auto noop = [] { return absl::OkStatus(); };
  const absl::Duration dependent = Best(1, [&] {
    for (int i = 0; i < kOps; ++i) eng.Push(noop, {}, {chain}, m.cpu0, "noop");
    CheckOk(eng.WaitAll());
  });
  const absl::Duration independent = Best(1, [&] {
    for (int i = 0; i < kOps; ++i) {
      eng.Push(noop, {}, {vars[i % 64]}, i % 2 ? m.cpu0 : m.cpu1, "noop");
    }
    CheckOk(eng.WaitAll());
  });
  std::printf(
      "experiment=overhead ops=%d chain_us_per_op=%.2f two_queues_us_per_op=%.2f "
      "verdict=INFO\n",
      kOps, absl::ToDoubleMicroseconds(dependent) / kOps,
      absl::ToDoubleMicroseconds(independent) / kOps);
  return Verdict::kPass;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string only = absl::GetFlag(FLAGS_only);
  struct Experiment {
    const char* name;
    dtrain::Verdict (*run)();
  } experiments[] = {
      {"two_devices", dtrain::TwoDevices},
      {"compute_copy", dtrain::ComputeCopy},
      {"dependency_graph", dtrain::DependencyGraph},
      {"overhead", dtrain::Overhead},
  };
  int failed = 0, inconclusive = 0;
  for (const Experiment& e : experiments) {
    if (!only.empty() && only != e.name) continue;
    const dtrain::Verdict v = e.run();
    failed += v == dtrain::Verdict::kFail;
    inconclusive += v == dtrain::Verdict::kInconclusive;
    std::fflush(stdout);
  }
  std::printf("summary experiments_failed=%d experiments_inconclusive=%d\n", failed, inconclusive);
  return failed == 0 ? 0 : 1;
}
