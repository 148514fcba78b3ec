// Differentiable operations on Variables. Each computes its forward result
// with the ops in libs/ops and records a backward closure (variable.h).
// Shapes and semantics follow libs/ops/ops.h.
#ifndef DTRAIN_LIBS_AUTOGRAD_FUNCTIONS_H_
#define DTRAIN_LIBS_AUTOGRAD_FUNCTIONS_H_

#include "libs/autograd/variable.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace autograd {

// `b` may be an undefined Variable (no bias). With `relu`, the result is
// relu(conv(x) + b) computed by one fused kernel.
Variable Conv2d(const Variable& x, const Variable& w, const Variable& b, const ops::Conv2dParams& p,
                bool relu = false);
Variable Linear(const Variable& x, const Variable& w, const Variable& b, bool relu = false);
Variable MatMul(const Variable& a, const Variable& b);
Variable Relu(const Variable& x);
Variable Add(const Variable& a, const Variable& b);
Variable AvgPool2d(const Variable& x, const ops::Pool2dParams& p);
Variable MaxPool2d(const Variable& x, const ops::Pool2dParams& p);
Variable GlobalAvgPool(const Variable& x);
// A view with a new shape (one dimension may be -1).
Variable Reshape(const Variable& x, const Shape& shape);
// [N, ...] -> [N, prod(...)].
Variable Flatten(const Variable& x);
// Batch norm over channels (dim 1). In training, uses batch statistics and
// updates *running_mean / *running_var; otherwise uses them.
Variable BatchNorm(const Variable& x, const Variable& gamma, const Variable& beta,
                   Tensor* running_mean, Tensor* running_var, bool training, float momentum,
                   float eps);
// Mean softmax cross-entropy of logits [N,C] against i32 labels [N]: a scalar.
Variable SoftmaxCrossEntropy(const Variable& logits, const Tensor& labels);
// Sum of all elements: a scalar.
Variable Sum(const Variable& x);

}  // namespace autograd
}  // namespace dtrain

#endif  // DTRAIN_LIBS_AUTOGRAD_FUNCTIONS_H_
