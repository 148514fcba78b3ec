#include "libs/scheduler/scheduler.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/scheduler/loss_curve.h"
#include "libs/scheduler/spec.h"
#include "libs/security/job_token.h"

namespace dtrain {
namespace scheduler {

namespace {

// KVSTORE jobs whose weights live on the kvstore: every generation of an
// attempt trains in the attempt's own kvstore job (generation 0's).
bool KvstoreHoldsWeights(const JobSpec& spec) {
  return spec.sync().mode() == v1::KVSTORE && (spec.sync().consistency() == v1::ASYNCHRONOUS ||
                                               spec.sync().consistency() == v1::BOUNDED_DELAY);
}

int KvstoreGeneration(const JobSpec& spec, int generation) {
  return KvstoreHoldsWeights(spec) ? 0 : generation;
}

}  // namespace

bool IsFinal(JobState s) { return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED; }

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Open(SchedulerOptions options) {
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(options)));
  absl::MutexLock lock(&s->mu_);
  if (!s->options_.wal_path.empty()) {
    std::vector<std::string> records;
    DT_ASSIGN_OR_RETURN(s->wal_, Wal::Open(s->options_.wal_path, &records));
    DT_RETURN_IF_ERROR(s->Replay(records));
    s->MaybeCompact();
  }
  return s;
}

absl::Status Scheduler::Replay(const std::vector<std::string>& records) {
  for (size_t i = 0; i < records.size(); ++i) {
    JobStatus st;
    if (!st.ParseFromString(records[i]) || st.id().empty()) {
      return absl::DataLossError(
          absl::StrCat(options_.wal_path, ": record ", i, " is not a job status"));
    }
    if (st.id() == kQueuesRecordId) {
      DT_RETURN_IF_ERROR(ReplayQueues(records[i], i));
      continue;
    }
    int64_t n = 0;
    const bool numbered = absl::SimpleAtoi(absl::string_view(st.id()).substr(4), &n);
    if (numbered) next_job_ = std::max(next_job_, n + 1);
    if (st.state() == v1::JOB_STATE_UNSPECIFIED) {
      // A tombstone: the job was dropped after its retention period.
      auto seen = by_request_id_.find(st.submit_request_id());
      if (seen != by_request_id_.end() && seen->second == st.id()) by_request_id_.erase(seen);
      jobs_.erase(st.id());
      continue;
    }
    Job& job = jobs_[st.id()];
    job.status = std::move(st);
    if (!job.status.submit_request_id().empty()) {
      by_request_id_[job.status.submit_request_id()] = job.status.id();
    }
    if (numbered) job.seq = n;
  }
  // Versions handed out before the restart may run ahead of the clock by
  // a microsecond per change made faster than that (a burst of progress
  // reports): starting a second ahead covers a million of them.
  version_ = std::max(version_, absl::ToUnixMicros(absl::Now()) + 1000000);
  const absl::Time adopt_by = options_.now() + options_.heartbeat_timeout;
  for (auto& [id, job] : jobs_) {
    job.status.set_version(NextVersion());
    if (job.status.state() == v1::RUNNING && job.status.trainers_size() == 0) {
      // No placement to adopt (a record no scheduler of this version
      // writes): requeued at once. Not logging this is harmless: replay
      // requeues it again.
      Requeue(&job.status, absl::StrCat(kRestartRequeued, "; it had no placement to adopt"),
              /*counted=*/false);
      continue;
    }
    if (job.status.state() == v1::RUNNING) {
      // Its trainers keep training: they claim it when they register again
      // (see "A restart restarts nothing"); nothing is logged until then.
      job.awaiting_adoption = true;
      job.adopt_by = adopt_by;
      job.rank_done.assign(job.status.trainers_size(), false);
      job.recovered_generation = job.status.generation();
      Kv& kv = kv_[id];
      kv = Kv();
      kv.attempt = job.status.attempts();
      DT_LOG(INFO) << "job " << id << " was running attempt " << job.status.attempts() << " on "
                   << absl::StrJoin(job.status.trainers(), ", ")
                   << "; awaiting its trainers until requeueing it in "
                   << options_.heartbeat_timeout;
    }
  }
  DT_RETURN_IF_ERROR(UseAppliedQueues());
  if (!records.empty()) {
    DT_LOG(INFO) << "replayed " << records.size() << " WAL records: " << jobs_.size() << " jobs";
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Persist(const JobStatus& status, absl::string_view refused) {
  if (wal_ == nullptr) return absl::OkStatus();
  absl::Status s = wal_->Append(status.SerializeAsString());
  if (s.ok()) return s;
  return absl::UnavailableError(
      absl::StrCat("the scheduler cannot write its job log (", s.message(), "); ", refused));
}

absl::Status Scheduler::Commit(Job* job, JobStatus next) {
  DT_RETURN_IF_ERROR(
      Persist(next, absl::StrCat(next.id(), " is unchanged (the change to ",
                                 v1::JobState_Name(next.state()), " was not made)")));
  AccrueDeviceSeconds(job, next.state() == v1::RUNNING);
  job->status = std::move(next);
  ++commits_;
  if (job->status.state() != v1::RUNNING) {
    kv_.erase(job->status.id());
    job->preempting = false;
    job->awaiting_adoption = false;
  }
  MaybeCompact();
  return absl::OkStatus();
}

void Scheduler::LogRefusal(const absl::Status& s) {
  const absl::Time now = absl::Now();
  if (now - last_refusal_log_ < absl::Seconds(10)) return;
  last_refusal_log_ = now;
  DT_LOG(ERROR) << s << " (a change the scheduler makes itself; retried on the next heartbeat or "
                << "liveness check)";
}

std::vector<std::string> Scheduler::Snapshot() const {
  std::vector<std::string> records;
  const std::string last = absl::StrFormat("job-%06d", next_job_ - 1);
  if (next_job_ > 1 && jobs_.count(last) == 0) {
    // Keeps the id counter: ids of dropped jobs are never reused.
    JobStatus tombstone;
    tombstone.set_id(last);
    records.push_back(tombstone.SerializeAsString());
  }
  if (queues_record_) records.push_back(queues_record_->SerializeAsString());
  for (const auto& [id, job] : jobs_) records.push_back(job.status.SerializeAsString());
  return records;
}

void Scheduler::MaybeCompact(bool dropped) {
  if (wal_ == nullptr) return;
  const int64_t live = static_cast<int64_t>(jobs_.size()) + 1;
  if (wal_->records() <= 2 * live + (dropped ? 0 : 64) || wal_->records() < next_compaction_) {
    return;
  }
  const int64_t before = wal_->records();
  absl::Status s = wal_->Compact(Snapshot());
  if (!s.ok()) {
    // Compaction only saves space: try again after another 64 records.
    next_compaction_ = before + 64;
    DT_LOG(WARNING) << "compacting the job log: " << s;
    return;
  }
  next_compaction_ = 0;
  DT_LOG(INFO) << "compacted " << wal_->path() << " from " << before << " to " << wal_->records()
               << " records";
}

void Scheduler::SetState(JobStatus* status, JobState state, const std::string& reason) {
  status->set_state(state);
  v1::JobEvent* e = status->add_events();
  e->set_time_unix_ms(absl::ToUnixMillis(options_.now()));
  e->set_state(state);
  e->set_reason(reason);
  Touch(status);
}

absl::StatusOr<JobStatus> Scheduler::Submit(JobSpec spec, const std::string& request_id,
                                            const std::string& owner) {
  if (request_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: at most 128 bytes, got ", request_id.size()));
  }
  DT_RETURN_IF_ERROR(ValidateJobSpec(spec));
  ApplyDefaults(&spec);
  absl::MutexLock lock(&mu_);
  if (!request_id.empty()) {
    auto seen = by_request_id_.find(request_id);
    if (seen != by_request_id_.end()) return jobs_[seen->second].status;  // a retry
  }
  DT_ASSIGN_OR_RETURN(std::string queue, queues_.ForSubmit(spec, owner));
  if (options_.max_queued_jobs_per_user > 0) {
    int queued = 0;
    for (const auto& [unused, j] : jobs_) {
      if (j.status.state() == v1::QUEUED && j.status.owner() == owner) ++queued;
    }
    if (queued >= options_.max_queued_jobs_per_user) {
      return absl::ResourceExhaustedError(
          absl::StrCat("user ", Quote(owner), " already has ", queued,
                       " queued jobs, the limit per user (scheduler --max_queued_jobs_per_user=",
                       options_.max_queued_jobs_per_user,
                       "); wait for some to start or cancel some, then submit again"));
    }
  }
  std::string id = absl::StrFormat("job-%06d", next_job_);
  Job job;
  job.seq = next_job_;
  job.status.set_id(id);
  job.status.set_submit_request_id(request_id);
  job.status.set_owner(owner);
  job.status.set_queue(std::move(queue));
  *job.status.mutable_spec() = std::move(spec);
  job.status.set_test_accuracy(-1);
  job.status.set_submit_time_unix_ms(absl::ToUnixMillis(options_.now()));
  SetState(&job.status, v1::QUEUED, "submitted");
  DT_RETURN_IF_ERROR(Persist(job.status, "the job was not submitted"));
  ++commits_;
  ++next_job_;
  if (!request_id.empty()) by_request_id_[request_id] = id;
  jobs_[id] = std::move(job);
  Schedule();
  return jobs_[id].status;
}

absl::StatusOr<JobStatus> Scheduler::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", Quote(id)));
  return it->second.status;
}

std::vector<JobStatus> Scheduler::List(JobState state) const {
  absl::MutexLock lock(&mu_);
  std::vector<const Job*> sorted;
  for (const auto& [id, job] : jobs_) {
    if (state == v1::JOB_STATE_UNSPECIFIED || job.status.state() == state) sorted.push_back(&job);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const Job* a, const Job* b) { return a->seq < b->seq; });
  std::vector<JobStatus> out;
  for (const Job* j : sorted) out.push_back(j->status);
  return out;
}

absl::StatusOr<JobPage> Scheduler::ListPage(JobState state, int page_size,
                                            const std::string& page_token,
                                            const std::string* owner) const {
  if (page_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_size: must be >= 0, got ", page_size));
  }
  if (page_size == 0) page_size = kDefaultListPageSize;
  page_size = std::min(page_size, kMaxListPageSize);
  // The token is the arrival number of the last job of the previous page:
  // the next page starts after it, whatever was added or dropped since.
  int64_t after = 0;
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &after) || after < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: ", Quote(page_token), " is not one a List reply gave"));
  }
  absl::MutexLock lock(&mu_);
  std::vector<const Job*> sorted;
  for (const auto& [id, job] : jobs_) {
    if (job.seq <= after && !page_token.empty()) continue;
    if (owner != nullptr && job.status.owner() != *owner) continue;
    if (state == v1::JOB_STATE_UNSPECIFIED || job.status.state() == state) sorted.push_back(&job);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const Job* a, const Job* b) { return a->seq < b->seq; });
  JobPage page;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i == static_cast<size_t>(page_size)) {
      page.next_page_token = absl::StrCat(sorted[i - 1]->seq);
      break;
    }
    page.jobs.push_back(sorted[i]->status);
  }
  return page;
}

absl::StatusOr<JobStatus> Scheduler::Cancel(const std::string& id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", Quote(id)));
  Job& job = it->second;
  if (IsFinal(job.status.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " already finished (",
                                                      v1::JobState_Name(job.status.state()), ")"));
  }
  const std::vector<std::string> placed = Placement(job);
  JobStatus next = job.status;
  SetState(&next, v1::CANCELLED, reason.empty() ? "cancelled by user" : reason);
  DT_RETURN_IF_ERROR(Commit(&job, std::move(next)));
  ReleaseTrainers(id, placed, "");
  Schedule();
  return job.status;
}

absl::StatusOr<JobStatus> Scheduler::WaitForChange(const std::string& id, int64_t after_version,
                                                   absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_.find(id);
    return it == jobs_.end() || it->second.status.version() > after_version;
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", Quote(id)));
  return it->second.status;
}

absl::StatusOr<RegisterTrainerReply> Scheduler::RegisterTrainer(
    const RegisterTrainerRequest& request) {
  Trainer t;
  if (request.devices().empty()) {
    return absl::InvalidArgumentError("devices: a trainer needs at least one device");
  }
  for (const std::string& d : request.devices()) {
    std::string kind = d.substr(0, d.find(':'));
    if (kind != "cpu" && kind != "cuda") {
      return absl::InvalidArgumentError(
          absl::StrCat("devices: '", d, "' is not cpu, cpu:N, cuda or cuda:N"));
    }
    ++t.devices[kind];
  }
  absl::MutexLock lock(&mu_);
  t.order = next_trainer_++;
  t.name = request.name();
  t.last_heartbeat = options_.now();
  Job* claimed = Claim(request, &t);
  if (claimed == nullptr) {
    // Not an id a trainer holds, nor one a job awaiting adoption names (a
    // scheduler restarted within the second numbers its trainers alike).
    auto taken = [&](const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (trainers_.count(id) > 0) return true;
      for (const auto& [unused, j] : jobs_) {
        if (!j.awaiting_adoption) continue;
        for (const std::string& tid : j.status.trainers()) {
          if (tid == id) return true;
        }
      }
      return false;
    };
    for (;;) {
      t.id = absl::StrCat("trainer-", absl::ToUnixSeconds(options_.now()) % 1000000, "-", t.order);
      if (!taken(t.id)) break;
      t.order = next_trainer_++;
    }
  }
  DT_LOG(INFO) << "trainer " << t.id << " (" << t.name << ") registered with "
               << absl::StrJoin(request.devices(), ",")
               << (claimed != nullptr
                       ? absl::StrCat(", claiming rank ", t.rank, " of job ", t.job_id, " attempt ",
                                      claimed->status.attempts())
                       : "");
  std::string id = t.id;
  trainers_[id] = std::move(t);
  if (claimed != nullptr) MaybeAdopt(claimed);
  RegisterTrainerReply reply;
  reply.set_trainer_id(id);
  reply.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  Schedule();
  return reply;
}

Scheduler::Job* Scheduler::Claim(const RegisterTrainerRequest& request, Trainer* t) {
  if (request.previous_trainer_id().empty() || !request.has_running()) return nullptr;
  const RegisterTrainerRequest::RunningWork& w = request.running();
  auto jt = jobs_.find(w.job_id());
  if (auto rt = trainers_.find(request.previous_trainer_id());
      jt != jobs_.end() && rt != trainers_.end() && rt->second.job_id == w.job_id() &&
      rt->second.rank == w.rank() && rt->second.delivered) {
    // The same claim again: a registration retried after its reply was lost
    // (a deadline while the restarted scheduler was busy). The trainer keeps
    // its id and rank; registering it anew would make it a stranger whose
    // heartbeats cancel the job it runs.
    t->id = rt->second.id;
    t->job_id = rt->second.job_id;
    t->rank = rt->second.rank;
    t->delivered = true;
    t->join = false;
    t->generation = rt->second.generation;
    return &jt->second;
  }
  std::string why;
  if (jt == jobs_.end()) {
    why = "no such job";
  } else if (!jt->second.awaiting_adoption || jt->second.status.state() != v1::RUNNING) {
    why = "the job is not awaiting adoption";
  } else if (w.attempt() != jt->second.status.attempts()) {
    why = absl::StrCat("the job's attempt is ", jt->second.status.attempts());
  } else if (w.rank() < 0 || w.rank() >= jt->second.status.trainers_size() ||
             jt->second.status.trainers(w.rank()) != request.previous_trainer_id()) {
    why = "that rank is not this trainer's in the job's placement";
  } else if (trainers_.count(request.previous_trainer_id()) > 0) {
    why = "a trainer with that id is registered";
  } else if (w.generation() > jt->second.status.generation()) {
    why = absl::StrCat("the job's generation is ", jt->second.status.generation());
  } else if (!Fits(*t, jt->second.status.spec())) {
    why = "the trainer lacks the job's devices";
  }
  if (!why.empty()) {
    DT_LOG(INFO) << "trainer " << request.previous_trainer_id() << " (" << request.name()
                 << ") claims rank " << w.rank() << " of job " << w.job_id() << " attempt "
                 << w.attempt() << ": not adopted (" << why << "); registered as a new trainer";
    return nullptr;
  }
  Job& job = jt->second;
  t->id = request.previous_trainer_id();
  t->job_id = job.status.id();
  t->rank = w.rank();
  t->delivered = true;
  t->join = false;
  // An older generation: the heartbeats offer the newer one as a regroup.
  t->generation = w.generation();
  if (w.rank() == 0 && (w.epoch() > job.status.epoch() ||
                        (w.epoch() == job.status.epoch() && w.step() > job.status.step()))) {
    // Progress since the last logged epoch (rank 0's reports say the rest).
    job.status.set_epoch(w.epoch());
    job.status.set_step(w.step());
    Touch(&job.status);
  }
  return &job;
}

void Scheduler::MaybeAdopt(Job* job) {
  if (!job->awaiting_adoption) return;
  for (const std::string& tid : job->status.trainers()) {
    auto it = trainers_.find(tid);
    if (it == trainers_.end() || !InPlacement(*job, it->second)) return;
  }
  job->awaiting_adoption = false;
  job->adopt_by = absl::InfiniteFuture();
  const int n = job->status.trainers_size();
  JobStatus next = job->status;
  SetState(&next, v1::RUNNING,
           absl::StrCat("scheduler restarted; adopted the running attempt ", next.attempts(),
                        " from its ", n, " trainer", n == 1 ? "" : "s"));
  if (absl::Status s = Commit(job, next); !s.ok()) {
    // Adopted all the same: the event is the only change.
    LogRefusal(s);
    job->status = std::move(next);
  }
  DT_LOG(INFO) << "job " << job->status.id() << ": " << job->status.events().rbegin()->reason();
}

bool Scheduler::RequeueUnclaimed() {
  bool requeued = false;
  const absl::Time now = options_.now();
  for (auto& [id, job] : jobs_) {
    if (!job.awaiting_adoption || now < job.adopt_by) continue;
    std::vector<std::string> unclaimed;
    for (int rank = 0; rank < job.status.trainers_size(); ++rank) {
      auto it = trainers_.find(job.status.trainers(rank));
      if (it == trainers_.end() || !InPlacement(job, it->second)) {
        unclaimed.push_back(absl::StrCat(rank, " (", job.status.trainers(rank), ")"));
      }
    }
    const std::vector<std::string> placed = Placement(job);
    JobStatus next = job.status;
    Requeue(&next,
            absl::StrCat(kRestartRequeued, "; rank", unclaimed.size() == 1 ? " " : "s ",
                         absl::StrJoin(unclaimed, ", "), " not claimed by a trainer within ",
                         absl::FormatDuration(options_.heartbeat_timeout)),
            /*counted=*/false);
    if (absl::Status s = Commit(&job, std::move(next)); !s.ok()) {
      LogRefusal(s);  // the next liveness check tries again
      continue;
    }
    ReleaseTrainers(id, placed, "");
    requeued = true;
    DT_LOG(WARNING) << "job " << id << ": " << job.status.events().rbegin()->reason();
  }
  return requeued;
}

absl::Status Scheduler::UnknownTrainer(const std::string& trainer_id) const {
  for (const auto& [id, job] : jobs_) {
    if (!job.awaiting_adoption) continue;
    for (const std::string& tid : job.status.trainers()) {
      if (tid == trainer_id) {
        return absl::UnavailableError(
            absl::StrCat("the scheduler restarted and waits for trainer '", trainer_id, "' (job ",
                         id, ") to register again; try again"));
      }
    }
  }
  return absl::NotFoundError(absl::StrCat("unknown trainer '", trainer_id, "'"));
}

absl::StatusOr<HeartbeatReply> Scheduler::Heartbeat(const HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = trainers_.find(request.trainer_id());
  if (it == trainers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown trainer '", request.trainer_id(), "'; register again"));
  }
  Trainer& t = it->second;
  t.last_heartbeat = options_.now();
  if (request.draining() && !t.draining) {
    // Its next heartbeat tries again when the log refuses.
    if (absl::Status s = StartDrain(&t, "it is going away"); !s.ok()) LogRefusal(s);
  }
  HeartbeatReply reply;
  for (const std::string& id : request.peer_lost_job_ids()) {
    auto jt = jobs_.find(id);
    if (id != t.job_id || jt == jobs_.end() || jt->second.status.state() != v1::RUNNING ||
        !InPlacement(jt->second, t)) {
      continue;
    }
    Job& job = jt->second;
    if (!job.peer_lost) {
      DT_LOG(INFO) << "job " << id << ": trainer " << t.id << " lost a peer";
    }
    job.peer_lost = true;
    const absl::Time now = options_.now();
    for (const std::string& other : Placement(job)) {
      auto ot = trainers_.find(other);
      if (other == t.id || ot == trainers_.end()) continue;
      const absl::Duration silent = now - ot->second.last_heartbeat;
      if (silent > PeerLostTimeout()) {
        LoseTrainer(other, absl::StrCat("a peer's collectives failed and it has not heartbeated "
                                        "for ",
                                        absl::FormatDuration(silent)));
      }
    }
  }
  std::set<std::string> running(request.running_job_ids().begin(), request.running_job_ids().end());
  // Jobs the trainer still runs but should not (cancelled, reassigned).
  for (const std::string& id : running) {
    if (id != t.job_id) t.cancels.push_back(id);
  }
  if (!t.job_id.empty() && t.delivered && running.count(t.job_id) == 0) {
    // It dropped the job without a final report (it restarted, say).
    auto jt = jobs_.find(t.job_id);
    bool release = true;
    if (jt != jobs_.end() && jt->second.status.state() == v1::RUNNING &&
        InPlacement(jt->second, t)) {
      const std::vector<std::string> placed = Placement(jt->second);
      JobStatus next = jt->second.status;
      SetState(&next, v1::FAILED,
               absl::StrCat("trainer ", t.id, " stopped running the job without reporting why"));
      absl::Status s = Commit(&jt->second, std::move(next));
      if (s.ok()) {
        ReleaseTrainers(jt->first, placed, t.id);
      } else {
        // Nothing changes; the next heartbeat tries again. The heartbeat
        // itself succeeds: liveness does not depend on the log.
        LogRefusal(s);
        release = false;
      }
    }
    if (release) {
      t.job_id.clear();
      t.rank = -1;
      t.delivered = false;
    }
  }
  if (!t.job_id.empty() && !t.delivered) {
    auto jt = jobs_.find(t.job_id);
    if (jt != jobs_.end()) {
      Assignment* a = reply.add_assignments();
      a->set_job_id(t.job_id);
      *a->mutable_spec() = jt->second.status.spec();
      a->set_rank(t.rank);
      a->set_world_size(jt->second.status.trainers_size());
      a->set_attempt(jt->second.status.attempts());
      a->set_resume_checkpoint(jt->second.status.checkpoint_path());
      a->set_resume_epoch(jt->second.status.checkpoint_epoch());
      a->set_resume_step(jt->second.status.checkpoint_step());
      *a->mutable_trainer_ids() = jt->second.status.trainers();
      if (!options_.job_token_secret.empty() && a->spec().sync().mode() == v1::KVSTORE) {
        a->set_kvstore_token(security::MintJobToken(
            options_.job_token_secret,
            security::KvstoreJobName(a->job_id(), a->attempt(),
                                     KvstoreGeneration(a->spec(), jt->second.status.generation())),
            options_.now() + options_.job_token_lifetime, a->world_size()));
      }
      // Every job: a KVSTORE job's ranks meet over a host communicator too
      // when they recover in place.
      if (!options_.job_token_secret.empty()) {
        a->set_collective_secret(
            security::CollectiveSecret(options_.job_token_secret, a->job_id(), a->attempt()));
      }
      a->set_generation(jt->second.status.generation());
      a->set_join(t.join);
      t.delivered = true;
    }
  }
  if (!t.job_id.empty() && t.delivered) {
    // Also to an earlier generation's joiner, for the generations after its
    // own.
    auto jt = jobs_.find(t.job_id);
    if (jt != jobs_.end() && jt->second.status.state() == v1::RUNNING &&
        jt->second.status.generation() > t.generation &&
        (InPlacement(jt->second, t) || t.leaving_generation == jt->second.status.generation())) {
      v1::Regroup* g = reply.add_regroups();
      g->set_job_id(t.job_id);
      g->set_attempt(jt->second.status.attempts());
      g->set_generation(jt->second.status.generation());
      *g->mutable_trainer_ids() = jt->second.status.trainers();
      if (!options_.job_token_secret.empty() &&
          jt->second.status.spec().sync().mode() == v1::KVSTORE) {
        g->set_kvstore_token(security::MintJobToken(
            options_.job_token_secret,
            security::KvstoreJobName(t.job_id, g->attempt(),
                                     KvstoreGeneration(jt->second.status.spec(), g->generation())),
            options_.now() + options_.job_token_lifetime, g->trainer_ids_size()));
      }
    }
  }
  if (!t.job_id.empty() && t.delivered) {
    auto jt = jobs_.find(t.job_id);
    if (t.draining || (jt != jobs_.end() && jt->second.preempting)) {
      reply.add_drain_job_ids(t.job_id);
    }
  }
  for (std::string& c : t.cancels) reply.add_cancel_job_ids(std::move(c));
  t.cancels.clear();
  Schedule();
  return reply;
}

absl::StatusOr<bool> Scheduler::ReportProgress(const ProgressReport& report) {
  absl::MutexLock lock(&mu_);
  auto tt = trainers_.find(report.trainer_id());
  if (tt == trainers_.end()) return UnknownTrainer(report.trainer_id());
  Trainer& t = tt->second;
  t.last_heartbeat = options_.now();
  auto jt = jobs_.find(report.job_id());
  if (jt == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", Quote(report.job_id())));
  }
  Job& job = jt->second;
  ProgressReport r = report;
  if (t.job_id == r.job_id() && t.rank != r.rank() && r.attempt() == job.status.attempts() &&
      r.generation() < job.status.generation()) {
    // Sent under an earlier membership of this attempt (an elastic job's
    // ranks were renumbered and this one has not regrouped yet).
    if (r.final_state() == v1::JOB_STATE_UNSPECIFIED) return false;
    r.set_rank(t.rank);
  }
  if (t.job_id != r.job_id() || t.rank != r.rank()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", r.job_id(), " rank ", r.rank(), " is not assigned to trainer ", t.id));
  }
  const bool final = r.final_state() != v1::JOB_STATE_UNSPECIFIED;
  if (r.attempt() > 0 && r.attempt() != job.status.attempts()) {
    // An earlier attempt still winding down on a trainer that may already
    // hold the current one: it only learns to stop.
    return true;
  }
  if (job.status.state() != v1::RUNNING || !InPlacement(job, t)) {
    // Cancelled (or failed by another rank) while this one was working.
    if (final) {
      t.job_id.clear();
      t.rank = -1;
      t.delivered = false;
      Schedule();
    }
    return true;
  }
  // The job's status after this report; it replaces job.status only once
  // logged (when it must be).
  JobStatus next = job.status;
  bool log = false;
  if (r.has_step_times() && r.step_times().steps() > 0) StepTimes(&job, t, r, &next);
  // A recovery report (OnRecovered) carries no progress.
  if (r.rank() == 0 && r.recovery_seconds() == 0) {
    const bool new_epoch = r.epoch() > next.epoch();
    next.set_epoch(r.epoch());
    next.set_step(r.step());
    next.set_loss(r.loss());
    next.set_train_accuracy(r.train_accuracy());
    next.set_test_accuracy(r.test_accuracy());
    next.set_samples_per_second(r.samples_per_second());
    next.set_achieved_gflops(r.achieved_gflops());
    next.set_mfu(r.mfu());
    if (r.steps_per_epoch() > 0) next.set_steps_per_epoch(r.steps_per_epoch());
    MergeStepLosses(r.step_losses(), &next);
    if (r.epoch_seconds() > 0) next.set_epoch_seconds(r.epoch_seconds());
    if (r.data_train_samples() > 0) {
      next.set_data_train_samples(r.data_train_samples());
      next.set_data_test_samples(r.data_test_samples());
      next.set_data_corrupt_skipped(r.data_corrupt_skipped());
    }
    const bool new_checkpoint = !r.checkpoint_path().empty() &&
                                (r.checkpoint_epoch() > 0 || r.checkpoint_step() > 0) &&
                                (r.checkpoint_path() != next.checkpoint_path() ||
                                 r.checkpoint_epoch() != next.checkpoint_epoch() ||
                                 r.checkpoint_step() != next.checkpoint_step());
    if (new_checkpoint) {
      next.set_checkpoint_path(r.checkpoint_path());
      next.set_checkpoint_epoch(r.checkpoint_epoch());
      next.set_checkpoint_step(r.checkpoint_step());
    }
    Touch(&next);
    // Steps, losses and rates between epochs are not logged.
    log = new_epoch || new_checkpoint;
  }
  bool settled = false;  // the current generation's change completed
  if (r.recovery_seconds() > 0 && r.generation() == next.generation() &&
      r.generation() > job.recovered_generation) {
    if (job.change == Job::Change::kReplace && job.lost_at != absl::InfinitePast()) {
      // Kvstore-held weights: the replacement cannot know when its
      // predecessor died; count from its last sign of life.
      r.set_recovery_seconds(
          std::max(r.recovery_seconds(), absl::ToDoubleSeconds(options_.now() - job.lost_at)));
    }
    settled = true;
    const std::string lost =
        absl::StrFormat("(generation %d, %d step%s lost)", r.generation(), r.recovery_steps_lost(),
                        r.recovery_steps_lost() == 1 ? "" : "s");
    if (job.change == Job::Change::kGrow || job.change == Job::Change::kYield) {
      SetState(&next, v1::RUNNING,
               absl::StrFormat("%s in %.1f s (generation %d)", job.recovery_note,
                               r.recovery_seconds(), r.generation()));
    } else {
      next.set_recoveries(next.recoveries() + 1);
      next.set_last_recovery_seconds(r.recovery_seconds());
      next.set_steps_lost(next.steps_lost() + r.recovery_steps_lost());
      SetState(
          &next, v1::RUNNING,
          job.change == Job::Change::kShrink
              ? absl::StrFormat("%s; continued on %d trainer%s in %.1f s %s", job.recovery_note,
                                next.trainers_size(), next.trainers_size() == 1 ? "" : "s",
                                r.recovery_seconds(), lost)
              : absl::StrFormat("%s; recovered in place on trainer %s in %.1f s %s",
                                job.recovery_note, job.recovery_trainer, r.recovery_seconds(),
                                lost));
    }
    log = true;
  }
  const bool recovered = next.recoveries() > job.status.recoveries();
  if (settled) {
    DT_RETURN_IF_ERROR(Commit(&job, std::move(next)));
    next = job.status;
    job.recovered_generation = r.generation();
    job.peer_lost = false;
    DT_LOG(INFO) << "job " << job.status.id() << ": " << job.status.events().rbegin()->reason();
    log = false;
  }
  if (recovered) {
    ++recoveries_;
    recovery_sum_ += r.recovery_seconds();
    size_t bucket = 0;
    while (bucket < std::size(kRecoverySecondsBounds) &&
           r.recovery_seconds() > kRecoverySecondsBounds[bucket]) {
      ++bucket;
    }
    recovery_counts_.resize(std::size(kRecoverySecondsBounds) + 1);
    ++recovery_counts_[bucket];
  }
  if (!final) {
    if (log) {
      DT_RETURN_IF_ERROR(Commit(&job, std::move(next)));
    } else {
      job.status = std::move(next);
    }
    if (settled) Schedule();  // an elastic job may grow now
    return false;
  }
  const std::vector<std::string> placed = Placement(job);
  if (r.final_state() == v1::SUCCEEDED) {
    bool all_done = true;
    for (size_t rank = 0; rank < job.rank_done.size(); ++rank) {
      all_done = all_done && (job.rank_done[rank] || static_cast<int>(rank) == r.rank());
    }
    if (all_done) {
      SetState(&next, v1::SUCCEEDED, r.reason().empty() ? "training finished" : r.reason());
      DT_RETURN_IF_ERROR(Commit(&job, std::move(next)));
    } else if (log) {
      DT_RETURN_IF_ERROR(Commit(&job, std::move(next)));
    } else {
      job.status = std::move(next);
    }
    if (r.rank() >= 0 && r.rank() < static_cast<int>(job.rank_done.size())) {
      job.rank_done[r.rank()] = true;
    }
  } else if (r.final_state() == v1::FAILED && r.retryable() && r.drained() && r.rank() != 0) {
    // Drained: rank 0's report (with the checkpoint) requeues the job; this
    // rank's trainer is free (or stays DRAINING).
    if (r.rank() >= 0 && r.rank() < static_cast<int>(job.rank_done.size())) {
      job.rank_done[r.rank()] = true;
    }
    job.status = std::move(next);
  } else {
    JobState state = r.final_state() == v1::CANCELLED ? v1::CANCELLED : v1::FAILED;
    const std::string why = absl::StrCat("rank ", r.rank(), " on trainer ", t.id, ": ",
                                         r.reason().empty() ? "no reason given" : r.reason());
    const bool drained = state == v1::FAILED && r.retryable() && r.drained();
    const bool requeue =
        drained || (state == v1::FAILED && r.retryable() && options_.requeue_on_trainer_loss);
    if (drained) next.set_drains(next.drains() + 1);
    if (requeue) {
      Requeue(&next, why);
    } else {
      SetState(&next, state, why);
    }
    DT_RETURN_IF_ERROR(Commit(&job, std::move(next)));
    ReleaseTrainers(job.status.id(), placed, t.id);
    if (requeue && !drained) {
      // A peer may be dead without being declared lost yet: the others must
      // show they are alive before the job is placed on them again.
      const absl::Time now = options_.now();
      for (const std::string& tid : placed) {
        auto other = trainers_.find(tid);
        if (tid != t.id && other != trainers_.end()) other->second.placeable_after = now;
      }
    }
  }
  t.job_id.clear();
  t.rank = -1;
  t.delivered = false;
  Schedule();
  return false;
}

void Scheduler::StepTimes(Job* job, const Trainer& t, const ProgressReport& r, JobStatus* next) {
  const int world = next->trainers_size();
  if (r.rank() < 0 || r.rank() >= world) return;
  while (next->rank_step_times_size() < world) next->add_rank_step_times();
  *next->mutable_rank_step_times(r.rank()) = r.step_times();
  if (job->stragglers == nullptr) {
    job->stragglers = std::make_unique<StragglerDetector>(world, options_.stragglers);
  }
  const std::optional<StragglerChange> c = job->stragglers->Observe(r.rank(), r.step_times());
  // The listed straggler's ratio follows its reports.
  for (v1::Straggler& s : *next->mutable_stragglers()) {
    if (s.rank() == r.rank()) s.set_ratio(job->stragglers->ratio(r.rank()));
  }
  if (!c.has_value()) return;
  // Not logged on its own: the next logged change (an epoch, a checkpoint,
  // the end) carries it.
  if (c->straggler) {
    v1::Straggler* s = next->add_stragglers();
    s->set_rank(c->rank);
    s->set_trainer(t.id);
    s->set_ratio(c->ratio);
    s->set_phase(c->phase);
    s->set_since_unix_ms(absl::ToUnixMillis(options_.now()));
    ++stragglers_detected_;
    SetState(next, v1::RUNNING,
             absl::StrFormat("straggler: rank %d on trainer %s is %.1fx slower than the median of "
                             "the other ranks, in %s",
                             c->rank, t.id, c->ratio, c->phase));
  } else {
    auto* list = next->mutable_stragglers();
    for (int i = 0; i < list->size(); ++i) {
      if (list->Get(i).rank() == c->rank) {
        list->DeleteSubrange(i, 1);
        break;
      }
    }
    SetState(next, v1::RUNNING,
             absl::StrFormat("straggler no more: rank %d on trainer %s is within %.2fx of the "
                             "median of the other ranks",
                             c->rank, t.id, c->ratio));
  }
  DT_LOG(INFO) << "job " << next->id() << ": " << next->events().rbegin()->reason();
}

bool Scheduler::InPlacement(const Job& job, const Trainer& t) {
  return t.job_id == job.status.id() && t.rank >= 0 && t.rank < job.status.trainers_size() &&
         job.status.trainers(t.rank) == t.id;
}

void Scheduler::Requeue(JobStatus* status, const std::string& why, bool counted) {
  // Drained attempts do not count, nor those a scheduler restart requeued.
  int restarts = 0;
  for (const v1::JobEvent& e : status->events()) {
    if (e.state() == v1::QUEUED && absl::StartsWith(e.reason(), kRestartRequeued)) ++restarts;
  }
  if (counted && status->attempts() - status->drains() - restarts >= options_.max_attempts) {
    SetState(status, v1::FAILED,
             absl::StrCat(why, "; not requeued: the job has been placed ", status->attempts(),
                          " times (the limit)"));
    return;
  }
  status->clear_trainers();
  const std::string at = status->checkpoint_step() > 0
                             ? absl::StrCat("epoch ", status->checkpoint_epoch() + 1, " step ",
                                            status->checkpoint_step())
                             : absl::StrCat("epoch ", status->checkpoint_epoch());
  SetState(status, v1::QUEUED,
           status->checkpoint_path().empty()
               ? absl::StrCat(why, "; requeued from the start (no checkpoint yet)")
               : absl::StrCat(why, "; requeued, resuming from ", status->checkpoint_path(), " (",
                              at, ")"));
}

absl::Status Scheduler::StartDrain(Trainer* t, const std::string& why) {
  if (!t->job_id.empty() && !t->delivered) {
    auto jt = jobs_.find(t->job_id);
    if (jt != jobs_.end() && jt->second.status.state() == v1::RUNNING &&
        InPlacement(jt->second, *t)) {
      const std::vector<std::string> placed = Placement(jt->second);
      JobStatus next = jt->second.status;
      next.set_drains(next.drains() + 1);
      Requeue(&next, absl::StrCat("trainer ", t->id, " is draining (", why,
                                  ") and had not received the job"));
      DT_RETURN_IF_ERROR(Commit(&jt->second, std::move(next)));
      ReleaseTrainers(jt->first, placed, t->id);
    }
    t->job_id.clear();
    t->rank = -1;
    t->delivered = false;
  }
  if (!t->draining) {
    DT_LOG(INFO) << "trainer " << t->id << " (" << t->name << ") draining: " << why;
  }
  t->draining = true;
  return absl::OkStatus();
}

v1::TrainerStatus Scheduler::ToStatus(const Trainer& t, v1::TrainerState state) {
  v1::TrainerStatus s;
  s.set_id(t.id);
  s.set_name(t.name);
  for (const auto& [kind, count] : t.devices) s.add_devices(absl::StrCat(count, " ", kind));
  s.set_state(state);
  if (!t.job_id.empty()) s.add_job_ids(t.job_id);
  s.set_rank(t.job_id.empty() ? -1 : t.rank);
  s.set_last_heartbeat_unix_ms(absl::ToUnixMillis(t.last_heartbeat));
  return s;
}

absl::StatusOr<v1::TrainerStatus> Scheduler::DrainTrainer(const std::string& trainer) {
  absl::MutexLock lock(&mu_);
  auto it = trainers_.find(trainer);
  if (it == trainers_.end()) {
    int matches = 0;
    for (auto t = trainers_.begin(); t != trainers_.end(); ++t) {
      if (!trainer.empty() && t->second.name == trainer) {
        ++matches;
        it = t;
      }
    }
    if (matches == 0) {
      return absl::NotFoundError(
          absl::StrCat("no trainer with id or name '", trainer, "' (see trainctl trainers)"));
    }
    if (matches > 1) {
      return absl::InvalidArgumentError(absl::StrCat("trainer: ", matches, " trainers are named '",
                                                     trainer, "'; name one by its id"));
    }
  }
  DT_RETURN_IF_ERROR(StartDrain(&it->second, "drained by an operator"));
  Schedule();
  return ToStatus(it->second, v1::DRAINING);
}

std::vector<v1::TrainerStatus> Scheduler::ListTrainers() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::TrainerStatus> out;
  for (const auto& [id, t] : trainers_) {
    out.push_back(ToStatus(t, t.draining ? v1::DRAINING : t.job_id.empty() ? v1::IDLE : v1::BUSY));
  }
  out.insert(out.end(), lost_.begin(), lost_.end());
  return out;
}

std::vector<std::string> Scheduler::Placement(const Job& job) {
  return std::vector<std::string>(job.status.trainers().begin(), job.status.trainers().end());
}

void Scheduler::ReleaseTrainers(const std::string& job_id, const std::vector<std::string>& placed,
                                const std::string& except) {
  for (const std::string& tid : placed) {
    auto it = trainers_.find(tid);
    if (it == trainers_.end() || it->second.job_id != job_id) continue;
    Trainer& t = it->second;
    if (tid != except && t.delivered) {
      // It is working on the job: it stops and sends a final report, which
      // finds the job finished. Until then it stays busy.
      t.cancels.push_back(job_id);
      continue;
    }
    t.job_id.clear();
    t.rank = -1;
    t.delivered = false;
  }
}

bool Scheduler::Fits(const Trainer& t, const JobSpec& spec) const {
  auto it = t.devices.find(spec.device_kind());
  return it != t.devices.end() && it->second >= spec.devices_per_trainer();
}

void Scheduler::Schedule() {
  const std::vector<JobRef> all = JobRefs();
  std::vector<JobRef> queue;
  for (const JobRef& j : all) {
    if (j.status->state() == v1::QUEUED) queue.push_back(j);
  }
  std::optional<QuotaState> quota = queues_.Usage(all);
  queues_.SortForPlacement(&queue, all, quota);
  std::vector<Trainer*> free;
  for (auto& [id, t] : trainers_) {
    if (t.job_id.empty() && !t.draining && t.last_heartbeat > t.placeable_after) {
      free.push_back(&t);
    }
  }
  std::sort(free.begin(), free.end(),
            [](const Trainer* a, const Trainer* b) { return a->order < b->order; });
  // Free trainers held for a higher job, with its id.
  std::map<const Trainer*, std::string> reserved;
  std::set<int> preempt_tried;  // queues whose first blocked job may preempt
  for (const JobRef& ref : queue) {
    Job* job = &jobs_[ref.status->id()];
    const JobSpec& spec = job->status.spec();
    const int q = queues_.QueueOf(job->status);
    const Resources gang = GangResources(spec.num_trainers(), spec.devices_per_trainer(),
                                         spec.device_kind() == "cuda");
    if (std::string why; q >= 0 && !quota->Fits(q, gang, &why)) {
      if (preempt_tried.insert(q).second) why = Preempt(job, why);
      if (why != job->status.pending_reason()) {
        job->status.set_pending_reason(why);
        Touch(&job->status);
      }
      continue;  // over its queue's quota: it holds no trainers
    }
    std::vector<Trainer*> fit;
    for (Trainer* t : free) {
      if (t->job_id.empty() && reserved.count(t) == 0 && Fits(*t, spec)) fit.push_back(t);
    }
    if (static_cast<int>(fit.size()) < spec.num_trainers()) {
      const std::string why = PendingReason(*job, static_cast<int>(fit.size()), reserved);
      if (why != job->status.pending_reason()) {
        job->status.set_pending_reason(why);
        Touch(&job->status);
      }
      // Hold these for the job so lower ones cannot starve it.
      for (Trainer* t : fit) reserved.emplace(t, job->status.id());
      continue;
    }
    fit.resize(spec.num_trainers());
    JobStatus next = job->status;
    next.clear_trainers();
    for (Trainer* t : fit) next.add_trainers(t->id);
    next.set_epoch(0);
    next.set_step(0);
    next.set_attempts(next.attempts() + 1);
    next.set_generation(0);
    next.clear_pending_reason();
    next.clear_stragglers();
    next.clear_rank_step_times();
    SetState(&next, v1::RUNNING, absl::StrCat("placed on ", absl::StrJoin(next.trainers(), ", ")));
    absl::Status s = Commit(job, std::move(next));
    if (!s.ok()) {
      // Nothing is placed until the log takes the placement; every
      // heartbeat schedules again.
      LogRefusal(s);
      return;
    }
    job->rank_done.assign(fit.size(), false);
    job->stragglers =
        std::make_unique<StragglerDetector>(static_cast<int>(fit.size()), options_.stragglers);
    job->peer_lost = false;
    job->recovered_generation = 0;
    for (size_t rank = 0; rank < fit.size(); ++rank) {
      fit[rank]->job_id = job->status.id();
      fit[rank]->rank = static_cast<int>(rank);
      fit[rank]->delivered = false;
      fit[rank]->join = false;
      fit[rank]->generation = 0;
      fit[rank]->leaving_generation = -1;
    }
    Kv& kv = kv_[job->status.id()];
    kv = Kv();
    kv.attempt = job->status.attempts();
    if (q >= 0) {
      quota->Add(q, gang);
      queues_.RecordAdmission(job->status.queue(),
                              QueuedSeconds(job->status, absl::ToUnixMillis(options_.now())));
    }
  }
  UpdateQueuePositions();
  Grow(reserved);
}

std::string Scheduler::PendingReason(const Job& job, int free_fit,
                                     const std::map<const Trainer*, std::string>& reserved) const {
  const JobSpec& spec = job.status.spec();
  const int n = spec.num_trainers(), d = spec.devices_per_trainer();
  std::string out = absl::StrCat(
      "needs ", n, " trainer", n == 1 ? "" : "s", " with ", d, " free ", spec.device_kind(),
      " device", d == 1 ? "" : "s", "; ",
      free_fit == 0 ? "none is" : absl::StrCat(free_fit, free_fit == 1 ? " is" : " are"), " free");
  // What the other trainers that would fit are doing, in registration order.
  std::vector<const Trainer*> fitting;
  for (const auto& [id, t] : trainers_) {
    if (Fits(t, spec)) fitting.push_back(&t);
  }
  std::sort(fitting.begin(), fitting.end(),
            [](const Trainer* a, const Trainer* b) { return a->order < b->order; });
  // Another owner's job is not named: users see only their own jobs.
  auto name = [&](const std::string& id) -> std::string {
    auto other = jobs_.find(id);
    return other == jobs_.end() || other->second.status.owner() == job.status.owner()
               ? id
               : "another user's job";
  };
  std::vector<std::string> others;
  for (const Trainer* t : fitting) {
    if (!t->job_id.empty()) {
      others.push_back(absl::StrCat(t->id, " runs ", name(t->job_id)));
    } else if (t->draining) {
      others.push_back(absl::StrCat(t->id, " is draining"));
    } else if (t->last_heartbeat <= t->placeable_after) {
      others.push_back(absl::StrCat(t->id, " has not heartbeated since its last job failed"));
    } else if (auto r = reserved.find(t); r != reserved.end()) {
      others.push_back(absl::StrCat(t->id, " is held for ", name(r->second), " (higher priority)"));
    }
  }
  constexpr size_t kMaxNamed = 4;
  if (others.size() > kMaxNamed) {
    const size_t more = others.size() - kMaxNamed;
    others.resize(kMaxNamed);
    others.push_back(absl::StrCat(more, " more busy"));
  }
  if (!others.empty()) absl::StrAppend(&out, ", ", absl::StrJoin(others, ", "));
  if (static_cast<int>(fitting.size()) < n) {
    absl::StrAppend(&out, "; only ", fitting.size(), " of the ", trainers_.size(),
                    " registered trainers ", fitting.size() == 1 ? "has" : "have", " ", d, " ",
                    spec.device_kind(), " device", d == 1 ? "" : "s");
  }
  return out;
}

absl::StatusOr<Scheduler::Kv*> Scheduler::StoreFor(const std::string& trainer_id,
                                                   const std::string& job_id, int attempt,
                                                   const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("key: must not be empty");
  if (key.size() > kMaxStoreKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: ", key.size(), " bytes; the limit is ", kMaxStoreKeyBytes));
  }
  auto tt = trainers_.find(trainer_id);
  if (tt == trainers_.end()) return UnknownTrainer(trainer_id);
  auto jt = jobs_.find(job_id);
  if (jt == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", Quote(job_id)));
  const Job& job = jt->second;
  if (job.status.state() != v1::RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", v1::JobState_Name(job.status.state()), ", not RUNNING"));
  }
  if (attempt != job.status.attempts()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " attempt ", attempt,
                                                      " is over; the current attempt is ",
                                                      job.status.attempts()));
  }
  if (tt->second.job_id != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer ", trainer_id, " is not working on job ", job_id));
  }
  auto kt = kv_.find(job_id);
  if (kt == kv_.end() || kt->second.attempt != attempt) {
    // Not reachable while the job runs; be safe anyway.
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " attempt ", attempt, " has no rendezvous store"));
  }
  return &kt->second;
}

absl::Status Scheduler::StoreSet(const StoreSetRequest& r) {
  absl::MutexLock lock(&mu_);
  DT_ASSIGN_OR_RETURN(Kv * kv, StoreFor(r.trainer_id(), r.job_id(), r.attempt(), r.key()));
  if (r.value().size() > kMaxStoreValueBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("value of '", r.key(), "': ", r.value().size(),
                                                     " bytes; the limit is ", kMaxStoreValueBytes));
  }
  auto it = kv->values.find(r.key());
  const size_t old = it == kv->values.end() ? 0 : it->first.size() + it->second.size();
  const size_t add = r.key().size() + r.value().size();
  if (it == kv->values.end() && kv->values.size() + kv->add_results.size() >= kMaxStoreKeys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job ", r.job_id(), " store is full (", kMaxStoreKeys, " keys)"));
  }
  if (kv->bytes - old + add > kMaxStoreBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job ", r.job_id(), " store is full (", kMaxStoreBytes, " bytes)"));
  }
  kv->bytes = kv->bytes - old + add;
  kv->values[r.key()] = r.value();
  return absl::OkStatus();
}

absl::StatusOr<StoreGetReply> Scheduler::StoreGet(const StoreGetRequest& r) {
  absl::MutexLock lock(&mu_);
  DT_ASSIGN_OR_RETURN(Kv * kv, StoreFor(r.trainer_id(), r.job_id(), r.attempt(), r.key()));
  if (r.wait_ms() < 0) return absl::InvalidArgumentError("wait_ms: must be >= 0");
  if (kv->values.count(r.key()) == 0 && r.wait_ms() > 0) {
    const absl::Time deadline =
        absl::Now() + std::min(absl::Milliseconds(r.wait_ms()), kMaxStoreWait);
    const std::string& job_id = r.job_id();
    const int attempt = r.attempt();
    // Wakes when the key appears or the attempt's table goes away.
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto kt = kv_.find(job_id);
      return kt == kv_.end() || kt->second.attempt != attempt ||
             kt->second.values.count(r.key()) > 0;
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    DT_ASSIGN_OR_RETURN(kv, StoreFor(r.trainer_id(), r.job_id(), r.attempt(), r.key()));
  }
  StoreGetReply reply;
  auto it = kv->values.find(r.key());
  if (it != kv->values.end()) {
    reply.set_found(true);
    reply.set_value(it->second);
  }
  return reply;
}

absl::StatusOr<int64_t> Scheduler::StoreAdd(const StoreAddRequest& r) {
  absl::MutexLock lock(&mu_);
  DT_ASSIGN_OR_RETURN(Kv * kv, StoreFor(r.trainer_id(), r.job_id(), r.attempt(), r.key()));
  if (r.request_id() != 0) {
    auto done = kv->add_results.find(r.request_id());
    if (done != kv->add_results.end()) return done->second;
  }
  auto it = kv->values.find(r.key());
  int64_t value = 0;
  if (it != kv->values.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("key '", r.key(), "' does not hold an integer"));
  }
  const size_t entries = kv->values.size() + kv->add_results.size() +
                         (it == kv->values.end() ? 1 : 0) + (r.request_id() != 0 ? 1 : 0);
  if (entries > kMaxStoreKeys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job ", r.job_id(), " store is full (", kMaxStoreKeys, " keys)"));
  }
  value += r.delta();
  std::string text = absl::StrCat(value);
  const size_t old = it == kv->values.end() ? 0 : it->first.size() + it->second.size();
  const size_t add = r.key().size() + text.size() + (r.request_id() != 0 ? 16 : 0);
  if (kv->bytes - old + add > kMaxStoreBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job ", r.job_id(), " store is full (", kMaxStoreBytes, " bytes)"));
  }
  kv->bytes = kv->bytes - old + add;
  kv->values[r.key()] = std::move(text);
  if (r.request_id() != 0) kv->add_results[r.request_id()] = value;
  return value;
}

bool Scheduler::LoseTrainer(const std::string& trainer_id, const std::string& why) {
  auto it = trainers_.find(trainer_id);
  if (it == trainers_.end()) return false;
  const std::string job_id = it->second.job_id;
  auto jt = jobs_.find(job_id);
  const bool placed_here = !job_id.empty() && jt != jobs_.end() &&
                           jt->second.status.state() == v1::RUNNING &&
                           InPlacement(jt->second, it->second);
  std::vector<std::string> placed;
  if (placed_here) {
    Job& job = jt->second;
    placed = Placement(job);
    if (RecoverInPlace(&job, it->second, why)) {
      DT_LOG(WARNING) << "trainer " << trainer_id << " lost: " << why;
      lost_.push_back(ToStatus(it->second, v1::LOST));
      if (lost_.size() > kMaxLostTrainersListed) lost_.pop_front();
      trainers_.erase(it);
      return true;
    }
    JobStatus next = job.status;
    std::string reason = absl::StrCat("trainer ", trainer_id, " lost (", why, ")");
    if (options_.requeue_on_trainer_loss) {
      Requeue(&next, reason);
    } else {
      SetState(&next, v1::FAILED, reason);
    }
    absl::Status s = Commit(&job, std::move(next));
    if (!s.ok()) {
      // The trainer stays until its job's change is logged: the next
      // liveness check tries again (or it heartbeats and is not lost).
      LogRefusal(s);
      return false;
    }
  }
  DT_LOG(WARNING) << "trainer " << trainer_id << " lost: " << why;
  lost_.push_back(ToStatus(it->second, v1::LOST));
  if (lost_.size() > kMaxLostTrainersListed) lost_.pop_front();
  trainers_.erase(it);
  if (placed_here) ReleaseTrainers(job_id, placed, "");
  return true;
}

absl::Duration Scheduler::PeerLostTimeout() const {
  return std::min(options_.heartbeat_timeout, options_.heartbeat_interval * 2);
}

bool Scheduler::RecoversInPlace(const Job& job) const {
  const JobSpec& spec = job.status.spec();
  // CPU and CUDA trainers (the state travels through host memory; NCCL
  // communicators are made again). KVSTORE jobs in synchronous rounds meet
  // in a kvstore job of their generation (the replicas hold the weights);
  // with kvstore-held weights the spare joins the attempt's kvstore job
  // (see "Recovery in place"). Not with sync_batch_norm (its groups span
  // the old membership). The job must have made progress (or already
  // regrouped): the survivors hold a state to send. A loss before that (the
  // ranks may still be meeting for the first time) requeues.
  return options_.recover_in_place && !spec.sync_batch_norm() &&
         (job.status.generation() > 0 || job.status.epoch() > 0 || job.status.step() > 0);
}

bool Scheduler::RecoverInPlace(Job* job, const Trainer& lost, const std::string& why) {
  const JobSpec& spec = job->status.spec();
  if (!RecoversInPlace(*job) || job->status.trainers_size() < 2 || lost.rank < 0 ||
      lost.rank >= static_cast<int>(job->rank_done.size()) || job->rank_done[lost.rank]) {
    return false;
  }
  Trainer* spare = nullptr;
  for (auto& [id, t] : trainers_) {
    if (id == lost.id || !t.job_id.empty() || t.draining || t.last_heartbeat <= t.placeable_after ||
        !Fits(t, spec)) {
      continue;
    }
    if (spare == nullptr || t.order < spare->order) spare = &t;
  }
  if (spare == nullptr) {
    if (Shrink(job, lost, why)) return true;
    DT_LOG(INFO) << "job " << job->status.id() << ": no free trainer to recover rank " << lost.rank
                 << " in place";
    return false;
  }
  JobStatus next = job->status;
  next.set_trainers(lost.rank, spare->id);
  for (int i = 0; i < next.stragglers_size(); ++i) {
    if (next.stragglers(i).rank() == lost.rank) next.mutable_stragglers()->DeleteSubrange(i--, 1);
  }
  next.set_generation(next.generation() + 1);
  SetState(&next, v1::RUNNING,
           absl::StrCat("rank ", lost.rank, " lost on trainer ", lost.id, " (", why,
                        "); recovering in place on trainer ", spare->id, " (generation ",
                        next.generation(), ")"));
  if (absl::Status s = Commit(job, std::move(next)); !s.ok()) {
    LogRefusal(s);
    return false;
  }
  job->recovery_note = absl::StrCat("rank ", lost.rank, " lost on trainer ", lost.id);
  job->recovery_trainer = spare->id;
  job->change = Job::Change::kReplace;
  job->lost_at = KvstoreHoldsWeights(spec) ? lost.last_heartbeat : absl::InfinitePast();
  job->peer_lost = false;
  job->rank_done[lost.rank] = false;
  if (job->stragglers != nullptr) job->stragglers->Reset(lost.rank);
  spare->job_id = job->status.id();
  spare->rank = lost.rank;
  spare->delivered = false;
  spare->join = true;
  spare->generation = job->status.generation();
  spare->leaving_generation = -1;
  DT_LOG(WARNING) << "job " << job->status.id() << ": " << job->status.events().rbegin()->reason();
  return true;
}

bool Scheduler::Shrink(Job* job, const Trainer& lost, const std::string& why) {
  const int left = job->status.trainers_size() - 1;
  if (left < std::max(1, job->status.spec().min_trainers())) return false;
  JobStatus next = job->status;
  next.mutable_trainers()->erase(next.mutable_trainers()->begin() + lost.rank);
  next.set_generation(next.generation() + 1);
  // The ranks are renumbered: the straggler comparison starts again.
  next.clear_stragglers();
  next.clear_rank_step_times();
  SetState(&next, v1::RUNNING,
           absl::StrCat("rank ", lost.rank, " lost on trainer ", lost.id, " (", why,
                        "); no spare trainer: continuing on ", left, " trainer",
                        left == 1 ? "" : "s", " (min_trainers ", job->status.spec().min_trainers(),
                        ", generation ", next.generation(), ")"));
  if (absl::Status s = Commit(job, std::move(next)); !s.ok()) {
    LogRefusal(s);
    return false;
  }
  job->recovery_note = absl::StrCat("rank ", lost.rank, " lost on trainer ", lost.id);
  job->recovery_trainer.clear();
  job->change = Job::Change::kShrink;
  job->stragglers.reset();  // made again for the new world size by StepTimes
  job->peer_lost = false;
  job->rank_done.erase(job->rank_done.begin() + lost.rank);
  // The survivors' ranks follow their order in the new membership.
  for (int rank = 0; rank < job->status.trainers_size(); ++rank) {
    auto it = trainers_.find(job->status.trainers(rank));
    if (it != trainers_.end()) it->second.rank = rank;
  }
  DT_LOG(WARNING) << "job " << job->status.id() << ": " << job->status.events().rbegin()->reason();
  return true;
}

bool Scheduler::MembershipSettled(const Job& job) const {
  if (job.status.state() != v1::RUNNING || job.awaiting_adoption || !RecoversInPlace(job) ||
      job.peer_lost || job.recovered_generation != job.status.generation()) {
    return false;
  }
  for (const std::string& tid : job.status.trainers()) {
    auto it = trainers_.find(tid);
    if (it == trainers_.end() || !it->second.delivered || it->second.draining) return false;
  }
  return true;
}

void Scheduler::Grow(const std::map<const Trainer*, std::string>& reserved) {
  std::optional<QuotaState> quota = queues_.Usage(JobRefs());
  for (auto& [id, job] : jobs_) {
    const JobSpec& spec = job.status.spec();
    const int size = job.status.trainers_size();
    if (spec.max_trainers() <= size || !MembershipSettled(job)) continue;
    std::vector<Trainer*> joining;
    const int q = queues_.QueueOf(job.status);
    const Resources one =
        GangResources(1, spec.devices_per_trainer(), spec.device_kind() == "cuda");
    for (auto& [tid, t] : trainers_) {
      if (static_cast<int>(joining.size()) + size >= spec.max_trainers()) break;
      if (q >= 0 && !quota->Fits(q, GangResources(static_cast<int>(joining.size()) + 1,
                                                  spec.devices_per_trainer(),
                                                  spec.device_kind() == "cuda"))) {
        break;  // its queue's quota
      }
      if (t.job_id.empty() && !t.draining && t.last_heartbeat > t.placeable_after &&
          reserved.count(&t) == 0 && Fits(t, spec)) {
        joining.push_back(&t);
      }
    }
    if (joining.empty()) continue;
    std::sort(joining.begin(), joining.end(),
              [](const Trainer* a, const Trainer* b) { return a->order < b->order; });
    JobStatus next = job.status;
    std::vector<std::string> names;
    for (Trainer* t : joining) {
      next.add_trainers(t->id);
      names.push_back(t->id);
    }
    next.set_generation(next.generation() + 1);
    // More ranks to compare: the straggler comparison starts again.
    next.clear_stragglers();
    SetState(&next, v1::RUNNING,
             absl::StrCat("growing to ", next.trainers_size(), " trainers (max_trainers ",
                          spec.max_trainers(), "): ", absl::StrJoin(names, ", "),
                          " joins at a step boundary (generation ", next.generation(), ")"));
    if (absl::Status s = Commit(&job, std::move(next)); !s.ok()) {
      LogRefusal(s);
      return;
    }
    for (size_t i = 0; q >= 0 && i < joining.size(); ++i) quota->Add(q, one);
    job.recovery_note = absl::StrCat("grew to ", job.status.trainers_size(), " trainers (",
                                     absl::StrJoin(names, ", "), " joined)");
    job.recovery_trainer = names.front();
    job.change = Job::Change::kGrow;
    job.stragglers.reset();  // made again for the new world size by StepTimes
    for (size_t i = 0; i < joining.size(); ++i) {
      joining[i]->job_id = id;
      joining[i]->rank = size + static_cast<int>(i);
      joining[i]->delivered = false;
      joining[i]->join = true;
      joining[i]->generation = job.status.generation();
      joining[i]->leaving_generation = -1;
      job.rank_done.push_back(false);
    }
    DT_LOG(INFO) << "job " << id << ": " << job.status.events().rbegin()->reason();
  }
}

int Scheduler::CheckLiveness() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.now();
  std::vector<std::string> lost;
  for (const auto& [id, t] : trainers_) {
    absl::Duration timeout = options_.heartbeat_timeout;
    if (auto jt = jobs_.find(t.job_id);
        jt != jobs_.end() && jt->second.peer_lost && jt->second.status.state() == v1::RUNNING) {
      timeout = PeerLostTimeout();
    }
    if (now - t.last_heartbeat > timeout) lost.push_back(id);
  }
  const bool requeued = RequeueUnclaimed();
  int n = 0;
  for (const std::string& id : lost) {
    if (LoseTrainer(id, absl::StrCat("no heartbeat for ",
                                     absl::FormatDuration(now - trainers_[id].last_heartbeat)))) {
      ++n;
    }
  }
  DropExpiredJobs();
  if (n > 0 || requeued) Schedule();
  return n;
}

int Scheduler::DropExpiredJobs() {
  if (options_.finished_job_retention == absl::InfiniteDuration()) return 0;
  const int64_t cutoff = absl::ToUnixMillis(options_.now() - options_.finished_job_retention);
  std::vector<std::string> expired;
  std::vector<std::string> tombstones;
  for (const auto& [id, job] : jobs_) {
    if (!IsFinal(job.status.state())) continue;
    const int64_t finished = job.status.events().empty()
                                 ? job.status.submit_time_unix_ms()
                                 : job.status.events().rbegin()->time_unix_ms();
    if (finished > cutoff) continue;
    JobStatus tombstone;
    tombstone.set_id(id);
    tombstone.set_submit_request_id(job.status.submit_request_id());
    expired.push_back(id);
    tombstones.push_back(tombstone.SerializeAsString());
  }
  if (expired.empty()) return 0;
  if (wal_ != nullptr) {
    absl::Status s = wal_->AppendAll(tombstones);
    if (!s.ok()) {
      // They stay until the log takes their tombstones (the next check).
      LogRefusal(absl::UnavailableError(
          absl::StrCat("the scheduler cannot write its job log (", s.message(), "); ",
                       expired.size(), " finished jobs past their retention are kept")));
      return 0;
    }
  }
  for (const std::string& id : expired) {
    auto it = jobs_.find(id);
    auto seen = by_request_id_.find(it->second.status.submit_request_id());
    if (seen != by_request_id_.end() && seen->second == id) by_request_id_.erase(seen);
    jobs_.erase(it);
  }
  DT_LOG(INFO) << "dropped " << expired.size() << " jobs finished more than "
               << absl::FormatDuration(options_.finished_job_retention) << " ago";
  MaybeCompact(/*dropped=*/true);
  return static_cast<int>(expired.size());
}

SchedulerStats Scheduler::Stats() const {
  absl::MutexLock lock(&mu_);
  SchedulerStats s;
  for (JobState st : {v1::QUEUED, v1::RUNNING, v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    s.jobs_by_state[st] = 0;
  }
  for (const auto& [id, job] : jobs_) ++s.jobs_by_state[job.status.state()];
  s.queue_length = s.jobs_by_state[v1::QUEUED];
  s.trainers_alive = static_cast<int64_t>(trainers_.size());
  for (const auto& [id, t] : trainers_) s.trainers_busy += t.job_id.empty() ? 0 : 1;
  s.recoveries = recoveries_;
  s.recovery_seconds_counts = recovery_counts_;
  s.recovery_seconds_counts.resize(std::size(kRecoverySecondsBounds) + 1);
  s.recovery_seconds_sum = recovery_sum_;
  for (const auto& [id, job] : jobs_) {
    if (job.status.state() == v1::RUNNING) s.stragglers += job.status.stragglers_size();
  }
  s.stragglers_detected = stragglers_detected_;
  s.queues = queues_.Metrics(JobRefs(), absl::ToUnixMillis(options_.now()));
  return s;
}

}  // namespace scheduler
}  // namespace dtrain
