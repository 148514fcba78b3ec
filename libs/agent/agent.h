// Agent: a trainer's life in a cluster, free of any transport. It registers
// with the scheduler, heartbeats, runs the jobs it is assigned (one at a
// time, with libs/train's RunJob), reports their progress and end, stops
// them when they are cancelled, and stops cleanly when asked to shut down.
// services/trainer's daemon gives it a gRPC ClusterClient, the kvstore
// client and Prometheus metrics; tests give it fakes.
//
//   Agent agent(&cluster, options, &metrics);
//   std::thread signals([&] { shutdown.Wait(); agent.Shutdown(); });
//   agent.Run();  // until Shutdown()
//
// Threads. Run() is the heartbeat thread: it registers (again, with
// exponential backoff, whenever the scheduler forgets the trainer: NOT_FOUND
// from Heartbeat), heartbeats every heartbeat_interval_ms the scheduler asked
// for (a failed heartbeat is logged and tried again at the next interval),
// passes cancellations on and hands assignments to a job thread. Everything
// a job does (planning it with PlanJob, meeting its peers, training,
// reporting) runs on that job thread, so heartbeats keep flowing however
// long a job takes to start; they list the job while the trainer holds it.
//
// Jobs. The plan comes from PlanJob (job_plan.h). Several trainers meet
// through the scheduler's rendezvous store of the attempt
// (ClusterClient::RendezvousStore) and create a communicator there; KVSTORE
// jobs get a parameter server from options.connect_parameter_server. Rank 0
// reports progress (after every epoch, and between epochs at most once per
// report_interval); every rank reports its recent step times
// (ProgressReport.step_times: medians of its last 32 steps' phases,
// step_window.h) at most once per report_interval, which the scheduler
// compares across ranks (stragglers); every rank sends one final report: SUCCEEDED ("training
// finished"); CANCELLED ("cancelled at epoch E step S") when the scheduler
// cancelled it (a cancel_job_ids entry, or stop in a progress reply);
// FAILED with the error's message otherwise, marked retryable when a peer,
// the network or a kvstore shard failed (a transient error: IsTransient in
// libs/base/retry.h) so that the scheduler requeues it. Stopping a job
// (cancelled, superseded, shutdown) also cancels its kvstore operations
// (ParameterServer::Cancel), so a rank waiting for a round a failed peer
// never pushes stops as soon as the scheduler tells it (its next
// heartbeat). After the final report a KVSTORE job's kvstore job is left
// (SUCCEEDED: the shards drop it when every rank left) or deleted (any other
// end), so nothing stays on the shards. A job that cannot
// start (a bad assignment, devices this trainer lacks, a failed rendezvous)
// is such a FAILED job: it never disappears silently. Final reports are
// tried up to 5 times while the error is transient.
//
// One job at a time. An assignment that arrives while a job is ending (its
// final report under way), or a newer attempt of the running job (which
// supersedes it: "superseded by attempt N"), waits up to previous_job_wait
// for it to end; any other assignment while a job runs is refused (FAILED,
// "trainer is already running job X"). A repeated delivery of the running
// attempt is ignored.
//
// Shutdown() stops the running job at its next step (FAILED and retryable,
// "trainer shutting down at epoch E step S": the scheduler requeues it from
// its newest checkpoint, counting the attempt), reports it and makes Run()
// return.
//
// Drain() (SIGTERM) drains instead: heartbeats say draining (the scheduler
// places no new work here), the running job (and one that arrives
// meanwhile) is drained, and Run() returns once no job is left. A
// scheduler's HeartbeatReply.drain_job_ids (trainctl drain) drains the job
// the same way without ending Run(). Draining a job: the ranks must stop at
// the same step (they meet every step), so they agree through the attempt's
// rendezvous store (ClusterClient::RendezvousStore; jobs of one rank need
// no agreement): a rank asked to drain claims the drain (StoreAdd
// "dtrain/drain/claim" 1; the first claimant wins) and, before its next
// step s+1, publishes it (StoreSet "dtrain/drain/step" D: stop once D
// steps of this attempt are done), with D the first multiple of
// drain_poll_steps (k) after s. Every rank reads the key (StoreGet without
// waiting, which adds nothing to the store) only when its steps done are a
// multiple of k, so at D itself at the latest; no rank can finish step s+1
// before the claimant took part in it, so that read comes after the
// publication: every rank stops at D; ALLREDUCE and synchronous KVSTORE
// jobs alike. The cost: one scheduler call per k steps and rank (every step,
// as first written, cost the 2-trainer demo job 4% of its speed), and a
// drain waits up to k steps longer. While the store cannot
// be read a rank trains on and reads again a second later (if a drain was
// published meanwhile the ranks may part: the attempt fails like one with a
// lost peer). Asynchronous KVSTORE ranks are not in lockstep; they stop
// at the same step count, not at the same moment.
// Then train::RunJob drains (libs/train/job.h: partial statistics, rank 0's
// checkpoint at that step) and every rank reports FAILED with retryable and
// drained ("drained at epoch E step S"); rank 0's report carries the
// checkpoint (checkpoint_step) and the scheduler requeues the job from it
// without counting the attempt.
//
// Recovery in place (ALLREDUCE jobs, CPU or CUDA devices; not with
// sync_batch_norm):
// when a step fails because a peer is gone, train::RunJob asks the job's
// observer to regroup (libs/train/job.h). The job keeps its state; its
// heartbeats (sent at once, then every regroup_heartbeat_interval) list it
// in peer_lost_job_ids, so the scheduler declares the silent peer lost
// without waiting for its heartbeat timeout and, when a spare trainer is
// free, puts it in the lost rank's place in a new generation of the attempt
// (HeartbeatReply.regroups). The job then connects a new communicator under
// the generation's rendezvous keys ("gen<G>/...", same attempt store) and
// RunJob continues; the rank that sent the state reports the recovery
// (ProgressReport.recovery_seconds). An Assignment with join set (the spare)
// connects under its generation's keys and passes JobConfig::join. With no
// regroup within regroup_wait, or when the scheduler cancels the job
// instead (it requeued the attempt: no spare), the job ends as before
// (FAILED and retryable, or CANCELLED). Drains keep using the attempt's
// own keys, which every generation shares. The rank and world size of a
// regroup are this trainer's place in the Regroup's trainer_ids (an elastic
// job that shrank renumbers its ranks; a trainer not listed ends the job
// with FAILED_PRECONDITION); the job's reports then carry them, and the
// generation. Elastic jobs grow at a step boundary: a Regroup for a newer
// generation while no step failed makes the first rank that hears of it
// claim "dtrain/grow/<G>/claim" and publish "dtrain/grow/<G>/step" (the
// first multiple of drain_poll_steps after its steps done), which every
// rank reads at multiples of drain_poll_steps, as for a drain; there every
// rank regroups (train::JobControl::RegroupRequested) and the joiner,
// waiting in its first connect, meets them. Only elastic jobs read these
// keys (one more store read per drain_poll_steps steps).
//
// Scheduler restarts: the job trains on while the scheduler cannot be
// reached (heartbeats fail and are tried every
// unreachable_heartbeat_interval, progress reports at their next time, a
// store read a second later; a report or store call the restarted scheduler
// answers UNAVAILABLE, before this trainer registered again, likewise). When
// Heartbeat says NOT_FOUND (a restarted scheduler forgot the trainer), the
// agent registers again at once, with its previous id and, while a job
// runs (not stopping), what it runs (RegisterTrainerRequest.running: job,
// attempt, generation, rank, world size, epoch, step, devices): the
// scheduler then gives the old id back and adopts the attempt, so the job
// never notices (its reports, store and regroups keep using that id).
//
// Timeline: each job records its spans (train::JobConfig::trace) in a ring
// buffer of trace_capacity spans; the final report of every rank, and rank
// 0's epoch reports, carry them (ProgressReport.timeline) with the clock
// offset estimated from heartbeats: the scheduler's time in the reply
// against the midpoint of the call, from the reply with the shortest round
// trip seen (NTP's rule; on one machine the offset is about zero).
//
// KVSTORE jobs in synchronous rounds (CPU devices) recover in place too.
// A survivor cannot see the loss: it waits in a round for the lost rank's
// push. Once a step has lasted longer than max(1 s, 4 x the previous
// step), its heartbeats list the job in peer_lost_job_ids (so the silent
// trainer is declared lost after the peer-lost timeout); when the
// scheduler's Regroup arrives the agent cancels the job's kvstore client,
// the step fails, and the regroup connects a communicator as above (it
// only carries the exchange of the state) and a kvstore client of the
// generation's own kvstore job (security::KvstoreJobName with the
// generation, Regroup.kvstore_token; train::MembershipTransports::kvstore).
// The old generation's kvstore job is dropped after RunJob. A replacement
// (join) connects both. A cancelled epoch's statistics round regroups the
// same way (libs/train/job.h), but no step runs then, so the loss is
// noticed at the heartbeat timeout; any other cancelled round outside a
// step ends the attempt retryably: the scheduler requeues it.
//
// ALLREDUCE jobs over NCCL: a survivor blocked in an NCCL collective on a
// dead peer may never fail by itself, so its heartbeats say peer-lost once
// its step stalls (as for synchronous kvstore rounds below) and a Regroup
// aborts the job's NCCL communicator (collective::Communicator::Abort,
// after the agent's lock is released: device_comm_slot.h); the
// regroup then connects a host communicator (TCP, "regroup" keys) for the
// exchange of the state and a new NCCL communicator for the gradients
// (train::MembershipTransports::device_communicator), both under the
// generation's keys; a replacement (join) connects the same two, in the
// same order (train::JobConfig::exchange_communicator).
//
// KVSTORE jobs whose weights live on the kvstore (ASYNCHRONOUS,
// BOUNDED_DELAY) recover in place without a regroup: the survivors keep
// training (a Regroup does not cancel their kvstore client; a
// bounded-delay survivor that waits in a pull for the lost worker has its
// heartbeats say a peer is lost once its step stalls, as above), and a
// replacement (join) connects to the attempt's own kvstore job as the lost
// rank's worker, with no communicator: train::RunJob pulls the weights and
// continues that worker's rounds (libs/train/job.h).
//
// Thread-safety: Shutdown() may be called from any thread at any time; Run()
// is called once. The observer is called on job threads, one job at a time.
#ifndef DTRAIN_LIBS_AGENT_AGENT_H_
#define DTRAIN_LIBS_AGENT_AGENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/agent/cluster_client.h"
#include "libs/agent/job_plan.h"
#include "libs/collective/communicator.h"
#include "libs/kvstore/parameter_server.h"
#include "libs/train/job.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace agent {

// What happens to the trainer's jobs, for metrics. Called on the job's
// thread.
class AgentObserver {
 public:
  virtual ~AgentObserver() = default;
  // A job starts: before it meets its peers. `devices` are the ones it will
  // use (empty when it cannot be planned; it then ends at once).
  virtual void OnJobStart(const std::string& job_id, int rank, const std::vector<Device>& devices) {
  }
  // After every step and every epoch of the job (train::JobObserver's).
  virtual void OnStep(const train::JobProgress& progress, const train::StepTimes& times) {}
  virtual void OnEpoch(const train::JobProgress& progress) {}
  // The job ended and its final report was sent (or given up on).
  virtual void OnJobEnd(const std::string& job_id, scheduler::v1::JobState final_state) {}
};

// Makes the parameter server of one worker of a kvstore job; `token` is the
// attempt's kvstore capability (Assignment.kvstore_token; "" without one),
// which the client presents with every call.
using ParameterServerFactory =
    std::function<absl::StatusOr<std::unique_ptr<kvstore::ParameterServer>>(
        const std::string& kvstore_job, int worker, const std::string& token)>;

// Makes the communicator of rank `rank` of `world` through `store` (which
// outlives it). collective::Communicator::Create has this shape.
using CommunicatorFactory = std::function<absl::StatusOr<std::unique_ptr<collective::Communicator>>(
    int rank, int world, collective::Store* store, const collective::CommunicatorOptions& options)>;

struct AgentOptions {
  // The trainer's name for people (RegisterTrainerRequest.name).
  std::string name;
  // Devices offered, checkpoint directory, collective settings.
  // has_parameter_server is ignored: it is whether connect_parameter_server
  // is set.
  TrainerResources resources;
  // Null: KVSTORE jobs fail (FAILED_PRECONDITION).
  ParameterServerFactory connect_parameter_server;
  // Null: collective::Communicator::Create.
  CommunicatorFactory connect_communicator;

  // The shortest heartbeat interval honoured, whatever the scheduler asks.
  absl::Duration min_heartbeat_interval = absl::Milliseconds(50);
  // While heartbeats fail (the scheduler is unreachable, say restarting),
  // they are tried this often (at most the scheduler's interval).
  absl::Duration unreachable_heartbeat_interval = absl::Milliseconds(250);
  // Registration retries: this delay, doubling up to max_register_backoff.
  absl::Duration register_backoff = absl::Milliseconds(200);
  absl::Duration max_register_backoff = absl::Seconds(5);
  // Ranks read a published drain step every this many steps (see Drain()).
  int drain_poll_steps = 16;
  // Rank 0's progress reports between epochs: at most one per interval.
  absl::Duration report_interval = absl::Seconds(1);
  // How long an assignment waits for the previous job to end.
  absl::Duration previous_job_wait = absl::Seconds(30);
  // Recovery in place: how long a job whose collective failed waits for the
  // scheduler's regroup, and the heartbeat interval meanwhile.
  absl::Duration regroup_wait = absl::Seconds(30);
  absl::Duration regroup_heartbeat_interval = absl::Milliseconds(200);
  // A regroup's communicator waits at most this long for its peers (the
  // replacement may die before it connects: the survivors then wait for
  // the next generation) and for each of its operations afterwards.
  absl::Duration regroup_timeout = absl::Seconds(15);
  // The measured peak FLOP/s of one CPU kernel thread (ops/peak.h): jobs
  // report their model FLOPs utilization against it
  // (train::JobConfig::cpu_peak_flops_per_thread). 0: no MFU.
  double cpu_peak_flops_per_thread = 0;
  // Timeline spans kept per job (newest; about 100 bytes each). 0: no
  // timeline.
  size_t trace_capacity = 8192;
};

class Agent {
 public:
  // `cluster` and `observer` (may be null) are not owned and must outlive
  // the agent.
  Agent(ClusterClient* cluster, AgentOptions options, AgentObserver* observer = nullptr);
  // REQUIRES: Run() has returned, or was never called.
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Registers, heartbeats and runs jobs until Shutdown(); then stops the
  // running job, sends its final report and returns.
  void Run();

  // Asks Run() to stop and return. Returns at once.
  void Shutdown();

  // Asks Run() to drain its job (see above) and return when no job is left.
  // Returns at once. Shutdown() afterwards stops a drain that takes too
  // long.
  void Drain();

  // The id the scheduler gave at the last registration ("" while
  // unregistered).
  std::string trainer_id() const;

 private:
  struct Job;
  class Progress;

  bool WaitForWake(absl::Duration timeout);
  absl::Status Register(absl::Duration* interval);
  // Whether the scheduler answered (NOT_FOUND included).
  bool Heartbeat();
  void Accept(const scheduler::v1::Assignment& a);
  void StartLocked(const scheduler::v1::Assignment& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reap();
  void Stop(Job* job, const std::string& reason);
  // Sets the job's stop reason (once) and cancels its kvstore operations.
  void StopLocked(Job* job, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Refuse(const scheduler::v1::Assignment& a, scheduler::v1::JobState state,
              const std::string& reason);
  // True: the job is no longer this trainer's (stop it). `delivered` (if
  // set): whether the scheduler received the report.
  bool Report(const scheduler::v1::Assignment& a, scheduler::v1::JobState final_state,
              const std::string& reason, const scheduler::v1::ProgressReport* stats = nullptr,
              bool* delivered = nullptr);
  void Work(Job* job);
  // Puts the job's timeline spans (if it records them) in `report`.
  void AttachTimeline(const Job& job, scheduler::v1::ProgressReport* report);
  // `ps` receives the job's parameter server (KVSTORE jobs), which Work
  // cleans up after the final report.
  absl::Status RunAssignment(Job* job, train::JobProgress* progress,
                             std::unique_ptr<kvstore::ParameterServer>* ps);
  // Leaves (SUCCEEDED, or drained) or deletes (any other end) the attempt's
  // kvstore job.
  // A KVSTORE job's step has waited longer than its allowance (a round may
  // wait for a lost rank).
  bool StepStalledLocked(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndKvstoreJob(kvstore::ParameterServer* ps, const scheduler::v1::Assignment& a,
                     scheduler::v1::JobState final_state, bool drained);

  ClusterClient* const cluster_;
  AgentOptions options_;
  AgentObserver* const observer_;

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // a job ended: reap it now
  std::string trainer_id_ ABSL_GUARDED_BY(mu_);
  // The id of the last registration (kept when trainer_id_ is cleared).
  std::string previous_trainer_id_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Job> current_ ABSL_GUARDED_BY(mu_);
  // An assignment waiting for current_ to end, until next_deadline_.
  std::optional<scheduler::v1::Assignment> next_ ABSL_GUARDED_BY(mu_);
  absl::Time next_deadline_ ABSL_GUARDED_BY(mu_);
  // This trainer's clock minus the scheduler's (see "Timeline"), from the
  // heartbeat with the shortest round trip so far.
  int64_t clock_offset_us_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t clock_rtt_us_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace agent
}  // namespace dtrain

#endif  // DTRAIN_LIBS_AGENT_AGENT_H_
