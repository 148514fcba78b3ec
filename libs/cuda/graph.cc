#include "libs/cuda/graph.h"

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/device_allocator.h"

namespace dtrain {
namespace cuda {

absl::StatusOr<std::unique_ptr<CudaGraph>> CudaGraph::Capture(
    CudaStream* stream, const std::function<absl::Status()>& body) {
  if (stream == nullptr) return absl::InvalidArgumentError("CudaGraph::Capture: null stream");
  const int device = stream->device_index();
  absl::StatusOr<CachingAllocator*> alloc = DeviceAllocator(device);
  if (!alloc.ok()) return alloc.status();
  DeviceGuard guard(device);
  const auto sid = reinterpret_cast<uintptr_t>(stream->get());
  const CachingAllocator::PoolId pool = (*alloc)->BeginPrivatePool(sid);
  absl::Status body_status;
  cudaGraph_t graph = nullptr;
  cudaError_t begin = cudaStreamBeginCapture(stream->get(), cudaStreamCaptureModeThreadLocal);
  if (begin == cudaSuccess) {
    {
      StreamGuard on_stream(stream);
      body_status = body();
    }
    cudaError_t end = cudaStreamEndCapture(stream->get(), &graph);
    if (body_status.ok() && end != cudaSuccess) {
      body_status = CudaStatus(end, "cudaStreamEndCapture", __FILE__, __LINE__);
    }
    if (end != cudaSuccess) cudaGetLastError();
  } else {
    body_status = CudaStatus(begin, "cudaStreamBeginCapture", __FILE__, __LINE__);
  }
  (*alloc)->EndPrivatePool(sid);
  auto fail = [&](absl::Status s) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    (*alloc)->ReleasePrivatePool(pool);
    return absl::Status(s.code(),
                        absl::StrCat("capturing a CUDA graph on cuda:", device, ": ", s.message()));
  };
  if (!body_status.ok()) return fail(body_status);
  size_t nodes = 0;
  cudaError_t err = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (err != cudaSuccess) return fail(CudaStatus(err, "cudaGraphGetNodes", __FILE__, __LINE__));
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) return fail(CudaStatus(err, "cudaGraphInstantiate", __FILE__, __LINE__));
  return std::unique_ptr<CudaGraph>(new CudaGraph(stream, graph, exec, pool, nodes));
}

CudaGraph::~CudaGraph() {
  DeviceGuard guard(stream_->device_index());
  if (cudaStreamSynchronize(stream_->get()) != cudaSuccess) cudaGetLastError();
  cudaGraphExecDestroy(exec_);
  cudaGraphDestroy(graph_);
  absl::StatusOr<CachingAllocator*> alloc = DeviceAllocator(stream_->device_index());
  if (alloc.ok()) (*alloc)->ReleasePrivatePool(pool_);
}

absl::Status CudaGraph::Replay() {
  DeviceGuard guard(stream_->device_index());
  DT_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream_->get()));
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace dtrain
