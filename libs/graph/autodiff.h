// Reverse-mode differentiation inside the IR: turns a forward graph into a
// whole training step (forward, loss, backward, optimizer update) that runs
// as one plan.
//
//   Graph g = ...;                           // forward, output 0 = logits
//   DT_RETURN_IF_ERROR(BuildTrainingStep(&g, {.lr = 0.1f}));
//   // inputs: x, labels; outputs: loss, logits
//
// The gradient graph is built from per-op rules that use the backward ops
// (the *_backward kernels of libs/ops), visiting forward nodes in reverse
// order. A value read by several nodes receives the sum of their gradient
// contributions (add nodes). Only values that depend on a parameter get
// gradients; ops whose imperative counterpart stops gradients
// (batch_norm_inference) stop them here too. Then one sgd_update per
// parameter that received a gradient, in parameter order, with momentum
// buffers (state values "<param>.momentum_buffer", zero-initialized) when
// the momentum is not 0.
//
// Supported forward ops: conv2d, linear, matmul (no transposes), relu, add,
// scale, avg_pool2d, max_pool2d, global_avg_pool, reshape, batch_norm_train,
// batch_norm_inference. Others give kUnimplemented.
#ifndef DTRAIN_LIBS_GRAPH_AUTODIFF_H_
#define DTRAIN_LIBS_GRAPH_AUTODIFF_H_

#include "absl/status/status.h"
#include "libs/graph/ir.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace graph {

// Extends `graph` (a forward graph with one input, the batch, and output 0
// the logits [N, C]) in place: adds the graph input "labels" (i32 [N]), a
// softmax_cross_entropy loss (mean over the batch), the backward nodes and
// the updates. Afterwards the graph's outputs are {loss, logits}. On error
// the graph is unchanged.
absl::Status BuildTrainingStep(Graph* graph, const ops::SgdParams& sgd);

}  // namespace graph
}  // namespace dtrain

#endif  // DTRAIN_LIBS_GRAPH_AUTODIFF_H_
