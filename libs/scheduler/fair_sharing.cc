#include "libs/scheduler/fair_sharing.h"

#include <algorithm>

namespace dtrain {
namespace scheduler {

Resources CohortLendable(const QueueConfig& config, const std::string& cohort) {
  Resources out;
  if (cohort.empty()) return out;
  for (const QueueSpec& q : config.queues) {
    if (q.cohort == cohort) out += q.lending_limit;
  }
  return out;
}

double QueueShare(const QueueSpec& q, const Resources& usage, const Resources& lendable) {
  if (q.cohort.empty()) return 0;
  double share = 0;
  for (int r = 0; r < kNumResources; ++r) {
    if (!q.managed[r] || lendable[r] <= 0) continue;
    const int64_t above = usage[r] - q.quota[r];
    if (above > 0) share = std::max(share, static_cast<double>(above) / lendable[r]);
  }
  return share / q.weight;
}

double UserShare(const QueueSpec& q, const Resources& user_usage) {
  double share = 0;
  bool any = false;
  for (int r = 0; r < kNumResources; ++r) {
    if (!q.managed[r] || q.quota[r] <= 0) continue;
    any = true;
    share = std::max(share, static_cast<double>(user_usage[r]) / q.quota[r]);
  }
  return any ? share : static_cast<double>(user_usage[kTrainers]);
}

std::vector<double> WeightedFairShares(const std::vector<double>& nominal,
                                       const std::vector<double>& limit,
                                       const std::vector<double>& weight,
                                       const std::vector<double>& demand, double capacity) {
  const size_t n = nominal.size();
  std::vector<double> share(n, 0);
  double left = capacity;
  for (size_t i = 0; i < n; ++i) {
    share[i] = std::min({demand[i], nominal[i], limit[i]});
    left -= share[i];
  }
  // Water-filling by weight: repeatedly give every queue that still wants
  // more its weighted part of what is left, capped by its want.
  for (int round = 0; round < 64 && left > 1e-9; ++round) {
    double weights = 0;
    for (size_t i = 0; i < n; ++i) {
      if (std::min(demand[i], limit[i]) - share[i] > 1e-9) weights += weight[i];
    }
    if (weights <= 0) break;
    double given = 0;
    for (size_t i = 0; i < n; ++i) {
      const double want = std::min(demand[i], limit[i]) - share[i];
      if (want <= 1e-9) continue;
      const double part = std::min(want, left * weight[i] / weights);
      share[i] += part;
      given += part;
    }
    left -= given;
    if (given <= 1e-12) break;
  }
  return share;
}

}  // namespace scheduler
}  // namespace dtrain
