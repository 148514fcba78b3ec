#include "libs/cuda/nccl/communicator.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/nccl/nccl_status.h"
#include "libs/cuda/stream.h"

namespace dtrain {
namespace cuda {
namespace {

std::string Key(const NcclOptions& o, absl::string_view what) {
  return absl::StrCat(o.key_prefix, "/", what);
}

// Ranks that have not published "<prefix>/joined/<r>" (looked up without
// waiting).
std::vector<int> MissingRanks(collective::Store* store, const NcclOptions& o, int world, int self) {
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (r == self) continue;
    if (!store->Get(Key(o, absl::StrCat("joined/", r)), absl::ZeroDuration()).ok()) {
      missing.push_back(r);
    }
  }
  return missing;
}

// "; rank 3 reported: <reason>" for peers that published an error.
std::string PeerErrors(collective::Store* store, const NcclOptions& o, int world, int self) {
  std::string out;
  for (int r = 0; r < world; ++r) {
    if (r == self) continue;
    absl::StatusOr<std::string> e =
        store->Get(Key(o, absl::StrCat("error/", r)), absl::ZeroDuration());
    if (e.ok()) absl::StrAppend(&out, "; rank ", r, " reported: ", *e);
  }
  return out;
}

}  // namespace

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kAvg:
      return ncclAvg;
  }
  return ncclSum;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(int rank, int world_size,
                                                                           int device,
                                                                           collective::Store* store,
                                                                           const NcclOptions& o) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL communicator: rank ", rank, " of world size ", world_size));
  }
  if (store == nullptr) return absl::InvalidArgumentError("NCCL communicator: null store");
  std::string reason;
  const int count = DeviceCount(&reason);
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL communicator for rank ", rank, ": cuda:", device, " does not exist (",
        count == 0 ? "no CUDA device: " + reason : absl::StrCat(count, " CUDA device(s)"), ")"));
  }
  const std::string who = absl::StrCat("rank ", rank, " of ", world_size, " (cuda:", device, ")");
  DeviceGuard guard(device);

  // The unique id, from rank 0 through the store.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    DT_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    absl::Status s = store->Set(Key(o, "id"), std::string(id.internal, sizeof(id.internal)));
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("NCCL init on ", who,
                                                 ": publishing the unique id: ", s.message()));
    }
  } else {
    absl::StatusOr<std::string> v = store->Get(Key(o, "id"), o.init_timeout);
    if (!v.ok()) {
      return absl::Status(v.status().code(),
                          absl::StrCat("NCCL init on ", who, ": no unique id from rank 0 (",
                                       v.status().message(), ")"));
    }
    if (v->size() != sizeof(id.internal)) {
      return absl::InternalError(absl::StrCat("NCCL init on ", who, ": the unique id under ",
                                              Key(o, "id"), " has ", v->size(), " bytes, not ",
                                              sizeof(id.internal)));
    }
    std::memcpy(id.internal, v->data(), sizeof(id.internal));
  }

  // Non-blocking init, polled against the deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const absl::Time deadline = absl::Now() + o.init_timeout;
  ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclStatus(r, "ncclCommInitRankConfig", __FILE__, __LINE__,
                      absl::StrCat("on ", who).c_str());
  }
  while (true) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      std::string detail = ncclGetLastError(comm);
      ncclCommAbort(comm);
      (void)store->Set(Key(o, absl::StrCat("error/", rank)),
                       absl::StrCat("init failed: ", NcclResultName(state)));
      return NcclStatus(
          state, "ncclCommInitRankConfig", __FILE__, __LINE__,
          absl::StrCat("on ", who, ": ", detail, PeerErrors(store, o, world_size, rank)).c_str());
    }
    if (absl::Now() > deadline) {
      ncclCommAbort(comm);
      (void)store->Set(Key(o, absl::StrCat("error/", rank)), "init timed out");
      std::vector<int> missing = MissingRanks(store, o, world_size, rank);
      return absl::DeadlineExceededError(absl::StrCat(
          "NCCL init on ", who, " did not complete within ", absl::FormatDuration(o.init_timeout),
          "; aborted. ",
          missing.empty() ? std::string("Every other rank joined")
                          : absl::StrCat("Rank", missing.size() == 1 ? " " : "s ",
                                         absl::StrJoin(missing, ", "), " never joined"),
          PeerErrors(store, o, world_size, rank)));
    }
    absl::SleepFor(o.poll_interval);
  }
  (void)store->Set(Key(o, absl::StrCat("joined/", rank)), "1");
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(rank, world_size, device, store, o, comm));
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  DeviceGuard guard(device_);
  if (aborted()) return;  // Abort released the communicator
  // Finalize flushes pending work; bounded, then destroy (or abort).
  ncclResult_t r = ncclCommFinalize(comm_);
  const absl::Time deadline = absl::Now() + std::min(options_.op_timeout, absl::Seconds(60));
  while (r == ncclSuccess || r == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
      return;
    }
    if (state != ncclInProgress || absl::Now() > deadline) break;
    absl::SleepFor(options_.poll_interval);
  }
  DT_LOG(WARNING) << "NCCL communicator of " << Who() << " did not finalize cleanly; aborting it";
  Abort("destroyed while not finalized");
}

std::string NcclCommunicator::Who() const {
  return absl::StrCat("rank ", rank_, " of ", world_size_, " (cuda:", device_, ")");
}

void NcclCommunicator::Abort(const std::string& reason) {
  absl::MutexLock lock(&abort_mu_);
  if (aborted_.load(std::memory_order_acquire)) return;
  DeviceGuard guard(device_);
  ncclCommAbort(comm_);
  aborted_.store(true, std::memory_order_release);
  (void)store_->Set(Key(options_, absl::StrCat("error/", rank_)), reason);
}

absl::Status NcclCommunicator::Fail(const char* op, absl::StatusCode code,
                                    const std::string& what) {
  std::string msg = absl::StrCat("NCCL ", op, " on ", Who(), ": ", what);
  Abort(absl::StrCat(op, ": ", what));
  absl::StrAppend(&msg, "; communicator aborted", PeerErrors(store_, options_, world_size_, rank_));
  return absl::Status(code, msg);
}

absl::Status NcclCommunicator::CheckAsyncError() {
  if (aborted()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL communicator of ", Who(), " was aborted"));
  }
  ncclResult_t state = ncclSuccess;
  ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
  if (q != ncclSuccess) state = q;
  if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
  absl::Status s =
      NcclStatus(state, "ncclCommGetAsyncError", __FILE__, __LINE__, ncclGetLastError(comm_));
  return Fail("asynchronous error check", s.code(), std::string(s.message()));
}

absl::Status NcclCommunicator::Finish(const char* op, ncclResult_t r) {
  if (r == ncclSuccess) return absl::OkStatus();
  if (r != ncclInProgress) {
    absl::Status s = NcclStatus(r, op, __FILE__, __LINE__, ncclGetLastError(comm_));
    return Fail(op, s.code(), std::string(s.message()));
  }
  const absl::Time deadline = absl::Now() + options_.op_timeout;
  while (true) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      absl::Status s = NcclStatus(state, op, __FILE__, __LINE__, ncclGetLastError(comm_));
      return Fail(op, s.code(), std::string(s.message()));
    }
    if (absl::Now() > deadline) {
      return Fail(
          op, absl::StatusCode::kDeadlineExceeded,
          absl::StrCat("still being enqueued after ", absl::FormatDuration(options_.op_timeout)));
    }
    absl::SleepFor(options_.poll_interval);
  }
}

absl::Status NcclCommunicator::CheckTensor(const char* op, const char* name,
                                           const Tensor& t) const {
  if (aborted()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL ", op, " on ", Who(), ": the communicator was aborted"));
  }
  if (!t.defined() || t.device() != Device::Cuda(device_)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL ", op, " on ", Who(), ": ", name, " ",
                                                   t.DebugString(), " is not on cuda:", device_));
  }
  return absl::OkStatus();
}

cudaStream_t NcclCommunicator::StreamFor(Stream* stream) const {
  if (stream != nullptr) return NativeStream(stream);
  return CurrentCudaStream(device_);
}

absl::Status NcclCommunicator::CheckPointer(const char* op, const char* name, const void* p,
                                            size_t count) const {
  if (aborted()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL ", op, " on ", Who(), ": the communicator was aborted"));
  }
  if (count == 0) return absl::OkStatus();
  if (p == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL ", op, " on ", Who(), ": ", name, " is null but count is ", count));
  }
  cudaPointerAttributes attr;
  std::memset(&attr, 0, sizeof(attr));
  cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) cudaGetLastError();  // older runtimes fail for host pointers
  const bool on_device =
      e == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
  if (!on_device || attr.device != device_) {
    const char* where = !on_device ? "host memory" : "memory of another device";
    return absl::InvalidArgumentError(absl::StrCat("NCCL ", op, " on ", Who(), ": ", name, " ",
                                                   absl::StrFormat("%p", p), " is ", where,
                                                   ", not memory of cuda:", device_));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Allreduce(const Tensor& send, Tensor* recv, ReduceOp op,
                                         Stream* stream) {
  DT_RETURN_IF_ERROR(CheckTensor("allreduce", "send", send));
  DT_RETURN_IF_ERROR(CheckTensor("allreduce", "recv", *recv));
  if (send.numel() != recv->numel() || send.dtype() != recv->dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL allreduce on ", Who(), ": send ",
                                                   send.DebugString(), ", recv ",
                                                   recv->DebugString()));
  }
  return Allreduce(send.raw_data(), recv->raw_data(), static_cast<size_t>(send.numel()),
                   send.dtype(), op, StreamFor(stream));
}

absl::Status NcclCommunicator::Broadcast(Tensor* t, int root, Stream* stream) {
  DT_RETURN_IF_ERROR(CheckTensor("broadcast", "t", *t));
  return Broadcast(t->raw_data(), t->raw_data(), static_cast<size_t>(t->numel()), t->dtype(), root,
                   StreamFor(stream));
}

absl::Status NcclCommunicator::Allgather(const Tensor& send, Tensor* recv, Stream* stream) {
  DT_RETURN_IF_ERROR(CheckTensor("allgather", "send", send));
  DT_RETURN_IF_ERROR(CheckTensor("allgather", "recv", *recv));
  if (recv->numel() != send.numel() * world_size_ || send.dtype() != recv->dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL allgather on ", Who(), ": recv ",
                                                   recv->DebugString(), " must hold ", world_size_,
                                                   " times send ", send.DebugString()));
  }
  return Allgather(send.raw_data(), recv->raw_data(), static_cast<size_t>(send.numel()),
                   send.dtype(), StreamFor(stream));
}

absl::Status NcclCommunicator::ReduceScatter(const Tensor& send, Tensor* recv, ReduceOp op,
                                             Stream* stream) {
  DT_RETURN_IF_ERROR(CheckTensor("reduce_scatter", "send", send));
  DT_RETURN_IF_ERROR(CheckTensor("reduce_scatter", "recv", *recv));
  if (send.numel() != recv->numel() * world_size_ || send.dtype() != recv->dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL reduce_scatter on ", Who(), ": send ",
                                                   send.DebugString(), " must hold ", world_size_,
                                                   " times recv ", recv->DebugString()));
  }
  return ReduceScatter(send.raw_data(), recv->raw_data(), static_cast<size_t>(recv->numel()),
                       send.dtype(), op, StreamFor(stream));
}

absl::Status NcclCommunicator::Allreduce(const void* send, void* recv, size_t count, DType dtype,
                                         ReduceOp op, cudaStream_t stream) {
  DT_RETURN_IF_ERROR(CheckPointer("allreduce", "send", send, count));
  DT_RETURN_IF_ERROR(CheckPointer("allreduce", "recv", recv, count));
  DeviceGuard guard(device_);
  return Finish("allreduce",
                ncclAllReduce(send, recv, count, NcclType(dtype), NcclOp(op), comm_, stream));
}

absl::Status NcclCommunicator::Broadcast(const void* send, void* recv, size_t count, DType dtype,
                                         int root, cudaStream_t stream) {
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL broadcast on ", Who(), ": root ", root, " out of range"));
  }
  // Only the root's send buffer is read.
  DT_RETURN_IF_ERROR(CheckPointer("broadcast", "send", rank_ == root ? send : recv, count));
  DT_RETURN_IF_ERROR(CheckPointer("broadcast", "recv", recv, count));
  DeviceGuard guard(device_);
  return Finish("broadcast",
                ncclBroadcast(send, recv, count, NcclType(dtype), root, comm_, stream));
}

absl::Status NcclCommunicator::Allgather(const void* send, void* recv, size_t send_count,
                                         DType dtype, cudaStream_t stream) {
  DT_RETURN_IF_ERROR(CheckPointer("allgather", "send", send, send_count));
  DT_RETURN_IF_ERROR(CheckPointer("allgather", "recv", recv, send_count * world_size_));
  DeviceGuard guard(device_);
  return Finish("allgather", ncclAllGather(send, recv, send_count, NcclType(dtype), comm_, stream));
}

absl::Status NcclCommunicator::ReduceScatter(const void* send, void* recv, size_t recv_count,
                                             DType dtype, ReduceOp op, cudaStream_t stream) {
  DT_RETURN_IF_ERROR(CheckPointer("reduce_scatter", "send", send, recv_count * world_size_));
  DT_RETURN_IF_ERROR(CheckPointer("reduce_scatter", "recv", recv, recv_count));
  DeviceGuard guard(device_);
  return Finish("reduce_scatter", ncclReduceScatter(send, recv, recv_count, NcclType(dtype),
                                                    NcclOp(op), comm_, stream));
}

absl::Status NcclCommunicator::Synchronize(Stream* stream) {
  if (aborted()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL communicator of ", Who(), " was aborted"));
  }
  DeviceGuard guard(device_);
  cudaStream_t s = StreamFor(stream);
  const absl::Time deadline = absl::Now() + options_.op_timeout;
  while (true) {
    cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return CheckAsyncError();
    if (q != cudaErrorNotReady) {
      absl::Status e = CudaStatus(q, "cudaStreamQuery", __FILE__, __LINE__);
      cudaGetLastError();
      return Fail("synchronize", e.code(), std::string(e.message()));
    }
    cudaGetLastError();  // cudaErrorNotReady is not an error
    DT_RETURN_IF_ERROR(CheckAsyncError());
    if (absl::Now() > deadline) {
      return Fail("synchronize", absl::StatusCode::kDeadlineExceeded,
                  absl::StrCat("enqueued collectives did not finish within ",
                               absl::FormatDuration(options_.op_timeout),
                               " (a peer stopped or called different collectives?)"));
    }
    absl::SleepFor(options_.poll_interval);
  }
}

}  // namespace cuda
}  // namespace dtrain
