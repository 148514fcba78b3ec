#include "libs/cuda/handles.h"

#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "libs/base/logging.h"
#include "libs/cuda/blas_status.h"
#include "libs/cuda/stream.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace cuda {
namespace {

// Handles released by exited threads, per pool and device.
struct FreeHandles {
  absl::Mutex mu;
  absl::flat_hash_map<const void*, std::vector<void*>> free[kMaxDevices];
};

FreeHandles& Free() {
  static FreeHandles* f = new FreeHandles();
  return *f;
}

// The calling thread's handles: (pool, device) -> handle. Returned to the
// free lists when the thread exits.
struct ThreadHandles {
  absl::flat_hash_map<const void*, void*> handles[kMaxDevices];
  ~ThreadHandles() {
    FreeHandles& f = Free();
    absl::MutexLock lock(&f.mu);
    for (int d = 0; d < kMaxDevices; ++d) {
      for (auto& [pool, h] : handles[d]) f.free[d][pool].push_back(h);
    }
  }
};

ThreadHandles& Mine() {
  thread_local ThreadHandles t;
  return t;
}

struct BlasHandle {
  cublasHandle_t handle = nullptr;
  // Workspaces by stream, kept for the handle's lifetime.
  std::unordered_map<cudaStream_t, Tensor> workspaces;
};

}  // namespace

void* ThreadHandlePool::Get(int device) {
  DT_CHECK(device >= 0 && device < kMaxDevices) << "bad CUDA device " << device;
  ThreadHandles& mine = Mine();
  auto it = mine.handles[device].find(this);
  if (it != mine.handles[device].end()) return it->second;
  void* h = nullptr;
  {
    FreeHandles& f = Free();
    absl::MutexLock lock(&f.mu);
    auto& list = f.free[device][this];
    if (!list.empty()) {
      h = list.back();
      list.pop_back();
    }
  }
  if (h == nullptr) {
    DeviceGuard guard(device);
    h = create_();
  }
  mine.handles[device][this] = h;
  return h;
}

cublasHandle_t CublasHandle(int device, cudaStream_t stream) {
  static ThreadHandlePool* pool = new ThreadHandlePool([]() -> void* {
    auto* b = new BlasHandle();
    DT_CUBLAS_CHECK(cublasCreate(&b->handle));
    return b;
  });
  auto* b = static_cast<BlasHandle*>(pool->Get(device));
  DT_CUBLAS_CHECK(cublasSetStream(b->handle, stream));
  // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again.
  auto it = b->workspaces.find(stream);
  if (it == b->workspaces.end()) {
    Tensor ws;
    absl::StatusOr<Tensor> t = Tensor::TryEmpty({static_cast<int64_t>(kCublasWorkspaceBytes)},
                                                DType::kU8, Device::Cuda(device));
    if (t.ok()) {
      ws = *t;
    } else {
      DT_LOG(WARNING) << "cuda:" << device << ": no memory for a cuBLAS workspace ("
                      << t.status().message() << "); cuBLAS uses its own";
    }
    it = b->workspaces.emplace(stream, ws).first;
  }
  if (it->second.defined()) {
    DT_CUBLAS_CHECK(cublasSetWorkspace(b->handle, it->second.raw_data(), it->second.nbytes()));
  }
  return b->handle;
}

}  // namespace cuda
}  // namespace dtrain
