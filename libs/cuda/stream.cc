#include "libs/cuda/stream.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/cuda/cuda_status.h"

namespace dtrain {
namespace cuda {
namespace {

thread_local Stream* tls_current[kMaxDevices] = {};
std::atomic<Stream*> g_default[kMaxDevices] = {};

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) {
    cudaGetLastError();
    cur = -1;
  }
  if (cur != device) {
    prev_ = cur;
    if (cudaSetDevice(device) != cudaSuccess) cudaGetLastError();
  }
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0 && cudaSetDevice(prev_) != cudaSuccess) cudaGetLastError();
}

absl::StatusOr<std::unique_ptr<CudaEvent>> CudaEvent::Create(int device, bool timing) {
  DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  DT_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return std::unique_ptr<CudaEvent>(new CudaEvent(device, e));
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

absl::Status CudaEvent::Record(cudaStream_t stream) {
  DeviceGuard guard(device_);
  DT_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return absl::OkStatus();
}

absl::Status CudaEvent::Record(Stream* stream) { return Record(NativeStream(stream)); }

absl::StatusOr<bool> CudaEvent::Query() const {
  cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  DT_CUDA_RETURN_IF_ERROR(err);
  return false;
}

absl::Status CudaEvent::Synchronize() const {
  DT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::StatusOr<float> CudaEvent::ElapsedMs(const CudaEvent& start, const CudaEvent& end) {
  float ms = 0;
  DT_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, end.event_));
  return ms;
}

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create(int device, int priority) {
  if (device < 0 || device >= kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device index ", device, " out of range"));
  }
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  DT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  return std::unique_ptr<CudaStream>(new CudaStream(device, s));
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) {
    DeviceGuard guard(device_);
    cudaStreamDestroy(stream_);
  }
}

absl::Status CudaStream::Synchronize() {
  DT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaStream::Wait(const CudaEvent& event) {
  DT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, event.get(), 0));
  return absl::OkStatus();
}

absl::Status CudaStream::Wait(Stream* other) {
  if (other == nullptr || other == this) return absl::OkStatus();
  if (!other->device().is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaStream::Wait: ", other->device().ToString(), " is not a CUDA stream"));
  }
  absl::StatusOr<std::unique_ptr<CudaEvent>> e = CudaEvent::Create(other->device().index);
  if (!e.ok()) return e.status();
  absl::Status s = (*e)->Record(NativeStream(other));
  if (!s.ok()) return s;
  // Destroying the event right after the wait is allowed: the wait keeps
  // what it needs.
  return Wait(**e);
}

Stream* CurrentStream(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  if (tls_current[device] != nullptr) return tls_current[device];
  Stream* s = g_default[device].load(std::memory_order_acquire);
  if (s == nullptr) {
    s = DefaultStream(Device::Cuda(device));
    if (s != nullptr) g_default[device].store(s, std::memory_order_release);
  }
  return s;
}

cudaStream_t CurrentCudaStream(int device) {
  Stream* s = CurrentStream(device);
  DT_CHECK(s != nullptr) << "cuda:" << device << " has no stream (no such device?)";
  return static_cast<cudaStream_t>(s->native_handle());
}

cudaStream_t NativeStream(Stream* stream) {
  DT_CHECK(stream != nullptr && stream->device().is_cuda())
      << "expected a CUDA stream, got "
      << (stream == nullptr ? std::string("null") : stream->device().ToString());
  return static_cast<cudaStream_t>(stream->native_handle());
}

StreamGuard::StreamGuard(Stream* stream) {
  DT_CHECK(stream != nullptr && stream->device().is_cuda() && stream->device().index >= 0 &&
           stream->device().index < kMaxDevices)
      << "StreamGuard needs a CUDA stream";
  device_ = stream->device().index;
  prev_ = tls_current[device_];
  tls_current[device_] = stream;
}

StreamGuard::~StreamGuard() { tls_current[device_] = prev_; }

RelaxedCaptureModeGuard::RelaxedCaptureModeGuard() : prev_(cudaStreamCaptureModeRelaxed) {
  if (cudaThreadExchangeStreamCaptureMode(&prev_) != cudaSuccess) {
    cudaGetLastError();
    prev_ = cudaStreamCaptureModeRelaxed;
  }
}

RelaxedCaptureModeGuard::~RelaxedCaptureModeGuard() {
  if (cudaThreadExchangeStreamCaptureMode(&prev_) != cudaSuccess) cudaGetLastError();
}

Stream* NewDefaultStream(int device) {
  absl::StatusOr<std::unique_ptr<CudaStream>> s = CudaStream::Create(device);
  if (!s.ok()) {
    DT_LOG(WARNING) << "cuda:" << device
                    << ": cannot create the default stream: " << s.status().message();
    return nullptr;
  }
  return s->release();
}

}  // namespace cuda
}  // namespace dtrain
