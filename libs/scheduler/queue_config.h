// QueueConfig: the cluster's queues, from a queues file (docs/queues.md):
// who may submit where, each queue's nominal quota, its cohort, how much it
// may borrow from and lend to the cohort, its fair-share weight and its
// preemption policies.
//
//   queues:
//     - name: team-a
//       cohort: research
//       quota: {trainers: 1}
//       borrowing_limit: {trainers: 1}
//       users: [alice]
//     - name: team-b
//       cohort: research
//       quota: {trainers: 1}
//       users: [bob]
//   preemption:
//     within_queue: lower_priority
//     reclaim_within_cohort: any
//
//   DT_ASSIGN_OR_RETURN(QueueConfig c, ParseQueueConfig(text));
//   DT_ASSIGN_OR_RETURN(int q, c.Resolve("alice", {}, spec.queue()));
//   DT_RETURN_IF_ERROR(CheckQuotaChange(new_config, manager.UsageByQueue()));
//
// Resources are counted per job as a gang: `trainers` is num_trainers and
// `cpu_devices` / `cuda_devices` num_trainers x devices_per_trainer of the
// job's kind. A resource a queue's quota does not name is not limited by
// that queue (so the example above limits trainers only); the queues of one
// cohort must name the same resources. Every error (parse or validation) is
// InvalidArgument naming the line, the queue and the numbers.
//
// Values, thread-compatible.
#ifndef DTRAIN_LIBS_SCHEDULER_QUEUE_CONFIG_H_
#define DTRAIN_LIBS_SCHEDULER_QUEUE_CONFIG_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace scheduler {

enum Resource { kTrainers = 0, kCpuDevices = 1, kCudaDevices = 2 };
inline constexpr int kNumResources = 3;
// "trainers", "cpu_devices", "cuda_devices": the names in the file.
const char* ResourceName(int r);

// An amount of each resource.
struct Resources {
  std::array<int64_t, kNumResources> v{};

  int64_t& operator[](int r) { return v[r]; }
  int64_t operator[](int r) const { return v[r]; }
  Resources& operator+=(const Resources& o);
  Resources& operator-=(const Resources& o);
  bool operator==(const Resources& o) const { return v == o.v; }
  bool IsZero() const;
  // "trainers 2, cpu_devices 8" (zero amounts left out; "nothing" if all are).
  std::string ToString() const;
};

// A job's gang: trainers x devices_per_trainer devices of one kind.
Resources GangResources(int trainers, int devices_per_trainer, bool cuda);

enum class WithinQueuePolicy { kNever, kLowerPriority };
enum class ReclaimPolicy { kNever, kLowerPriority, kAny };
const char* PolicyName(WithinQueuePolicy p);
const char* PolicyName(ReclaimPolicy p);

// "No limit" in borrowing_limit / lending_limit.
inline constexpr int64_t kUnlimited = int64_t{1} << 50;

struct QueueSpec {
  std::string name;
  std::string cohort;  // empty: none (it neither borrows nor lends)
  // Which resources the quota names; the others are not limited here.
  std::array<bool, kNumResources> managed{};
  Resources quota;  // nominal quota (0 where not managed)
  // How far above its quota the queue may go by borrowing from its cohort:
  // kUnlimited where not set (in a cohort), 0 without a cohort.
  Resources borrowing_limit;
  // How much of its unused quota others in the cohort may borrow: its quota
  // where not set; quota - lending_limit is kept for the queue alone.
  Resources lending_limit;
  double weight = 1.0;             // fair-share weight among the cohort's queues (> 0)
  std::vector<std::string> users;  // "*": everyone
  // Groups whose members may submit: the file's `groups:` (below), or
  // groups the caller's identity carries (Resolve's `groups`).
  std::vector<std::string> groups;
  WithinQueuePolicy within_queue = WithinQueuePolicy::kNever;
  ReclaimPolicy reclaim_within_cohort = ReclaimPolicy::kNever;
  int line = 0;  // where the queue starts in the file
};

struct QueueConfig {
  std::vector<QueueSpec> queues;
  // user -> default queue: `default_queues` in the file, else the only
  // queue that names the user (or a group of theirs).
  std::map<std::string, std::string> default_queue;
  // group -> its users: the file's top-level `groups:` mapping, e.g.
  //   groups:
  //     ml-research: [alice, carol]
  // A queue's `groups: [ml-research]` lets alice and carol submit to it.
  std::map<std::string, std::vector<std::string>> group_members;

  // Index of the queue called `name`, or -1.
  int Find(absl::string_view name) const;
  // The queues `user` (with `groups`, beyond those the file puts the user
  // in) may submit to, in file order.
  std::vector<int> QueuesOf(absl::string_view user, const std::vector<std::string>& groups) const;
  // The queue a job of `user` goes to: `requested` (JobSpec.queue) if set
  // and allowed, else the user's default. NotFound for an unknown queue,
  // PermissionDenied for a queue the user may not use, FailedPrecondition
  // when the user has no queue at all; each names the user's queues.
  absl::StatusOr<int> Resolve(absl::string_view user, const std::vector<std::string>& groups,
                              absl::string_view requested) const;
};

// Parses and validates a queues file. InvalidArgument naming the line and
// the problem: a malformed file, unknown keys or policy names, a negative
// quota, a borrowing limit beyond what the cohort can lend, a lending limit
// above the quota, a user listed twice in a queue or in several queues
// without a default, a default naming an unknown queue or one the user is
// not in, queues of a cohort that limit different resources, a queue naming
// a group that `groups:` does not define.
absl::StatusOr<QueueConfig> ParseQueueConfig(absl::string_view yaml);

// The cluster without a queues file: one queue "default" that everyone
// uses, with no quota (every resource unlimited) and no preemption.
QueueConfig DefaultQueueConfig();

// Whether `next` can replace the running config given the resources each
// queue's admitted (running) jobs use now. FailedPrecondition naming the
// queue, resource and numbers when it would strand them: a queue with
// running jobs that is gone, a queue whose usage exceeds its new quota plus
// borrowing limit, or a cohort whose members' borrowing exceeds what the
// others now lend.
absl::Status CheckQuotaChange(const QueueConfig& next,
                              const std::map<std::string, Resources>& usage_by_queue);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_QUEUE_CONFIG_H_
