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
// Ordering. Collectives are matched by order: every rank must issue the same
// collectives (same kind, count, dtype, root) in the same order. Operations
// of one communicator run one at a time in issue order, synchronous and
// asynchronous ones alike. Use one communicator per independent stream of
// collectives.
//
// Failures. Every operation has a timeout (CommunicatorOptions::timeout
// unless the call gives one), counted from when the operation starts
// running. A peer that dies, closes its communicator or fails makes the
// operation fail on every rank, never hang: UNAVAILABLE or ABORTED naming the
// rank, and DEADLINE_EXCEEDED naming the operation when the time runs out.
// An operation that failed leaves the communicator broken (streams are out of
// step); it tells its peers, and all later operations fail at once with
// FAILED_PRECONDITION quoting the first error. Create a new communicator
// (under a new key prefix) to continue. Argument errors (INVALID_ARGUMENT) are
// reported before any communication and do not break it.
//
// Thread-safety: all methods may be called from any thread; calls racing
// from several threads are serialized in an unspecified order, which must
// still match the other ranks, so issue collectives from one thread (or
// order them yourself). The Communicator must outlive its Work handles'
// operations: the destructor waits for queued operations to finish (each is
// bounded by its timeout). A synchronous call made while nothing is queued
// runs on the calling thread; everything else runs on one worker thread.
#ifndef DTRAIN_LIBS_COLLECTIVE_COMMUNICATOR_H_
#define DTRAIN_LIBS_COLLECTIVE_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/collective/reduce.h"
#include "libs/collective/shm_transport.h"
#include "libs/collective/store.h"
#include "libs/collective/tcp_transport.h"
#include "libs/collective/transport.h"
#include "libs/tensor/dtype.h"

namespace dtrain {
namespace collective {

enum class TransportKind : uint8_t {
  kInProcess = 0,  // ranks are threads of one process
  kShm = 1,        // ranks are processes on one host
  kTcp = 2,        // ranks anywhere
};
const char* TransportKindName(TransportKind kind);  // "inprocess", "shm", "tcp"
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
  friend class Communicator;
  explicit Work(std::string description) : description_(std::move(description)) {}
  void Complete(absl::Status status);

  const std::string description_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class Communicator {
 public:
  // Passing kDefaultTimeout as an operation's timeout means
  // CommunicatorOptions::timeout.
  static constexpr absl::Duration kDefaultTimeout = absl::ZeroDuration();

  // Joins rank `rank` of `size` through `store` (not owned; used only during
  // Create) and connects to the peers the algorithms need. Blocks until all
  // ranks have joined, or fails with DEADLINE_EXCEEDED after options.timeout.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      int rank, int size, Store* store, const CommunicatorOptions& options = {});

  // Waits for queued operations, then closes the connections. Peers that
  // still expect data from this rank fail with UNAVAILABLE.
  ~Communicator();

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommunicatorOptions& options() const { return options_; }
  const char* transport_name() const;

  // OK while healthy; otherwise the error that broke the communicator.
  absl::Status health() const;

  // The algorithm Allreduce uses for a message of `bytes`.
  Algorithm AllreduceAlgorithmFor(size_t bytes) const;

  // --- Synchronous operations. Buffers are `count` elements of `dtype`.

  // data[i] = reduction over ranks of data[i], in place. `op` needs f32, f16
  // or bf16. Every rank ends with bitwise identical results.
  absl::Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op = ReduceOp::kSum,
                         absl::Duration timeout = kDefaultTimeout);

  // `input` holds size() blocks of `output_count` elements; rank r receives
  // in `output` the reduction of block r over all ranks. `input` is not
  // modified; `output` may alias block r of `input`.
  absl::Status ReduceScatter(const void* input, void* output, size_t output_count, DType dtype,
                             ReduceOp op = ReduceOp::kSum,
                             absl::Duration timeout = kDefaultTimeout);

  // `output` (size() * input_count elements) receives every rank's `input`
  // in rank order. `input` may alias block rank() of `output`. Any dtype.
  absl::Status Allgather(const void* input, void* output, size_t input_count, DType dtype,
                         absl::Duration timeout = kDefaultTimeout);

  // Copies `data` of rank `root` into `data` of every rank. Any dtype.
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         absl::Duration timeout = kDefaultTimeout);

  // Returns once every rank has called Barrier.
  absl::Status Barrier(absl::Duration timeout = kDefaultTimeout);

  // --- Asynchronous versions: return at once; buffers must stay valid and
  // untouched until the Work finishes. Argument errors show in the Work.
  std::shared_ptr<Work> AllreduceAsync(void* data, size_t count, DType dtype,
                                       ReduceOp op = ReduceOp::kSum,
                                       absl::Duration timeout = kDefaultTimeout);
  std::shared_ptr<Work> ReduceScatterAsync(const void* input, void* output, size_t output_count,
                                           DType dtype, ReduceOp op = ReduceOp::kSum,
                                           absl::Duration timeout = kDefaultTimeout);
  std::shared_ptr<Work> AllgatherAsync(const void* input, void* output, size_t input_count,
                                       DType dtype, absl::Duration timeout = kDefaultTimeout);
  std::shared_ptr<Work> BroadcastAsync(void* data, size_t count, DType dtype, int root,
                                       absl::Duration timeout = kDefaultTimeout);
  std::shared_ptr<Work> BarrierAsync(absl::Duration timeout = kDefaultTimeout);

 private:
  // One queued operation: validated arguments bound into `run`.
  struct Task {
    std::shared_ptr<Work> work;
    absl::Duration timeout;
    std::function<absl::Status(absl::Time deadline)> run;
  };

  Communicator(int rank, int size, const CommunicatorOptions& options,
               std::unique_ptr<Transport> transport);

  // Builds the task for an operation (or a Work that failed validation).
  Task MakeTask(std::string description, absl::Duration timeout, absl::Status validation,
                std::function<absl::Status(absl::Time)> run);
  std::shared_ptr<Work> Enqueue(Task task);
  absl::Status RunNowOrQueue(Task task);
  void Execute(Task& task);
  void WorkerLoop();

  // Operation bodies (run on the executing thread).
  absl::Status DoAllreduce(void* data, size_t count, DType dtype, ReduceOp op, Algorithm algorithm,
                           absl::Time deadline);
  absl::Status DoReduceScatter(const void* input, void* output, size_t count, DType dtype,
                               ReduceOp op, absl::Time deadline);
  absl::Status DoAllgather(const void* input, void* output, size_t bytes, absl::Time deadline);
  absl::Status DoBroadcast(void* data, size_t bytes, int root, absl::Time deadline);

  Task AllreduceTask(void* data, size_t count, DType dtype, ReduceOp op, absl::Duration timeout);
  Task ReduceScatterTask(const void* input, void* output, size_t count, DType dtype, ReduceOp op,
                         absl::Duration timeout);
  Task AllgatherTask(const void* input, void* output, size_t count, DType dtype,
                     absl::Duration timeout);
  Task BroadcastTask(void* data, size_t count, DType dtype, int root, absl::Duration timeout);
  Task BarrierTask(absl::Duration timeout);

  const int rank_;
  const int size_;
  const CommunicatorOptions options_;
  std::unique_ptr<Transport> transport_;  // used only by the executing thread
  std::vector<char> scratch_;             // likewise

  mutable absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // an operation is executing
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  uint64_t issued_ ABSL_GUARDED_BY(mu_) = 0;  // operations issued, for descriptions
  std::thread worker_;
};

}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_COMMUNICATOR_H_
