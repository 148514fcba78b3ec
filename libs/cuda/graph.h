// CUDA graphs: record the kernels of a step whose shapes are fixed once, then
// replay them with one launch (no per-kernel launch cost, no host work).
//
//   // Run the step eagerly at least once first: cuDNN chooses its algorithms
//   // and libraries create their handles outside the capture.
//   DT_RETURN_IF_ERROR(step());
//   DT_ASSIGN_OR_RETURN(auto graph, CudaGraph::Capture(stream.get(), step));
//   for (...) {
//     DT_RETURN_IF_ERROR(input.CopyFrom(next_batch));   // into the captured buffer
//     DT_RETURN_IF_ERROR(graph->Replay());
//   }
//
// The body runs once, with `stream` as its device's current stream; the CUDA
// work it enqueues there is recorded, not run. It must be free of host
// synchronization (no ScalarValue, no ToVector, no copies from pageable host
// memory) and enqueue its work on `stream` only. Tensors it allocates come
// from a private memory pool that lives as long as the graph, so replays
// write to the same addresses; tensors created before the capture and used by
// it (inputs, parameters) must stay alive, and keep their addresses, for as
// long as the graph is replayed. This is the hybridized path's contract:
// fixed shapes, buffers planned ahead.
#ifndef DTRAIN_LIBS_CUDA_GRAPH_H_
#define DTRAIN_LIBS_CUDA_GRAPH_H_

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/cuda/caching_allocator.h"
#include "libs/cuda/stream.h"

namespace dtrain {
namespace cuda {

class CudaGraph {
 public:
  // Captures what `body` enqueues on `stream`. Returns body's error, or the
  // capture's (an illegal call inside the capture, say), naming the step.
  static absl::StatusOr<std::unique_ptr<CudaGraph>> Capture(
      CudaStream* stream, const std::function<absl::Status()>& body);
  // Waits for the graph's replays, then releases its memory pool.
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Enqueues one replay on the capture stream (asynchronous).
  absl::Status Replay();
  // Number of kernel and copy nodes recorded.
  size_t num_nodes() const { return num_nodes_; }

 private:
  CudaGraph(CudaStream* stream, cudaGraph_t graph, cudaGraphExec_t exec,
            CachingAllocator::PoolId pool, size_t nodes)
      : stream_(stream), graph_(graph), exec_(exec), pool_(pool), num_nodes_(nodes) {}
  CudaStream* stream_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  CachingAllocator::PoolId pool_;
  size_t num_nodes_;
};

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_GRAPH_H_
