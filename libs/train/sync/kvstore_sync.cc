// "kvstore_sync": trainers meet on the parameter server in synchronous
// rounds (DataParallelOptions::kvstore_consistency kSync). Every bucket is a
// key "grad/bucket<b>" of a job with no server optimizer and gradient_scale
// 1/kvstore_workers: each step pushes the trainer's mean bucket gradient and
// pulls the mean over all trainers of that round, which every replica then
// applies with its local optimizer. Epoch statistics go through one more key,
// "stats/epoch" (with more than one trainer).
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/kvstore/parameter_server.h"
#include "libs/train/gradient_sync.h"

namespace dtrain {
namespace train {
namespace {

constexpr const char* kStatsKey = "stats/epoch";

class KvstoreSync : public GradientSync {
 public:
  explicit KvstoreSync(const DataParallelOptions& o) : options_(o), ps_(o.kvstore) {}

  const char* name() const override { return "kvstore_sync"; }
  int trainers() const override { return options_.kvstore_workers; }

  absl::Status ReduceBucket(int b, float* flat) override {
    // One synchronous round: push this trainer's bucket, pull the mean over
    // all trainers once every trainer has pushed it.
    return Annotate(ps_->PushPull({{absl::StrCat("grad/bucket", b), flat, flat}}),
                    absl::StrCat("kvstore push-pull of gradient bucket ", b));
  }

  // A synchronous round: the pull is the mean over the trainers, whose
  // ratios are the global ones.
  absl::Status AverageStatistics(float* sums, int n) override {
    if (options_.kvstore_workers <= 1) return absl::OkStatus();
    if (n != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("the kvstore key ", kStatsKey, " holds 3 statistics, got ", n));
    }
    return ps_->PushPull({{kStatsKey, sums, sums}});
  }

  // The rounds continue in the new membership's kvstore job, which this
  // makes (a joiner's client made it at Create: this hook carries on).
  absl::StatusOr<std::unique_ptr<GradientSync>> Regroup(const DataParallelOptions& next) override {
    if (next.kvstore == nullptr) {
      return absl::InvalidArgumentError("Regroup of a kvstore job needs the new kvstore job");
    }
    if (next.kvstore == ps_) return nullptr;
    DataParallelOptions o = options_;
    o.kvstore = next.kvstore;
    o.kvstore_workers = next.kvstore_workers;
    auto sync = std::make_unique<KvstoreSync>(o);
    DT_RETURN_IF_ERROR(sync->Start(reducer()));
    return sync;
  }

 protected:
  absl::Status ShareInitialWeights() override {
    DT_RETURN_IF_ERROR(CreateKvstoreJob(ps_, options_));
    std::vector<kvstore::KeySpec> keys;
    for (size_t b = 0; b < reducer()->buckets().size(); ++b) {
      keys.push_back(
          {absl::StrCat("grad/bucket", b), {reducer()->buckets()[b].numel}, DType::kF32, nullptr});
    }
    DT_RETURN_IF_ERROR(Annotate(ps_->Init(keys), "initializing the kvstore keys"));
    if (options_.kvstore_workers > 1) {
      DT_RETURN_IF_ERROR(Annotate(ps_->Init({{kStatsKey, {3}, DType::kF32, nullptr}}),
                                  "initializing the kvstore key of the epoch statistics"));
    }
    return absl::OkStatus();
  }

 private:
  DataParallelOptions options_;
  kvstore::ParameterServer* ps_;
};

// A survivor waits in a round for the lost trainer's push and cannot tell:
// its agent cancels the kvstore client when the scheduler offers the next
// membership (the step fails CANCELLED), the state is exchanged over a host
// communicator of that membership, and the rounds continue in the
// membership's own kvstore job (Regroup above).
class KvstoreSyncStrategy : public SyncStrategy {
 public:
  const char* name() const override { return "kvstore_sync"; }
  bool Selects(const DataParallelOptions& o) const override {
    return o.kvstore != nullptr && o.communicator == nullptr &&
           o.kvstore_consistency == kvstore::Consistency::kSync;
  }
  absl::StatusOr<std::unique_ptr<GradientSync>> Create(
      const DataParallelOptions& o) const override {
    return std::make_unique<KvstoreSync>(o);
  }
  bool uses_kvstore() const override { return true; }
  bool RegroupsInPlace(int world) const override { return world > 1; }
  bool loss_is_silent() const override { return true; }
  bool MayBePeerLoss(const absl::Status& failure) const override {
    return absl::IsCancelled(failure);
  }
};

DT_REGISTER_SYNC_STRATEGY(KvstoreSyncStrategy);

}  // namespace
}  // namespace train
}  // namespace dtrain
