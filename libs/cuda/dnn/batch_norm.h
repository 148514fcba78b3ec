// Testing hook of the CUDA batch-norm kernels (batch_norm.cc). Model code uses
// libs/ops and never this header.
#ifndef DTRAIN_LIBS_CUDA_DNN_BATCH_NORM_H_
#define DTRAIN_LIBS_CUDA_DNN_BATCH_NORM_H_

namespace dtrain {
namespace cuda {
namespace dnn {

// Which implementation runs the training-mode passes:
//  kAuto   cuDNN for f32 and f16, the own kernels for bf16 (cuDNN's legacy
//          batch-norm API documents no bf16) and for any dtype cuDNN has
//          answered NOT_SUPPORTED before;
//  kCudnn  cuDNN for every dtype (fatal if it refuses);
//  kOwn    the own kernels for every dtype.
enum class BatchNormImpl { kAuto = 0, kCudnn = 1, kOwn = 2 };
void SetBatchNormImplForTesting(BatchNormImpl impl);

}  // namespace dnn
}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_DNN_BATCH_NORM_H_
