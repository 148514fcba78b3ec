#include "libs/agent/agent.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "libs/agent/device_comm_slot.h"
#include "libs/agent/model_cache.h"
#include "libs/agent/step_window.h"
#include "libs/base/logging.h"
#include "libs/base/retry.h"
#include "libs/base/status.h"
#include "libs/security/job_token.h"
#include "libs/tensor/allocator.h"
#include "libs/trace/trace.h"

namespace dtrain {
namespace agent {

namespace v1 = scheduler::v1;

struct Agent::Job {
  v1::Assignment assignment;
  std::atomic<bool> stop{false};
  // Drain it (Agent::Drain, or the scheduler's drain_job_ids).
  std::atomic<bool> drain{false};
  std::string stop_reason;  // guarded by Agent::mu_; set once, with stop
  // Sending the final report; about to end.
  std::atomic<bool> finishing{false};
  bool done = false;  // guarded by Agent::mu_: the thread may be joined
  // The job's parameter server while it runs (guarded by Agent::mu_):
  // stopping the job cancels its operations, so that a pull waiting for a
  // round that will never complete (a peer's push failed) ends at once.
  kvstore::ParameterServer* ps = nullptr;
  std::thread thread;
  // Recovery in place (guarded by Agent::mu_): a collective failed and the
  // job waits for a regroup (heartbeats say so); the newest generation the
  // scheduler offered (HeartbeatReply.regroups).
  bool peer_lost = false;
  int offered_generation = 0;
  // The job's timeline (null: none), written by the job's thread.
  std::unique_ptr<trace::Recorder> trace;
  std::vector<std::string> offered_trainer_ids;  // by rank: that membership
  std::string offered_kvstore_token;             // KVSTORE jobs: its kvstore job's
  // The kvstore client was cancelled for a regroup: a failure that follows
  // is the attempt's, not the job's (retryable).
  bool regroup_cancelled = false;
  // KVSTORE jobs in synchronous rounds or bounded delay (guarded by Agent::mu_): when this
  // rank's current step started (InfiniteFuture: not in a step), and how
  // long a step may take before heartbeats say a peer is lost (a survivor
  // waits in a round for a lost rank; see agent.h).
  absl::Time step_since = absl::InfiniteFuture();
  absl::Duration step_allowance = absl::Seconds(1);
  // ALLREDUCE jobs over NCCL: the current membership's NCCL communicator,
  // which a regroup offer aborts (a collective waiting for a dead peer may
  // never fail by itself). The pointer never changes; the heartbeat thread
  // copies it under Agent::mu_ and aborts after releasing the lock.
  const std::shared_ptr<DeviceCommSlot> device_comm = std::make_shared<DeviceCommSlot>();
  // The job's strategy once planned (guarded by Agent::mu_; null before).
  const train::SyncStrategy* strategy = nullptr;
  // What a registration says the trainer runs (guarded by Agent::mu_): the
  // devices the job holds, epochs completed and steps done in the current
  // epoch.
  std::vector<std::string> devices;
  int epoch = 0;
  int64_t step = 0;
};

namespace {

v1::ProgressReport ToReport(const train::JobProgress& p) {
  v1::ProgressReport r;
  r.set_epoch(p.epoch);
  r.set_step(p.step);
  r.set_steps_per_epoch(p.steps_per_epoch);
  r.set_loss(p.loss);
  r.set_train_accuracy(p.train_accuracy);
  r.set_test_accuracy(p.test_accuracy);
  r.set_samples_per_second(p.samples_per_second);
  r.set_achieved_gflops(p.achieved_flops / 1e9);
  r.set_mfu(p.mfu);
  r.set_epoch_seconds(p.epoch_seconds);
  r.set_checkpoint_path(p.checkpoint_path);
  r.set_checkpoint_epoch(p.checkpoint_epoch);
  r.set_checkpoint_step(p.checkpoint_step);
  r.set_data_train_samples(p.data_train_samples);
  r.set_data_test_samples(p.data_test_samples);
  r.set_data_corrupt_skipped(p.data_corrupt_skipped);
  return r;
}

AgentObserver* NoObserver() {
  static AgentObserver* const none = new AgentObserver();
  return none;
}

}  // namespace

// Steps a rank's step-time summary covers (ProgressReport.step_times).
constexpr int kStepWindow = 32;
// Step losses rank 0 holds for its next report (the newest).
constexpr size_t kMaxPendingStepLosses = 1000;

// The rendezvous store keys of a drain (see agent.h).
constexpr char kDrainClaim[] = "dtrain/drain/claim";
constexpr char kDrainStep[] = "dtrain/drain/step";

namespace {

// ALLREDUCE jobs over NCCL exchange a regroup's state over a host
// communicator (TCP) made from the job's NCCL options.
collective::CommunicatorOptions ExchangeOptions(const collective::CommunicatorOptions& nccl) {
  collective::CommunicatorOptions o = nccl;
  o.transport = collective::TransportKind::kTcp;
  o.key_prefix = "regroup";
  return o;
}

// The keys of membership generation G > 0 of an attempt: "gen<G>/<key>".
class GenerationStore : public collective::Store {
 public:
  GenerationStore(collective::Store* base, int generation)
      : base_(base), prefix_(absl::StrCat("gen", generation, "/")) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return base_->Set(absl::StrCat(prefix_, key), value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    return base_->Get(absl::StrCat(prefix_, key), timeout);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    return base_->Add(absl::StrCat(prefix_, key), delta);
  }

 private:
  collective::Store* const base_;
  const std::string prefix_;
};

// The rendezvous store key of where an attempt started: "<epochs done>
// <steps of the next epoch>".
constexpr char kAttemptStartKey[] = "dtrain/kvstore/start";

// Where a replacement that continues a lost worker's rounds
// (train::SyncStrategy::replacement_continues_rounds) counts them from:
// rank 0 publishes where the attempt started (its assignment's resume
// position) before training, a joiner reads it.
absl::Status ShareAttemptStart(collective::Store* store, const v1::Assignment& a,
                               train::JobConfig* config) {
  if (!a.join()) {
    if (a.rank() != 0) return absl::OkStatus();
    const absl::Status s =
        store->Set(kAttemptStartKey, absl::StrCat(a.resume_epoch(), " ", a.resume_step()));
    if (!s.ok()) {
      DT_LOG(WARNING) << "job " << a.job_id() << ": " << s
                      << "; a replacement could not join this attempt";
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> start = store->Get(kAttemptStartKey, absl::Seconds(10));
  if (!start.ok()) {
    return Annotate(start.status(), "reading where the attempt started (rank 0 publishes it)");
  }
  std::vector<std::string> parts = absl::StrSplit(*start, ' ');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &config->attempt_start_epoch) ||
      !absl::SimpleAtoi(parts[1], &config->attempt_start_step)) {
    return absl::DataLossError(
        absl::StrCat(kAttemptStartKey, " holds '", *start, "', not '<epoch> <step>'"));
  }
  return absl::OkStatus();
}

}  // namespace

// A running job as train::RunJob sees its trainer: progress to the
// observer and (rank 0) to the scheduler (train::JobObserver); stops,
// drains agreed through `store` (null: one rank, nothing to agree) and an
// elastic job's growth (train::JobControl); the next membership of a
// regroup (train::Membership).
class Agent::Progress : public train::JobObserver,
                        public train::JobControl,
                        public train::Membership {
 public:
  // `attempt_store` (may be null): the attempt's rendezvous store, for
  // regroups; `strategy` the job's; `comm_options` those of the job's
  // communicators. `ps` (kvstore strategies that regroup; null otherwise):
  // the job's kvstore client, which a regroup replaces with the new
  // membership's (the old one is kept until this is destroyed, after
  // RunJob).
  Progress(Agent* agent, Job* job, collective::Store* store, collective::Store* attempt_store,
           const train::SyncStrategy& strategy, const collective::CommunicatorOptions& comm_options,
           std::unique_ptr<kvstore::ParameterServer>* ps, bool watch_steps)
      : agent_(agent),
        job_(job),
        store_(store),
        attempt_store_(attempt_store),
        strategy_(strategy),
        comm_options_(comm_options),
        ps_(ps != nullptr && *ps != nullptr ? ps : nullptr),
        watch_steps_(watch_steps),
        generation_(job->assignment.generation()) {}

  ~Progress() override {
    // The communicators are about to go (this rank's and RunAssignment's);
    // waits for an abort in flight.
    job_->device_comm->Set(nullptr, 0);
    for (const std::unique_ptr<kvstore::ParameterServer>& old : retired_ps_) {
      const absl::Status s = old->DeleteJob();
      if (!s.ok() && !absl::IsNotFound(s)) {
        DT_LOG(WARNING) << "job " << job_->assignment.job_id() << ": kvstore job " << old->job()
                        << " not dropped (the shards drop it after their job TTL): " << s;
      }
    }
  }

  // Recovery in place (see agent.h): waits for the scheduler's next
  // generation of the attempt and meets it: a communicator (for the state,
  // and the gradients unless the strategy's go over NCCL or the kvstore),
  // the NCCL one, the kvstore job of that generation.
  absl::StatusOr<train::MembershipTransports> Regroup(const absl::Status& failure) override {
    const v1::Assignment& a = job_->assignment;
    if (attempt_store_ == nullptr) return failure.ok() ? absl::InternalError("no store") : failure;
    if (failure.ok()) {
      DT_LOG(INFO) << "job " << a.job_id() << " rank " << a.rank()
                   << ": the job grows; meeting the new membership";
    } else {
      DT_LOG(INFO) << "job " << a.job_id() << " rank " << a.rank() << ": " << failure
                   << "; waiting up to " << agent_->options_.regroup_wait
                   << " for the scheduler to regroup the attempt";
    }
    int tried = generation_;  // generations that failed (or the current one)
    for (;;) {
      int generation = 0;
      int rank = -1;
      int world = 0;
      std::string kvstore_token;
      {
        absl::MutexLock lock(&agent_->mu_);
        // Until the regroup is connected, heartbeats say a peer is lost: a
        // replacement that dies too is noticed as fast as the first loss.
        // (A grow's regroup has no lost peer.)
        job_->peer_lost = !failure.ok() || tried > generation_;
        if (job_->peer_lost) agent_->wake_ = true;  // heartbeat now: the scheduler learns it
        auto ready = [this, tried]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(agent_->mu_) {
          return job_->stop || agent_->shutdown_ || job_->offered_generation > tried;
        };
        agent_->mu_.AwaitWithTimeout(absl::Condition(&ready), agent_->options_.regroup_wait);
        if (job_->stop || agent_->shutdown_) {
          job_->peer_lost = false;
          return absl::CancelledError(
              absl::StrCat("stopped while waiting to regroup (", job_->stop_reason, ")"));
        }
        if (job_->offered_generation <= tried) {
          job_->peer_lost = false;
          return absl::DeadlineExceededError(
              absl::StrCat("no new membership from the scheduler within ",
                           absl::FormatDuration(agent_->options_.regroup_wait)));
        }
        generation = job_->offered_generation;
        // This trainer's rank in that membership (an elastic job's ranks are
        // renumbered when it shrinks); absent: it was dropped from the job.
        const std::vector<std::string>& ids = job_->offered_trainer_ids;
        world = static_cast<int>(ids.size());
        auto me = std::find(ids.begin(), ids.end(), agent_->trainer_id_);
        if (me == ids.end()) {
          job_->peer_lost = false;
          return absl::FailedPreconditionError(
              absl::StrCat("this trainer is not in generation ", generation, " of the job"));
        }
        rank = static_cast<int>(me - ids.begin());
        kvstore_token = job_->offered_kvstore_token;
      }
      stores_.push_back(std::make_unique<GenerationStore>(attempt_store_, generation));
      const absl::Time start = absl::Now();
      collective::CommunicatorOptions o = comm_options_;
      o.timeout = std::min(o.timeout, agent_->options_.regroup_timeout);
      // Over NCCL: the state goes over a host communicator, then the
      // gradients over a new NCCL communicator (a new unique id under the
      // generation's keys).
      const bool nccl = strategy_.uses_device_communicator();
      absl::StatusOr<std::unique_ptr<collective::Communicator>> made =
          agent_->options_.connect_communicator(rank, world, stores_.back().get(),
                                                nccl ? ExchangeOptions(o) : o);
      absl::StatusOr<std::unique_ptr<collective::Communicator>> device;
      if (made.ok() && nccl) {
        device = agent_->options_.connect_communicator(rank, world, stores_.back().get(), o);
        if (!device.ok()) made = device.status();
      }
      if (!made.ok()) {
        absl::Status s = Annotate(
            made.status(),
            absl::StrCat("regroup of rank ", rank, " of ", world, " in generation ", generation));
        if (!IsTransient(s)) {
          absl::MutexLock lock(&agent_->mu_);
          job_->peer_lost = false;
          return s;
        }
        // The replacement died too (or never came): the scheduler offers
        // the next generation.
        DT_LOG(WARNING) << "job " << a.job_id() << " rank " << a.rank() << ": " << s
                        << "; waiting for the next generation";
        tried = generation;
        continue;
      }
      if (ps_ != nullptr) {
        absl::Status s = ConnectKvstore(generation, rank, kvstore_token);
        if (!s.ok()) {
          absl::MutexLock lock(&agent_->mu_);
          job_->peer_lost = false;
          return s;
        }
      }
      if (nccl) {
        device_comms_.push_back(*std::move(device));
        job_->device_comm->Set(device_comms_.back().get(), generation);
      }
      {
        absl::MutexLock lock(&agent_->mu_);
        job_->peer_lost = false;
        // Reports name the rank and generation this trainer now runs.
        job_->assignment.set_rank(rank);
        job_->assignment.set_world_size(world);
        job_->assignment.set_generation(generation);
      }
      DT_LOG(INFO) << "job " << a.job_id() << " rank " << rank << " of " << world << ": generation "
                   << generation << " connected in " << absl::Now() - start;
      generation_ = generation;
      comms_.push_back(*std::move(made));
      train::MembershipTransports next;
      next.communicator = comms_.back().get();
      if (nccl) next.device_communicator = device_comms_.back().get();
      if (ps_ != nullptr) next.kvstore = ps_->get();
      return next;
    }
  }

  void OnRecovered(double seconds, int64_t steps_lost) override {
    v1::ProgressReport r;
    r.set_generation(generation_);
    r.set_recovery_seconds(std::max(seconds, 1e-6));
    r.set_recovery_steps_lost(steps_lost);
    DT_LOG(INFO) << "job " << job_->assignment.job_id() << " rank " << job_->assignment.rank()
                 << ": recovered in place in " << seconds << " s, " << steps_lost
                 << " steps lost (generation " << generation_ << ")";
    agent_->Report(job_->assignment, v1::JOB_STATE_UNSPECIFIED, "", &r);
  }

  bool DrainRequested(int64_t steps_done) override {
    if (watch_steps_) {
      absl::MutexLock lock(&agent_->mu_);
      job_->step_since = absl::Now();  // a step follows
    }
    if (drain_at_ < 0) {
      if (store_ == nullptr) {
        if (job_->drain) drain_at_ = steps_done;
      } else {
        if (job_->drain && !claimed_) Claim(steps_done);
        if (drain_at_ < 0 && steps_done % PollSteps() == 0 && absl::Now() >= next_poll_) Poll();
      }
      if (drain_at_ >= 0) {
        DT_LOG(INFO) << "job " << job_->assignment.job_id() << " rank " << job_->assignment.rank()
                     << ": draining after " << drain_at_ << " steps of this attempt";
      }
    }
    return drain_at_ >= 0 && steps_done >= drain_at_;
  }

  // Every rank reports at most once per report interval: rank 0 its
  // progress, every rank its recent step times (the scheduler compares the
  // ranks: stragglers).
  void OnStep(const train::JobProgress& p, const train::StepTimes& t) override {
    agent_->observer_->OnStep(p, t);
    window_.Add(t.phases, t.samples);
    if (job_->assignment.rank() == 0 && p.job_step >= 0) {
      // The loss curve (JobStatus.step_losses): every step's, sent with the
      // next report that arrives.
      if (step_losses_.size() >= kMaxPendingStepLosses) step_losses_.pop_front();
      step_losses_.push_back({p.job_step, p.step_loss});
    }
    const absl::Time now = absl::Now();
    {
      absl::MutexLock lock(&agent_->mu_);
      job_->epoch = p.epoch;
      job_->step = p.step;
      if (watch_steps_) {
        job_->step_allowance = std::max(absl::Seconds(1), 4 * (now - job_->step_since));
        job_->step_since = absl::InfiniteFuture();
      }
    }
    if (now - last_report_ >= agent_->options_.report_interval) {
      last_report_ = now;
      Send(p);
    }
  }

  void OnEpoch(const train::JobProgress& p) override {
    agent_->observer_->OnEpoch(p);
    if (job_->assignment.rank() == 0) {
      // The loss curve in the trainer's log, exactly (%.17g: the double's
      // every bit), for people and for tests that compare two runs.
      DT_LOG(INFO) << absl::StrFormat(
          "job %s rank 0: epoch %d/%d loss %.17g train_accuracy %.17g test_accuracy %.17g",
          job_->assignment.job_id(), p.epoch, job_->assignment.spec().epochs(), p.loss,
          p.train_accuracy, p.test_accuracy);
    }
    {
      absl::MutexLock lock(&agent_->mu_);
      job_->epoch = p.epoch;
      job_->step = p.step;
    }
    // An epoch's report does not restart the progress reports' clock: with
    // it, a job whose epoch lasts a little longer than report_interval was
    // only ever seen at the same step of each epoch.
    if (job_->assignment.rank() == 0) Send(p, /*with_timeline=*/true);
  }

  bool StopRequested() override { return job_->stop; }

  // An elastic job grows at a step every rank agrees on, like a drain (see
  // agent.h): the first rank that heard of the new generation claims
  // "dtrain/grow/<G>/claim" and publishes "dtrain/grow/<G>/step"; every
  // rank reads it when its steps done are a multiple of drain_poll_steps.
  bool RegroupRequested(int64_t steps_done) override {
    if (!elastic_ || attempt_store_ == nullptr) return false;
    const int next = generation_ + 1;
    if (grow_generation_ != next) {
      grow_generation_ = next;
      grow_at_ = -1;
      grow_claimed_ = false;
    }
    const std::string key = absl::StrCat("dtrain/grow/", next, "/");
    if (grow_at_ < 0) {
      bool offered = false;
      {
        absl::MutexLock lock(&agent_->mu_);
        offered = job_->offered_generation >= next;
      }
      if (offered && !grow_claimed_) {
        absl::StatusOr<int64_t> claim = attempt_store_->Add(key + "claim", 1);
        if (claim.ok()) {
          grow_claimed_ = true;
          if (*claim == 1) {
            const int64_t at = (steps_done / PollSteps() + 1) * PollSteps();
            if (attempt_store_->Set(key + "step", absl::StrCat(at)).ok()) grow_at_ = at;
          }
        }
      }
      if (grow_at_ < 0 && steps_done % PollSteps() == 0) {
        absl::StatusOr<std::string> at = attempt_store_->Get(key + "step", absl::ZeroDuration());
        int64_t n = 0;
        if (at.ok() && absl::SimpleAtoi(*at, &n) && n > 0) grow_at_ = n;
      }
      if (grow_at_ >= 0) {
        DT_LOG(INFO) << "job " << job_->assignment.job_id() << " rank " << job_->assignment.rank()
                     << ": meeting generation " << next << " after " << grow_at_ << " steps";
      }
    }
    return grow_at_ >= 0 && steps_done >= grow_at_;
  }

 private:
  int64_t PollSteps() const { return std::max(1, agent_->options_.drain_poll_steps); }

  // A KVSTORE job's regroup: the client of generation `generation`'s own
  // kvstore job replaces the old one (dropped by ~Progress, after RunJob:
  // dropped now, a survivor that has not yet heard of the regroup would
  // fail its round with ABORTED instead of being cancelled into it).
  absl::Status ConnectKvstore(int generation, int rank, const std::string& token) {
    const v1::Assignment& a = job_->assignment;
    const std::string name = security::KvstoreJobName(a.job_id(), a.attempt(), generation);
    absl::StatusOr<std::unique_ptr<kvstore::ParameterServer>> made =
        agent_->options_.connect_parameter_server(name, rank, token);
    if (!made.ok()) {
      return Annotate(made.status(), absl::StrCat("connecting to the kvstore job ", name));
    }
    std::unique_ptr<kvstore::ParameterServer> old = std::move(*ps_);
    *ps_ = *std::move(made);
    {
      absl::MutexLock lock(&agent_->mu_);
      job_->ps = ps_->get();
      if (job_->stop) job_->ps->Cancel(absl::StrCat("job stopped: ", job_->stop_reason));
    }
    old->Cancel("regrouped");
    retired_ps_.push_back(std::move(old));
    return absl::OkStatus();
  }

  // The first claimant names the step: the first multiple of PollSteps()
  // after the ones done, where every rank reads it (see agent.h).
  void Claim(int64_t steps_done) {
    absl::StatusOr<int64_t> claim = store_->Add(kDrainClaim, 1);
    if (!claim.ok()) {
      DT_LOG(WARNING) << "drain: " << claim.status() << "; trying again at the next step";
      return;
    }
    claimed_ = true;
    if (*claim != 1) return;  // another rank's claim: its step is read below
    const int64_t at = (steps_done / PollSteps() + 1) * PollSteps();
    absl::Status s = store_->Set(kDrainStep, absl::StrCat(at));
    if (s.ok()) {
      drain_at_ = at;
    } else {
      DT_LOG(WARNING) << "drain: " << s << "; the job is not drained";
    }
  }

  // Whether a rank named the step (a read that adds nothing to the store).
  // While the store cannot be read, training goes on and reads again after
  // a second (a drain published meanwhile may then be missed by this rank:
  // it fails the attempt like a lost peer).
  void Poll() {
    absl::StatusOr<std::string> at = store_->Get(kDrainStep, absl::ZeroDuration());
    int64_t n = 0;
    if (at.ok() && absl::SimpleAtoi(*at, &n) && n > 0) {
      drain_at_ = n;
    } else if (!at.ok() && !absl::IsDeadlineExceeded(at.status())) {
      DT_LOG(WARNING) << "drain: " << at.status() << "; reading it again in a second";
      next_poll_ = absl::Now() + absl::Seconds(1);
    }
  }

  void Send(const train::JobProgress& p, bool with_timeline = false) {
    v1::ProgressReport r = ToReport(p);
    if (window_.size() > 0) *r.mutable_step_times() = window_.Summary();
    for (const auto& [step, loss] : step_losses_) {
      v1::StepLoss* l = r.add_step_losses();
      l->set_step(step);
      l->set_loss(loss);
    }
    if (with_timeline) agent_->AttachTimeline(*job_, &r);
    bool delivered = false;
    if (agent_->Report(job_->assignment, v1::JOB_STATE_UNSPECIFIED, "", &r, &delivered)) {
      agent_->Stop(job_, "cancelled");
    }
    // Step losses of a report that did not arrive go with the next one.
    if (delivered) step_losses_.clear();
  }

  Agent* const agent_;
  Job* const job_;
  collective::Store* const store_;
  collective::Store* const attempt_store_;
  const train::SyncStrategy& strategy_;
  const collective::CommunicatorOptions comm_options_;
  std::unique_ptr<kvstore::ParameterServer>* const ps_;
  // Step start and end times go to the heartbeats (Job::step_since).
  const bool watch_steps_;
  // Earlier generations' kvstore clients (the trainer may hold them until
  // its regroup is done).
  std::vector<std::unique_ptr<kvstore::ParameterServer>> retired_ps_;
  int generation_;  // the membership this rank runs in
  // An elastic job (it may grow: RegroupRequested polls the store).
  const bool elastic_ = job_->assignment.spec().max_trainers() >
                        job_->assignment.spec().min_trainers();
  int grow_generation_ = 0;  // the generation grow_at_ and grow_claimed_ are for
  int64_t grow_at_ = -1;
  bool grow_claimed_ = false;
  // Each regroup's store and communicator, alive until the job ends.
  std::vector<std::unique_ptr<collective::Store>> stores_;
  std::vector<std::unique_ptr<collective::Communicator>> comms_;
  // ALLREDUCE jobs over NCCL: each regroup's NCCL communicator.
  std::vector<std::unique_ptr<collective::Communicator>> device_comms_;
  absl::Time last_report_ = absl::InfinitePast();
  StepWindow window_{kStepWindow};
  // Rank 0: (job step, loss) of the steps since the last report.
  std::deque<std::pair<int64_t, float>> step_losses_;
  bool claimed_ = false;
  int64_t drain_at_ = -1;  // steps of this attempt after which it drains
  absl::Time next_poll_ = absl::InfinitePast();
};

Agent::Agent(ClusterClient* cluster, AgentOptions options, AgentObserver* observer)
    : cluster_(cluster),
      options_(std::move(options)),
      observer_(observer != nullptr ? observer : NoObserver()) {
  options_.resources.has_parameter_server = options_.connect_parameter_server != nullptr;
  if (options_.connect_communicator == nullptr) {
    options_.connect_communicator = [](int rank, int world, collective::Store* store,
                                       const collective::CommunicatorOptions& o) {
      return collective::Communicator::Create(rank, world, store, o);
    };
  }
}

Agent::~Agent() {
  std::unique_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    job = std::move(current_);
  }
  if (job != nullptr && job->thread.joinable()) {
    Stop(job.get(), "trainer shutting down");
    job->thread.join();
  }
}

std::string Agent::trainer_id() const {
  absl::MutexLock lock(&mu_);
  return trainer_id_;
}

void Agent::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

void Agent::Drain() {
  absl::MutexLock lock(&mu_);
  if (!draining_) DT_LOG(INFO) << "draining";
  draining_ = true;
  wake_ = true;
  if (current_ != nullptr) current_->drain = true;
}

bool Agent::WaitForWake(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_ || wake_; };
  mu_.AwaitWithTimeout(absl::Condition(&woken), timeout);
  wake_ = false;
  return shutdown_;
}

void Agent::Run() {
  absl::Duration interval = absl::Seconds(1);
  absl::Duration backoff = options_.register_backoff;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) break;
    }
    if (trainer_id().empty()) {
      {
        absl::MutexLock lock(&mu_);
        if (draining_ && current_ == nullptr && !next_.has_value()) break;
      }
      if (absl::Status s = Register(&interval); !s.ok()) {
        DT_LOG(WARNING) << s << "; retrying in " << backoff;
        WaitForWake(backoff);
        backoff = std::min(backoff * 2, options_.max_register_backoff);
        continue;
      }
      backoff = options_.register_backoff;
    }
    Reap();
    const bool reached = Heartbeat();
    bool awaiting_regroup = false;
    // The scheduler unreachable (restarting): try sooner, so that the
    // trainer learns it came back (and registers again) soon after.
    absl::Duration wait =
        reached ? interval : std::min(interval, options_.unreachable_heartbeat_interval);
    {
      // Drained: the scheduler heard it (when it could be reached).
      absl::MutexLock lock(&mu_);
      if (draining_ && current_ == nullptr && !next_.has_value()) break;
      awaiting_regroup =
          current_ != nullptr && (current_->peer_lost || StepStalledLocked(*current_));
      // A KVSTORE job's step: the heartbeat that says it stalled is sent as
      // soon as it has.
      if (current_ != nullptr && !awaiting_regroup &&
          current_->step_since != absl::InfiniteFuture()) {
        wait = std::min(wait, std::max(options_.regroup_heartbeat_interval,
                                       current_->step_since + current_->step_allowance -
                                           absl::Now() + absl::Milliseconds(10)));
      }
    }
    // A job waiting for a regroup hears of it sooner.
    WaitForWake(awaiting_regroup ? std::min(interval, options_.regroup_heartbeat_interval) : wait);
  }
  DT_LOG(INFO) << "shutting down";
  std::unique_ptr<Job> job;
  std::optional<v1::Assignment> next;
  {
    absl::MutexLock lock(&mu_);
    job = std::move(current_);
    next = std::move(next_);
    next_.reset();
  }
  if (job != nullptr) {
    Stop(job.get(), "trainer shutting down");
    if (job->thread.joinable()) job->thread.join();
  }
  if (next.has_value()) Refuse(*next, v1::FAILED, "trainer shutting down");
}

absl::Status Agent::Register(absl::Duration* interval) {
  v1::RegisterTrainerRequest request;
  request.set_name(options_.name);
  for (const std::string& d : options_.resources.devices) request.add_devices(d);
  {
    // Registering again while a job runs: the scheduler (restarted) may
    // adopt it (see "Scheduler restarts").
    absl::MutexLock lock(&mu_);
    request.set_previous_trainer_id(previous_trainer_id_);
    if (!previous_trainer_id_.empty() && current_ != nullptr && !current_->done &&
        !current_->stop && !current_->finishing) {
      const v1::Assignment& a = current_->assignment;
      v1::RegisterTrainerRequest::RunningWork* w = request.mutable_running();
      w->set_job_id(a.job_id());
      w->set_attempt(a.attempt());
      w->set_generation(a.generation());
      w->set_rank(a.rank());
      w->set_world_size(a.world_size());
      w->set_epoch(current_->epoch);
      w->set_step(current_->step);
      for (const std::string& d : current_->devices) w->add_devices(d);
    }
  }
  DT_ASSIGN_OR_RETURN(v1::RegisterTrainerReply reply, cluster_->RegisterTrainer(request));
  if (reply.trainer_id().empty()) {
    return absl::InternalError("ClusterService.RegisterTrainer: the reply has no trainer_id");
  }
  *interval =
      std::max(options_.min_heartbeat_interval, absl::Milliseconds(reply.heartbeat_interval_ms()));
  {
    absl::MutexLock lock(&mu_);
    trainer_id_ = reply.trainer_id();
    previous_trainer_id_ = trainer_id_;
  }
  DT_LOG(INFO) << "registered as " << reply.trainer_id() << "; heartbeat every " << *interval
               << (request.has_running() ? absl::StrCat("; claimed rank ", request.running().rank(),
                                                        " of job ", request.running().job_id(),
                                                        " attempt ", request.running().attempt())
                                         : "");
  return absl::OkStatus();
}

bool Agent::StepStalledLocked(const Job& job) const {
  return job.step_since != absl::InfiniteFuture() &&
         absl::Now() - job.step_since > job.step_allowance;
}

bool Agent::Heartbeat() {
  v1::HeartbeatRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_trainer_id(trainer_id_);
    request.set_draining(draining_);
    if (current_ != nullptr && !current_->done) {
      request.add_running_job_ids(current_->assignment.job_id());
      if (current_->peer_lost || StepStalledLocked(*current_)) {
        request.add_peer_lost_job_ids(current_->assignment.job_id());
      }
    }
    if (next_.has_value() &&
        (current_ == nullptr || current_->assignment.job_id() != next_->job_id())) {
      request.add_running_job_ids(next_->job_id());
    }
  }
  const int64_t sent_us = trace::NowMicros();
  absl::StatusOr<v1::HeartbeatReply> reply = cluster_->Heartbeat(request);
  const int64_t received_us = trace::NowMicros();
  if (reply.ok() && reply->server_time_unix_us() > 0) {
    const int64_t rtt = received_us - sent_us;
    absl::MutexLock lock(&mu_);
    if (clock_rtt_us_ < 0 || rtt <= clock_rtt_us_) {
      clock_rtt_us_ = rtt;
      clock_offset_us_ = sent_us + rtt / 2 - reply->server_time_unix_us();
    }
  }
  if (absl::IsNotFound(reply.status())) {
    DT_LOG(WARNING) << reply.status() << "; registering again";
    absl::MutexLock lock(&mu_);
    if (trainer_id_ == request.trainer_id()) trainer_id_.clear();
    wake_ = true;  // at once: a restarted scheduler waits for the running job's claim
    return true;
  }
  if (!reply.ok()) {
    DT_LOG(WARNING) << reply.status();
    return false;
  }
  for (const std::string& id : reply->cancel_job_ids()) {
    std::optional<v1::Assignment> dropped;
    {
      absl::MutexLock lock(&mu_);
      if (next_.has_value() && next_->job_id() == id) {
        dropped = std::move(next_);
        next_.reset();
      }
    }
    if (dropped.has_value()) {
      DT_LOG(INFO) << "job " << id << " cancelled before it started";
      Refuse(*dropped, v1::CANCELLED, "cancelled before it started");
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr && !current_->done && current_->assignment.job_id() == id) {
      DT_LOG(INFO) << "job " << id << " cancelled; stopping";
      StopLocked(current_.get(), "cancelled");
    }
  }
  for (const std::string& id : reply->drain_job_ids()) {
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr && !current_->done && current_->assignment.job_id() == id &&
        !current_->drain) {
      DT_LOG(INFO) << "job " << id << ": the scheduler drains this trainer";
      current_->drain = true;
    }
  }
  // NCCL communicators to abort, after Agent::mu_ is released.
  struct DeviceAbort {
    std::shared_ptr<DeviceCommSlot> slot;
    std::string reason;
    int32_t generation;
  };
  std::vector<DeviceAbort> aborts;
  for (const v1::Regroup& g : reply->regroups()) {
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr && !current_->done && current_->assignment.job_id() == g.job_id() &&
        current_->assignment.attempt() == g.attempt() &&
        g.generation() > current_->offered_generation &&
        g.generation() > current_->assignment.generation()) {
      DT_LOG(INFO) << "job " << g.job_id() << ": regroup in generation " << g.generation() << " ("
                   << g.trainer_ids_size() << " trainers)";
      current_->offered_generation = g.generation();
      current_->offered_trainer_ids.assign(g.trainer_ids().begin(), g.trainer_ids().end());
      current_->offered_kvstore_token = g.kvstore_token();
      // A survivor whose strategy's loss is silent may wait in a kvstore
      // round the lost rank never pushes, or in an NCCL collective: its
      // step fails now, and it meets the new membership
      // (train::Membership::Regroup). (With kvstore-held weights the
      // survivors go on: the replacement continues the lost worker's
      // rounds.)
      const train::SyncStrategy* strategy = current_->strategy;
      if (strategy != nullptr && strategy->loss_is_silent()) {
        if (current_->ps != nullptr) {
          current_->regroup_cancelled = true;
          current_->ps->Cancel(absl::StrCat("regrouping in generation ", g.generation()));
        }
        aborts.push_back({current_->device_comm,
                          absl::StrCat("regrouping in generation ", g.generation()),
                          g.generation()});
      }
    }
  }
  for (const DeviceAbort& d : aborts) d.slot->Abort(d.reason, d.generation);
  for (const v1::Assignment& a : reply->assignments()) Accept(a);
  return true;
}

void Agent::Accept(const v1::Assignment& a) {
  std::string refusal;
  std::optional<v1::Assignment> displaced;
  {
    absl::MutexLock lock(&mu_);
    Job* running = current_.get();
    if (running == nullptr || running->done) {
      if (running == nullptr) {
        StartLocked(a);
        return;
      }
      // Ended but not joined yet: Reap() starts it.
      displaced = std::move(next_);
      next_ = a;
      next_deadline_ = absl::Now() + options_.previous_job_wait;
      wake_ = true;
    } else {
      const v1::Assignment& r = running->assignment;
      if (r.job_id() == a.job_id() && r.attempt() == a.attempt() && r.rank() == a.rank()) {
        DT_LOG(WARNING) << "job " << a.job_id() << " attempt " << a.attempt()
                        << " delivered again while it runs; ignored";
        return;
      }
      if (r.job_id() == a.job_id() && r.attempt() != a.attempt() && !running->stop) {
        DT_LOG(INFO) << "job " << a.job_id() << ": attempt " << a.attempt()
                     << " supersedes attempt " << r.attempt();
        StopLocked(running, absl::StrCat("superseded by attempt ", a.attempt()));
      }
      if (running->stop || running->finishing) {
        displaced = std::move(next_);
        next_ = a;
        next_deadline_ = absl::Now() + options_.previous_job_wait;
      } else {
        // The scheduler gives a trainer one job at a time; refuse rather
        // than oversubscribe.
        refusal = "trainer is already running job " + r.job_id();
      }
    }
  }
  if (displaced.has_value()) {
    Refuse(*displaced, v1::FAILED, "replaced by job " + a.job_id() + " before it started");
  }
  if (!refusal.empty()) Refuse(a, v1::FAILED, refusal);
}

void Agent::StartLocked(const v1::Assignment& a) {
  current_ = std::make_unique<Job>();
  current_->assignment = a;
  current_->drain = draining_;
  Job* job = current_.get();
  DT_LOG(INFO) << "starting job " << a.job_id() << " (" << a.spec().name() << ", "
               << (a.spec().model_digest().empty() ? a.spec().model() : a.spec().model_digest())
               << ", " << a.spec().epochs() << " epochs) as rank " << a.rank() << " of "
               << a.world_size() << ", attempt " << a.attempt();
  job->thread = std::thread([this, job] { Work(job); });
}

void Agent::Reap() {
  std::unique_ptr<Job> done;
  {
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr && current_->done) done = std::move(current_);
  }
  if (done != nullptr && done->thread.joinable()) done->thread.join();
  std::optional<v1::Assignment> late;
  std::string running;
  {
    absl::MutexLock lock(&mu_);
    if (!next_.has_value()) return;
    if (current_ == nullptr) {
      StartLocked(*next_);
      next_.reset();
      return;
    }
    if (absl::Now() < next_deadline_) return;
    running = current_->assignment.job_id();
    late = std::move(next_);
    next_.reset();
  }
  Refuse(*late, v1::FAILED, "trainer is already running job " + running);
}

void Agent::Stop(Job* job, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  StopLocked(job, reason);
}

void Agent::StopLocked(Job* job, const std::string& reason) {
  if (job->stop) return;
  job->stop_reason = reason;
  job->stop = true;
  if (job->ps != nullptr) job->ps->Cancel(absl::StrCat("job stopped: ", reason));
}

void Agent::Refuse(const v1::Assignment& a, v1::JobState state, const std::string& reason) {
  DT_LOG(INFO) << "job " << a.job_id() << " rank " << a.rank() << " " << v1::JobState_Name(state)
               << ": " << reason;
  Report(a, state, reason);
}

bool Agent::Report(const v1::Assignment& a, v1::JobState final_state, const std::string& reason,
                   const v1::ProgressReport* stats, bool* delivered) {
  v1::ProgressReport r;
  if (stats != nullptr) r = *stats;
  r.set_job_id(a.job_id());
  r.set_rank(a.rank());
  r.set_attempt(a.attempt());
  if (r.generation() == 0) r.set_generation(a.generation());
  r.set_final_state(final_state);
  r.set_reason(reason);
  // Progress is sent once (the next report carries newer numbers); a final
  // report is retried while the scheduler is unreachable.
  RetryPolicy policy;
  policy.max_attempts = final_state == v1::JOB_STATE_UNSPECIFIED ? 1 : 5;
  policy.initial_backoff = absl::Milliseconds(200);
  policy.max_backoff = absl::Seconds(2);
  RetryHooks hooks;
  hooks.on_retry = [](const absl::Status& s, int attempts, absl::Duration wait) {
    DT_LOG(WARNING) << s << "; retrying in " << wait;
  };
  bool stop = false;
  const absl::Status s = Retry(
      policy,
      [&] {
        // Between a heartbeat's "unknown trainer" (a restarted scheduler)
        // and the registration that claims the running job again, the agent
        // has no id. A report sent then would name no trainer, and the
        // scheduler's NOT_FOUND would read as "the job is not yours" and
        // cancel the job it is about to adopt: wait for the id instead.
        r.set_trainer_id(trainer_id());
        if (r.trainer_id().empty()) {
          return absl::UnavailableError(
              "registering with the scheduler again; the report waits for the trainer id");
        }
        absl::StatusOr<v1::ReportProgressReply> reply = cluster_->ReportProgress(r);
        if (reply.ok()) stop = reply->stop();
        return reply.status();
      },
      hooks);
  if (delivered != nullptr) *delivered = s.ok();
  if (s.ok()) return stop;
  DT_LOG(WARNING) << s;
  // The job is no longer ours (the scheduler restarted or requeued it).
  return absl::IsNotFound(s) || absl::IsFailedPrecondition(s);
}

void Agent::AttachTimeline(const Job& job, v1::ProgressReport* report) {
  if (job.trace == nullptr) return;
  v1::RankTimeline* t = report->mutable_timeline();
  t->set_rank(job.assignment.rank());
  t->set_trainer_id(trainer_id());
  t->set_attempt(job.assignment.attempt());
  t->set_dropped_spans(job.trace->dropped());
  {
    absl::MutexLock lock(&mu_);
    t->set_clock_offset_us(clock_offset_us_);
  }
  for (const trace::Span& s : job.trace->Snapshot()) {
    v1::TraceSpan* out = t->add_spans();
    out->set_name(s.name);
    out->set_track(s.track);
    out->set_start_unix_us(s.start_us);
    out->set_duration_us(s.duration_us);
    out->set_step(s.step);
  }
}

void Agent::Work(Job* job) {
  const v1::Assignment& a = job->assignment;
  if (options_.trace_capacity > 0) {
    job->trace = std::make_unique<trace::Recorder>(options_.trace_capacity);
  }
  train::JobProgress progress;
  std::unique_ptr<kvstore::ParameterServer> ps;
  const absl::Status s = RunAssignment(job, &progress, &ps);
  v1::ProgressReport last = ToReport(progress);
  v1::JobState final_state = v1::SUCCEEDED;
  std::string reason = "training finished";
  if (progress.drained && absl::IsCancelled(s)) {
    // Every rank stopped at the agreed step; rank 0's report carries the
    // checkpoint. Not the job's fault: the scheduler requeues it.
    final_state = v1::FAILED;
    reason = std::string(s.message());
    last.set_retryable(true);
    last.set_drained(true);
  } else if (job->stop) {
    absl::MutexLock lock(&mu_);
    final_state = job->stop_reason == "cancelled" ? v1::CANCELLED : v1::FAILED;
    reason = absl::StrCat(job->stop_reason, " at epoch ", last.epoch() + 1, " step ", last.step());
    // The trainer went away (a drain that took too long): not the job's
    // fault; the scheduler requeues it from its newest checkpoint.
    last.set_retryable(job->stop_reason == "trainer shutting down");
  } else if (!s.ok()) {
    final_state = v1::FAILED;
    reason = std::string(s.message());
    // A peer, the network or a kvstore shard failed, not this job's
    // definition: the scheduler may run the job again.
    // (Or the kvstore client was cancelled for a regroup the job could not
    // make outside a step: the scheduler requeues it.)
    absl::MutexLock lock(&mu_);
    last.set_retryable(IsTransient(s) || (absl::IsCancelled(s) && job->regroup_cancelled));
  }
  DT_LOG(INFO) << "job " << a.job_id() << " rank " << a.rank() << " "
               << v1::JobState_Name(final_state) << ": " << reason;
  job->finishing = true;
  AttachTimeline(*job, &last);
  Report(a, final_state, reason, &last);
  if (ps != nullptr) {
    // After the report, so the scheduler has the failure (and requeues)
    // before peers see the job vanish.
    EndKvstoreJob(ps.get(), a, final_state, last.drained());
    absl::MutexLock lock(&mu_);
    job->ps = nullptr;
  }
  ps.reset();
  observer_->OnJobEnd(a.job_id(), final_state);
  absl::MutexLock lock(&mu_);
  job->done = true;
  wake_ = true;
}

void Agent::EndKvstoreJob(kvstore::ParameterServer* ps, const v1::Assignment& a,
                          v1::JobState final_state, bool drained) {
  // SUCCEEDED or drained (every rank stopped at an agreed step, and a rank
  // may still exchange the drained epoch's statistics through the job): this
  // rank leaves; the shards drop the job once every rank left, so a rank
  // still reading the last round is not cut off. Otherwise the attempt is
  // over for every rank (the next attempt has a kvstore job of its own): drop
  // it now; kNotFound means a peer already did.
  const bool leave = final_state == v1::SUCCEEDED || drained;
  const absl::Status s = leave ? ps->LeaveJob() : ps->DeleteJob();
  if (s.ok() || absl::IsNotFound(s)) {
    DT_LOG(INFO) << "job " << a.job_id() << " rank " << a.rank() << ": kvstore job " << ps->job()
                 << (leave ? " left" : " deleted");
  } else {
    DT_LOG(WARNING) << "job " << a.job_id() << " rank " << a.rank() << ": kvstore job " << ps->job()
                    << " not cleaned up (the shards drop it after their job TTL): " << s;
  }
}

absl::Status Agent::RunAssignment(Job* job, train::JobProgress* progress,
                                  std::unique_ptr<kvstore::ParameterServer>* ps) {
  const v1::Assignment& a = job->assignment;
  absl::StatusOr<JobPlan> planned = PlanJob(a, options_.resources);
  if (planned.ok()) {
    planned->config.trace = job->trace.get();
    planned->config.cpu_peak_flops_per_thread = options_.cpu_peak_flops_per_thread;
  }
  observer_->OnJobStart(a.job_id(), a.rank(),
                        planned.ok() ? planned->config.devices : std::vector<Device>{});
  if (planned.ok()) {
    absl::MutexLock lock(&mu_);
    for (const Device& d : planned->config.devices) job->devices.push_back(d.ToString());
  }
  if (!planned.ok()) return planned.status();
  JobPlan& plan = *planned;
  // The user's model file (PlanJob named its cache path): fetched or
  // reused, verified against the digest before the job imports it.
  if (!plan.config.model_file.empty()) {
    std::string trainer_id;
    {
      absl::MutexLock lock(&mu_);
      trainer_id = trainer_id_;
    }
    DT_RETURN_IF_ERROR(FetchModel(cluster_, trainer_id, a.job_id(), a.spec().model_digest(),
                                  plan.config.model_file));
  }
  const train::SyncStrategy& strategy = *plan.strategy;
  const int rank = plan.config.rank;
  const int world = plan.config.world_size;
  {
    absl::MutexLock lock(&mu_);
    job->strategy = plan.strategy;
  }

  std::unique_ptr<collective::Store> store;
  std::unique_ptr<collective::Store> generation_store;
  std::unique_ptr<collective::Communicator> exchange_comm;  // an NCCL joiner's
  std::unique_ptr<collective::Communicator> comm;
  // Before `comm` goes, on every path (Progress clears it too).
  absl::Cleanup forget_device_comm = [job] { job->device_comm->Set(nullptr, 0); };
  if (strategy.uses_kvstore()) {
    absl::StatusOr<std::unique_ptr<kvstore::ParameterServer>> made =
        options_.connect_parameter_server(plan.kvstore_job, rank, plan.kvstore_token);
    if (!made.ok()) return Annotate(made.status(), "connecting to the kvstore");
    *ps = *std::move(made);
    plan.config.kvstore = ps->get();
    plan.config.join = a.join();
    absl::MutexLock lock(&mu_);
    job->ps = ps->get();
    if (job->stop) job->ps->Cancel(absl::StrCat("job stopped: ", job->stop_reason));
  }
  // A replacement receives the survivors' state over a communicator of its
  // generation (train::JobConfig::join), unless it continues the lost
  // worker's kvstore rounds.
  const bool exchange = a.join() && !strategy.replacement_continues_rounds();
  if (strategy.uses_communicator() || exchange) {
    store = cluster_->RendezvousStore(trainer_id(), a.job_id(), a.attempt());
    // Generation G > 0 (a replacement joining a running attempt) meets
    // under its own keys.
    if (a.generation() > 0) {
      generation_store = std::make_unique<GenerationStore>(store.get(), a.generation());
    }
    plan.config.join = a.join();
    const absl::Time start = absl::Now();
    collective::Store* meet = generation_store != nullptr ? generation_store.get() : store.get();
    const std::string meeting = strategy.uses_communicator()
                                    ? absl::StrCat("rendezvous of rank ", rank, " of ", world)
                                    : absl::StrCat("regroup of rank ", rank, " of ", world,
                                                   " in generation ", a.generation());
    if (exchange && strategy.uses_device_communicator()) {
      // A replacement receives the state over a host communicator first,
      // as the survivors send it (Progress::Regroup).
      absl::StatusOr<std::unique_ptr<collective::Communicator>> exchanged =
          options_.connect_communicator(rank, world, meet,
                                        ExchangeOptions(plan.communicator_options));
      if (!exchanged.ok()) {
        return Annotate(exchanged.status(), absl::StrCat("regroup of rank ", rank, " of ", world,
                                                         " in generation ", a.generation()));
      }
      exchange_comm = *std::move(exchanged);
      plan.config.exchange_communicator = exchange_comm.get();
    }
    absl::StatusOr<std::unique_ptr<collective::Communicator>> made =
        options_.connect_communicator(rank, world, meet, plan.communicator_options);
    if (!made.ok()) return Annotate(made.status(), meeting);
    comm = *std::move(made);
    if (strategy.uses_device_communicator()) job->device_comm->Set(comm.get(), a.generation());
    if (strategy.uses_communicator()) {
      DT_LOG(INFO) << "job " << a.job_id() << " rank " << rank << ": connected to " << world - 1
                   << " peers in " << absl::Now() - start << " (" << strategy.name() << ")";
    }
    plan.config.communicator = comm.get();
  }
  for (const Device& d : plan.config.devices) {
    if (absl::StatusOr<Allocator*> alloc = GetAllocator(d); alloc.ok()) (*alloc)->ResetPeak();
  }
  // Several ranks agree on a drain through the attempt's store.
  if (store == nullptr && world > 1) {
    store = cluster_->RendezvousStore(trainer_id(), a.job_id(), a.attempt());
  }
  if (strategy.replacement_continues_rounds() && world > 1) {
    DT_RETURN_IF_ERROR(ShareAttemptStart(store.get(), a, &plan.config));
  }
  // Recovery in place with a regroup (the strategy says whether), without
  // sync_batch_norm.
  const bool regroups =
      world > 1 && !plan.config.sync_batch_norm && strategy.RegroupsInPlace(world);
  // A survivor may wait for a lost peer without an error (the strategy says
  // when: a synchronous or bounded-delay kvstore round, an NCCL collective
  // over shared memory or NVLink). Its heartbeats say so once a step stalls.
  const bool watch_steps = world > 1 && strategy.StepMayStall(plan.config.kvstore_consistency) &&
                           (regroups || !strategy.RegroupsInPlace(world));
  Progress observer(this, job, world > 1 ? store.get() : nullptr, regroups ? store.get() : nullptr,
                    strategy, plan.communicator_options,
                    regroups && strategy.uses_kvstore() ? ps : nullptr, watch_steps);
  return train::RunJob(plan.config, &observer, progress);
}

}  // namespace agent
}  // namespace dtrain
