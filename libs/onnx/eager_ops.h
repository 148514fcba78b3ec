// Autograd functions for the ONNX ops that libs/autograd does not have yet:
// numpy-broadcasting binary ops, a few activations, grouped/dilated/
// asymmetric convolution, Transpose, Concat and Dropout.
//
//   Variable y = onnx::Binary(onnx::BinaryOp::kMul, x, scale);
//
// They compute on the host (CPU tensors only; a CUDA tensor is a fatal
// programming error naming the op: the importer lists models that use them in
// OnnxModel::cpu_only_ops) and record backward closures like libs/autograd's
// functions. Under a tracer they report an event whose op is "onnx_<name>",
// which hybridize refuses ("op onnx_sigmoid is not supported inside a
// hybridized forward") instead of tracing a wrong graph.
//
// Thread-safety: as libs/autograd.
#ifndef DTRAIN_LIBS_ONNX_EAGER_OPS_H_
#define DTRAIN_LIBS_ONNX_EAGER_OPS_H_

#include <array>
#include <cstdint>
#include <vector>

#include "libs/autograd/variable.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace onnx {

using autograd::Variable;

enum class BinaryOp { kAdd, kSub, kMul, kDiv };
// numpy broadcasting (ONNX multidirectional broadcasting).
Variable Binary(BinaryOp op, const Variable& a, const Variable& b);
// The broadcast shape of a and b, or false when they do not broadcast.
bool BroadcastShape(const Shape& a, const Shape& b, Shape* out);

enum class UnaryOp { kLeakyRelu, kSigmoid, kTanh, kErf };
Variable Unary(UnaryOp op, const Variable& x, float alpha = 0.01f);

struct ConvParams {
  std::array<int, 2> stride = {1, 1};
  std::array<int, 4> pads = {0, 0, 0, 0};  // top, left, bottom, right
  std::array<int, 2> dilation = {1, 1};
  int groups = 1;
};
// Output size of one axis; <= 0 when the window does not fit.
int64_t ConvOut(int64_t in, int64_t kernel, int stride, int pad_begin, int pad_end, int dilation);
// x [N,C,H,W], w [O,C/groups,kh,kw], b [O] or undefined.
Variable ConvGeneral(const Variable& x, const Variable& w, const Variable& b, const ConvParams& p);

Variable Transpose(const Variable& x, const std::vector<int>& perm);
Variable Concat(const std::vector<Variable>& xs, int axis);
// Inverted dropout with a mask from Philox(seed, offset): y = x * mask / (1-p).
Variable Dropout(const Variable& x, float ratio, uint64_t seed, uint64_t offset);

}  // namespace onnx
}  // namespace dtrain

#endif  // DTRAIN_LIBS_ONNX_EAGER_OPS_H_
