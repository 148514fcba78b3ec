#include "libs/kvstore/worker_keys.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/kvstore/types.h"

namespace dtrain {
namespace kvstore {

WorkerKeys::WorkerKeys(std::string who) : who_(std::move(who)) {}

absl::Status WorkerKeys::NotInitedError(absl::string_view what, const std::string& key) const {
  return absl::NotFoundError(absl::StrCat(what, "key '", key, "' not Init'ed by ", who_));
}

const WorkerKeys::Key* WorkerKeys::FindLocked(const std::string& key) const {
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : it->second.get();
}

absl::StatusOr<std::vector<std::unique_ptr<WorkerKeys::Key>>> WorkerKeys::Place(
    absl::string_view job, const std::vector<KeySpec>& keys, int num_servers,
    const PlacementOptions& options) const {
  std::vector<std::vector<PlacedSlice>> slices;
  {
    absl::ReaderMutexLock lock(&mu_);
    DT_ASSIGN_OR_RETURN(slices, PlaceInitKeys(job, keys, num_servers, options,
                                              [this](const std::string& name)
                                                  ABSL_NO_THREAD_SAFETY_ANALYSIS -> const KeySpec* {
                                                    const Key* known = FindLocked(name);
                                                    return known == nullptr ? nullptr
                                                                            : &known->spec;
                                                  }));
  }
  std::vector<std::unique_ptr<Key>> placed;
  for (size_t k = 0; k < keys.size(); ++k) {
    auto key = std::make_unique<Key>();
    key->spec = keys[k];
    key->spec.initial = nullptr;
    key->slices = std::move(slices[k]);
    key->pushed.assign(key->slices.size(), 0);
    placed.push_back(std::move(key));
  }
  return placed;
}

std::vector<std::vector<WorkerKeys::InitSlice>> WorkerKeys::SlicesByServer(
    const std::vector<KeySpec>& keys, const std::vector<std::unique_ptr<Key>>& placed,
    int num_servers) {
  std::vector<std::vector<InitSlice>> by_server(static_cast<size_t>(num_servers));
  for (size_t k = 0; k < keys.size(); ++k) {
    const size_t esize = DTypeSize(keys[k].dtype);
    for (const PlacedSlice& s : placed[k]->slices) {
      InitSlice init;
      init.slice = &s;
      if (keys[k].initial != nullptr) {
        init.initial =
            static_cast<const char*>(keys[k].initial) + static_cast<size_t>(s.spec.offset) * esize;
      }
      by_server[static_cast<size_t>(s.server)].push_back(init);
    }
  }
  return by_server;
}

void WorkerKeys::Add(std::vector<std::unique_ptr<Key>> placed) {
  absl::MutexLock lock(&mu_);
  for (std::unique_ptr<Key>& key : placed) {
    const std::string name = key->spec.key;
    keys_.try_emplace(name, std::move(key));
  }
}

absl::StatusOr<WorkerKeys::Plan> WorkerKeys::PlanCall(CallKind kind,
                                                      const std::vector<CallItem>& items,
                                                      const std::shared_ptr<Work::State>& call) {
  absl::MutexLock lock(&mu_);
  std::vector<Key*> keys;
  for (const CallItem& item : items) {
    auto it = keys_.find(item.key);
    if (it == keys_.end()) {
      return NotInitedError(absl::StrCat(CallKindName(kind), " of "), item.key);
    }
    keys.push_back(it->second.get());
  }
  Plan plan;
  for (size_t k = 0; k < items.size(); ++k) {
    Key* key = keys[k];
    const CallItem& item = items[k];
    const size_t esize = DTypeSize(key->spec.dtype);
    for (size_t i = 0; i < key->slices.size(); ++i) {
      SliceOp op;
      op.key = key;
      op.slice = &key->slices[i];
      const size_t offset = static_cast<size_t>(op.slice->spec.offset) * esize;
      if (kind == CallKind::kPull) {
        op.round = item.round == kLastPushedRound ? key->pushed[i] : item.round;
      } else {
        op.round = ++key->pushed[i];
        op.src = static_cast<const char*>(item.src) + offset;
      }
      if (kind != CallKind::kPush) op.dst = static_cast<char*>(item.dst) + offset;
      plan.ops.push_back(op);
    }
    if (key->last && key->last != call &&
        std::find(plan.after.begin(), plan.after.end(), key->last) == plan.after.end()) {
      plan.after.push_back(key->last);
    }
    key->last = call;
  }
  return plan;
}

int64_t WorkerKeys::SetPushedRounds(const std::vector<JobStatus>& per_server) {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, key] : keys_) {
    if (key->last) key->last->WaitTasks();
  }
  int64_t lowest = -1;
  for (const auto& [name, key] : keys_) {
    for (size_t i = 0; i < key->slices.size(); ++i) {
      const PlacedSlice& placed = key->slices[i];
      if (placed.server >= 0 && static_cast<size_t>(placed.server) < per_server.size()) {
        for (const SliceStatus& s : per_server[static_cast<size_t>(placed.server)].slices) {
          if (s.spec.key == placed.spec.key && s.spec.slice == placed.spec.slice) {
            key->pushed[i] = s.pushed_round;
          }
        }
      }
      lowest = lowest < 0 ? key->pushed[i] : std::min(lowest, key->pushed[i]);
    }
  }
  return std::max<int64_t>(lowest, 0);
}

absl::StatusOr<int64_t> WorkerKeys::PushedRound(const std::string& key) const {
  absl::ReaderMutexLock lock(&mu_);
  const Key* k = FindLocked(key);
  if (k == nullptr) return NotInitedError("", key);
  return *std::min_element(k->pushed.begin(), k->pushed.end());
}

absl::StatusOr<std::vector<PlacedSlice>> WorkerKeys::Placement(const std::string& key) const {
  absl::ReaderMutexLock lock(&mu_);
  const Key* k = FindLocked(key);
  if (k == nullptr) return NotInitedError("", key);
  return k->slices;
}

}  // namespace kvstore
}  // namespace dtrain
