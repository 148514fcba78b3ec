#include "libs/collective/host_communicator.h"

#include <sys/random.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/base/status.h"
#include "libs/collective/algorithms.h"
#include "libs/collective/inprocess_transport.h"
#include "libs/collective/reduce.h"
#include "libs/collective/shm_transport.h"
#include "libs/collective/tcp_transport.h"

namespace dtrain {
namespace collective {
namespace internal {

namespace {

// 128 random bits from the kernel: the name of the communicator's TCP
// handshakes and shared-memory segments, which nobody outside the job can
// guess (shm segments are also 0600 and owner-checked, shm_transport.cc).
std::string NewJobId() {
  uint64_t words[2] = {0, 0};
  size_t got = 0;
  while (got < sizeof(words)) {
    ssize_t n = ::getrandom(reinterpret_cast<char*>(words) + got, sizeof(words) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::StrFormat("%016x%016x", words[0], words[1]);
}

absl::Status CheckBuffer(const void* p, size_t count, const char* what) {
  if (p == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is null but count is ", count));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> HostCommunicator::Create(
    int rank, int size, Store* store, const CommunicatorOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  PrefixStore prefixed(absl::StrCat(options.key_prefix, "/"), store);

  // Rank 0 names the job; the name keys everything else.
  std::string job_id;
  if (rank == 0) {
    job_id = NewJobId();
    DT_RETURN_IF_ERROR(prefixed.Set("job_id", job_id));
  } else {
    absl::StatusOr<std::string> id = prefixed.Get("job_id", options.timeout);
    if (!id.ok()) {
      return Annotate(id.status(),
                      absl::StrCat("rank ", rank, " of ", size, " waiting for rank 0 to start"));
    }
    job_id = *std::move(id);
  }

  TransportOptions topts;
  topts.rank = rank;
  topts.size = size;
  topts.store = &prefixed;
  topts.job_id = job_id;
  topts.peers = PeersNeeded(rank, size);
  topts.channels = 2;
  topts.deadline = deadline;
  absl::StatusOr<std::unique_ptr<Transport>> transport;
  switch (options.transport) {
    case TransportKind::kInProcess:
      transport = CreateInProcessTransport(topts);
      break;
    case TransportKind::kShm:
      transport = CreateShmTransport(topts, options.shm);
      break;
    case TransportKind::kTcp:
      transport = CreateTcpTransport(topts, options.tcp);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(TransportKindName(options.transport), " is not a host transport"));
  }
  if (!transport.ok()) {
    return Annotate(transport.status(),
                    absl::StrCat("creating the ", TransportKindName(options.transport),
                                 " transport for rank ", rank, " of ", size));
  }
  return std::unique_ptr<Communicator>(
      new HostCommunicator(rank, size, options, *std::move(transport)));
}

HostCommunicator::HostCommunicator(int rank, int size, const CommunicatorOptions& options,
                                   std::unique_ptr<Transport> transport)
    : rank_(rank), size_(size), options_(options), transport_(std::move(transport)) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

HostCommunicator::~HostCommunicator() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }
  worker_.join();
  transport_.reset();
}

const char* HostCommunicator::transport_name() const { return transport_->name(); }

absl::Status HostCommunicator::health() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

Algorithm HostCommunicator::AllreduceAlgorithmFor(size_t bytes) const {
  if (options_.algorithm != Algorithm::kAuto) return options_.algorithm;
  if (bytes <= options_.recursive_doubling_max_bytes) return Algorithm::kRecursiveDoubling;
  if (bytes <= options_.halving_doubling_max_bytes) return Algorithm::kHalvingDoubling;
  return options_.large_algorithm == Algorithm::kBidirectionalRing ? Algorithm::kBidirectionalRing
                                                                   : Algorithm::kRing;
}

// --- Execution

HostCommunicator::Task HostCommunicator::MakeTask(std::string description, absl::Duration timeout,
                                                  absl::Status validation,
                                                  std::function<absl::Status(absl::Time)> run) {
  Task task;
  {
    absl::MutexLock lock(&mu_);
    description = absl::StrCat(description.substr(0, description.find(' ')), " #", ++issued_,
                               description.substr(description.find(' ')));
  }
  task.work = NewWork(std::move(description));
  task.timeout = timeout == kDefaultTimeout ? options_.timeout : timeout;
  if (!validation.ok()) {
    CompleteWork(*task.work, Annotate(validation, task.work->description()));
  } else {
    task.run = std::move(run);
  }
  return task;
}

void HostCommunicator::Execute(Task& task) {
  absl::Status broken;
  {
    absl::MutexLock lock(&mu_);
    broken = broken_;
  }
  if (!broken.ok()) {
    CompleteWork(*task.work, absl::FailedPreconditionError(absl::StrCat(
                                 task.work->description(), " not run: the communicator of rank ",
                                 rank_, " is broken by an earlier error: ", broken.message())));
    return;
  }
  const absl::Time deadline = absl::Now() + task.timeout;
  absl::Status status = task.run(deadline);
  if (!status.ok()) {
    std::string context = absl::StrCat(task.work->description(), " on rank ", rank_, " of ", size_,
                                       " (", transport_->name(), ")");
    if (absl::IsDeadlineExceeded(status)) {
      absl::StrAppend(&context, " timed out after ", absl::FormatDuration(task.timeout));
    }
    status = Annotate(status, context);
    transport_->Abort(status);
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = status;
  }
  CompleteWork(*task.work, std::move(status));
}

std::shared_ptr<Work> HostCommunicator::Enqueue(Task task) {
  std::shared_ptr<Work> work = task.work;
  if (!task.run) return work;  // failed validation
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  return work;
}

absl::Status HostCommunicator::RunNowOrQueue(Task task) {
  std::shared_ptr<Work> work = task.work;
  if (!task.run) return work->Wait();
  bool run_here = false;
  {
    absl::MutexLock lock(&mu_);
    if (!busy_ && queue_.empty()) {
      busy_ = true;
      run_here = true;
    } else {
      queue_.push_back(std::move(task));
    }
  }
  if (run_here) {
    // Nothing queued before it: run on the caller's thread (saves a thread
    // switch per operation).
    Execute(task);
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
  return work->Wait();
}

void HostCommunicator::WorkerLoop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return (!queue_.empty() && !busy_) || (shutdown_ && queue_.empty() && !busy_);
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // shutdown
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    Execute(task);
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
}

// --- Operation bodies

absl::Status HostCommunicator::RunAllreduce(void* data, size_t count, DType dtype, ReduceOp op,
                                            Algorithm algorithm, absl::Time deadline) {
  AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
  switch (algorithm) {
    case Algorithm::kRing:
    case Algorithm::kAuto:
      return RingAllreduce(ctx, data, count, dtype, op);
    case Algorithm::kBidirectionalRing:
      return BidirectionalRingAllreduce(ctx, data, count, dtype, op);
    case Algorithm::kHalvingDoubling:
      return HalvingDoublingAllreduce(ctx, data, count, dtype, op);
    case Algorithm::kRecursiveDoubling:
      if (scratch_.size() < count * DTypeSize(dtype)) scratch_.resize(count * DTypeSize(dtype));
      return RecursiveDoublingAllreduce(ctx, data, count, dtype, op, scratch_.data());
  }
  return absl::InternalError("unknown algorithm");
}

absl::Status HostCommunicator::RunReduceScatter(const void* input, void* output, size_t count,
                                                DType dtype, ReduceOp op, absl::Time deadline) {
  const size_t block = count * DTypeSize(dtype);
  const size_t total = block * size_;
  if (scratch_.size() < total) scratch_.resize(total);
  if (total > 0) std::memcpy(scratch_.data(), input, total);
  AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
  DT_RETURN_IF_ERROR(RingReduceScatter(ctx, scratch_.data(), count, dtype, op));
  if (block > 0) std::memcpy(output, scratch_.data() + rank_ * block, block);
  return absl::OkStatus();
}

absl::Status HostCommunicator::RunAllgather(const void* input, void* output, size_t bytes,
                                            absl::Time deadline) {
  char* own = static_cast<char*>(output) + rank_ * bytes;
  if (bytes > 0 && input != own) std::memmove(own, input, bytes);
  AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
  return RingAllgather(ctx, output, bytes);
}

absl::Status HostCommunicator::RunBroadcast(void* data, size_t bytes, int root,
                                            absl::Time deadline) {
  AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
  if (bytes <= options_.tree_broadcast_max_bytes) {
    return TreeBroadcast(ctx, data, bytes, root);
  }
  return ChainBroadcast(ctx, data, bytes, root);
}

// --- Tasks

namespace {

absl::Status CheckCount(size_t count, DType dtype, int factor) {
  if (count > (SIZE_MAX / 2) / DTypeSize(dtype) / static_cast<size_t>(factor)) {
    return absl::InvalidArgumentError(absl::StrCat("count ", count, " is too large"));
  }
  return absl::OkStatus();
}

}  // namespace

HostCommunicator::Task HostCommunicator::AllreduceTask(void* data, size_t count, DType dtype,
                                                       ReduceOp op, absl::Duration timeout) {
  const Algorithm algorithm = AllreduceAlgorithmFor(count * DTypeSize(dtype));
  absl::Status valid = CheckReducible(dtype);
  if (valid.ok()) valid = CheckBuffer(data, count, "allreduce buffer");
  if (valid.ok()) valid = CheckCount(count, dtype, 1);
  return MakeTask(absl::StrCat("allreduce (", count, " x ", DTypeName(dtype), ", ",
                               ReduceOpName(op), ", ", AlgorithmName(algorithm), ")"),
                  timeout, valid, [=](absl::Time deadline) {
                    return RunAllreduce(data, count, dtype, op, algorithm, deadline);
                  });
}

HostCommunicator::Task HostCommunicator::ReduceScatterTask(const void* input, void* output,
                                                           size_t count, DType dtype, ReduceOp op,
                                                           absl::Duration timeout) {
  absl::Status valid = CheckReducible(dtype);
  if (valid.ok()) valid = CheckBuffer(input, count, "reduce-scatter input");
  if (valid.ok()) valid = CheckBuffer(output, count, "reduce-scatter output");
  if (valid.ok()) valid = CheckCount(count, dtype, size_);
  return MakeTask(absl::StrCat("reduce_scatter (", count, " x ", DTypeName(dtype), " per rank, ",
                               ReduceOpName(op), ", ring)"),
                  timeout, valid, [=](absl::Time deadline) {
                    return RunReduceScatter(input, output, count, dtype, op, deadline);
                  });
}

HostCommunicator::Task HostCommunicator::AllgatherTask(const void* input, void* output,
                                                       size_t count, DType dtype,
                                                       absl::Duration timeout) {
  absl::Status valid = CheckBuffer(input, count, "allgather input");
  if (valid.ok()) valid = CheckBuffer(output, count, "allgather output");
  if (valid.ok()) valid = CheckCount(count, dtype, size_);
  const size_t bytes = count * DTypeSize(dtype);
  return MakeTask(
      absl::StrCat("allgather (", count, " x ", DTypeName(dtype), " per rank, ring)"), timeout,
      valid, [=](absl::Time deadline) { return RunAllgather(input, output, bytes, deadline); });
}

HostCommunicator::Task HostCommunicator::BroadcastTask(void* data, size_t count, DType dtype,
                                                       int root, absl::Duration timeout) {
  absl::Status valid = CheckBuffer(data, count, "broadcast buffer");
  if (valid.ok() && (root < 0 || root >= size_)) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not a rank of ", size_));
  }
  if (valid.ok()) valid = CheckCount(count, dtype, 1);
  const size_t bytes = count * DTypeSize(dtype);
  return MakeTask(
      absl::StrCat("broadcast (", count, " x ", DTypeName(dtype), " from rank ", root, ", ",
                   bytes <= options_.tree_broadcast_max_bytes ? "tree" : "chain", ")"),
      timeout, valid,
      [=](absl::Time deadline) { return RunBroadcast(data, bytes, root, deadline); });
}

HostCommunicator::Task HostCommunicator::BarrierTask(absl::Duration timeout) {
  return MakeTask("barrier (hypercube)", timeout, absl::OkStatus(), [this](absl::Time deadline) {
    AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
    return internal::Barrier(ctx);
  });
}

// --- Communicator's operations

absl::Status HostCommunicator::DoAllreduce(void* data, size_t count, DType dtype, ReduceOp op,
                                           absl::Duration timeout) {
  return RunNowOrQueue(AllreduceTask(data, count, dtype, op, timeout));
}

absl::Status HostCommunicator::DoReduceScatter(const void* input, void* output, size_t output_count,
                                               DType dtype, ReduceOp op, absl::Duration timeout) {
  return RunNowOrQueue(ReduceScatterTask(input, output, output_count, dtype, op, timeout));
}

absl::Status HostCommunicator::DoAllgather(const void* input, void* output, size_t input_count,
                                           DType dtype, absl::Duration timeout) {
  return RunNowOrQueue(AllgatherTask(input, output, input_count, dtype, timeout));
}

absl::Status HostCommunicator::DoBroadcast(void* data, size_t count, DType dtype, int root,
                                           absl::Duration timeout) {
  return RunNowOrQueue(BroadcastTask(data, count, dtype, root, timeout));
}

absl::Status HostCommunicator::DoBarrier(absl::Duration timeout) {
  return RunNowOrQueue(BarrierTask(timeout));
}

std::shared_ptr<Work> HostCommunicator::DoAllreduceAsync(void* data, size_t count, DType dtype,
                                                         ReduceOp op, absl::Duration timeout) {
  return Enqueue(AllreduceTask(data, count, dtype, op, timeout));
}

std::shared_ptr<Work> HostCommunicator::DoReduceScatterAsync(const void* input, void* output,
                                                             size_t output_count, DType dtype,
                                                             ReduceOp op, absl::Duration timeout) {
  return Enqueue(ReduceScatterTask(input, output, output_count, dtype, op, timeout));
}

std::shared_ptr<Work> HostCommunicator::DoAllgatherAsync(const void* input, void* output,
                                                         size_t input_count, DType dtype,
                                                         absl::Duration timeout) {
  return Enqueue(AllgatherTask(input, output, input_count, dtype, timeout));
}

std::shared_ptr<Work> HostCommunicator::DoBroadcastAsync(void* data, size_t count, DType dtype,
                                                         int root, absl::Duration timeout) {
  return Enqueue(BroadcastTask(data, count, dtype, root, timeout));
}

std::shared_ptr<Work> HostCommunicator::DoBarrierAsync(absl::Duration timeout) {
  return Enqueue(BarrierTask(timeout));
}

}  // namespace internal
}  // namespace collective
}  // namespace dtrain
