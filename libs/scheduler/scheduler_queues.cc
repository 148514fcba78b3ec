// The Scheduler's queue methods (scheduler.h; the logic is job_queues.h's):
// preemption carried out as drains, queue positions, trainctl queues, and
// the queues file applied at run time and kept in the job log.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/scheduler/scheduler.h"

namespace dtrain {
namespace scheduler {
namespace {

void SetResources(const Resources& r, v1::QueueResources* out) {
  out->set_trainers(r[kTrainers]);
  out->set_cpu_devices(r[kCpuDevices]);
  out->set_cuda_devices(r[kCudaDevices]);
}

}  // namespace

std::vector<JobRef> Scheduler::JobRefs() const {
  std::vector<JobRef> out;
  out.reserve(jobs_.size());
  for (const auto& [id, j] : jobs_) {
    out.push_back({&j.status, j.seq, j.preempting, &j.preempted_for, ShrinkTo(j)});
  }
  return out;
}

int Scheduler::ShrinkTo(const Job& job) const {
  const JobSpec& spec = job.status.spec();
  const int size = job.status.trainers_size();
  const int min = std::max(1, spec.min_trainers());
  if (!queues_.enabled() || min >= size || job.preempting || !MembershipSettled(job)) return 0;
  return min;
}

bool Scheduler::YieldTrainers(Job* job, const Victim& v) {
  const int keep = v.trainers_after;
  JobStatus next = job->status;
  const std::vector<std::string> leaving(next.trainers().begin() + keep, next.trainers().end());
  next.mutable_trainers()->DeleteSubrange(keep, next.trainers_size() - keep);
  next.set_generation(next.generation() + 1);
  // Fewer ranks to compare: the straggler comparison starts again.
  next.clear_stragglers();
  next.clear_rank_step_times();
  SetState(&next, v1::RUNNING,
           absl::StrCat(v.message, "; ", absl::StrJoin(leaving, ", "),
                        leaving.size() == 1 ? " leaves" : " leave",
                        " at a step boundary (generation ", next.generation(), ")"));
  if (absl::Status s = Commit(job, std::move(next)); !s.ok()) {
    LogRefusal(s);
    return false;
  }
  job->recovery_note =
      absl::StrCat("shrank to ", keep, keep == 1 ? " trainer" : " trainers", " (",
                   absl::StrJoin(leaving, ", "), leaving.size() == 1 ? " left)" : " left)");
  job->recovery_trainer.clear();
  job->change = Job::Change::kYield;
  job->stragglers.reset();  // made again for the new world size by StepTimes
  job->rank_done.resize(keep);
  for (const std::string& tid : leaving) {
    auto it = trainers_.find(tid);
    // It stays busy until its final report (or a heartbeat without the
    // job) says it left.
    if (it != trainers_.end()) it->second.leaving_generation = job->status.generation();
  }
  DT_LOG(INFO) << "job " << v.id << ": " << job->status.events().rbegin()->reason();
  return true;
}

double Scheduler::UnrecordedDeviceSeconds(const Job& job) const {
  if (job.status.state() != v1::RUNNING || job.accrued_at == absl::InfinitePast()) return 0;
  const double seconds = std::max(0.0, absl::ToDoubleSeconds(options_.now() - job.accrued_at));
  return seconds * job.status.trainers_size() *
         std::max(1, job.status.spec().devices_per_trainer());
}

void Scheduler::AccrueDeviceSeconds(Job* job, bool running_next) {
  if (queues_.enabled()) {
    const int q = queues_.QueueOf(job->status);
    if (q >= 0) {
      queues_.RecordDeviceSeconds(queues_.config().queues[q].name, job->status.owner(),
                                  UnrecordedDeviceSeconds(*job));
    }
  }
  job->accrued_at = running_next ? options_.now() : absl::InfinitePast();
}

std::string Scheduler::Preempt(Job* job, const std::string& why) {
  const std::vector<JobRef> all = JobRefs();
  const JobRef self{&job->status, job->seq};
  if (const int waiting = JobQueues::WaitingFor(self, all); waiting > 0) {
    return absl::StrCat(why, "; waiting for ", waiting, " preempted ",
                        waiting == 1 ? "job" : "jobs", " to drain");
  }
  if (job->no_victims_at == commits_) return why;  // nothing changed since
  const std::optional<PreemptionDecision> d = queues_.FindVictims(self, all);
  if (!d) {
    job->no_victims_at = commits_;
    return why;
  }
  for (const Victim& v : d->victims) {
    Job& victim = jobs_[v.id];
    if (v.trainers_after > 0) {
      // Elastic: it gives up trainers instead (the preemptor waits for them
      // as for any busy trainer).
      if (!YieldTrainers(&victim, v)) return why;
      queues_.RecordPreemption(v.queue, v);
      continue;
    }
    JobStatus next = victim.status;
    SetState(&next, v1::RUNNING, v.message);
    if (absl::Status s = Commit(&victim, std::move(next)); !s.ok()) {
      LogRefusal(s);
      return why;
    }
    victim.preempting = true;
    victim.preempted_for = job->status.id();
    queues_.RecordPreemption(v.queue, v);
    DT_LOG(INFO) << "job " << v.id << ": " << v.message;
  }
  JobStatus next = job->status;
  SetState(&next, v1::QUEUED, d->message);
  if (absl::Status s = Commit(job, std::move(next)); !s.ok()) LogRefusal(s);
  return absl::StrCat(why, "; ", d->message);
}

void Scheduler::UpdateQueuePositions() {
  if (!queues_.enabled() || positions_at_ == commits_) return;
  positions_at_ = commits_;
  std::map<std::string, int> positions;
  queues_.Summaries(JobRefs(), &positions);
  for (auto& [id, job] : jobs_) {
    auto p = positions.find(id);
    const int position = p == positions.end() ? 0 : p->second;
    if (job.status.queue_position() == position) continue;
    job.status.set_queue_position(position);
    Touch(&job.status);
  }
}

v1::ListQueuesReply Scheduler::ListQueues(bool with_yaml) const {
  absl::MutexLock lock(&mu_);
  v1::ListQueuesReply reply;
  reply.set_configured(queues_.enabled());
  if (!queues_.enabled()) return reply;
  if (with_yaml) reply.set_yaml(queues_.yaml());
  const std::vector<JobRef> all = JobRefs();
  const std::vector<QueueMetrics> metrics =
      queues_.Metrics(all, absl::ToUnixMillis(options_.now()));
  for (size_t q = 0; q < metrics.size(); ++q) {
    const QueueSummary& s = metrics[q].summary;
    const QueueSpec& spec = queues_.config().queues[q];
    v1::QueueStatus* out = reply.add_queues();
    out->set_name(s.name);
    out->set_cohort(s.cohort);
    for (int r = 0; r < kNumResources; ++r) {
      if (s.managed[r]) out->add_resources(ResourceName(r));
    }
    SetResources(s.quota, out->mutable_quota());
    SetResources(s.usage, out->mutable_usage());
    SetResources(s.borrowed, out->mutable_borrowed());
    SetResources(s.lent, out->mutable_lent());
    Resources available = s.available;
    for (int r = 0; r < kNumResources; ++r) {
      if (!s.managed[r]) available[r] = 0;  // not limited here: not shown as a number
    }
    SetResources(available, out->mutable_available());
    out->set_pending(s.pending);
    out->set_admitted(s.admitted);
    out->set_weight(spec.weight);
    if (with_yaml) {
      for (const std::string& u : spec.users) out->add_users(u);
    }
    out->set_within_queue(PolicyName(spec.within_queue));
    out->set_reclaim_within_cohort(PolicyName(spec.reclaim_within_cohort));
    for (const auto& [rule, n] : metrics[q].preemptions) (*out->mutable_preempted())[rule] = n;
    if (with_yaml) {
      // Per user: recorded, plus what running jobs used since.
      struct PerUser {
        double device_seconds = 0;
        int running = 0, pending = 0;
      };
      std::map<std::string, PerUser> users;
      for (const auto& [user, ds] : queues_.DeviceSeconds(spec.name)) {
        users[user].device_seconds = ds;
      }
      for (const auto& [id, job] : jobs_) {
        const v1::JobState state = job.status.state();
        if ((state != v1::RUNNING && state != v1::QUEUED) ||
            queues_.QueueOf(job.status) != static_cast<int>(q)) {
          continue;
        }
        PerUser& u = users[job.status.owner()];
        if (state == v1::QUEUED) {
          ++u.pending;
          continue;
        }
        ++u.running;
        u.device_seconds += UnrecordedDeviceSeconds(job);
      }
      for (const auto& [user, u] : users) {
        v1::QueueUserUsage* usage = out->add_user_usage();
        usage->set_user(user);
        usage->set_device_seconds(u.device_seconds);
        usage->set_running(u.running);
        usage->set_pending(u.pending);
      }
    }
  }
  return reply;
}

absl::StatusOr<v1::ListQueuesReply> Scheduler::ApplyQueues(const std::string& yaml,
                                                           const std::string& who) {
  DT_ASSIGN_OR_RETURN(QueueConfig next, ParseQueueConfig(yaml));
  {
    absl::MutexLock lock(&mu_);
    if (!queues_.enabled()) {
      return absl::FailedPreconditionError(
          "the scheduler runs without queues (one queue, no quota); start it with "
          "--queues=FILE to use queues");
    }
    DT_RETURN_IF_ERROR(queues_.CheckApply(next, JobRefs()));
    {
      v1::QueuesRecord record;
      record.set_id(kQueuesRecordId);
      record.set_yaml(yaml);
      record.set_flag_yaml(options_.queues_yaml);
      record.set_applied_by(who);
      record.set_time_unix_ms(absl::ToUnixMillis(options_.now()));
      if (wal_ != nullptr) {
        if (absl::Status s = wal_->Append(record.SerializeAsString()); !s.ok()) {
          return absl::UnavailableError(absl::StrCat("the scheduler cannot write its job log (",
                                                     s.message(),
                                                     "); the queues were not changed"));
        }
      }
      queues_record_ = std::move(record);
      MaybeCompact();
      queues_.Replace(std::move(next), yaml);
      ++commits_;  // positions and blocked jobs are looked at afresh
      DT_LOG(INFO) << "queues file applied by " << who << ": " << queues_.config().queues.size()
                   << " queues";
      Schedule();
    }
  }
  return ListQueues(/*with_yaml=*/true);
}

absl::Status Scheduler::ReplayQueues(const std::string& record, size_t index) {
  v1::QueuesRecord r;
  if (!r.ParseFromString(record)) {
    return absl::DataLossError(
        absl::StrCat(options_.wal_path, ": record ", index, " is not a queues record"));
  }
  queues_record_ = std::move(r);
  return absl::OkStatus();
}

absl::Status Scheduler::UseAppliedQueues() {
  if (!queues_record_) return absl::OkStatus();
  const v1::QueuesRecord& r = *queues_record_;
  if (!options_.queues || r.flag_yaml() != options_.queues_yaml) {
    DT_LOG(WARNING) << "the queues file " << r.applied_by() << " applied at "
                    << absl::FormatTime(absl::FromUnixMillis(r.time_unix_ms()))
                    << " is not used: the scheduler's --queues file changed since";
    queues_record_.reset();
    return absl::OkStatus();
  }
  absl::StatusOr<QueueConfig> c = ParseQueueConfig(r.yaml());
  if (!c.ok()) {
    return absl::DataLossError(
        absl::StrCat(options_.wal_path, ": the applied queues file: ", c.status().message()));
  }
  queues_.Replace(*std::move(c), r.yaml());
  DT_LOG(INFO) << "using the queues file " << r.applied_by() << " applied at "
               << absl::FormatTime(absl::FromUnixMillis(r.time_unix_ms()))
               << " (the job log) over the --queues file";
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace dtrain
