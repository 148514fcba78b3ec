// NCCL communicators for data-parallel training on CUDA devices, built so
// that a failure anywhere ends in an error on every rank instead of a hang.
//
//   collective::FileStore store("/tmp/job42");      // or any Store all ranks reach
//   DT_ASSIGN_OR_RETURN(auto comm,
//                       NcclCommunicator::Create(rank, world_size, /*device=*/rank, &store));
//   DT_RETURN_IF_ERROR(comm->Allreduce(grad, &grad, ReduceOp::kSum));  // enqueued
//   DT_RETURN_IF_ERROR(comm->Synchronize());                         // waited for
//
// Rendezvous. Rank 0 creates NCCL's unique id and publishes it in the store
// under "<prefix>/id"; the other ranks wait for it (init_timeout). Each rank
// publishes "<prefix>/joined/<rank>" once its communicator is ready and
// "<prefix>/error/<rank>" when it aborts, so that a rank that times out can
// say which peers never joined and which one failed.
//
// Errors never hang. The communicator is non-blocking (NCCL's config
// blocking = 0): initialization and every call return at once and are polled
// (ncclCommGetAsyncError) against a deadline. Synchronize waits for the
// enqueued work the same way. On an error or a timeout the communicator is
// aborted (ncclCommAbort, which also releases kernels stuck waiting for a
// dead peer) and the Status names this rank, its device and, when known, the
// failing peer. An aborted communicator fails every later call; create a new
// one (with a new key prefix) to go on.
//
// Thread-safety: one thread issues a communicator's operations; Abort may be
// called from any thread (a watchdog), but not while another thread is
// inside an operation (ncclCommAbort frees the communicator), so a watchdog
// serializes the two (nccl_collective.cc does).
//
// For code written against collective::Communicator (raw buffers, Work
// handles, timeouts per operation), nccl_collective.h wraps this class in
// that interface.
#ifndef DTRAIN_LIBS_CUDA_NCCL_COMMUNICATOR_H_
#define DTRAIN_LIBS_CUDA_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/collective/store.h"
#include "libs/tensor/stream.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace cuda {

enum class ReduceOp { kSum, kProd, kMax, kMin, kAvg };

struct NcclOptions {
  // How long Create waits for the unique id and for every rank to join.
  absl::Duration init_timeout = absl::Minutes(5);
  // How long Synchronize waits for enqueued collectives before aborting, and
  // how long a call may stay "in progress" (non-blocking enqueue).
  absl::Duration op_timeout = absl::Minutes(10);
  // Store keys start with this; communicators sharing a store need different
  // prefixes (and a retry after a failure needs a fresh one).
  std::string key_prefix = "nccl";
  // Sleep between polls of NCCL's state.
  absl::Duration poll_interval = absl::Microseconds(200);
};

class NcclCommunicator {
 public:
  // Joins rank `rank` of `world_size` on CUDA device `device`; see the file
  // comment. Errors: InvalidArgument for bad ranks, FailedPrecondition when the
  // device does not exist, DeadlineExceeded (naming the missing ranks) when
  // the group does not form within init_timeout, or NCCL's error. `store`
  // must outlive the communicator.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(int rank, int world_size,
                                                                  int device,
                                                                  collective::Store* store,
                                                                  const NcclOptions& options = {});

  // Destroys the communicator after its pending work (bounded by op_timeout),
  // or aborts it if it is broken or the work does not finish.
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }

  // Collectives on CUDA tensors of this communicator's device, enqueued on
  // `stream` (null: the device's CurrentStream) and asynchronous: wait with
  // Synchronize (or order later work on the same stream). All ranks must make
  // the same calls in the same order with matching sizes and dtypes.
  //   Allreduce: recv = op over ranks of send (same shape; recv may be send).
  //   Broadcast: t on every rank = t on `root`.
  //   Allgather: recv (world_size * send.numel() elements) = the ranks'
  //              sends, concatenated in rank order.
  //   ReduceScatter: recv (send.numel() / world_size elements) = block `rank`
  //              of the reduction of the sends.
  absl::Status Allreduce(const Tensor& send, Tensor* recv, ReduceOp op, Stream* stream = nullptr);
  absl::Status Broadcast(Tensor* t, int root, Stream* stream = nullptr);
  absl::Status Allgather(const Tensor& send, Tensor* recv, Stream* stream = nullptr);
  absl::Status ReduceScatter(const Tensor& send, Tensor* recv, ReduceOp op,
                             Stream* stream = nullptr);

  // The same on raw pointers into memory of this communicator's device
  // (INVALID_ARGUMENT, before any communication, for other pointers), counts
  // in elements of `dtype`, enqueued on `stream` (a stream of the device).
  // In place: Allreduce and Broadcast with send == recv, Allgather with send
  // == recv + rank * send_count, ReduceScatter with recv == send + rank *
  // recv_count. nccl_collective.h builds the collective::Communicator on
  // these.
  absl::Status Allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         cudaStream_t stream);
  absl::Status Broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                         cudaStream_t stream);
  absl::Status Allgather(const void* send, void* recv, size_t send_count, DType dtype,
                         cudaStream_t stream);
  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count, DType dtype,
                             ReduceOp op, cudaStream_t stream);

  // Waits until the work enqueued on `stream` (null: the CurrentStream) has
  // finished, watching NCCL's asynchronous error state; aborts and returns an
  // error on a failure or after op_timeout.
  absl::Status Synchronize(Stream* stream = nullptr);

  // NCCL's asynchronous error state now (OK while healthy or busy).
  absl::Status CheckAsyncError();

  // Aborts the communicator: kernels waiting in it return, later calls fail.
  // Publishes `reason` under "<prefix>/error/<rank>". Idempotent.
  void Abort(const std::string& reason);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // Aborts (as Abort) and returns the error for `op` with `code`: "NCCL <op>
  // on rank 1 of 4 (cuda:1): <what>; communicator aborted", plus what peers
  // published under "<prefix>/error/<r>". For watchdogs that decide an
  // operation failed (a timeout) outside this class.
  absl::Status Fail(const char* op, absl::StatusCode code, const std::string& what);

  // "rank 1 of 4 (cuda:1)".
  std::string Who() const;

 private:
  NcclCommunicator(int rank, int world_size, int device, collective::Store* store,
                   const NcclOptions& options, ncclComm_t comm)
      : rank_(rank),
        world_size_(world_size),
        device_(device),
        store_(store),
        options_(options),
        comm_(comm) {}

  // Checks that the communicator is usable and `t` is a CUDA tensor of its
  // device with an NCCL dtype.
  absl::Status CheckTensor(const char* op, const char* name, const Tensor& t) const;
  // Checks that the communicator is usable and `p` (when count > 0) points
  // into memory of its device.
  absl::Status CheckPointer(const char* op, const char* name, const void* p, size_t count) const;
  cudaStream_t StreamFor(Stream* stream) const;
  // After an NCCL call: polls while it is in progress, turns errors into a
  // Status (aborting the communicator).
  absl::Status Finish(const char* op, ncclResult_t r);
  const int rank_, world_size_, device_;
  collective::Store* const store_;
  const NcclOptions options_;
  ncclComm_t comm_;
  absl::Mutex abort_mu_;
  std::atomic<bool> aborted_{false};
};

// NCCL's element type for a dtype (all six dtypes have one).
ncclDataType_t NcclType(DType dtype);
ncclRedOp_t NcclOp(ReduceOp op);

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_NCCL_COMMUNICATOR_H_
