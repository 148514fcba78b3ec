// cuDNN handles and RAII descriptors for the cuDNN op kernels (conv.cc,
// batch_norm.cc). Internal to libs/cuda/dnn.
#ifndef DTRAIN_LIBS_CUDA_DNN_CUDNN_UTIL_H_
#define DTRAIN_LIBS_CUDA_DNN_CUDNN_UTIL_H_

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>

#include "libs/tensor/dtype.h"

namespace dtrain {
namespace cuda {
namespace dnn {

// The calling thread's cuDNN handle for `device` (current), set to `stream`.
cudnnHandle_t CudnnHandle(int device, cudaStream_t stream);

// f32, f16, bf16 -> CUDNN_DATA_FLOAT, _HALF, _BFLOAT16 (fatal otherwise).
cudnnDataType_t CudnnType(DType dt);

class TensorDesc {
 public:
  TensorDesc();
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  // A packed NCHW tensor.
  void Set(DType dt, int64_t n, int64_t c, int64_t h, int64_t w);
  // Any dtype code cuDNN knows (batch norm's derived f32 descriptors).
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

class FilterDesc {
 public:
  FilterDesc();
  ~FilterDesc();
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  void Set(DType dt, int64_t o, int64_t c, int64_t kh, int64_t kw);
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc();
  ~ConvDesc();
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  // Cross-correlation (what deep-learning "convolution" means) with f32
  // accumulation whatever the data type.
  void Set(int pad, int stride);
  void SetMath(cudnnMathType_t math);
  cudnnConvolutionDescriptor_t get() const { return d_; }

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

}  // namespace dnn
}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_DNN_CUDNN_UTIL_H_
