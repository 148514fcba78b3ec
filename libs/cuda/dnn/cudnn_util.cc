#include "libs/cuda/dnn/cudnn_util.h"

#include <climits>

#include "libs/base/logging.h"
#include "libs/cuda/dnn/cudnn_status.h"
#include "libs/cuda/handles.h"

namespace dtrain {
namespace cuda {
namespace dnn {

cudnnHandle_t CudnnHandle(int device, cudaStream_t stream) {
  static ThreadHandlePool* pool = new ThreadHandlePool([]() -> void* {
    cudnnHandle_t h = nullptr;
    DT_CUDNN_CHECK(cudnnCreate(&h));
    return h;
  });
  auto h = static_cast<cudnnHandle_t>(pool->Get(device));
  DT_CUDNN_CHECK(cudnnSetStream(h, stream));
  return h;
}

cudnnDataType_t CudnnType(DType dt) {
  switch (dt) {
    case DType::kF32:
      return CUDNN_DATA_FLOAT;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      DT_CHECK(false) << "cuDNN kernels take f32, f16 or bf16, not " << DTypeName(dt);
      return CUDNN_DATA_FLOAT;
  }
}

namespace {

int Int(int64_t v, const char* what) {
  DT_CHECK(v >= 0 && v <= INT_MAX) << "cuDNN: " << what << " " << v << " exceeds int";
  return static_cast<int>(v);
}

}  // namespace

TensorDesc::TensorDesc() { DT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_)); }
TensorDesc::~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }

void TensorDesc::Set(DType dt, int64_t n, int64_t c, int64_t h, int64_t w) {
  DT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW, CudnnType(dt), Int(n, "N"),
                                            Int(c, "C"), Int(h, "H"), Int(w, "W")));
}

FilterDesc::FilterDesc() { DT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d_)); }
FilterDesc::~FilterDesc() { cudnnDestroyFilterDescriptor(d_); }

void FilterDesc::Set(DType dt, int64_t o, int64_t c, int64_t kh, int64_t kw) {
  DT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d_, CudnnType(dt), CUDNN_TENSOR_NCHW, Int(o, "O"),
                                            Int(c, "C"), Int(kh, "kh"), Int(kw, "kw")));
}

ConvDesc::ConvDesc() { DT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d_)); }
ConvDesc::~ConvDesc() { cudnnDestroyConvolutionDescriptor(d_); }

void ConvDesc::Set(int pad, int stride) {
  DT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d_, pad, pad, stride, stride, 1, 1,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
}

void ConvDesc::SetMath(cudnnMathType_t math) {
  DT_CUDNN_CHECK(cudnnSetConvolutionMathType(d_, math));
}

}  // namespace dnn
}  // namespace cuda
}  // namespace dtrain
