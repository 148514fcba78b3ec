#include "libs/train/gradient_sync.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "libs/base/logging.h"
#include "libs/base/retry.h"
#include "libs/base/status.h"

namespace dtrain {
namespace train {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<std::string, const SyncStrategy*, std::less<>> strategies ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

absl::Status GradientSync::UpdateReplica(int r) {
  return absl::InternalError(
      absl::StrCat("gradient sync \"", name(), "\" steps locally and sets no weights"));
}

absl::StatusOr<std::unique_ptr<GradientSync>> GradientSync::Regroup(
    const DataParallelOptions& next) {
  DataParallelOptions o = next;
  o.kvstore = nullptr;  // the communicator carries the gradients
  o.joining = false;
  DT_ASSIGN_OR_RETURN(const SyncStrategy* strategy, ChooseSyncStrategy(o));
  if (!strategy->RegroupsInPlace(o.communicator != nullptr ? o.communicator->size() : 1)) {
    return absl::UnimplementedError(
        absl::StrCat("recovery in place with the ", strategy->name(), " strategy"));
  }
  DT_ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> sync, strategy->Create(o));
  sync->Attach(reducer());
  return sync;
}

absl::Status GradientSync::ReduceStepStatistics(double* sums, int n) {
  return absl::UnimplementedError(
      absl::StrCat("gradient sync \"", name(), "\" does not sum statistics in each step"));
}

absl::StatusOr<int64_t> GradientSync::ResumeRounds() {
  return absl::FailedPreconditionError(
      absl::StrCat("resuming a kvstore worker needs kvstore-held weights (kAsync or "
                   "kBoundedDelay); the strategy is ",
                   name()));
}

bool SyncStrategy::MayBePeerLoss(const absl::Status& failure) const { return IsTransient(failure); }

bool RegisterSyncStrategy(const SyncStrategy* strategy) {
  DT_CHECK(strategy != nullptr && strategy->name()[0] != '\0');
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  bool inserted = r.strategies.emplace(strategy->name(), strategy).second;
  DT_CHECK(inserted) << "sync strategy \"" << strategy->name() << "\" registered twice";
  return true;
}

std::vector<std::string> GradientSyncNames() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::vector<std::string> names;
  for (const auto& [name, strategy] : r.strategies) names.push_back(name);
  return names;
}

const SyncStrategy* FindSyncStrategy(absl::string_view name) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.strategies.find(name);
  return it == r.strategies.end() ? nullptr : it->second;
}

absl::StatusOr<const SyncStrategy*> ChooseSyncStrategy(const DataParallelOptions& options) {
  std::vector<const SyncStrategy*> chosen;
  {
    Registry& r = GetRegistry();
    absl::MutexLock lock(&r.mu);
    for (const auto& [name, strategy] : r.strategies) {
      if (strategy->Selects(options)) chosen.push_back(strategy);
    }
  }
  auto describe = [&options] {
    return absl::StrCat(
        "communicator ", options.communicator != nullptr ? "set" : "none", ", kvstore ",
        options.kvstore != nullptr ? kvstore::ConsistencyName(options.kvstore_consistency) : "none",
        ", devices ", options.devices.empty() ? "none" : options.devices[0].ToString(), "...");
  };
  if (chosen.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no gradient-sync strategy for these options (", describe(),
                     "); registered: ", absl::StrJoin(GradientSyncNames(), ", ")));
  }
  if (chosen.size() > 1) {
    std::vector<std::string> names;
    for (const SyncStrategy* c : chosen) names.push_back(c->name());
    return absl::InternalError(
        absl::StrCat("several gradient-sync strategies select the same "
                     "options (",
                     describe(), "): ", absl::StrJoin(names, ", ")));
  }
  return chosen[0];
}

absl::StatusOr<std::unique_ptr<GradientSync>> CreateGradientSync(
    const DataParallelOptions& options) {
  DT_ASSIGN_OR_RETURN(const SyncStrategy* strategy, ChooseSyncStrategy(options));
  return strategy->Create(options);
}

absl::Status CreateKvstoreJob(kvstore::ParameterServer* ps, const DataParallelOptions& options) {
  const kvstore::JobConfig config = MakeKvstoreJobConfig(ps->job(), options);
  DT_RETURN_IF_ERROR(Annotate(ps->SetPushCompression(options.kvstore_compression),
                              "choosing the kvstore push compression"));
  return Annotate(ps->CreateJob(config), absl::StrCat("creating the kvstore job (",
                                                      kvstore::DescribeJobConfig(config), ")"));
}

}  // namespace train
}  // namespace dtrain
