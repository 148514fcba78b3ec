// "nccl_allreduce": one CUDA replica per trainer and a communicator whose
// transport is TransportKind::kNccl (libs/cuda/nccl/nccl_collective.h, which
// takes device pointers). Each bucket is flattened into a device buffer by
// the reducer, averaged over the trainers by NCCL and copied back, with no
// host staging; the initial weights are broadcast in device memory. The
// collectives are ordered after the work enqueued on the replica's stream.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/collective/communicator.h"
#include "libs/cuda/stream.h"
#include "libs/train/gradient_sync.h"

namespace dtrain {
namespace train {
namespace {

class NcclAllreduceSync : public GradientSync {
 public:
  explicit NcclAllreduceSync(const DataParallelOptions& o)
      : comm_(o.communicator), device_(o.devices[0]) {}

  const char* name() const override { return "nccl_allreduce"; }
  Reducer::BufferPlace bucket_place() const override { return Reducer::BufferPlace::kDevice; }
  int trainers() const override { return comm_->size(); }

  absl::Status ReduceBucket(int b, float* flat) override {
    cuda::DeviceGuard guard(device_.index);
    // The NCCL communicator orders its collective after the work enqueued on
    // this thread's current stream of its device: the replica's stream.
    cuda::StreamGuard on_replica(reducer()->stream(0));
    return Annotate(comm_->Allreduce(flat, static_cast<size_t>(reducer()->buckets()[b].numel),
                                     DType::kF32, collective::ReduceOp::kAverage),
                    absl::StrCat("NCCL allreduce of gradient bucket ", b));
  }

  // Through the device's memory, where NCCL wants its buffers.
  absl::Status AverageStatistics(float* sums, int n) override {
    Tensor host = Tensor::FromVector(std::vector<float>(sums, sums + n), {n});
    DT_ASSIGN_OR_RETURN(Tensor on_device, host.To(device_));
    DT_RETURN_IF_ERROR(
        comm_->Allreduce(on_device.raw_data(), n, DType::kF32, collective::ReduceOp::kSum));
    DT_ASSIGN_OR_RETURN(Tensor back, on_device.To(Device::Cpu(0)));
    DT_RETURN_IF_ERROR(back.CopyToHost(sums));
    return absl::OkStatus();
  }

 protected:
  // Rank 0's weights, broadcast in device memory on the replica's stream.
  absl::Status ShareInitialWeights() override {
    cuda::StreamGuard on_replica(reducer()->stream(0));
    for (int p = 0; p < reducer()->num_params(); ++p) {
      Tensor& t = reducer()->param(0, p).mutable_value();
      DT_RETURN_IF_ERROR(
          Annotate(comm_->Broadcast(t.raw_data(), static_cast<size_t>(t.numel()), DType::kF32, 0),
                   "broadcast of initial weights"));
    }
    return absl::OkStatus();
  }

 private:
  collective::Communicator* comm_;
  Device device_;
};

std::string DeviceList(const std::vector<Device>& devices) {
  std::string out;
  for (const Device& d : devices) absl::StrAppend(&out, out.empty() ? "" : ", ", d.ToString());
  return out;
}

absl::StatusOr<std::unique_ptr<GradientSync>> CreateNccl(const DataParallelOptions& o) {
  if (o.devices.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an NCCL communicator reduces device memory of one GPU per trainer; this trainer has ",
        o.devices.size(), " devices (", DeviceList(o.devices),
        "): run one trainer (rank) per GPU, or use a host transport"));
  }
  if (o.communicator->options().cuda_device != o.devices[0].index) {
    return absl::InvalidArgumentError(
        absl::StrCat("the NCCL communicator is on cuda:", o.communicator->options().cuda_device,
                     " but the trainer's device is ", o.devices[0].ToString()));
  }
  return std::make_unique<NcclAllreduceSync>(o);
}

// A collective waiting for a dead peer over shared memory or NVLink may
// never fail by itself: the agent aborts the communicator when the
// scheduler offers the next membership, and any failure is then worth a
// regroup. The state travels over a host communicator of that membership
// (device memory through the host), the gradients over its new NCCL one.
class NcclAllreduceStrategy : public SyncStrategy {
 public:
  const char* name() const override { return "nccl_allreduce"; }
  bool Selects(const DataParallelOptions& o) const override {
    return o.communicator != nullptr && o.kvstore == nullptr && !o.devices.empty() &&
           o.devices[0].is_cuda() &&
           o.communicator->options().transport == collective::TransportKind::kNccl;
  }
  absl::StatusOr<std::unique_ptr<GradientSync>> Create(
      const DataParallelOptions& o) const override {
    return CreateNccl(o);
  }
  bool uses_communicator() const override { return true; }
  bool uses_device_communicator() const override { return true; }
  bool RegroupsInPlace(int world) const override { return true; }
  bool loss_is_silent() const override { return true; }
  bool MayBePeerLoss(const absl::Status& failure) const override { return true; }
};

DT_REGISTER_SYNC_STRATEGY(NcclAllreduceStrategy);

}  // namespace
}  // namespace train
}  // namespace dtrain
