#include "libs/train/gradient_sync.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "libs/base/logging.h"

namespace dtrain {
namespace train {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<std::string, GradientSyncRegistration> strategies ABSL_GUARDED_BY(mu);
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

bool RegisterGradientSync(GradientSyncRegistration registration) {
  DT_CHECK(!registration.name.empty() && registration.selects && registration.create);
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::string name = registration.name;
  bool inserted = r.strategies.emplace(name, std::move(registration)).second;
  DT_CHECK(inserted) << "gradient sync \"" << name << "\" registered twice";
  return true;
}

std::vector<std::string> GradientSyncNames() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::vector<std::string> names;
  for (const auto& [name, registration] : r.strategies) names.push_back(name);
  return names;
}

absl::StatusOr<std::unique_ptr<GradientSync>> CreateGradientSync(
    const DataParallelOptions& options) {
  std::vector<const GradientSyncRegistration*> chosen;
  {
    Registry& r = GetRegistry();
    absl::MutexLock lock(&r.mu);
    for (const auto& [name, registration] : r.strategies) {
      if (registration.selects(options)) chosen.push_back(&registration);
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
    for (const GradientSyncRegistration* c : chosen) names.push_back(c->name);
    return absl::InternalError(
        absl::StrCat("several gradient-sync strategies select the same "
                     "options (",
                     describe(), "): ", absl::StrJoin(names, ", ")));
  }
  // Registrations are never removed: the pointer stays valid.
  return chosen[0]->create(options);
}

}  // namespace train
}  // namespace dtrain
