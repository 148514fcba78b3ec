// Export any traceable module (the built-in models: mlp, lenet, resnet18) as
// an ONNX model, so a built-in model's trained weights go to onnxruntime or
// back into a framework, and a built-in model can be the starting point of a
// user's own file.
//
//   DT_ASSIGN_OR_RETURN(auto net, nn::MakeModel("lenet"));
//   DT_ASSIGN_OR_RETURN(std::string bytes,
//                       onnx::ExportModule(net.get(), /*input_shape=*/{1, 28, 28}));
//
// How: the module's Forward runs once in eval mode on a zero batch of one
// under a tracer (libs/autograd/trace.h); every op becomes ONNX nodes (conv2d
// -> Conv [+ Relu], linear -> Gemm transB=1 [+ Relu], batch_norm ->
// BatchNormalization, avg/max pooling, global average pooling, reshape ->
// Flatten/Reshape, add, relu, matmul). Parameters and buffers become
// initializers under their module names ("0.weight", "1.running_mean"), so
// ImportModel of the result gives a module whose NamedParameters match the
// original's. The graph input "x" and output "logits" have a symbolic batch
// dimension "N". Opset 13, IR version 7. The module's mode is restored.
//
// Errors: Unimplemented for an op with no ONNX mapping here.
// Thread-safety: uses the module; one thread at a time.
#ifndef DTRAIN_LIBS_ONNX_EXPORT_H_
#define DTRAIN_LIBS_ONNX_EXPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "libs/nn/module.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace onnx {

// `input_shape`: one sample, batch excluded. Returns the serialized model.
absl::StatusOr<std::string> ExportModule(nn::Module* module, const Shape& input_shape,
                                         const std::string& graph_name = "dtrain");

}  // namespace onnx
}  // namespace dtrain

#endif  // DTRAIN_LIBS_ONNX_EXPORT_H_
