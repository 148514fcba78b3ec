#include "libs/collective/communicator.h"

#include <unistd.h>

#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/base/status.h"
#include "libs/collective/algorithms.h"
#include "libs/collective/inprocess_transport.h"

namespace dtrain {
namespace collective {

const char* TransportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kInProcess:
      return "inprocess";
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kTcp:
      return "tcp";
  }
  return "?";
}

absl::StatusOr<TransportKind> ParseTransportKind(absl::string_view name) {
  for (TransportKind kind : {TransportKind::kInProcess, TransportKind::kShm, TransportKind::kTcp}) {
    if (name == TransportKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "'; expected inprocess, shm or tcp"));
}

const char* AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kBidirectionalRing:
      return "bidir_ring";
    case Algorithm::kHalvingDoubling:
      return "hd";
    case Algorithm::kRecursiveDoubling:
      return "rd";
  }
  return "?";
}

absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kBidirectionalRing,
                      Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling}) {
    if (name == AlgorithmName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown algorithm '", name, "'; expected auto, ring, bidir_ring, hd or rd"));
}

// ------------------------------------------------------------------------ Work

absl::Status Work::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(description_, " did not finish within ",
                                                    absl::FormatDuration(timeout),
                                                    " (it is still running)"));
  }
  return status_;
}

bool Work::IsCompleted() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void Work::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  done_ = true;
}

// ---------------------------------------------------------------- Communicator

namespace {

std::string NewJobId() {
  std::random_device device;
  std::mt19937_64 gen((static_cast<uint64_t>(device()) << 32) ^ device() ^
                      static_cast<uint64_t>(::getpid()) ^
                      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  return absl::StrFormat("%016x", gen());
}

absl::Status CheckBuffer(const void* p, size_t count, const char* what) {
  if (p == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is null but count is ", count));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    int rank, int size, Store* store, const CommunicatorOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of size ", size, " is not a valid position"));
  }
  if (store == nullptr) return absl::InvalidArgumentError("Communicator::Create needs a store");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("CommunicatorOptions::timeout must be positive");
  }
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
  topts.peers = internal::PeersNeeded(rank, size);
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
  }
  if (!transport.ok()) {
    return Annotate(transport.status(),
                    absl::StrCat("creating the ", TransportKindName(options.transport),
                                 " transport for rank ", rank, " of ", size));
  }
  return std::unique_ptr<Communicator>(
      new Communicator(rank, size, options, *std::move(transport)));
}

Communicator::Communicator(int rank, int size, const CommunicatorOptions& options,
                           std::unique_ptr<Transport> transport)
    : rank_(rank), size_(size), options_(options), transport_(std::move(transport)) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

Communicator::~Communicator() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }
  worker_.join();
  transport_.reset();
}

const char* Communicator::transport_name() const { return transport_->name(); }

absl::Status Communicator::health() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

Algorithm Communicator::AllreduceAlgorithmFor(size_t bytes) const {
  if (options_.algorithm != Algorithm::kAuto) return options_.algorithm;
  if (bytes <= options_.recursive_doubling_max_bytes) return Algorithm::kRecursiveDoubling;
  if (bytes <= options_.halving_doubling_max_bytes) return Algorithm::kHalvingDoubling;
  return options_.large_algorithm == Algorithm::kBidirectionalRing ? Algorithm::kBidirectionalRing
                                                                   : Algorithm::kRing;
}

// --- Execution

Communicator::Task Communicator::MakeTask(std::string description, absl::Duration timeout,
                                          absl::Status validation,
                                          std::function<absl::Status(absl::Time)> run) {
  Task task;
  {
    absl::MutexLock lock(&mu_);
    description = absl::StrCat(description.substr(0, description.find(' ')), " #", ++issued_,
                               description.substr(description.find(' ')));
  }
  task.work = std::shared_ptr<Work>(new Work(std::move(description)));
  task.timeout = timeout == kDefaultTimeout ? options_.timeout : timeout;
  if (!validation.ok()) {
    task.work->Complete(Annotate(validation, task.work->description()));
  } else {
    task.run = std::move(run);
  }
  return task;
}

void Communicator::Execute(Task& task) {
  absl::Status broken;
  {
    absl::MutexLock lock(&mu_);
    broken = broken_;
  }
  if (!broken.ok()) {
    task.work->Complete(absl::FailedPreconditionError(
        absl::StrCat(task.work->description(), " not run: the communicator of rank ", rank_,
                     " is broken by an earlier error: ", broken.message())));
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
  task.work->Complete(std::move(status));
}

std::shared_ptr<Work> Communicator::Enqueue(Task task) {
  std::shared_ptr<Work> work = task.work;
  if (!task.run) return work;  // failed validation
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  return work;
}

absl::Status Communicator::RunNowOrQueue(Task task) {
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

void Communicator::WorkerLoop() {
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

absl::Status Communicator::DoAllreduce(void* data, size_t count, DType dtype, ReduceOp op,
                                       Algorithm algorithm, absl::Time deadline) {
  internal::AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
  switch (algorithm) {
    case Algorithm::kRing:
    case Algorithm::kAuto:
      return internal::RingAllreduce(ctx, data, count, dtype, op);
    case Algorithm::kBidirectionalRing:
      return internal::BidirectionalRingAllreduce(ctx, data, count, dtype, op);
    case Algorithm::kHalvingDoubling:
      return internal::HalvingDoublingAllreduce(ctx, data, count, dtype, op);
    case Algorithm::kRecursiveDoubling:
      if (scratch_.size() < count * DTypeSize(dtype)) scratch_.resize(count * DTypeSize(dtype));
      return internal::RecursiveDoublingAllreduce(ctx, data, count, dtype, op, scratch_.data());
  }
  return absl::InternalError("unknown algorithm");
}

absl::Status Communicator::DoReduceScatter(const void* input, void* output, size_t count,
                                           DType dtype, ReduceOp op, absl::Time deadline) {
  const size_t block = count * DTypeSize(dtype);
  const size_t total = block * size_;
  if (scratch_.size() < total) scratch_.resize(total);
  if (total > 0) std::memcpy(scratch_.data(), input, total);
  internal::AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
  DT_RETURN_IF_ERROR(internal::RingReduceScatter(ctx, scratch_.data(), count, dtype, op));
  if (block > 0) std::memcpy(output, scratch_.data() + rank_ * block, block);
  return absl::OkStatus();
}

absl::Status Communicator::DoAllgather(const void* input, void* output, size_t bytes,
                                       absl::Time deadline) {
  char* own = static_cast<char*>(output) + rank_ * bytes;
  if (bytes > 0 && input != own) std::memmove(own, input, bytes);
  internal::AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
  return internal::RingAllgather(ctx, output, bytes);
}

absl::Status Communicator::DoBroadcast(void* data, size_t bytes, int root, absl::Time deadline) {
  internal::AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
  if (bytes <= options_.tree_broadcast_max_bytes) {
    return internal::TreeBroadcast(ctx, data, bytes, root);
  }
  return internal::ChainBroadcast(ctx, data, bytes, root);
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

Communicator::Task Communicator::AllreduceTask(void* data, size_t count, DType dtype, ReduceOp op,
                                               absl::Duration timeout) {
  const Algorithm algorithm = AllreduceAlgorithmFor(count * DTypeSize(dtype));
  absl::Status valid = CheckReducible(dtype);
  if (valid.ok()) valid = CheckBuffer(data, count, "allreduce buffer");
  if (valid.ok()) valid = CheckCount(count, dtype, 1);
  return MakeTask(absl::StrCat("allreduce (", count, " x ", DTypeName(dtype), ", ",
                               ReduceOpName(op), ", ", AlgorithmName(algorithm), ")"),
                  timeout, valid, [=](absl::Time deadline) {
                    return DoAllreduce(data, count, dtype, op, algorithm, deadline);
                  });
}

Communicator::Task Communicator::ReduceScatterTask(const void* input, void* output, size_t count,
                                                   DType dtype, ReduceOp op,
                                                   absl::Duration timeout) {
  absl::Status valid = CheckReducible(dtype);
  if (valid.ok()) valid = CheckBuffer(input, count, "reduce-scatter input");
  if (valid.ok()) valid = CheckBuffer(output, count, "reduce-scatter output");
  if (valid.ok()) valid = CheckCount(count, dtype, size_);
  return MakeTask(absl::StrCat("reduce_scatter (", count, " x ", DTypeName(dtype), " per rank, ",
                               ReduceOpName(op), ", ring)"),
                  timeout, valid, [=](absl::Time deadline) {
                    return DoReduceScatter(input, output, count, dtype, op, deadline);
                  });
}

Communicator::Task Communicator::AllgatherTask(const void* input, void* output, size_t count,
                                               DType dtype, absl::Duration timeout) {
  absl::Status valid = CheckBuffer(input, count, "allgather input");
  if (valid.ok()) valid = CheckBuffer(output, count, "allgather output");
  if (valid.ok()) valid = CheckCount(count, dtype, size_);
  const size_t bytes = count * DTypeSize(dtype);
  return MakeTask(absl::StrCat("allgather (", count, " x ", DTypeName(dtype), " per rank, ring)"),
                  timeout, valid,
                  [=](absl::Time deadline) { return DoAllgather(input, output, bytes, deadline); });
}

Communicator::Task Communicator::BroadcastTask(void* data, size_t count, DType dtype, int root,
                                               absl::Duration timeout) {
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
      [=](absl::Time deadline) { return DoBroadcast(data, bytes, root, deadline); });
}

Communicator::Task Communicator::BarrierTask(absl::Duration timeout) {
  return MakeTask("barrier (hypercube)", timeout, absl::OkStatus(), [this](absl::Time deadline) {
    internal::AlgorithmContext ctx{transport_.get(), deadline, options_.chunk_bytes};
    return internal::Barrier(ctx);
  });
}

// --- Public entry points

absl::Status Communicator::Allreduce(void* data, size_t count, DType dtype, ReduceOp op,
                                     absl::Duration timeout) {
  return RunNowOrQueue(AllreduceTask(data, count, dtype, op, timeout));
}

absl::Status Communicator::ReduceScatter(const void* input, void* output, size_t output_count,
                                         DType dtype, ReduceOp op, absl::Duration timeout) {
  return RunNowOrQueue(ReduceScatterTask(input, output, output_count, dtype, op, timeout));
}

absl::Status Communicator::Allgather(const void* input, void* output, size_t input_count,
                                     DType dtype, absl::Duration timeout) {
  return RunNowOrQueue(AllgatherTask(input, output, input_count, dtype, timeout));
}

absl::Status Communicator::Broadcast(void* data, size_t count, DType dtype, int root,
                                     absl::Duration timeout) {
  return RunNowOrQueue(BroadcastTask(data, count, dtype, root, timeout));
}

absl::Status Communicator::Barrier(absl::Duration timeout) {
  return RunNowOrQueue(BarrierTask(timeout));
}

std::shared_ptr<Work> Communicator::AllreduceAsync(void* data, size_t count, DType dtype,
                                                   ReduceOp op, absl::Duration timeout) {
  return Enqueue(AllreduceTask(data, count, dtype, op, timeout));
}

std::shared_ptr<Work> Communicator::ReduceScatterAsync(const void* input, void* output,
                                                       size_t output_count, DType dtype,
                                                       ReduceOp op, absl::Duration timeout) {
  return Enqueue(ReduceScatterTask(input, output, output_count, dtype, op, timeout));
}

std::shared_ptr<Work> Communicator::AllgatherAsync(const void* input, void* output,
                                                   size_t input_count, DType dtype,
                                                   absl::Duration timeout) {
  return Enqueue(AllgatherTask(input, output, input_count, dtype, timeout));
}

std::shared_ptr<Work> Communicator::BroadcastAsync(void* data, size_t count, DType dtype, int root,
                                                   absl::Duration timeout) {
  return Enqueue(BroadcastTask(data, count, dtype, root, timeout));
}

std::shared_ptr<Work> Communicator::BarrierAsync(absl::Duration timeout) {
  return Enqueue(BarrierTask(timeout));
}

}  // namespace collective
}  // namespace dtrain
