// Test helpers for ops: finite-difference gradients and tensor comparison.
#ifndef DTRAIN_LIBS_OPS_TESTING_GRADCHECK_H_
#define DTRAIN_LIBS_OPS_TESTING_GRADCHECK_H_

#include <cstdint>
#include <functional>
#include <string>

#include "gtest/gtest.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace ops {
namespace testing {

// d/dx of L(x) = sum_i f(x)[i] * dy[i] by central differences with step
// `eps`, evaluated element by element (L accumulated in double). `f` must be
// a pure function of x. Returns a tensor shaped like x, on the CPU.
Tensor NumericGradient(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                       const Tensor& dy, double eps = 1e-2);

// A CPU f32 tensor of `shape` with values uniform in [low, high) from a
// std::mt19937 seeded with `seed` (test inputs; not the Philox op).
Tensor RandomTensor(const Shape& shape, uint64_t seed, float low = -1.0f, float high = 1.0f);

// gtest assertion: shapes equal and |a - e| <= atol + rtol * |e| everywhere.
// On failure names `what`, the worst index and both values.
::testing::AssertionResult TensorsNear(const Tensor& actual, const Tensor& expected, double rtol,
                                       double atol, const std::string& what = "");

}  // namespace testing
}  // namespace ops
}  // namespace dtrain

#endif  // DTRAIN_LIBS_OPS_TESTING_GRADCHECK_H_
