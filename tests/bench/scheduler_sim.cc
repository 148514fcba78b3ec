// scheduler_sim: the queues' admission and preemption (libs/scheduler
// admission.h, preemptor.h) driven in process by a seeded synthetic cluster
// and workload, in simulated time. Prints key=value lines:
//   cycle_p50_ms, cycle_p99_ms, cycle_max_ms  wall time of one admission
//       cycle (every admission and preemption decision of one moment)
//   utilisation          busy trainer-seconds / (trainers x makespan)
//   utilisation_loaded   the same while the jobs wanted every trainer
//   queue.<q>.share      its trainer-seconds / its fair share's, counted
//                        while it had demand (fair share: its quota, then the
//                        cohort's spare split by weight, never above demand)
//   min_share_ratio      the smallest of those
//   preemptions.<rule>, shrinks.<rule>
// The same workload then runs through one queue without quotas (the
// scheduler today: priority, then age) as the reference, and the ratios of
// the two are printed (baseline.*, *_vs_baseline).
//
//   bazel run -c opt //tests/bench:scheduler_sim -- --seed=1
//
// Model: trainers have 4 cpu devices; a job asks for trainers x devices as a
// gang, does trainers x duration trainer-seconds of work and is elastic (may
// shrink to half) with probability 0.2. A preempted job drains for
// --drain_seconds (holding its trainers) and resumes where it stopped (no
// work lost, as with the scheduler's drain); a shrunk job keeps its
// remaining work on fewer trainers. Arrivals are Poisson; each queue's share
// of them changes every 5000 s (so queues go idle and busy).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "libs/scheduler/admission.h"
#include "libs/scheduler/fair_sharing.h"
#include "libs/scheduler/queue_config.h"
#include "libs/scheduler/queue_manager.h"

ABSL_FLAG(uint64_t, seed, 1, "workload seed");
ABSL_FLAG(int, trainers, 1000, "trainers in the cluster");
ABSL_FLAG(int, jobs, 20000, "jobs submitted");
ABSL_FLAG(double, load, 1.2, "offered load / cluster capacity");
ABSL_FLAG(double, mean_duration, 600, "mean job duration at full size, seconds");
ABSL_FLAG(double, drain_seconds, 30, "how long a preempted job holds its trainers");
ABSL_FLAG(bool, baseline, true, "also run the one-queue reference");

namespace dtrain {
namespace scheduler {
namespace {

constexpr int kQueues = 10;
constexpr int kDevicesPerTrainer = 4;

struct SimJob {
  std::string id;
  int queue;  // the sim's queue (for fairness), whatever the config
  std::string user;
  int priority;
  double submit;
  int trainers;
  int min_trainers;
  int devices;
  double work;  // trainer-seconds left
  // while running:
  int running_trainers = 0;
  double started = 0;
  int version = 0;  // invalidates stale finish events
};

std::vector<SimJob> MakeWorkload(uint64_t seed, int n, int trainers, double load,
                                 double mean_duration) {
  std::mt19937_64 rng(seed);
  const int sizes[] = {1, 2, 4, 8, 16, 32};
  std::discrete_distribution<int> size({30, 25, 20, 13, 8, 4});
  double mean_size = 0;
  {
    const double p[] = {30, 25, 20, 13, 8, 4};
    for (int i = 0; i < 6; ++i) mean_size += sizes[i] * p[i] / 100;
  }
  std::lognormal_distribution<double> duration(std::log(mean_duration) - 0.5, 1.0);
  const double rate = load * trainers / (mean_size * mean_duration);
  std::exponential_distribution<double> gap(rate);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<SimJob> jobs;
  double t = 0;
  std::vector<double> mix(kQueues, 1);
  int phase = -1;
  for (int i = 0; i < n; ++i) {
    t += gap(rng);
    if (static_cast<int>(t / 5000) != phase) {
      phase = static_cast<int>(t / 5000);
      for (double& m : mix) m = u(rng) < 0.3 ? 0.05 : 0.5 + u(rng);
    }
    std::discrete_distribution<int> pick(mix.begin(), mix.end());
    SimJob j;
    j.id = absl::StrCat("job-", i);
    j.queue = pick(rng);
    j.user = absl::StrCat("u", j.queue, "-", static_cast<int>(u(rng) * 3));
    j.priority = u(rng) < 0.1 ? 5 : 0;
    j.submit = t;
    j.trainers = sizes[size(rng)];
    j.min_trainers = j.trainers >= 2 && u(rng) < 0.2 ? j.trainers / 2 : 0;
    j.devices = 1 << static_cast<int>(u(rng) * 3);  // 1, 2 or 4
    j.work = j.trainers * std::min(duration(rng), 20 * mean_duration);
    jobs.push_back(j);
  }
  return jobs;
}

// 10 queues in 2 cohorts of 5; quotas sum to the cluster's trainers.
std::string QueuesFile(int trainers) {
  const double part[5] = {0.3, 0.2, 0.2, 0.15, 0.15};
  const double weight[5] = {2, 1, 1, 1, 1};
  std::string text = "queues:\n";
  int given = 0;
  for (int q = 0; q < kQueues; ++q) {
    const int quota = q == kQueues - 1
                          ? trainers - given
                          : static_cast<int>(std::lround(trainers / 2.0 * part[q % 5]));
    given += quota;
    absl::StrAppend(&text, "  - name: q", q, "\n    cohort: ", q < 5 ? "north" : "south",
                    "\n    quota: {trainers: ", quota, "}\n    weight: ", weight[q % 5],
                    "\n    users: [u", q, "-0, u", q, "-1, u", q, "-2]\n");
  }
  absl::StrAppend(&text, "preemption:\n  within_queue: lower_priority\n",
                  "  reclaim_within_cohort: any\n");
  return text;
}

struct Figures {
  std::vector<double> cycle_ms;
  double busy = 0, capacity_time = 0, loaded_busy = 0, loaded_time = 0;
  std::vector<double> used = std::vector<double>(kQueues);
  std::vector<double> fair = std::vector<double>(kQueues);
  std::map<std::string, int> preemptions;
  double makespan = 0;
  int admissions = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

Figures Simulate(std::vector<SimJob> jobs, const QueueConfig& sim_queues, bool one_queue,
                 int trainers, double drain_seconds) {
  Figures f;
  f.used.assign(kQueues, 0);
  f.fair.assign(kQueues, 0);
  QueueConfig config = one_queue ? DefaultQueueConfig() : sim_queues;
  Resources capacity;
  capacity[kTrainers] = trainers;
  capacity[kCpuDevices] = static_cast<int64_t>(trainers) * kDevicesPerTrainer;
  capacity[kCudaDevices] = kUnlimited;
  QueueManager m(config, capacity);
  std::map<std::string, int> index;
  for (int i = 0; i < static_cast<int>(jobs.size()); ++i) index[jobs[i].id] = i;

  enum Kind { kArrive, kFinish, kDrained, kShrunk };
  struct Event {
    double t;
    int kind;
    int job;
    int version;
    int arg;
    bool operator>(const Event& o) const { return t > o.t; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  for (int i = 0; i < static_cast<int>(jobs.size()); ++i) {
    events.push({jobs[i].submit, kArrive, i, 0, 0});
  }
  std::vector<double> usage(kQueues, 0), pending(kQueues, 0);
  // Fair-share inputs per sim queue.
  std::vector<double> nominal(kQueues), limit(kQueues), weight(kQueues);
  for (int q = 0; q < kQueues; ++q) {
    const QueueSpec& s = sim_queues.queues[q];
    nominal[q] = s.quota[kTrainers];
    limit[q] = static_cast<double>(
        std::min<int64_t>(kUnlimited, s.quota[kTrainers] + s.borrowing_limit[kTrainers]));
    weight[q] = s.weight;
  }
  double now = 0, last = 0;
  int done = 0;
  auto account = [&](double t) {
    const double dt = t - last;
    if (dt <= 0) return;
    double busy = 0, demand_all = 0;
    for (int c = 0; c < 2; ++c) {
      std::vector<double> nom, lim, w, demand;
      double cap = 0;
      for (int q = c * 5; q < c * 5 + 5; ++q) {
        nom.push_back(nominal[q]);
        lim.push_back(limit[q]);
        w.push_back(weight[q]);
        demand.push_back(usage[q] + pending[q]);
        cap += nominal[q];
      }
      const std::vector<double> fair = WeightedFairShares(nom, lim, w, demand, cap);
      for (int k = 0; k < 5; ++k) {
        const int q = c * 5 + k;
        busy += usage[q];
        demand_all += demand[k];
        if (demand[k] > 0) {
          f.used[q] += std::min(usage[q], demand[k]) * dt;
          f.fair[q] += fair[k] * dt;
        }
      }
    }
    f.busy += busy * dt;
    f.capacity_time += trainers * dt;
    if (demand_all >= trainers) {
      f.loaded_busy += busy * dt;
      f.loaded_time += trainers * dt;
    }
    last = t;
  };
  auto start = [&](int i) {
    SimJob& j = jobs[i];
    j.running_trainers = j.trainers;
    j.started = now;
    ++j.version;
    events.push({now + j.work / j.running_trainers, kFinish, i, j.version, 0});
  };
  while (!events.empty()) {
    now = events.top().t;
    account(now);
    while (!events.empty() && events.top().t <= now) {
      const Event e = events.top();
      events.pop();
      SimJob& j = jobs[e.job];
      switch (e.kind) {
        case kArrive: {
          Workload w;
          w.id = j.id;
          w.queue = one_queue ? "default" : absl::StrCat("q", j.queue);
          w.user = j.user;
          w.priority = j.priority;
          w.submit_time = j.submit;
          w.trainers = j.trainers;
          w.devices_per_trainer = j.devices;
          w.min_trainers = j.min_trainers;
          if (absl::Status s = m.AddPending(w); !s.ok()) {
            std::fprintf(stderr, "scheduler_sim: %s\n", std::string(s.message()).c_str());
            std::exit(1);
          }
          pending[j.queue] += j.trainers;
          break;
        }
        case kFinish:
          if (e.version != j.version) break;
          (void)m.Finish(j.id);
          usage[j.queue] -= j.running_trainers;
          j.running_trainers = 0;
          ++j.version;  // a drain or shrink still on its way is moot
          ++done;
          break;
        case kDrained: {
          if (e.version != j.version) break;
          j.work -= (now - j.started) * j.running_trainers;  // resumes at the drained step
          j.work = std::max(j.work, 1.0);
          (void)m.Requeue(j.id);
          usage[j.queue] -= j.running_trainers;
          j.running_trainers = 0;
          ++j.version;
          const Workload* w = m.Find(j.id);
          j.trainers = w->trainers;
          pending[j.queue] += j.trainers;
          break;
        }
        case kShrunk: {
          if (e.version != j.version) break;
          j.work -= (now - j.started) * j.running_trainers;
          j.work = std::max(j.work, 1.0);
          (void)m.Resize(j.id, e.arg);
          usage[j.queue] -= j.running_trainers - e.arg;
          j.running_trainers = e.arg;
          j.trainers = e.arg;
          j.started = now;
          ++j.version;
          events.push({now + j.work / j.running_trainers, kFinish, e.job, j.version, 0});
          break;
        }
      }
    }
    CycleOptions o;
    o.now = now;
    const auto t0 = std::chrono::steady_clock::now();
    const CycleResult r = RunAdmissionCycle(m, o);
    const auto t1 = std::chrono::steady_clock::now();
    f.cycle_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    for (const Admission& a : r.admitted) {
      const int i = index.at(a.id);
      pending[jobs[i].queue] -= jobs[i].trainers;
      usage[jobs[i].queue] += jobs[i].trainers;
      start(i);
      ++f.admissions;
    }
    for (const PreemptionDecision& d : r.preemptions) {
      for (const Victim& v : d.victims) {
        const int i = index.at(v.id);
        if (v.trainers_after > 0) {
          ++f.preemptions[absl::StrCat("shrinks.", RuleName(v.rule))];
          events.push({now + drain_seconds / 3, kShrunk, i, jobs[i].version, v.trainers_after});
        } else {
          ++f.preemptions[absl::StrCat("preemptions.", RuleName(v.rule))];
          events.push({now + drain_seconds, kDrained, i, jobs[i].version, 0});
        }
      }
    }
  }
  f.makespan = now;
  if (done != static_cast<int>(jobs.size()) || m.num_pending() != 0) {
    std::fprintf(stderr, "scheduler_sim: %d of %zu jobs finished, %d pending\n", done, jobs.size(),
                 m.num_pending());
    std::exit(1);
  }
  return f;
}

double MinShare(const Figures& f) {
  double min = 1e9;
  for (int q = 0; q < kQueues; ++q) {
    if (f.fair[q] > 0) min = std::min(min, f.used[q] / f.fair[q]);
  }
  return min;
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace dtrain::scheduler;
  const int trainers = absl::GetFlag(FLAGS_trainers);
  const std::vector<SimJob> jobs =
      MakeWorkload(absl::GetFlag(FLAGS_seed), absl::GetFlag(FLAGS_jobs), trainers,
                   absl::GetFlag(FLAGS_load), absl::GetFlag(FLAGS_mean_duration));
  absl::StatusOr<QueueConfig> config = ParseQueueConfig(QueuesFile(trainers));
  if (!config.ok()) {
    std::fprintf(stderr, "scheduler_sim: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  std::printf("seed=%llu\ntrainers=%d\njobs=%zu\nqueues=%d\ncohorts=2\n",
              static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)), trainers, jobs.size(),
              kQueues);
  const Figures f = Simulate(jobs, *config, false, trainers, absl::GetFlag(FLAGS_drain_seconds));
  std::printf("cycles=%zu\nadmissions=%d\n", f.cycle_ms.size(), f.admissions);
  std::printf("cycle_p50_ms=%.4f\ncycle_p99_ms=%.4f\ncycle_max_ms=%.4f\n",
              Percentile(f.cycle_ms, 0.5), Percentile(f.cycle_ms, 0.99),
              Percentile(f.cycle_ms, 1.0));
  std::printf("makespan_s=%.0f\nutilisation=%.4f\nutilisation_loaded=%.4f\n", f.makespan,
              f.busy / f.capacity_time, f.loaded_time > 0 ? f.loaded_busy / f.loaded_time : 0);
  for (int q = 0; q < kQueues; ++q) {
    std::printf("queue.q%d.share=%.4f\n", q, f.fair[q] > 0 ? f.used[q] / f.fair[q] : 0);
  }
  std::printf("min_share_ratio=%.4f\n", MinShare(f));
  for (const char* key : {"preemptions.within_queue", "preemptions.reclaim_within_cohort",
                          "shrinks.within_queue", "shrinks.reclaim_within_cohort"}) {
    auto it = f.preemptions.find(key);
    std::printf("%s=%d\n", key, it == f.preemptions.end() ? 0 : it->second);
  }
  const bool ok = Percentile(f.cycle_ms, 0.99) <= 10 && MinShare(f) >= 0.9;
  std::printf("goal_p99_ms=10\ngoal_min_share_ratio=0.9\ngoal_met=%d\n", ok ? 1 : 0);
  if (absl::GetFlag(FLAGS_baseline)) {
    const Figures b = Simulate(jobs, *config, true, trainers, absl::GetFlag(FLAGS_drain_seconds));
    std::printf("baseline.cycle_p99_ms=%.4f\nbaseline.utilisation=%.4f\n",
                Percentile(b.cycle_ms, 0.99), b.busy / b.capacity_time);
    for (int q = 0; q < kQueues; ++q) {
      std::printf("baseline.queue.q%d.share=%.4f\n", q, b.fair[q] > 0 ? b.used[q] / b.fair[q] : 0);
    }
    std::printf("baseline.min_share_ratio=%.4f\n", MinShare(b));
    std::printf("min_share_ratio_vs_baseline=%.3f\nutilisation_vs_baseline=%.3f\n",
                MinShare(f) / MinShare(b), (f.busy / f.capacity_time) / (b.busy / b.capacity_time));
  }
  return 0;
}
