// Model FLOPs of a training step, counted from the model's graph: the
// numerator of model FLOPs utilization (MFU, as PaLM's appendix defines it:
// the FLOPs the model needs, not the ones an implementation happens to do).
//
//   DT_ASSIGN_OR_RETURN(graph::TrainingFlops f, graph::TrainingFlopsPerSample("lenet"));
//   double mfu = f.total() * samples_per_second / peak_flops;
//
// Only matrix products count (2 FLOPs per multiply-add): conv2d, linear and
// matmul forward; their backward for the input gradient (not for the graph
// input, which needs none) and for the weight gradient, exactly as the
// training step's graph (BuildTrainingStep, no optimization passes) has
// them. Elementwise ops, pooling, batch norm, the loss and the optimizer are
// a rounding error next to them for the models here (as in the usual 6N
// rule for transformers) and are left out, so the same count serves any
// framework.
#ifndef DTRAIN_LIBS_GRAPH_FLOPS_H_
#define DTRAIN_LIBS_GRAPH_FLOPS_H_

#include <string>

#include "absl/status/statusor.h"
#include "libs/graph/ir.h"
#include "libs/nn/models.h"
#include "libs/nn/module.h"

namespace dtrain {
namespace graph {

struct TrainingFlops {
  double forward = 0;   // per sample
  double backward = 0;  // per sample: input and weight gradients
  double total() const { return forward + backward; }
};

// FLOPs of the matrix products of `g` (any graph: forward, training step)
// over its whole batch, split into forward and backward ops.
TrainingFlops CountMatrixFlops(const Graph& g);

// The per-sample FLOPs of one training step of nn::MakeModel(model,
// options) on inputs of nn::ModelInputShape(model, options) (a job's: its
// data's channels, classes and, for resnet18, size). Errors: the model's
// (unknown name), the trace's (kUnimplemented for ops the IR cannot express).
absl::StatusOr<TrainingFlops> TrainingFlopsPerSample(const std::string& model,
                                                     const nn::ModelOptions& options = {});

// The same for any module (an imported ONNX model) on samples of `sample`
// (batch excluded).
absl::StatusOr<TrainingFlops> TrainingFlopsPerSample(nn::Module* module, const Shape& sample);

}  // namespace graph
}  // namespace dtrain

#endif  // DTRAIN_LIBS_GRAPH_FLOPS_H_
