// NCCL behind the collective::Communicator interface: code written against
// libs/collective/communicator.h (raw buffers, Work handles, a timeout per
// operation, every failure an error on every rank) runs its collectives with
// NCCL on CUDA device memory, without knowing it.
//
//   collective::CommunicatorOptions o;
//   o.transport = collective::TransportKind::kNccl;  // links this library
//   o.cuda_device = local_rank;                      // -1: rank % device count
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<collective::Communicator> comm,
//                       collective::Communicator::Create(rank, size, &store, o));
//   DT_RETURN_IF_ERROR(comm->Allreduce(grad_on_device, n, DType::kF32,
//                                      collective::ReduceOp::kAverage));
//
// (Or call CreateNcclCommunicator directly.) Linking this library
// (alwayslink) registers it for TransportKind::kNccl with
// collective::RegisterCommunicatorFactory, so libs/collective does not depend
// on CUDA and a binary without it gets FAILED_PRECONDITION for kNccl.
//
// Built on NcclCommunicator (communicator.h), which does the rendezvous (rank
// 0 creates the ncclUniqueId and publishes it in the store under
// "<key_prefix>/nccl/id"; the others wait for it), the non-blocking init
// against CommunicatorOptions::timeout, and ncclCommAbort with rank-naming
// errors.
//
// Buffers: device pointers into memory of the communicator's device
// (options().cuda_device); a host pointer or another device's memory is
// INVALID_ARGUMENT, reported before any communication, which does not break
// the communicator. Allreduce and ReduceScatter take f32, f16 and bf16 (the
// interface's contract), sum or average (ncclAvg, which may scale before
// summing, so an average can differ from the host transports' correctly
// rounded one in the last bits); Allgather and Broadcast any dtype. Barrier
// is an allreduce of one float on the device. AllreduceAlgorithmFor answers
// kAuto (NCCL picks ring, tree, ...; the options' algorithm knobs are
// ignored).
//
// Execution: every call, synchronous or not, first makes the communicator's
// own stream wait for the work already enqueued on the calling thread's
// current stream of the device (so kernels that produced the buffer come
// first), enqueues the NCCL collective there and records an event after it.
// A watchdog thread polls the oldest operation's event and NCCL's
// asynchronous error state; it completes the Work when the event fires. A
// synchronous call is its Async version followed by Work::Wait. So when Wait
// returns OK the result is in device memory and later work on any stream
// sees it.
//
// Failures: an NCCL error (of this rank or, through ncclRemoteError, of a
// peer), a CUDA error, or an operation still unfinished when its timeout
// (counted from when the previous operation finished) runs out aborts the
// NCCL communicator (ncclCommAbort, which also releases kernels waiting for a
// dead peer) and publishes the reason under "<key_prefix>/nccl/error/<rank>";
// the operation fails naming this rank and device and what peers published,
// and every pending and later operation fails with FAILED_PRECONDITION
// quoting it. health() reports the first error (it learns of NCCL's
// asynchronous errors while operations are pending). Abort(reason), from
// any thread, does the same on demand (a trainer's agent that learns a
// peer is lost: a collective waiting for it over shared memory or NVLink
// may never fail by itself): health() says ABORTED with the reason at once,
// and the watchdog thread calls ncclCommAbort, so Abort never waits for an
// operation being enqueued.
//
// Not supported: two ranks of one communicator on the same GPU (NCCL rejects
// it at init, "Duplicate GPU detected"); use one rank per GPU.
#ifndef DTRAIN_LIBS_CUDA_NCCL_NCCL_COLLECTIVE_H_
#define DTRAIN_LIBS_CUDA_NCCL_NCCL_COLLECTIVE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"

namespace dtrain {
namespace cuda {

// Joins rank `rank` of `size` on CUDA device options.cuda_device (-1: rank
// modulo the number of visible devices) through `store`, which must outlive
// the communicator. Uses options.timeout (init and the default per-operation
// limit) and options.key_prefix; ignores the host transports' options.
// Errors: INVALID_ARGUMENT for bad ranks, a null store or a non-positive
// timeout; FAILED_PRECONDITION when the device does not exist (saying why
// when there is no GPU at all); DEADLINE_EXCEEDED naming the ranks that never
// joined; NCCL's error otherwise.
absl::StatusOr<std::unique_ptr<collective::Communicator>> CreateNcclCommunicator(
    int rank, int size, collective::Store* store, const collective::CommunicatorOptions& options);

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_NCCL_NCCL_COLLECTIVE_H_
