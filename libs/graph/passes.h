// Graph passes: shape inference, dead-code elimination, constant folding
// (batch-norm folding into convolutions included) and fusion.
//
//   DT_RETURN_IF_ERROR(FoldBatchNorm(&graph));
//   DT_RETURN_IF_ERROR(Optimize(&graph, {}));   // the usual pipeline
//
// Every pass keeps the graph valid (Graph::Validate) and its results equal
// up to float rounding; each returns an error only for a graph it cannot
// handle, never crashes on one. Passes that count their rewrites return the
// count.
#ifndef DTRAIN_LIBS_GRAPH_PASSES_H_
#define DTRAIN_LIBS_GRAPH_PASSES_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/graph/ir.h"

namespace dtrain {
namespace graph {

// Shape inference: gives the graph inputs the shapes `input_shapes` (one per
// graph input, in order) and recomputes the type of every intermediate value
// in node order (InferOutputTypes). Attributes written for "the input's
// batch" (reshape and backward-op shapes with dim 0 == 0) follow the new
// batch, so a graph traced at one batch size runs at another. Errors name
// the first node whose operands do not fit; the graph is then unchanged.
absl::Status InferShapes(Graph* graph, const std::vector<Shape>& input_shapes);

// Dead-code elimination: removes nodes none of whose outputs is read by a
// later node or is a graph output, unless the node updates a tensor in place
// (batch_norm_train, sgd_update), and then values nothing refers to.
// Returns the number of nodes removed.
int EliminateDeadCode(Graph* graph);

// Constant folding: evaluates every node whose inputs are all constants (and
// that updates nothing in place) once, now, and replaces its outputs with
// constants holding the results. Returns the number of nodes folded.
absl::StatusOr<int> FoldConstants(Graph* graph);

// Batch-norm folding (inference): conv2d (without relu) followed by
// batch_norm_inference on its only use, all parameters constant, becomes one
// conv2d with weights w * s and bias (b - mean) * s + beta, where
// s = gamma / sqrt(running_var + eps) per output channel (computed in
// double). Returns the number of batch norms folded.
int FoldBatchNorm(Graph* graph);

// conv2d / linear without relu whose output's only use is a relu: sets the
// kernel's relu flag (oneDNN post-op) and drops the relu. Returns the count.
int FuseConvLinearRelu(Graph* graph);

// Chains of elementwise ops (relu, add, scale, relu_backward and fused
// nodes) where an intermediate result has exactly one use, also elementwise
// and not a graph output, become one fused_elementwise node (one pass over
// memory; kernels.h). Respects kMaxElementwiseInputs / Instrs. Returns the
// number of nodes merged away.
int FuseElementwise(Graph* graph);

// relu_backward(y, avg_pool2d_backward(dy)) where the pooled gradient has no
// other use becomes avg_pool2d_relu_backward(dy, y). Returns the count.
int FusePoolReluBackward(Graph* graph);

// conv2d_backward_weights(x, avg_pool2d_relu_backward(dy_pooled, y)) where
// the gradient has no other use, the pooling is tiled and the convolution
// is a first layer (see OpKind::kConv2dBackwardWeightsAvgPoolRelu) becomes
// one node that never stores the gradient. Returns the count.
int FuseConvWeightsGradient(Graph* graph);

struct OptimizeOptions {
  bool fold_batch_norm = true;  // only applies to constant weights
  bool fold_constants = true;
  bool fuse_conv_linear_relu = true;
  bool fuse_elementwise = true;
  bool fuse_pool_relu_backward = true;
  bool fuse_conv_weights_gradient = true;
};

// What Optimize did.
struct OptimizeStats {
  int batch_norms_folded = 0;
  int constants_folded = 0;
  int relus_fused = 0;
  int elementwise_fused = 0;
  int pool_relu_backward_fused = 0;
  int conv_weights_gradient_fused = 0;
  int dead_nodes_removed = 0;
};

// Runs the passes above in this order: batch-norm folding, constant
// folding, conv/linear + relu fusion, pool + relu backward fusion, conv
// weight-gradient fusion, elementwise fusion, dead-code elimination.
absl::StatusOr<OptimizeStats> Optimize(Graph* graph, const OptimizeOptions& options = {});

}  // namespace graph
}  // namespace dtrain

#endif  // DTRAIN_LIBS_GRAPH_PASSES_H_
