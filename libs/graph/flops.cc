#include "libs/graph/flops.h"

#include "libs/base/status.h"
#include "libs/graph/autodiff.h"
#include "libs/graph/hybridize.h"
#include "libs/nn/models.h"

namespace dtrain {
namespace graph {
namespace {

double Numel(const Shape& s) {
  double n = 1;
  for (int64_t d : s) n *= static_cast<double>(d);
  return n;
}

// 2 * (output elements) * (multiply-adds per output) of a convolution with
// output `y` [N,O,Ho,Wo] and weights `w` [O,C,kh,kw].
double ConvFlops(const Shape& y, const Shape& w) {
  if (y.size() != 4 || w.size() != 4) return 0;
  return 2.0 * Numel(y) * static_cast<double>(w[1] * w[2] * w[3]);
}

}  // namespace

TrainingFlops CountMatrixFlops(const Graph& g) {
  TrainingFlops f;
  auto shape = [&g](int v) -> const Shape& {
    static const Shape kNone;
    return v >= 0 ? g.value(v).shape : kNone;
  };
  // Products after the loss are backward ones (autodiff's matmul rules emit
  // matmuls).
  bool after_loss = false;
  for (const Node& n : g.nodes()) {
    const auto& in = n.inputs;
    const auto& out = n.outputs;
    double& product = after_loss ? f.backward : f.forward;
    switch (n.op) {
      case OpKind::kSoftmaxCrossEntropy:
        after_loss = true;
        break;
      case OpKind::kConv2d:  // x, w, b? -> y
        product += ConvFlops(shape(out[0]), shape(in[1]));
        break;
      case OpKind::kConv2dBackwardData:  // dy, w -> dx: as the forward
        f.backward += ConvFlops(shape(in[0]), shape(in[1]));
        break;
      case OpKind::kConv2dBackwardWeights:  // x, dy -> dw, db?
        f.backward += ConvFlops(shape(in[1]), shape(out[0]));
        break;
      case OpKind::kLinear: {  // x[N,K], w[M,K] -> y[N,M]
        const Shape& w = shape(in[1]);
        if (w.size() == 2) product += 2.0 * Numel(shape(out[0])) * static_cast<double>(w[1]);
        break;
      }
      case OpKind::kLinearBackward: {  // x, w, dy -> dx?, dw?, db?
        const Shape& w = shape(in[1]);
        if (w.size() != 2) break;
        const double one = 2.0 * Numel(shape(in[2])) * static_cast<double>(w[1]);
        if (out.size() > 0 && out[0] >= 0) f.backward += one;
        if (out.size() > 1 && out[1] >= 0) f.backward += one;
        break;
      }
      case OpKind::kMatMul: {  // a, b -> c: 2 * |c| * K
        const Shape& a = shape(in[0]);
        if (a.size() != 2) break;
        const double k = static_cast<double>(n.attrs.transpose_a ? a[0] : a[1]);
        product += 2.0 * Numel(shape(out[0])) * k;
        break;
      }
      default:
        break;
    }
  }
  return f;
}

absl::StatusOr<TrainingFlops> TrainingFlopsPerSample(const std::string& model,
                                                     const nn::ModelOptions& options) {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<nn::Module> m, nn::MakeModel(model, options));
  DT_ASSIGN_OR_RETURN(Shape sample, nn::ModelInputShape(model, options));
  return TrainingFlopsPerSample(m.get(), sample);
}

absl::StatusOr<TrainingFlops> TrainingFlopsPerSample(nn::Module* m, const Shape& sample) {
  // Two samples: batch norm in training mode wants more than one.
  constexpr int64_t kBatch = 2;
  Shape input = {kBatch};
  input.insert(input.end(), sample.begin(), sample.end());
  DT_ASSIGN_OR_RETURN(Graph g, TraceModule(m, input, /*training=*/true));
  DT_RETURN_IF_ERROR(BuildTrainingStep(&g, {.lr = 0.1f}));
  TrainingFlops f = CountMatrixFlops(g);
  f.forward /= kBatch;
  f.backward /= kBatch;
  return f;
}

}  // namespace graph
}  // namespace dtrain
