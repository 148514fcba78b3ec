#include "libs/cuda/nccl/nccl_collective.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/collective/reduce.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/nccl/communicator.h"
#include "libs/cuda/stream.h"

namespace dtrain {
namespace cuda {
namespace {

using collective::Communicator;
using collective::CommunicatorOptions;
using collective::Work;

ReduceOp ToNcclOp(collective::ReduceOp op) {
  return op == collective::ReduceOp::kAverage ? ReduceOp::kAvg : ReduceOp::kSum;
}

absl::Status CheckPointer(const void* p, size_t count, const char* what) {
  if (p == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is null but count is ", count));
  }
  return absl::OkStatus();
}

absl::Status CheckCount(size_t count, DType dtype, int factor) {
  if (count > (SIZE_MAX / 2) / DTypeSize(dtype) / static_cast<size_t>(factor)) {
    return absl::InvalidArgumentError(absl::StrCat("count ", count, " is too large"));
  }
  return absl::OkStatus();
}

class NcclCollective final : public Communicator {
 public:
  NcclCollective(const CommunicatorOptions& options, std::unique_ptr<NcclCommunicator> nccl,
                 std::unique_ptr<CudaStream> stream, float* barrier_buffer)
      : options_(options),
        nccl_(std::move(nccl)),
        stream_(std::move(stream)),
        barrier_buffer_(barrier_buffer) {
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  }

  ~NcclCollective() override {
    {
      absl::MutexLock lock(&mu_);
      shutdown_ = true;
    }
    watchdog_.join();  // every pending operation finished or failed
    nccl_.reset();     // finalizes (or, if aborted, already released) the NCCL communicator
    DeviceGuard guard(options_.cuda_device);
    cudaFree(barrier_buffer_);
    stream_.reset();
  }

  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->world_size(); }
  const CommunicatorOptions& options() const override { return options_; }
  const char* transport_name() const override { return "nccl"; }
  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return broken_;
  }
  collective::Algorithm AllreduceAlgorithmFor(size_t) const override {
    return collective::Algorithm::kAuto;  // NCCL's own choice
  }

  // Never waits for the issue lock (an enqueue may hold it): breaks the
  // communicator at once (later operations are NotRun, health() names the
  // reason) and hands the ncclCommAbort to the watchdog thread, which
  // serializes it with enqueues (ncclCommAbort frees the NCCL communicator);
  // the kernels waiting for a peer then return and the pending operations
  // fail. Takes only mu_, which no thread holds across an NCCL or CUDA call.
  void Abort(const std::string& reason) override {
    absl::MutexLock lock(&mu_);
    if (!abort_requested_) {
      abort_requested_ = true;
      abort_reason_ = reason;
    }
    if (broken_.ok()) {
      broken_ = absl::AbortedError(
          absl::StrCat("NCCL communicator of ", nccl_->Who(), " aborted: ", reason));
    }
  }

 private:
  // One enqueued operation, oldest first.
  struct Pending {
    std::shared_ptr<Work> work;
    std::unique_ptr<CudaEvent> done;  // recorded after the collective
    absl::Duration timeout;
    absl::Time started;  // when it became the oldest (the stream reached it)
  };

  // --- Operations

  std::shared_ptr<Work> DoAllreduceAsync(void* data, size_t count, DType dtype,
                                         collective::ReduceOp op, absl::Duration timeout) override {
    absl::Status valid = collective::CheckReducible(dtype);
    if (valid.ok()) valid = CheckPointer(data, count, "allreduce buffer");
    if (valid.ok()) valid = CheckCount(count, dtype, 1);
    return Issue("allreduce",
                 absl::StrCat("(", count, " x ", DTypeName(dtype), ", ",
                              collective::ReduceOpName(op), ", nccl)"),
                 timeout, valid, [=](cudaStream_t s) {
                   return nccl_->Allreduce(data, data, count, dtype, ToNcclOp(op), s);
                 });
  }

  std::shared_ptr<Work> DoReduceScatterAsync(const void* input, void* output, size_t count,
                                             DType dtype, collective::ReduceOp op,
                                             absl::Duration timeout) override {
    absl::Status valid = collective::CheckReducible(dtype);
    if (valid.ok()) valid = CheckPointer(input, count, "reduce-scatter input");
    if (valid.ok()) valid = CheckPointer(output, count, "reduce-scatter output");
    if (valid.ok()) valid = CheckCount(count, dtype, size());
    return Issue("reduce_scatter",
                 absl::StrCat("(", count, " x ", DTypeName(dtype), " per rank, ",
                              collective::ReduceOpName(op), ", nccl)"),
                 timeout, valid, [=](cudaStream_t s) {
                   return nccl_->ReduceScatter(input, output, count, dtype, ToNcclOp(op), s);
                 });
  }

  std::shared_ptr<Work> DoAllgatherAsync(const void* input, void* output, size_t count, DType dtype,
                                         absl::Duration timeout) override {
    absl::Status valid = CheckPointer(input, count, "allgather input");
    if (valid.ok()) valid = CheckPointer(output, count, "allgather output");
    if (valid.ok()) valid = CheckCount(count, dtype, size());
    return Issue("allgather", absl::StrCat("(", count, " x ", DTypeName(dtype), " per rank, nccl)"),
                 timeout, valid,
                 [=](cudaStream_t s) { return nccl_->Allgather(input, output, count, dtype, s); });
  }

  std::shared_ptr<Work> DoBroadcastAsync(void* data, size_t count, DType dtype, int root,
                                         absl::Duration timeout) override {
    absl::Status valid = CheckPointer(data, count, "broadcast buffer");
    if (valid.ok() && (root < 0 || root >= size())) {
      valid = absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " is not a rank of ", size()));
    }
    if (valid.ok()) valid = CheckCount(count, dtype, 1);
    return Issue(
        "broadcast",
        absl::StrCat("(", count, " x ", DTypeName(dtype), " from rank ", root, ", nccl)"), timeout,
        valid, [=](cudaStream_t s) { return nccl_->Broadcast(data, data, count, dtype, root, s); });
  }

  std::shared_ptr<Work> DoBarrierAsync(absl::Duration timeout) override {
    return Issue("barrier", "(nccl allreduce of 1 x f32)", timeout, absl::OkStatus(),
                 [this](cudaStream_t s) {
                   return nccl_->Allreduce(barrier_buffer_, barrier_buffer_, 1, DType::kF32,
                                           ReduceOp::kSum, s);
                 });
  }

  absl::Status DoAllreduce(void* data, size_t count, DType dtype, collective::ReduceOp op,
                           absl::Duration timeout) override {
    return DoAllreduceAsync(data, count, dtype, op, timeout)->Wait();
  }
  absl::Status DoReduceScatter(const void* input, void* output, size_t count, DType dtype,
                               collective::ReduceOp op, absl::Duration timeout) override {
    return DoReduceScatterAsync(input, output, count, dtype, op, timeout)->Wait();
  }
  absl::Status DoAllgather(const void* input, void* output, size_t count, DType dtype,
                           absl::Duration timeout) override {
    return DoAllgatherAsync(input, output, count, dtype, timeout)->Wait();
  }
  absl::Status DoBroadcast(void* data, size_t count, DType dtype, int root,
                           absl::Duration timeout) override {
    return DoBroadcastAsync(data, count, dtype, root, timeout)->Wait();
  }
  absl::Status DoBarrier(absl::Duration timeout) override {
    return DoBarrierAsync(timeout)->Wait();
  }

  // --- Execution

  // Numbers and describes the operation ("allreduce #3 (...)"), then either
  // completes its Work at once (argument error, broken communicator, failed
  // enqueue) or enqueues it with `enqueue` and hands it to the watchdog.
  std::shared_ptr<Work> Issue(const char* kind, const std::string& detail, absl::Duration timeout,
                              const absl::Status& valid,
                              const std::function<absl::Status(cudaStream_t)>& enqueue) {
    std::string description;
    {
      absl::MutexLock lock(&mu_);
      description = absl::StrCat(kind, " #", ++issued_, " ", detail);
    }
    std::shared_ptr<Work> work = NewWork(description);
    if (!valid.ok()) {
      CompleteWork(*work, Annotate(valid, description));
      return work;
    }
    const absl::Duration limit = timeout == kDefaultTimeout ? options_.timeout : timeout;

    // Enqueues and aborts are serialized (ncclCommAbort frees the NCCL
    // communicator); this also serializes racing callers.
    absl::MutexLock issue(&issue_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (!broken_.ok()) {
        CompleteWork(*work, NotRun(description));
        return work;
      }
    }
    // After the caller's work on the device (which produced the buffers).
    absl::Status s;
    if (Stream* current = CurrentStream(options_.cuda_device); current != nullptr) {
      s = stream_->Wait(current);
    }
    const bool aborted_before = nccl_->aborted();
    if (s.ok()) s = enqueue(stream_->get());
    if (absl::IsInvalidArgument(s) && !nccl_->aborted()) {
      // Rejected by NcclCommunicator's pointer checks before any NCCL call.
      CompleteWork(*work, Annotate(s, description));
      return work;
    }
    std::unique_ptr<CudaEvent> done;
    if (s.ok()) {
      absl::StatusOr<std::unique_ptr<CudaEvent>> e = CudaEvent::Create(options_.cuda_device);
      s = e.ok() ? (*e)->Record(stream_->get()) : e.status();
      if (e.ok()) done = *std::move(e);
    }
    if (!s.ok()) {
      // NCCL errors have aborted the communicator already; a CUDA error
      // leaves this rank out of step with its peers, so abort for them too.
      if (!aborted_before && !nccl_->aborted()) {
        s = nccl_->Fail(description.c_str(), s.code(), std::string(s.message()));
      }
      Break(s);
      CompleteWork(*work, std::move(s));
      return work;
    }
    absl::MutexLock lock(&mu_);
    pending_.push_back(Pending{work, std::move(done), limit,
                               pending_.empty() ? absl::Now() : absl::InfiniteFuture()});
    return work;
  }

  // FAILED_PRECONDITION for an operation issued, or still pending, after the
  // communicator broke.
  absl::Status NotRun(const std::string& description) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::FailedPreconditionError(
        absl::StrCat(description, " not completed: the NCCL communicator of rank ", nccl_->rank(),
                     " is broken by an earlier error: ", broken_.message()));
  }

  // Records the first error; the watchdog fails what is pending.
  void Break(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = status;
  }

  void WatchdogLoop() {
    while (true) {
      std::shared_ptr<Work> work;
      CudaEvent* done = nullptr;
      absl::Time deadline;
      absl::Duration timeout;
      bool abort_now = false;
      std::string abort_reason;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !pending_.empty() || shutdown_ || (abort_requested_ && !abort_done_);
        };
        mu_.Await(absl::Condition(&ready));
        if (abort_requested_ && !abort_done_) {
          abort_done_ = true;
          abort_now = true;
          abort_reason = abort_reason_;
        }
      }
      if (abort_now) {
        // Abort's request, before the pending operations fail (their
        // kernels may still wait for a peer).
        absl::MutexLock issue(&issue_mu_);
        if (!nccl_->aborted()) nccl_->Abort(abort_reason);
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        // Only this thread pops pending_: empty means shut down.
        if (pending_.empty()) return;
        if (!broken_.ok()) {
          FailPendingLocked(nullptr, absl::OkStatus());
          continue;
        }
        Pending& front = pending_.front();
        if (front.started == absl::InfiniteFuture()) front.started = absl::Now();
        work = front.work;
        done = front.done.get();  // only this thread pops pending_
        deadline = front.started + front.timeout;
        timeout = front.timeout;
      }

      absl::StatusOr<bool> finished = done->Query();
      absl::Status error;
      {
        absl::MutexLock issue(&issue_mu_);
        if (nccl_->aborted()) {
          error = absl::AbortedError(absl::StrCat("NCCL communicator of ", nccl_->Who(),
                                                  " was aborted while ", work->description(),
                                                  " was pending"));
        } else {
          // Aborts the NCCL communicator itself on an error.
          error = nccl_->CheckAsyncError();
          if (error.ok() && !finished.ok()) {
            error = nccl_->Fail(work->description().c_str(), finished.status().code(),
                                std::string(finished.status().message()));
          }
          if (error.ok() && !*finished && absl::Now() > deadline) {
            error = nccl_->Fail(work->description().c_str(), absl::StatusCode::kDeadlineExceeded,
                                absl::StrCat("timed out after ", absl::FormatDuration(timeout),
                                             " (a peer stopped or issued other collectives?)"));
          }
        }
        if (!error.ok()) {
          // Under issue_mu_, so that no call issued after the abort sees a
          // healthy communicator.
          absl::MutexLock lock(&mu_);
          if (broken_.ok()) broken_ = error;
          FailPendingLocked(work.get(), error);
          continue;
        }
      }
      if (*finished) {
        {
          absl::MutexLock lock(&mu_);
          pending_.pop_front();
          if (!pending_.empty()) pending_.front().started = absl::Now();
        }
        CompleteWork(*work, absl::OkStatus());
        continue;
      }
      absl::SleepFor(kPollInterval);
    }
  }

  // Fails every pending operation: `failed` (the one that broke the
  // communicator, if any) with `error`, the others with NotRun.
  void FailPendingLocked(Work* failed, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!pending_.empty()) {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      CompleteWork(*p.work, p.work.get() == failed ? error : NotRun(p.work->description()));
    }
  }

  static constexpr absl::Duration kPollInterval = absl::Microseconds(100);

  const CommunicatorOptions options_;  // cuda_device resolved
  std::unique_ptr<NcclCommunicator> nccl_;
  std::unique_ptr<CudaStream> stream_;  // the collectives' stream
  float* const barrier_buffer_;         // one float on the device

  absl::Mutex issue_mu_;  // held while enqueuing or aborting
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(issue_mu_);
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // Abort's request, which the watchdog carries out.
  bool abort_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool abort_done_ ABSL_GUARDED_BY(mu_) = false;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  uint64_t issued_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread watchdog_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    int rank, int size, collective::Store* store, const CommunicatorOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of size ", size, " is not a valid position"));
  }
  if (store == nullptr) return absl::InvalidArgumentError("CreateNcclCommunicator needs a store");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("CommunicatorOptions::timeout must be positive");
  }
  CommunicatorOptions o = options;
  o.transport = collective::TransportKind::kNccl;
  if (o.cuda_device < 0) {
    const int count = DeviceCount();
    o.cuda_device = count > 0 ? rank % count : 0;  // 0: Create says there is no device
  }
  NcclOptions no;
  no.init_timeout = o.timeout;
  no.op_timeout = o.timeout;
  no.key_prefix = absl::StrCat(o.key_prefix, "/nccl");
  DT_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                      NcclCommunicator::Create(rank, size, o.cuda_device, store, no));
  absl::StatusOr<std::unique_ptr<CudaStream>> stream = CudaStream::Create(o.cuda_device);
  float* barrier_buffer = nullptr;
  absl::Status s = stream.status();
  if (s.ok()) {
    DeviceGuard guard(o.cuda_device);
    s = CudaStatus(cudaMalloc(&barrier_buffer, sizeof(float)), "cudaMalloc", __FILE__, __LINE__);
    if (s.ok()) {
      // On the collectives' stream: a plain cudaMemset runs on the legacy
      // NULL stream, which the non-blocking stream_ does not wait for.
      s = CudaStatus(cudaMemsetAsync(barrier_buffer, 0, sizeof(float), (*stream)->get()),
                     "cudaMemsetAsync", __FILE__, __LINE__);
    }
  }
  if (!s.ok()) {
    if (barrier_buffer != nullptr) cudaFree(barrier_buffer);
    // The peers are connected: tell them this rank gives up.
    return nccl->Fail("setup", s.code(), std::string(s.message()));
  }
  return std::unique_ptr<Communicator>(
      new NcclCollective(o, std::move(nccl), *std::move(stream), barrier_buffer));
}

namespace {

// Communicator::Create(..., {.transport = kNccl}) lands here once this
// library is linked (alwayslink).
const bool kRegistered = [] {
  absl::Status s = collective::RegisterCommunicatorFactory(collective::TransportKind::kNccl,
                                                           &CreateNcclCommunicator);
  if (!s.ok()) DT_LOG(WARNING) << "registering the NCCL communicator: " << s.message();
  return s.ok();
}();

}  // namespace
}  // namespace cuda
}  // namespace dtrain
