#include "libs/cuda/vector_add.h"

#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "libs/cuda/cuda_status.h"

namespace dtrain {
namespace cuda {
namespace {

TEST(CudaStatusTest, ErrorsNameTheCallAndLocation) {
  absl::Status s = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "x.cc", 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cudaMalloc(&p, n) failed at x.cc:7"), std::string::npos);
  EXPECT_NE(s.message().find("cudaErrorMemoryAllocation"), std::string::npos);
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x", "y", 1).ok());
}

absl::Status RunAxpy(int64_t n, std::vector<float>* out) {
  std::vector<float> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.5f * i;
    b[i] = std::sin(static_cast<float>(i));
  }
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  size_t bytes = n * sizeof(float);
  DT_CUDA_RETURN_IF_ERROR(cudaMalloc(&da, bytes));
  DT_CUDA_RETURN_IF_ERROR(cudaMalloc(&db, bytes));
  DT_CUDA_RETURN_IF_ERROR(cudaMalloc(&dc, bytes));
  cudaStream_t stream;
  DT_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  DT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(da, a.data(), bytes, cudaMemcpyHostToDevice, stream));
  DT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(db, b.data(), bytes, cudaMemcpyHostToDevice, stream));
  DT_CUDA_RETURN_IF_ERROR(LaunchAxpy(2.0f, da, db, dc, n, stream));
  out->resize(n);
  DT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->data(), dc, bytes, cudaMemcpyDeviceToHost, stream));
  DT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return absl::OkStatus();
}

TEST(VectorAddTest, MatchesHostComputation) {
  std::string reason;
  if (DeviceCount(&reason) == 0) GTEST_SKIP() << "no CUDA device: " << reason;
  for (int64_t n : {1, 1000, 1 << 20, (1 << 20) + 3}) {
    std::vector<float> c;
    ASSERT_TRUE(RunAxpy(n, &c).ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_FLOAT_EQ(c[i], 2.0f * (0.5f * i) + std::sin(static_cast<float>(i))) << "i=" << i;
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace dtrain
