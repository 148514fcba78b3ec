// Collective communication between the ranks of a data-parallel job.
//
// A Communicator connects `size` ranks (threads of one process, processes on
// one host, or processes on many hosts) and runs collectives on raw buffers:
//
//   collective::FileStore store("/tmp/job42/rendezvous");
//   collective::CommunicatorOptions options;
//   options.transport = collective::TransportKind::kShm;
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<collective::Communicator> comm,
//                       collective::Communicator::Create(rank, size, &store, options));
//
//   // Average gradients in place (every rank passes its own buffer).
//   DT_RETURN_IF_ERROR(comm->Allreduce(grad, n, DType::kF32, collective::ReduceOp::kAverage));
//
//   // Or overlap it with computation:
//   std::shared_ptr<collective::Work> work = comm->AllreduceAsync(grad, n, DType::kF32);
//   ... compute ...
//   DT_RETURN_IF_ERROR(work->Wait());
//
// Communicator is an interface. Two implementations exist:
//   - the host one (host_communicator.h, private to this library): kInProcess,
//     kShm and kTcp transports, ring / bidirectional ring / halving-doubling /
//     recursive doubling allreduce on host memory;
//   - the NCCL one (//libs/cuda/nccl:nccl_collective): buffers in CUDA device
//     memory, NCCL's kernels on a stream of the communicator. It registers
//     itself for TransportKind::kNccl, so Create makes it when that library
//     is linked and libs/collective never depends on CUDA.
// Code that takes a Communicator* works with either; only where its buffers
// live differs.
//
// Ordering. Collectives are matched by order: every rank must issue the same
// collectives (same kind, count, dtype, root) in the same order. Operations
// of one communicator run one at a time in issue order, synchronous and
// asynchronous ones alike. Use one communicator per independent stream of
// collectives.
//
// Failures. Every operation has a timeout (CommunicatorOptions::timeout
// unless the call gives one), counted from when the operation starts
// running. A peer that dies, closes its communicator or fails makes the
// operation fail on every rank, never hang: an error naming the rank
// (UNAVAILABLE or ABORTED from the host transports; NCCL's error, e.g.
// UNAVAILABLE for ncclRemoteError, from kNccl), and DEADLINE_EXCEEDED naming
// the operation when the time runs out. An operation that failed leaves the
// communicator broken (streams are out of step; kNccl aborts its NCCL
// communicator with ncclCommAbort); it tells its peers, and all later
// operations fail at once with FAILED_PRECONDITION quoting the first error.
// Create a new communicator (under a new key prefix) to continue. Argument
// errors (INVALID_ARGUMENT) are reported before any communication and do not
// break it.
//
// Thread-safety: all methods may be called from any thread; calls racing
// from several threads are serialized in an unspecified order, which must
// still match the other ranks, so issue collectives from one thread (or
// order them yourself). The Communicator must outlive its Work handles'
// operations: the destructor waits for queued operations to finish (each is
// bounded by its timeout). Host transports: a synchronous call made while
// nothing is queued runs on the calling thread; everything else runs on one
// worker thread. kNccl: every call enqueues on the communicator's stream
// (after the work already on the calling thread's current stream of the
// device) and a watchdog thread completes the Work when the kernels finish.
#ifndef DTRAIN_LIBS_COLLECTIVE_COMMUNICATOR_H_
#define DTRAIN_LIBS_COLLECTIVE_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/collective/reduce.h"
#include "libs/collective/shm_transport.h"
#include "libs/collective/store.h"
#include "libs/collective/tcp_transport.h"
#include "libs/tensor/dtype.h"

namespace dtrain {
namespace collective {

enum class TransportKind : uint8_t {
  kInProcess = 0,  // ranks are threads of one process
  kShm = 1,        // ranks are processes on one host
  kTcp = 2,        // ranks anywhere
  kNccl = 3,       // ranks on CUDA devices, through NCCL; registered by
                   // //libs/cuda/nccl:nccl_collective (see Create)
};
// "inprocess", "shm", "tcp", "nccl".
const char* TransportKindName(TransportKind kind);
absl::StatusOr<TransportKind> ParseTransportKind(absl::string_view name);

enum class Algorithm : uint8_t {
  kAuto = 0,               // by message size, see CommunicatorOptions
  kRing = 1,               // chunked, pipelined ring
  kBidirectionalRing = 2,  // half the buffer each way around the ring
  kHalvingDoubling = 3,    // Rabenseifner: recursive halving, then doubling
  kRecursiveDoubling = 4,  // whole-buffer exchanges; fewest latencies
};
const char* AlgorithmName(Algorithm algorithm);  // "auto", "ring", "bidir_ring", "hd", "rd"
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name);

struct CommunicatorOptions {
  TransportKind transport = TransportKind::kTcp;

  // Default time limit for Create and for each operation.
  absl::Duration timeout = absl::Seconds(60);

  // Allreduce algorithm; kAuto picks by message size with the thresholds
  // below. Other collectives ignore it (they always use their ring or tree).
  // The algorithm options below are for the host transports; NCCL chooses
  // its own algorithms (NCCL_ALGO) and ignores them.
  Algorithm algorithm = Algorithm::kAuto;
  // kAuto: messages up to this many bytes use recursive doubling,
  size_t recursive_doubling_max_bytes = 32 << 10;
  // up to this many halving-doubling,
  size_t halving_doubling_max_bytes = 1 << 20;
  // and larger ones this algorithm (kRing or kBidirectionalRing).
  //
  // The defaults come from allreduce_bench on a 2-core machine (2-4 ranks,
  // TCP and shm, 4 KiB - 2 MiB): recursive doubling was fastest up to 32-128
  // KiB (one latency per doubling), halving-doubling from there to about
  // 1 MiB (fewer steps than the ring, which matters most when ranks share
  // cores), the ring beyond. The bidirectional ring measured within noise of
  // the ring on loopback, where the CPU and not the links is the limit; it
  // is meant for full-duplex links.
  Algorithm large_algorithm = Algorithm::kRing;
  // Broadcasts up to this size use the binomial tree, larger ones the
  // pipelined chain.
  size_t tree_broadcast_max_bytes = 64 << 10;

  // Pipelining granularity of the ring and chain algorithms.
  size_t chunk_bytes = 256 << 10;

  // Keys of this communicator in the store start with this prefix. Two
  // communicators sharing a store need different prefixes (and a store that
  // outlives a job must not be reused with the same prefix).
  std::string key_prefix = "collective";

  TcpOptions tcp;
  ShmOptions shm;

  // kNccl: the CUDA device whose memory the buffers are in. -1 means rank
  // modulo the number of visible devices (one rank per GPU of the host).
  int cuda_device = -1;
};

// The handle of an asynchronous operation. Thread-safe.
class Work {
 public:
  // Waits up to `timeout` for the operation to finish and returns its status.
  // If `timeout` passes first, returns DEADLINE_EXCEEDED and the operation
  // keeps running (its buffers must stay valid until it finishes).
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration());

  // True once the operation finished (successfully or not).
  bool IsCompleted() const;

  // What the operation is, e.g. "allreduce #3 (1024 x f32, sum, ring)".
  const std::string& description() const { return description_; }

 private:
  friend class Communicator;  // implementations go through its NewWork/CompleteWork
  explicit Work(std::string description) : description_(std::move(description)) {}
  void Complete(absl::Status status);

  const std::string description_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// The interface every implementation offers (see the file comment for the
// contract they share). Callers hold a Communicator* and never learn which
// implementation they talk to.
//
// Implementations override the private virtual methods; the public methods
// only forward to them (so default arguments live here, once).
class Communicator {
 public:
  // Passing kDefaultTimeout as an operation's timeout means
  // CommunicatorOptions::timeout.
  static constexpr absl::Duration kDefaultTimeout = absl::ZeroDuration();

  // Joins rank `rank` of `size` through `store` and connects to the peers the
  // algorithms need. Blocks until all ranks have joined, or fails with
  // DEADLINE_EXCEEDED after options.timeout.
  //
  // kInProcess, kShm and kTcp are built in; `store` (not owned) is used only
  // during Create. kNccl is available when the binary links
  // //libs/cuda/nccl:nccl_collective (which registers it, see
  // RegisterCommunicatorFactory; otherwise FAILED_PRECONDITION); its
  // `store` must outlive the communicator (failures are published there so
  // that peers can name the failing rank) and its buffers are device memory.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      int rank, int size, Store* store, const CommunicatorOptions& options = {});

  // Waits for queued operations (each bounded by its timeout), then closes
  // the connections. Peers that still expect data from this rank fail.
  virtual ~Communicator() = default;

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const CommunicatorOptions& options() const = 0;
  // "inprocess", "shm", "tcp" or "nccl".
  virtual const char* transport_name() const = 0;

  // OK while healthy; otherwise the error that broke the communicator.
  virtual absl::Status health() const = 0;

  // Breaks the communicator from another thread: operations waiting for
  // peers end with an error and later ones fail. For a caller that learns
  // elsewhere that a peer is gone while a collective may wait for it forever
  // (a device transport cannot always see it: NCCL over shared memory or
  // NVLink). The host transports see a dead peer's socket close; for them
  // it does nothing.
  virtual void Abort(const std::string& reason) {}

  // The algorithm Allreduce uses for a message of `bytes`; kAuto when the
  // implementation chooses by itself (NCCL).
  virtual Algorithm AllreduceAlgorithmFor(size_t bytes) const = 0;

  // --- Synchronous operations. Buffers are `count` elements of `dtype`, in
  // host memory for kInProcess/kShm/kTcp and in memory of the communicator's
  // CUDA device for kNccl.

  // data[i] = reduction over ranks of data[i], in place. `op` needs f32, f16
  // or bf16. Every rank ends with identical results (bitwise for the host
  // transports, whose algorithms reduce each block once and then copy it).
  absl::Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op = ReduceOp::kSum,
                         absl::Duration timeout = kDefaultTimeout) {
    return DoAllreduce(data, count, dtype, op, timeout);
  }

  // `input` holds size() blocks of `output_count` elements; rank r receives
  // in `output` the reduction of block r over all ranks. `input` is not
  // modified; `output` may alias block r of `input`.
  absl::Status ReduceScatter(const void* input, void* output, size_t output_count, DType dtype,
                             ReduceOp op = ReduceOp::kSum,
                             absl::Duration timeout = kDefaultTimeout) {
    return DoReduceScatter(input, output, output_count, dtype, op, timeout);
  }

  // `output` (size() * input_count elements) receives every rank's `input`
  // in rank order. `input` may alias block rank() of `output`. Any dtype.
  absl::Status Allgather(const void* input, void* output, size_t input_count, DType dtype,
                         absl::Duration timeout = kDefaultTimeout) {
    return DoAllgather(input, output, input_count, dtype, timeout);
  }

  // Copies `data` of rank `root` into `data` of every rank. Any dtype.
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         absl::Duration timeout = kDefaultTimeout) {
    return DoBroadcast(data, count, dtype, root, timeout);
  }

  // Returns once every rank has called Barrier.
  absl::Status Barrier(absl::Duration timeout = kDefaultTimeout) { return DoBarrier(timeout); }

  // --- Asynchronous versions: return at once; buffers must stay valid and
  // untouched until the Work finishes. Argument errors show in the Work.
  std::shared_ptr<Work> AllreduceAsync(void* data, size_t count, DType dtype,
                                       ReduceOp op = ReduceOp::kSum,
                                       absl::Duration timeout = kDefaultTimeout) {
    return DoAllreduceAsync(data, count, dtype, op, timeout);
  }
  std::shared_ptr<Work> ReduceScatterAsync(const void* input, void* output, size_t output_count,
                                           DType dtype, ReduceOp op = ReduceOp::kSum,
                                           absl::Duration timeout = kDefaultTimeout) {
    return DoReduceScatterAsync(input, output, output_count, dtype, op, timeout);
  }
  std::shared_ptr<Work> AllgatherAsync(const void* input, void* output, size_t input_count,
                                       DType dtype, absl::Duration timeout = kDefaultTimeout) {
    return DoAllgatherAsync(input, output, input_count, dtype, timeout);
  }
  std::shared_ptr<Work> BroadcastAsync(void* data, size_t count, DType dtype, int root,
                                       absl::Duration timeout = kDefaultTimeout) {
    return DoBroadcastAsync(data, count, dtype, root, timeout);
  }
  std::shared_ptr<Work> BarrierAsync(absl::Duration timeout = kDefaultTimeout) {
    return DoBarrierAsync(timeout);
  }

 protected:
  Communicator() = default;

  // For implementations: a Work that is not finished yet, and its completion
  // (once; later calls are ignored).
  static std::shared_ptr<Work> NewWork(std::string description);
  static void CompleteWork(Work& work, absl::Status status);

 private:
  // The operations, with the public methods' arguments (timeout may be
  // kDefaultTimeout). Synchronous ones return when the operation finished.
  virtual absl::Status DoAllreduce(void* data, size_t count, DType dtype, ReduceOp op,
                                   absl::Duration timeout) = 0;
  virtual absl::Status DoReduceScatter(const void* input, void* output, size_t output_count,
                                       DType dtype, ReduceOp op, absl::Duration timeout) = 0;
  virtual absl::Status DoAllgather(const void* input, void* output, size_t input_count, DType dtype,
                                   absl::Duration timeout) = 0;
  virtual absl::Status DoBroadcast(void* data, size_t count, DType dtype, int root,
                                   absl::Duration timeout) = 0;
  virtual absl::Status DoBarrier(absl::Duration timeout) = 0;
  virtual std::shared_ptr<Work> DoAllreduceAsync(void* data, size_t count, DType dtype, ReduceOp op,
                                                 absl::Duration timeout) = 0;
  virtual std::shared_ptr<Work> DoReduceScatterAsync(const void* input, void* output,
                                                     size_t output_count, DType dtype, ReduceOp op,
                                                     absl::Duration timeout) = 0;
  virtual std::shared_ptr<Work> DoAllgatherAsync(const void* input, void* output,
                                                 size_t input_count, DType dtype,
                                                 absl::Duration timeout) = 0;
  virtual std::shared_ptr<Work> DoBroadcastAsync(void* data, size_t count, DType dtype, int root,
                                                 absl::Duration timeout) = 0;
  virtual std::shared_ptr<Work> DoBarrierAsync(absl::Duration timeout) = 0;
};

// How Create makes a communicator of a transport that is not built in
// (kNccl): the same arguments, already checked (valid rank and size, non-null
// store, positive timeout).
using CommunicatorFactory = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
    int rank, int size, Store* store, const CommunicatorOptions& options)>;

// Makes Create use `factory` for `kind`. Meant for a static initializer of the
// library that implements it, so that libs/collective needs no CUDA: linking
// //libs/cuda/nccl:nccl_collective (alwayslink) registers kNccl. Registering a
// built-in kind, or one twice, is an error (INVALID_ARGUMENT /
// ALREADY_EXISTS). Thread-safe.
absl::Status RegisterCommunicatorFactory(TransportKind kind, CommunicatorFactory factory);

}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_COMMUNICATOR_H_
