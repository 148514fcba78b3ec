// "local": one trainer (no communicator, no kvstore). The reducer's weighted
// sum over the replicas is the gradient every replica applies.
#include <memory>

#include "libs/train/gradient_sync.h"

namespace dtrain {
namespace train {
namespace {

class LocalSync : public GradientSync {
 public:
  const char* name() const override { return "local"; }
  absl::Status ReduceBucket(int b, float* flat) override { return absl::OkStatus(); }
};

// Nothing crosses trainers, nothing to recover (a joiner's trainer starts
// with this hook until its first exchange: GradientSync::Regroup).
class LocalStrategy : public SyncStrategy {
 public:
  const char* name() const override { return "local"; }
  bool Selects(const DataParallelOptions& o) const override {
    return o.communicator == nullptr && o.kvstore == nullptr;
  }
  absl::StatusOr<std::unique_ptr<GradientSync>> Create(
      const DataParallelOptions& o) const override {
    return std::make_unique<LocalSync>();
  }
};

DT_REGISTER_SYNC_STRATEGY(LocalStrategy);

}  // namespace
}  // namespace train
}  // namespace dtrain
