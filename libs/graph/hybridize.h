// Hybridize: compile a model written with the imperative API (libs/nn) into
// a static plan, for inference or for a whole training step.
//
//   // Inference (the chapter's experiment): a frozen, optimized forward.
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<HybridModule> h,
//                       HybridModule::Create(net.get(), {1, 512}));
//   DT_ASSIGN_OR_RETURN(Tensor y, h->Forward(x));      // y views the plan's memory
//
//   // Training: forward, loss, backward and SGD in one plan that updates
//   // the module's parameters in place.
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<TrainStep> step,
//                       HybridizeTrainingStep(net.get(), {256, 1, 28, 28}, 10, {.lr = 0.1f}));
//   float loss = step->Run(x, labels);
//
// How: the module's Forward runs once on a zero input of the given shape
// while a tracer (autograd/trace.h) records every op into the graph IR
// (ir.h): parameters and buffers are recognized by identity and become
// bound values, the batch becomes the graph input "x", any other tensor a
// constant. The trace runs with the module in eval mode (inference) or
// training mode (training step); the module's mode and batch-norm running
// statistics are restored afterwards. Then passes (passes.h), autodiff for
// a training step (autodiff.h), memory planning and compilation
// (executor.h).
//
// Models must be traceable: the same ops for every input of the shape (no
// data-dependent control flow), built from libs/autograd/functions.h.
//
// Inference plans are snapshots: parameters and buffers are copied when the
// plan is made (batch norm is folded into convolutions, weights repacked),
// so training the module afterwards does not change them; hybridize again.
// Training plans share the module's parameters and running statistics and
// update them in place each step, exactly as loss.Backward() + Sgd::Step()
// would (momentum buffers are the plan's own, starting at zero as in a new
// nn::Sgd). Do not replace the module's tensors (Module::To) while a
// training plan exists.
//
// Thread-safety: a compiled object is used by one thread at a time.
#ifndef DTRAIN_LIBS_GRAPH_HYBRIDIZE_H_
#define DTRAIN_LIBS_GRAPH_HYBRIDIZE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "libs/graph/executor.h"
#include "libs/graph/ir.h"
#include "libs/graph/passes.h"
#include "libs/nn/module.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace graph {

enum class HybridizeMode {
  kInference,     // eval-mode forward; output: the model's output
  kTrainingStep,  // train-mode forward + mean cross-entropy + backward + SGD
};

struct HybridizeOptions {
  HybridizeMode mode = HybridizeMode::kInference;
  // kTrainingStep: the optimizer (torch.optim.SGD semantics, as nn::Sgd).
  ops::SgdParams sgd;
  // Graph passes (all on by default; turn off to compare or debug).
  OptimizeOptions optimize;
  ExecutorOptions executor;
};

// Traces module->Forward on a zero input of `input_shape` (batch included)
// into a forward graph with one input "x" and one output. `training`
// selects the module mode for the trace and how tensors are bound:
// parameters as kParameter and buffers as kState (training, shared with the
// module) or both as kConstant copies (inference). Errors: kUnimplemented for
// ops the IR cannot express, kInvalidArgument for a bad shape.
absl::StatusOr<Graph> TraceModule(nn::Module* module, const Shape& input_shape, bool training);

class HybridModule {
 public:
  // Traces, optimizes and compiles `module` for inputs of `input_shape`.
  static absl::StatusOr<std::unique_ptr<HybridModule>> Create(nn::Module* module,
                                                              const Shape& input_shape,
                                                              const HybridizeOptions& options = {});

  // Inference plans: runs on `x` (shape input_shape, f32) and returns the
  // output, a view of the plan's memory overwritten by the next call.
  absl::StatusOr<Tensor> Forward(const Tensor& x);

  // Training plans: one step on the batch `x` with i32 `labels` [N];
  // returns the loss (before the update, as loss.value() imperatively).
  absl::StatusOr<float> Step(const Tensor& x, const Tensor& labels);
  // The logits of the last Step (a view; see Forward).
  const Tensor& logits() const;

  HybridizeMode mode() const { return mode_; }
  const Graph& graph() const { return exe_->graph(); }
  const Executable& executable() const { return *exe_; }
  Executable& executable() { return *exe_; }
  const OptimizeStats& optimize_stats() const { return stats_; }

 private:
  HybridModule() = default;
  HybridizeMode mode_ = HybridizeMode::kInference;
  std::unique_ptr<Executable> exe_;
  OptimizeStats stats_;
};

// A hybridized training step, the shape `train_bench --hybridize` uses.
class TrainStep {
 public:
  explicit TrainStep(std::unique_ptr<HybridModule> module) : module_(std::move(module)) {}

  // One step on `x` (the compiled input shape) and `labels` (i32 [N], each in
  // [0, classes)); returns the loss. Shape mismatches are programming errors
  // (fatal, naming the shapes).
  float Run(const Tensor& x, const Tensor& labels);
  // Logits of the last Run (a view overwritten by the next Run).
  const Tensor& logits() const { return module_->logits(); }
  int64_t planned_peak_bytes() const { return module_->executable().planned_peak_bytes(); }
  // The SGD learning rate of the following steps (as nn::Sgd::set_lr).
  void set_lr(float lr) { module_->executable().SetLearningRate(lr); }
  HybridModule& module() { return *module_; }

 private:
  std::unique_ptr<HybridModule> module_;
};

// Hybridizes a training step of `module` for batches of `input_shape`
// (batch included) and a model with `num_classes` outputs, updating the
// parameters with SGD `sgd`. Errors as HybridModule::Create, and
// kInvalidArgument when the model's output is not [N, num_classes].
absl::StatusOr<std::unique_ptr<TrainStep>> HybridizeTrainingStep(nn::Module* module,
                                                                 const Shape& input_shape,
                                                                 int64_t num_classes,
                                                                 const ops::SgdParams& sgd);

}  // namespace graph
}  // namespace dtrain

#endif  // DTRAIN_LIBS_GRAPH_HYBRIDIZE_H_
