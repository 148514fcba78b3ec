// Runs a graph from a static plan: everything is decided when the graph is
// compiled, so that a run is a loop of kernel calls on preallocated tensors.
//
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, Executable::Compile(graph));
//   DT_RETURN_IF_ERROR(exe->Run({x}));
//   const Tensor& y = exe->output(0);   // valid until the next Run
//
// Compile plans memory (planner.h), allocates one arena per element type,
// makes a tensor view of the arena for every intermediate value, resolves
// each node's kernel in the op registry (ops::KernelRegistry) for the
// values' device, and builds one step per node: a function pointer that
// calls the kernel with the node's operands and attributes. Run binds the
// inputs (no copy: graph inputs view the caller's tensors) and calls the
// steps in order; no step allocates.
//
// Kernel choice beyond the registry (CPU): fused elementwise nodes and
// avg_pool2d_relu_backward run kernels of libs/graph (kernels.h); a linear
// node whose weights are constant and whose batch is small runs on weights
// packed at compile time (ExecutorOptions::small_linear_max_batch).
//
// Parameters and state are used in place: a training-step graph updates the
// tensors it was built with.
//
// Thread-safety: Run mutates the arena and bound state; one thread at a
// time. Kernels use the calling thread's ops::SetCpuThreads setting.
#ifndef DTRAIN_LIBS_GRAPH_EXECUTOR_H_
#define DTRAIN_LIBS_GRAPH_EXECUTOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/graph/ir.h"
#include "libs/graph/planner.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace graph {
namespace kernels {
class PackedLinear;
}  // namespace kernels

struct ExecutorOptions {
  PlannerOptions planner;
  // Linear nodes with constant weights and at most this many rows run on
  // weights repacked for matrix-vector products (0 disables). At batch 1 the
  // registered (oneDNN) kernel spends more time on dispatch than on math.
  int64_t small_linear_max_batch = 16;
  // Convolutions with few input channels (C * kh * kw <= 32, stride 1: a
  // network's first layer) run a direct kernel of libs/graph, forward and
  // weight gradient, instead of oneDNN's generic code for such shapes.
  bool small_conv = true;
};

// Time spent in each node over some runs (Executable::Profile).
struct NodeProfile {
  std::string op;       // OpInfo name, or "linear(small)" / "view" variants
  std::string shape;    // first output's shape
  double total_ms = 0;  // over all iterations
  double min_ms = 0;    // fastest iteration (robust to other load on the machine)
};

class Executable {
 public:
  // Compiles `graph` (which must be valid: Graph::Validate). The executable
  // keeps its own copy of the graph; bound tensors are shared, not copied.
  // Errors: kInvalidArgument for an invalid graph, kUnimplemented when a
  // node has no kernel for its device, allocation failures of the arena.
  static absl::StatusOr<std::unique_ptr<Executable>> Compile(const Graph& graph,
                                                             const ExecutorOptions& options = {});

  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  // Binds inputs[i] to graph input i (same shape, dtype and device, else
  // kInvalidArgument) and runs every node.
  absl::Status Run(absl::Span<const Tensor> inputs);

  // Runs `iterations` times and returns the time per node (for benchmarks).
  absl::StatusOr<std::vector<NodeProfile>> Profile(absl::Span<const Tensor> inputs, int iterations);

  // Sets the learning rate of every sgd_update node (schedules change it
  // between steps without compiling again).
  void SetLearningRate(float lr);

  int num_outputs() const { return static_cast<int>(graph_.outputs().size()); }
  // Graph output i of the last Run: a view of the arena (or of an input or
  // bound tensor) that the next Run overwrites. Clone() to keep it.
  const Tensor& output(int i) const { return slots_[graph_.outputs()[i]]; }

  const Graph& graph() const { return graph_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  // Bytes of the arenas (the planned peak of intermediate memory).
  int64_t planned_peak_bytes() const { return plan_.total_bytes; }
  // Number of linear nodes running on packed weights.
  int num_small_linear() const { return num_small_linear_; }
  // Number of conv2d / conv2d_backward_weights nodes on the direct kernels.
  int num_small_conv() const { return num_small_conv_; }

  ~Executable();

  struct Step;  // internal: one compiled node

 private:
  Executable() = default;
  absl::Status Build(const ExecutorOptions& options);
  absl::Status Bind(absl::Span<const Tensor> inputs);

  Graph graph_;
  MemoryPlan plan_;
  std::vector<Tensor> arenas_;
  std::vector<Tensor> slots_;  // per value; steps point into it
  std::vector<Step> steps_;
  std::vector<std::unique_ptr<kernels::PackedLinear>> packed_;  // used by steps
  std::vector<Tensor> scratch_;                                 // used by steps
  int num_small_linear_ = 0;
  int num_small_conv_ = 0;
};

}  // namespace graph
}  // namespace dtrain

#endif  // DTRAIN_LIBS_GRAPH_EXECUTOR_H_
