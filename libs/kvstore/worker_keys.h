// The keys one worker Init'ed, as that worker's side of a ParameterServer
// keeps them: where each key's slices live, the last round the worker pushed
// of each slice, and the latest operation on each key (operations on the same
// keys run in the order they were issued). RemoteParameterServer and
// InProcessParameterServer both keep theirs in one.
//
//   WorkerKeys keys("worker 3");
//   DT_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<WorkerKeys::Key>> placed,
//                       keys.Place(job, specs, num_servers, placement));
//   for (auto& slices : WorkerKeys::SlicesByServer(specs, *placed, num_servers)) ...
//     // create them on their server, with their initial values
//   keys.Add(std::move(placed));
//
//   auto call = std::make_shared<Work::State>();
//   DT_ASSIGN_OR_RETURN(WorkerKeys::Plan plan, keys.PlanCall(CallKind::kPush, items, call));
//   ...  // wait for plan.after, then run plan.ops grouped by op.slice->server
//
// Thread-safety: thread-safe.
#ifndef DTRAIN_LIBS_KVSTORE_WORKER_KEYS_H_
#define DTRAIN_LIBS_KVSTORE_WORKER_KEYS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/kvstore/parameter_server.h"
#include "libs/kvstore/placement.h"
#include "libs/kvstore/types.h"

namespace dtrain {
namespace kvstore {

class WorkerKeys {
 public:
  struct Key {
    KeySpec spec;  // `initial` cleared
    std::vector<PlacedSlice> slices;
    std::vector<int64_t> pushed;        // per slice: the last round pushed
    std::shared_ptr<Work::State> last;  // the latest operation on this key
  };

  // One slice's part of a call.
  struct SliceOp {
    const Key* key = nullptr;
    const PlacedSlice* slice = nullptr;
    int64_t round = 0;
    const char* src = nullptr;  // the slice's first element in the caller's buffer
    char* dst = nullptr;
  };

  // What a call does, slice by slice, and the earlier calls on its keys it
  // must wait for first.
  struct Plan {
    std::vector<SliceOp> ops;
    std::vector<std::shared_ptr<Work::State>> after;
  };

  // `who` names the worker in errors ("this client", "worker 3").
  explicit WorkerKeys(std::string who);
  WorkerKeys(const WorkerKeys&) = delete;
  WorkerKeys& operator=(const WorkerKeys&) = delete;

  // The placement of `job`'s `keys` on `num_servers` servers (PlaceInitKeys,
  // checked against the keys Init'ed before); records nothing.
  absl::StatusOr<std::vector<std::unique_ptr<Key>>> Place(absl::string_view job,
                                                          const std::vector<KeySpec>& keys,
                                                          int num_servers,
                                                          const PlacementOptions& options) const;
  // A placed slice to create, and its initial value (in the key's
  // KeySpec::initial; null without one).
  struct InitSlice {
    const PlacedSlice* slice = nullptr;
    const char* initial = nullptr;
  };
  // The slices of `placed` (Place's result for `keys`), by server.
  static std::vector<std::vector<InitSlice>> SlicesByServer(
      const std::vector<KeySpec>& keys, const std::vector<std::unique_ptr<Key>>& placed,
      int num_servers);
  // Records keys Place returned once their servers created them; a key
  // Init'ed before keeps its entry (and its rounds).
  void Add(std::vector<std::unique_ptr<Key>> placed);

  // A call of `kind` on `items` (checked with CheckCallItems first): its
  // slice operations, pushes numbered with the next round of each slice and
  // pulls with the round they ask for (kLastPushedRound: the last pushed),
  // and the latest earlier call on each of its keys. `call` becomes the
  // latest call on those keys. kNotFound for a key not Init'ed here.
  absl::StatusOr<Plan> PlanCall(CallKind kind, const std::vector<CallItem>& items,
                                const std::shared_ptr<Work::State>& call);

  // After a restart of either side: waits for every call in flight, then
  // sets each slice's pushed round to what its server reports
  // (`per_server[server]`, GetJob with its slices; a slice it does not
  // report keeps its round). Returns the lowest pushed round of any slice
  // (0 with no keys).
  int64_t SetPushedRounds(const std::vector<JobStatus>& per_server);

  // The lowest round this worker pushed of `key`'s slices; kNotFound if
  // not Init'ed here.
  absl::StatusOr<int64_t> PushedRound(const std::string& key) const;
  // Where `key`'s slices live; kNotFound if not Init'ed here.
  absl::StatusOr<std::vector<PlacedSlice>> Placement(const std::string& key) const;

 private:
  const Key* FindLocked(const std::string& key) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status NotInitedError(absl::string_view what, const std::string& key) const;

  const std::string who_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Key>> keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_WORKER_KEYS_H_
