#include "libs/cuda/gpu_test_util.h"

#include "libs/ops/ops.h"

namespace dtrain {
namespace cuda {
namespace testing {

Tensor ToCuda(const Tensor& cpu, DType dtype, int device) {
  Tensor cast = ops::Cast(cpu, dtype);
  absl::StatusOr<Tensor> t = cast.To(Device::Cuda(device));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : Tensor();
}

Tensor ToCpuF32(const Tensor& t) {
  absl::StatusOr<Tensor> cpu = t.To(Device::Cpu());
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!cpu.ok()) return Tensor();
  return ops::Cast(*cpu, DType::kF32);
}

Tensor RoundTo(const Tensor& cpu, DType dtype) {
  return ops::Cast(ops::Cast(cpu, dtype), DType::kF32);
}

double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return 4e-3;
    case DType::kBF16:
      return 2e-2;
    default:
      return 1e-5;
  }
}

}  // namespace testing
}  // namespace cuda
}  // namespace dtrain
