// Error mapping of the CUDA runtime, cuBLAS, cuDNN and NCCL status helpers:
// each error names the call, file:line and the library's own words, with a
// Status code that says what kind of failure it was. Runs on every machine.
#include <string>

#include "gtest/gtest.h"
#include "libs/cuda/blas_status.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/dnn/cudnn_status.h"
#include "libs/cuda/nccl/nccl_status.h"

namespace dtrain {
namespace cuda {
namespace {

bool Has(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

TEST(StatusTest, Success) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x", "f", 1).ok());
  EXPECT_TRUE(CublasStatus(CUBLAS_STATUS_SUCCESS, "x", "f", 1).ok());
  EXPECT_TRUE(CudnnStatus(CUDNN_STATUS_SUCCESS, "x", "f", 1).ok());
  EXPECT_TRUE(NcclStatus(ncclSuccess, "x", "f", 1).ok());
}

TEST(StatusTest, Cublas) {
  struct Case {
    cublasStatus_t st;
    absl::StatusCode code;
    const char* name;
  };
  for (const Case& c : {Case{CUBLAS_STATUS_ALLOC_FAILED, absl::StatusCode::kResourceExhausted,
                             "CUBLAS_STATUS_ALLOC_FAILED"},
                        Case{CUBLAS_STATUS_INVALID_VALUE, absl::StatusCode::kInvalidArgument,
                             "CUBLAS_STATUS_INVALID_VALUE"},
                        Case{CUBLAS_STATUS_NOT_SUPPORTED, absl::StatusCode::kUnimplemented,
                             "CUBLAS_STATUS_NOT_SUPPORTED"},
                        Case{CUBLAS_STATUS_NOT_INITIALIZED, absl::StatusCode::kFailedPrecondition,
                             "CUBLAS_STATUS_NOT_INITIALIZED"},
                        Case{CUBLAS_STATUS_EXECUTION_FAILED, absl::StatusCode::kInternal,
                             "CUBLAS_STATUS_EXECUTION_FAILED"}}) {
    SCOPED_TRACE(c.name);
    absl::Status s = CublasStatus(c.st, "cublasGemmEx(h, ...)", "blas.cc", 12);
    EXPECT_EQ(s.code(), c.code);
    EXPECT_TRUE(Has(s, "cublasGemmEx(h, ...) failed at blas.cc:12")) << s;
    EXPECT_TRUE(Has(s, c.name)) << s;
  }
}

TEST(StatusTest, Cudnn) {
  struct Case {
    cudnnStatus_t st;
    absl::StatusCode code;
  };
  for (const Case& c :
       {Case{CUDNN_STATUS_BAD_PARAM, absl::StatusCode::kInvalidArgument},
        Case{CUDNN_STATUS_BAD_PARAM_NULL_POINTER, absl::StatusCode::kInvalidArgument},
        Case{CUDNN_STATUS_NOT_SUPPORTED, absl::StatusCode::kUnimplemented},
        Case{CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, absl::StatusCode::kUnimplemented},
        Case{CUDNN_STATUS_NOT_INITIALIZED, absl::StatusCode::kFailedPrecondition},
        Case{CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED,
             absl::StatusCode::kResourceExhausted},
        Case{CUDNN_STATUS_EXECUTION_FAILED, absl::StatusCode::kInternal}}) {
    SCOPED_TRACE(static_cast<int>(c.st));
    absl::Status s = CudnnStatus(c.st, "cudnnConvolutionForward(h, ...)", "conv.cc", 7);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_TRUE(Has(s, "cudnnConvolutionForward(h, ...) failed at conv.cc:7")) << s;
    EXPECT_TRUE(Has(s, cudnnGetErrorString(c.st))) << s;
  }
}

TEST(StatusTest, Nccl) {
  absl::Status s = NcclStatus(ncclRemoteError, "ncclAllReduce(...)", "comm.cc", 99, "peer gone");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Has(s, "ncclAllReduce(...) failed at comm.cc:99")) << s;
  EXPECT_TRUE(Has(s, "ncclRemoteError")) << s;
  EXPECT_TRUE(Has(s, "peer gone")) << s;
  EXPECT_EQ(NcclStatus(ncclInvalidUsage, "x", "f", 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclStatus(ncclSystemError, "x", "f", 1).code(), absl::StatusCode::kInternal);
  EXPECT_STREQ(NcclResultName(ncclInProgress), "ncclInProgress");
}

TEST(StatusTest, CudaRuntime) {
  absl::Status s = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "x.cc", 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Has(s, "cudaMalloc(&p, n) failed at x.cc:7")) << s;
  EXPECT_TRUE(Has(s, "cudaErrorMemoryAllocation")) << s;
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x", "f", 1).code(),
            absl::StatusCode::kFailedPrecondition);
}

// The macros return early with the Status.
absl::Status ReturnsCublasError() {
  DT_CUBLAS_RETURN_IF_ERROR(CUBLAS_STATUS_INVALID_VALUE);
  return absl::OkStatus();
}
absl::Status ReturnsCudnnError() {
  DT_CUDNN_RETURN_IF_ERROR(CUDNN_STATUS_BAD_PARAM);
  return absl::OkStatus();
}
absl::Status ReturnsNcclError() {
  DT_NCCL_RETURN_IF_ERROR(ncclInternalError);
  return absl::OkStatus();
}

TEST(StatusTest, MacrosReturn) {
  absl::Status s = ReturnsCublasError();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "CUBLAS_STATUS_INVALID_VALUE failed at")) << s;
  EXPECT_EQ(ReturnsCudnnError().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReturnsNcclError().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace cuda
}  // namespace dtrain
