#include "libs/ops/registry.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace ops {
namespace {

// Every op that ops.cc dispatches must have a CPU kernel in this build.
TEST(RegistryTest, EveryOpHasACpuKernel) {
  const char* kOps[] = {"conv2d",
                        "conv2d_backward_data",
                        "conv2d_backward_weights",
                        "linear",
                        "linear_backward",
                        "matmul",
                        "relu",
                        "relu_backward",
                        "add",
                        "axpy",
                        "scale",
                        "avg_pool2d",
                        "avg_pool2d_backward",
                        "max_pool2d",
                        "max_pool2d_backward",
                        "global_avg_pool",
                        "global_avg_pool_backward",
                        "batch_norm_train",
                        "batch_norm_inference",
                        "batch_norm_backward",
                        "softmax_cross_entropy",
                        "argmax",
                        "count_correct",
                        "sum",
                        "sgd_update",
                        "fill",
                        "random_normal",
                        "random_uniform",
                        "cast"};
  std::set<std::string> cpu;
  for (const KernelInfo& k : KernelRegistry::Global().List()) {
    if (k.device == DeviceType::kCPU) cpu.insert(k.op);
  }
  for (const char* op : kOps) EXPECT_TRUE(cpu.count(op)) << "no CPU kernel for " << op;
  EXPECT_EQ(cpu.size(), sizeof(kOps) / sizeof(kOps[0])) << "an op is registered but not listed";
}

TEST(RegistryTest, MissingKernelIsFatalAndNamesOpAndDevice) {
  EXPECT_EQ(KernelRegistry::Global().Find("relu", DeviceType::kCUDA), nullptr);
  EXPECT_DEATH(ResolveKernelOrDie("relu", Device::Cuda(0)), "no kernel for op 'relu' on cuda:0");
}

void DummyKernel(const Tensor&, Tensor*) {}

TEST(RegistryTest, DuplicateRegistrationIsFatal) {
  KernelRegistry::Global().Register("test_only_op", DeviceType::kCUDA,
                                    reinterpret_cast<void*>(&DummyKernel));
  EXPECT_NE(KernelRegistry::Global().Find("test_only_op", DeviceType::kCUDA), nullptr);
  EXPECT_DEATH(KernelRegistry::Global().Register("test_only_op", DeviceType::kCUDA,
                                                 reinterpret_cast<void*>(&DummyKernel)),
               "registered twice");
}

}  // namespace
}  // namespace ops
}  // namespace dtrain
