// Testing hook of the cuDNN convolution kernels (conv.cc). Model code uses
// libs/ops and never this header.
//
//   ops::Conv2d(x, w, nullptr, p);  // x, w on a CUDA device
//   std::string algo = dnn::LastConvChoiceForTesting(dnn::ConvPass::kForward);
//   // e.g. "IMPLICIT_PRECOMP_GEMM math=FMA workspace=0"
//
// The choice is per calling thread and pass: the algorithm the calling
// thread's last convolution of that pass ran with (cuDNN's enum name without
// its prefix), the math mode it ran under and its workspace in bytes; "" when
// the thread has run none.
#ifndef DTRAIN_LIBS_CUDA_DNN_CONV_H_
#define DTRAIN_LIBS_CUDA_DNN_CONV_H_

#include <string>

namespace dtrain {
namespace cuda {
namespace dnn {

enum class ConvPass { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };
std::string LastConvChoiceForTesting(ConvPass pass);

}  // namespace dnn
}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_DNN_CONV_H_
