// "allreduce": trainers average each bucket with a collective::Communicator
// over a host transport (TCP, shm, in-process, ...), in host memory; CUDA
// replicas reach it through the reducer's pinned staging.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/collective/communicator.h"
#include "libs/train/gradient_sync.h"

namespace dtrain {
namespace train {
namespace {

class AllreduceSync : public GradientSync {
 public:
  explicit AllreduceSync(const DataParallelOptions& o)
      : comm_(o.communicator), timeout_(o.sync_batch_norm_timeout) {}

  const char* name() const override { return "allreduce"; }
  int trainers() const override { return comm_->size(); }

  nn::SyncBatchNormGroup::CrossGather BatchNormGather() override {
    collective::Communicator* comm = comm_;
    absl::Duration timeout = timeout_;
    return [comm, timeout](const std::vector<double>& local, std::vector<double>* all) {
      all->resize(local.size() * static_cast<size_t>(comm->size()));
      // Raw bytes: every trainer sums the gathered statistics itself, in rank
      // order, so all get bitwise the same result.
      return comm->Allgather(local.data(), all->data(), local.size() * sizeof(double), DType::kU8,
                             timeout);
    };
  }

  absl::Status ReduceBucket(int b, float* flat) override {
    return Annotate(comm_->Allreduce(flat, static_cast<size_t>(reducer()->buckets()[b].numel),
                                     DType::kF32, collective::ReduceOp::kAverage),
                    absl::StrCat("allreduce of gradient bucket ", b));
  }

  absl::Status AverageStatistics(float* sums, int n) override {
    return comm_->Allreduce(sums, n, DType::kF32, collective::ReduceOp::kSum);
  }

  // Raw bytes, gathered and summed in rank order (as BatchNormGather).
  bool reduces_step_statistics() const override { return true; }
  absl::Status ReduceStepStatistics(double* sums, int n) override {
    std::vector<double> all(static_cast<size_t>(n) * comm_->size());
    DT_RETURN_IF_ERROR(Annotate(
        comm_->Allgather(sums, all.data(), static_cast<size_t>(n) * sizeof(double), DType::kU8),
        "allgather of the step's statistics"));
    for (int i = 0; i < n; ++i) {
      double total = 0;
      for (int r = 0; r < comm_->size(); ++r) total += all[static_cast<size_t>(r) * n + i];
      sums[i] = total;
    }
    return absl::OkStatus();
  }

 protected:
  // Rank 0's replica 0 is the source.
  absl::Status ShareInitialWeights() override {
    Reducer* red = reducer();
    for (int p = 0; p < red->num_params(); ++p) {
      Tensor& t = red->param(0, p).mutable_value();
      if (!red->cuda_replicas()) {
        DT_RETURN_IF_ERROR(
            Annotate(comm_->Broadcast(t.raw_data(), static_cast<size_t>(t.numel()), DType::kF32, 0),
                     "broadcast of initial weights"));
        continue;
      }
      // CUDA replicas: through host memory.
      std::vector<float> host(static_cast<size_t>(t.numel()));
      DT_RETURN_IF_ERROR(t.CopyToHost(host.data()));
      DT_RETURN_IF_ERROR(Annotate(comm_->Broadcast(host.data(), host.size(), DType::kF32, 0),
                                  "broadcast of initial weights"));
      DT_RETURN_IF_ERROR(CopyBytes(t.device(), t.raw_data(), Device::Cpu(), host.data(), t.nbytes(),
                                   red->stream(0)));
    }
    if (red->cuda_replicas()) DT_RETURN_IF_ERROR(red->stream(0)->Synchronize());
    return absl::OkStatus();
  }

 private:
  collective::Communicator* comm_;
  absl::Duration timeout_;
};

// A lost peer fails the survivors' collectives (a transient error): they
// regroup in place and exchange the root's state over the new membership's
// communicator, which then carries the gradients; a replacement receives
// the state in the same exchange.
class AllreduceStrategy : public SyncStrategy {
 public:
  const char* name() const override { return "allreduce"; }
  // Every communicator but NCCL with CUDA replicas ("nccl_allreduce").
  bool Selects(const DataParallelOptions& o) const override {
    if (o.communicator == nullptr || o.kvstore != nullptr) return false;
    return !(!o.devices.empty() && o.devices[0].is_cuda() &&
             o.communicator->options().transport == collective::TransportKind::kNccl);
  }
  absl::StatusOr<std::unique_ptr<GradientSync>> Create(
      const DataParallelOptions& o) const override {
    return std::make_unique<AllreduceSync>(o);
  }
  bool uses_communicator() const override { return true; }
  bool RegroupsInPlace(int world) const override { return true; }
};

DT_REGISTER_SYNC_STRATEGY(AllreduceStrategy);

}  // namespace
}  // namespace train
}  // namespace dtrain
