// Fair sharing: the shares that order admission between the queues of a
// cohort and between the users of one queue, and the fair allocation a
// queue is entitled to (which the simulation benchmark measures against).
//
// Queues of a cohort (dominant-resource fair sharing, as Kueue's fair
// sharing): a queue's share is, over the resources its quota names, the
// largest of (what it uses above its nominal quota) / (what the cohort's
// queues lend in all), divided by its weight. A queue within its quota has
// share 0. Among heads that need to borrow, the lowest share (after
// admitting the head) goes first, so the cohort's spare quota is split in
// proportion to the weights.
//
// Users of one queue: a user's share is the largest over the queue's quota
// of their usage / the quota (trainers when the queue names none). Inside
// a priority level the user with the lowest share goes first.
//
// Pure functions, thread-compatible.
#ifndef DTRAIN_LIBS_SCHEDULER_FAIR_SHARING_H_
#define DTRAIN_LIBS_SCHEDULER_FAIR_SHARING_H_

#include <vector>

#include "libs/scheduler/queue_config.h"

namespace dtrain {
namespace scheduler {

// What the queues of `cohort` lend in all, per resource.
Resources CohortLendable(const QueueConfig& config, const std::string& cohort);

// The dominant borrowed share of queue `q` using `usage`, by its weight.
// `lendable` is CohortLendable(config, queue's cohort). 0 without a cohort.
double QueueShare(const QueueSpec& q, const Resources& usage, const Resources& lendable);

// A user's dominant share of queue `q` with `user_usage`.
double UserShare(const QueueSpec& q, const Resources& user_usage);

// The fair allocation of one resource among queues that share `capacity`:
// each queue first gets min(demand, nominal); what is left is split by
// weight among the queues that want more (water-filling), never above a
// queue's demand or its limit (nominal + borrowing limit). The sizes of
// `nominal`, `limit`, `weight` and `demand` are equal; the result sums to
// min(capacity, total demand) when the limits allow.
std::vector<double> WeightedFairShares(const std::vector<double>& nominal,
                                       const std::vector<double>& limit,
                                       const std::vector<double>& weight,
                                       const std::vector<double>& demand, double capacity);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SCHEDULER_FAIR_SHARING_H_
