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

bool Selects(const DataParallelOptions& o) {
  return o.communicator == nullptr && o.kvstore == nullptr;
}

absl::StatusOr<std::unique_ptr<GradientSync>> Create(const DataParallelOptions& o) {
  return std::make_unique<LocalSync>();
}

DT_REGISTER_GRADIENT_SYNC("local", Selects, Create);

}  // namespace
}  // namespace train
}  // namespace dtrain
