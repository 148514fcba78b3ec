// "kvstore_weights": the parameter server holds the weights
// (DataParallelOptions::kvstore_consistency kAsync or kBoundedDelay). Every
// bucket is a key "param/bucket<b>" initialized once with the initial weights
// (Init is idempotent: the first trainer's weights win, and every trainer
// starts from what the server holds). The server applies SGD to each pushed
// bucket gradient as it arrives; each step pushes every bucket as soon as it
// is summed, pulls back the weights as of that push (under bounded delay the
// pull waits for the slowest trainer to come within the bound), and every
// replica copies them in at the end of the step instead of a local SGD step.
// Epoch statistics stay per trainer (there is no common round).
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/kvstore/parameter_server.h"
#include "libs/train/gradient_sync.h"

namespace dtrain {
namespace train {
namespace {

std::string WeightKey(int b) { return absl::StrCat("param/bucket", b); }

class KvstoreWeightsSync : public GradientSync {
 public:
  explicit KvstoreWeightsSync(const DataParallelOptions& o) : options_(o), ps_(o.kvstore) {}

  const char* name() const override { return "kvstore_weights"; }
  int trainers() const override { return options_.kvstore_workers; }
  bool optimizer_steps_locally() const override { return false; }

  absl::Status ReduceBucket(int b, float* flat) override {
    // Push this trainer's mean gradient (the server applies SGD to it on
    // arrival) and pull the weights as of this push.
    return Annotate(
        ps_->PushPull({{WeightKey(b), flat, weights_[b].data()}}),
        absl::StrCat("kvstore push of gradient bucket ", b, " and pull of its weights"));
  }

  // The weights this step's pulls brought.
  absl::Status UpdateReplica(int r) override {
    for (size_t b = 0; b < weights_.size(); ++b) {
      DT_RETURN_IF_ERROR(CopyWeightsToReplica(static_cast<int>(b), r));
    }
    return absl::OkStatus();
  }

  absl::Status PullLatestWeights() override {
    return Annotate(PullWeights(), "pulling the latest weights from the kvstore");
  }

  absl::StatusOr<std::unique_ptr<GradientSync>> Regroup(const DataParallelOptions& next) override {
    return absl::UnimplementedError(
        "recovery in place is implemented for allreduce or synchronous kvstore rounds; with "
        "kvstore-held weights a replacement continues the lost worker's rounds");
  }

  // The rounds the lost worker had pushed (kvstore::ParameterServer::
  // ResumeRounds): the steps it completed.
  absl::StatusOr<int64_t> ResumeRounds() override {
    absl::StatusOr<int64_t> rounds = ps_->ResumeRounds();
    if (!rounds.ok()) {
      return Annotate(rounds.status(), absl::StrCat("resuming kvstore worker ", ps_->worker()));
    }
    return rounds;
  }

 protected:
  absl::Status ShareInitialWeights() override {
    DT_RETURN_IF_ERROR(CreateKvstoreJob(ps_, options_));
    const std::vector<Bucket>& buckets = reducer()->buckets();
    weights_.resize(buckets.size());
    std::vector<kvstore::KeySpec> keys;
    for (size_t b = 0; b < buckets.size(); ++b) {
      // The initial weights, flattened as the bucket's gradients are.
      const int bi = static_cast<int>(b);
      weights_[b].resize(static_cast<size_t>(buckets[b].numel));
      DT_RETURN_IF_ERROR(Flatten(reducer()->Values(bi, 0), Device::Cpu(), weights_[b].data(),
                                 reducer()->stream(0)));
      keys.push_back({WeightKey(bi), {buckets[b].numel}, DType::kF32, weights_[b].data()});
    }
    DT_RETURN_IF_ERROR(Annotate(ps_->Init(keys), "initializing the kvstore keys"));
    // Another trainer may have initialized the keys first (or trained
    // already): start from what the server holds.
    return Annotate(PullWeights(), "pulling the initial weights");
  }

 private:
  // Bucket b's pulled weights into replica r's parameters (on a CUDA
  // replica: ordered on its stream).
  absl::Status CopyWeightsToReplica(int b, int r) {
    return Unflatten(weights_[b].data(), Device::Cpu(), reducer()->MutableValues(b, r),
                     reducer()->stream(r));
  }

  // Every bucket's current weights (round 0: no waiting) into every replica.
  absl::Status PullWeights() {
    std::vector<kvstore::PullTarget> targets;
    for (size_t b = 0; b < weights_.size(); ++b) {
      targets.push_back({WeightKey(static_cast<int>(b)), weights_[b].data(), 0});
    }
    DT_RETURN_IF_ERROR(ps_->Pull(std::move(targets)));
    for (size_t b = 0; b < weights_.size(); ++b) {
      for (int r = 0; r < reducer()->num_replicas(); ++r) {
        DT_RETURN_IF_ERROR(CopyWeightsToReplica(static_cast<int>(b), r));
      }
    }
    return reducer()->SynchronizeReplicas();
  }

  DataParallelOptions options_;
  kvstore::ParameterServer* ps_;
  std::vector<std::vector<float>> weights_;  // [bucket]: the pulled weights
};

absl::StatusOr<std::unique_ptr<GradientSync>> CreateWeights(const DataParallelOptions& o) {
  if (o.sgd.nesterov) {
    return absl::InvalidArgumentError(
        absl::StrCat("the kvstore's server-side SGD has no nesterov momentum (kvstore_consistency ",
                     kvstore::ConsistencyName(o.kvstore_consistency), ")"));
  }
  if (!(o.sgd.lr > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the kvstore's server-side SGD needs a positive learning rate, got ", o.sgd.lr));
  }
  return std::make_unique<KvstoreWeightsSync>(o);
}

// The survivors hold nothing the job needs: they never stop (a regroup does
// not interrupt them), and a replacement joins the attempt's kvstore job as
// the lost worker, pulls the weights and continues its rounds (ResumeRounds).
// Under bounded delay a survivor's pull may wait for the lost worker.
class KvstoreWeightsStrategy : public SyncStrategy {
 public:
  const char* name() const override { return "kvstore_weights"; }
  bool Selects(const DataParallelOptions& o) const override {
    return o.kvstore != nullptr && o.communicator == nullptr &&
           (o.kvstore_consistency == kvstore::Consistency::kAsync ||
            o.kvstore_consistency == kvstore::Consistency::kBoundedDelay);
  }
  absl::StatusOr<std::unique_ptr<GradientSync>> Create(
      const DataParallelOptions& o) const override {
    return CreateWeights(o);
  }
  bool uses_kvstore() const override { return true; }
  bool replacement_continues_rounds() const override { return true; }
  bool StepMayStall(kvstore::Consistency consistency) const override {
    return consistency == kvstore::Consistency::kBoundedDelay;
  }
};

DT_REGISTER_SYNC_STRATEGY(KvstoreWeightsStrategy);

}  // namespace
}  // namespace train
}  // namespace dtrain
