// One trainer's share of a training job, as the trainer daemon runs it: the
// data shard of its rank, the data-parallel step over its devices
// (DataParallelTrainer, or a hybridized step), the epoch's loss and training
// accuracy averaged over the ranks, test accuracy and checkpoints on rank 0,
// and resuming from a checkpoint. No transport: the caller connects the
// collective communicator or the kvstore client, watches progress through a
// JobObserver (services/trainer reports it to the scheduler), stops and
// drains the job through a JobControl and connects a regroup's membership
// through a Membership (JobHooks). How the ranks meet, and how the job lives
// through a lost rank, is its strategy's (SyncStrategy, gradient_sync.h:
// RunJob asks it instead of branching on the transports).
//
//   JobConfig c;
//   c.model = "lenet";
//   c.epochs = 10;
//   c.checkpoint_interval_epochs = 1;
//   c.checkpoint_path = "/shared/ckpt/job-000001.ckpt";
//   JobProgress last;
//   absl::Status s = RunJob(c, &observer, &last);
//
// Determinism: the data order of epoch e depends only on (seed, e), and a
// checkpoint holds the parameters, buffers and momentum of replica 0, so a
// job resumed from the checkpoint of epoch e continues exactly as the
// undisturbed job would (same devices, ranks and thread counts).
//
// Drain. JobControl::DrainRequested is polled before every step with the
// steps this run has done; when it returns true every rank must be at the
// same step (the caller agrees on it: libs/agent does it through the job
// attempt's rendezvous store). Then each rank writes its partial epoch
// statistics (loss sum, samples, correct predictions) next to the
// checkpoint ("<checkpoint_path>.rank<R>.partial"), the ranks meet once
// (one more AverageStatistics round, so the files exist before the
// checkpoint does; strategies without a common round, kvstore-held
// weights, do not wait), rank 0 checkpoints the parameters, buffers and
// momentum with "epochs_done" and "steps_done" (the steps of the next epoch
// done), and RunJob returns Cancelled with progress->drained set. A job
// resumed from such a checkpoint (same world_size: each rank's shard of the
// epoch depends on it) skips the first steps_done batches of that epoch's
// order (DataLoader::StartEpoch) and restores its partial statistics, so it
// continues exactly as the undisturbed job: no step is lost or repeated.
// Rank 0 of the run that completes the job removes every
// "<checkpoint_path>.rank<R>.partial" (the checkpoint stays).
// (Ranks not in lockstep, asynchronous kvstore modes, may have drained at
// other steps than rank 0: their statistics file is then ignored, with a
// warning, and the epoch's loss counts only the resumed steps.)
//
// Recovery in place. The job's SyncStrategy (gradient_sync.h) says whether
// its ranks regroup (RegroupsInPlace), which failures may be a lost peer's
// (MayBePeerLoss, loss_is_silent) and whether a replacement continues a lost
// worker's kvstore rounds instead (replacement_continues_rounds); the
// paragraphs below describe each strategy's answers.
//
// Allreduce jobs on CPU ("allreduce"). When a step fails with a
// transient error (a peer was lost: UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED)
// RunJob does not return at once: it asks Membership::Regroup for the
// transports of the attempt's next membership (libs/agent waits for the
// scheduler to put a spare trainer in the lost rank's place). The failed
// step applied nothing (DataParallelTrainer::Regroup), so this rank still
// holds the model and optimizer state of its last completed step. The ranks
// of the new membership then exchange their positions (an allgather of
// survivor flag, epoch, step, steps attempted), the lowest surviving rank
// (the root) broadcasts its parameters, buffers, momentum and data position
// (epoch, step, its partial epoch statistics, which a joiner adopts for
// its own, and its count of steps, which every
// rank adopts so that DrainRequested sees the same counts on every rank
// after a recovery too) and every rank continues from the
// root's last completed step: its data loader restarts that epoch at that
// step. Over "allreduce" every step sums its loss, samples and correct
// predictions over the ranks before any update
// (DataParallelTrainer::last_step_statistics), so every rank's partial
// statistics are the whole job's: the root's hold the lost rank's share and
// the recovered epoch's loss and accuracy are the undisturbed run's bit for
// bit. Other strategies sum them once, at the epoch's end: there the lost
// rank's share of the epoch is gone and the root's stands in. A rank started with JobConfig::join
// (the replacement) takes part in the same exchange before its first step and receives all of it.
// Once the first step after a regroup completed, the root calls JobObserver::OnRecovered with the
// seconds since its failed step and the steps lost (the furthest any rank had got, counting the
// failed step, minus where the root resumed: 1 when every survivor failed the same step). A regroup
// that fails transiently (another rank lost meanwhile) asks for the next membership, up to 3 times;
// otherwise, or when Regroup answers an error, RunJob returns the step's error as before. A peer
// lost in the epoch's statistics round (after the epoch's last step) is recovered the same way with
// no step lost: the survivors' position is the epoch's end, and the new membership meets again for
// that epoch's statistics (a joiner adopts the root's; OnRecovered follows that round). Evaluation
// and checkpoints are rank 0's alone: a peer lost meanwhile shows in the
// next collective (a step's) and is recovered there; if rank 0 is lost,
// its replacement evaluates at the next epoch's end. Not recovered: this
// rank's own failures outside a step (a checkpoint it cannot write) and a
// drain's meeting: RunJob returns the error (a transient one: the
// scheduler requeues the attempt from its checkpoint).
//
// KVSTORE jobs in synchronous rounds ("kvstore_sync") recover the same way: a
// survivor's step fails when its kvstore client is cancelled (CANCELLED while
// StopRequested is false: libs/agent cancels it when the scheduler offers the
// next membership, as a survivor blocked in a round that waits for the lost
// rank cannot tell), the exchange goes over Regroup's communicator, and the
// rounds continue in the new membership's own kvstore job
// (MembershipTransports::kvstore): no round of the old one has to be
// completed. The recovery's seconds count from the start of the failed step
// (the wait for the scheduler to notice the loss included).
//
// KVSTORE jobs whose weights live on the kvstore ("kvstore_weights": kAsync,
// kBoundedDelay) need no exchange: the survivors never stop (they hold
// nothing the job needs), and a replacement (JobConfig::join, no
// communicator) joins the attempt's kvstore job as the lost rank's worker:
// Create pulls the server's weights, DataParallelTrainer::ResumeKvstoreWorker
// continues that worker's rounds, and the rounds it had pushed are the steps
// it completed, so the joiner continues at attempt_start + rounds (same epoch
// order, same shard) with the epoch's statistics from zero. The step the lost
// worker was in is lost (1 step; the buckets it had pushed of it stay
// applied). Once its first step is done the joiner calls OnRecovered.
//
// CUDA replicas recover the same way: the failed step applied nothing, the
// survivors keep their device-resident model and momentum, and the state
// travels through host memory over Regroup's communicator (a host transport).
// ALLREDUCE jobs over NCCL ("nccl_allreduce"): a survivor's step fails when
// its NCCL communicator is aborted (libs/agent aborts it when the scheduler
// offers the next membership: a collective waiting for a dead peer over
// shared memory or NVLink may never fail by itself), any step failure is then
// worth a regroup while StopRequested is false (a regroup that never comes
// ends it with the step's error), and the new membership's NCCL communicator
// (MembershipTransports::device_communicator; a joiner's JobConfig
// communicator, with exchange_communicator for the state) carries the
// gradients.
//
// Elastic jobs. The new membership may be smaller (no spare: the survivors
// continue, ranks renumbered) or larger (RegroupRequested: a new rank joins
// at a step boundary; no step is lost). Each rank keeps its batch
// (local_batch_size), so the global batch follows the number of ranks, and
// the data loader is made again for the new rank and world size: the
// interrupted epoch continues at the same share of its samples (the root's
// step times its old world size over the new one, rounded down, so a few
// samples may be seen twice but none skipped when the world shrinks), and
// later epochs are sharded over the new world. A rank that becomes rank 0
// loads the test set then. A joiner of a larger membership starts the
// epoch's statistics at zero (nothing was lost) unless they are the whole
// job's (summed in every step; then it adopts the root's); one that
// replaces a lost rank adopts the root's.
//
// Thread-safety: RunJob runs on the calling thread; the hooks are called on
// it.
#ifndef DTRAIN_LIBS_TRAIN_JOB_H_
#define DTRAIN_LIBS_TRAIN_JOB_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/collective/communicator.h"
#include "libs/data/config.h"
#include "libs/kvstore/parameter_server.h"
#include "libs/ops/ops.h"
#include "libs/tensor/tensor.h"
#include "libs/trace/trace.h"
#include "libs/train/step_phases.h"

namespace dtrain {
namespace train {

struct JobConfig {
  std::string name;  // for log lines, e.g. the job id

  // What to train (a JobSpec's fields).
  std::string model = "lenet";
  // Your own model (docs/models.md): an ONNX file on this machine, already
  // verified against its digest; non-empty: the job trains the imported
  // file (job_model.h) and `model` only names it (checkpoints record the
  // name: the file's digest). init may then be "from_model".
  std::string model_file;
  std::string data_dir;   // Fashion-MNIST; empty: the Debian package's
  data::DataConfig data;  // its format empty: Fashion-MNIST from data_dir
  int epochs = 1;
  int64_t global_batch_size = 256;  // over all ranks
  // Samples per step of each rank; 0: global_batch_size / world_size. An
  // elastic job sets it (global_batch_size / its num_trainers), so that a
  // rank keeps its batch whatever the membership (the global batch follows
  // the number of ranks; the learning rate is unchanged).
  int64_t local_batch_size = 0;
  ops::SgdParams sgd;
  std::string init = "normal";  // or "kaiming"
  uint64_t seed = 0;
  int threads = 0;  // CPU kernel threads of this trainer; 0: as configured
  int64_t train_limit = 0;
  int64_t test_limit = 0;
  bool hybridize = false;  // one rank, one CPU device
  bool sync_batch_norm = false;
  int checkpoint_interval_epochs = 0;  // 0: no checkpoints
  // Gradient bucket size (DataParallelOptions::bucket_bytes); 0: its default.
  int64_t bucket_bytes = 0;
  // The measured peak FLOP/s of one CPU kernel thread (ops/peak.h), for
  // MFU: this rank's peak is it times the kernel threads the job uses. 0, or
  // CUDA devices: unknown (JobProgress::mfu stays 0).
  double cpu_peak_flops_per_thread = 0;

  // This trainer's place in the job.
  int rank = 0;
  int world_size = 1;
  std::vector<Device> devices = {Device::Cpu(0)};
  // Between the ranks (not owned): a communicator (allreduce) or a kvstore
  // client (one worker per rank), or neither for one rank.
  collective::Communicator* communicator = nullptr;
  kvstore::ParameterServer* kvstore = nullptr;
  kvstore::Consistency kvstore_consistency = kvstore::Consistency::kSync;
  int kvstore_max_staleness = 0;
  kvstore::CompressionSpec kvstore_compression;

  // Rank 0 writes a checkpoint here (atomically replaced) every
  // checkpoint_interval_epochs, with these extra metadata entries.
  std::string checkpoint_path;
  // Also keep each epoch's checkpoint as <checkpoint_path>.epoch<E> (a hard
  // link to the file written; state_io.h EpochCheckpointPath).
  bool keep_epoch_checkpoints = false;
  std::map<std::string, std::string> checkpoint_metadata;
  // Non-empty: every rank starts from this checkpoint instead of the
  // initial weights, with the epoch after the one it holds.
  std::string resume_from;
  // This rank replaces a lost one of a running job (see "Recovery in
  // place"): `communicator` is the new membership's; the state, the data
  // position and the epoch's statistics come from the surviving ranks.
  bool join = false;
  // A joiner of an ALLREDUCE job over NCCL (not owned): the host
  // communicator of its generation that carries the exchange of the state
  // (device memory travels through the host); `communicator` (NCCL) then
  // carries the gradients. Null otherwise.
  collective::Communicator* exchange_communicator = nullptr;
  // A joiner with kvstore-held weights (kvstore_consistency kAsync or
  // kBoundedDelay): where the attempt started (its checkpoint's epochs done
  // and steps of the next epoch), which the lost worker's rounds count from.
  int attempt_start_epoch = 0;
  int64_t attempt_start_step = 0;

  // The timeline (not owned; null: none): every step's phases and bucket
  // reductions (step_trace.h, with the count of steps this call ran) and, on
  // the step track, "epoch statistics", "evaluate", "checkpoint" and
  // "recovery" (a failed step until the regrouped state).
  trace::Recorder* trace = nullptr;
};

struct JobProgress {
  int epoch = 0;     // epochs completed
  int64_t step = 0;  // within the current epoch
  int64_t steps_per_epoch = 0;
  double loss = 0;  // running mean over the epoch; at its end, over all ranks
  // The last step's loss (this rank's batch mean, as float32 computed it)
  // and its index over the job (0-based: epoch * steps_per_epoch + step);
  // job_step -1 before the first step. The loss curve (JobStatus.step_losses).
  float step_loss = 0;
  int64_t job_step = -1;
  double train_accuracy = 0;      // likewise (predictions before each update)
  double test_accuracy = -1;      // rank 0, after each epoch; -1: not yet
  double samples_per_second = 0;  // of the whole job
  // Model FLOPs (graph/flops.h: a training step's per sample) times
  // samples_per_second, and its ratio to every rank's peak (world_size times
  // this rank's, see JobConfig::cpu_peak_flops_per_thread); 0 when unknown.
  double achieved_flops = 0;
  double mfu = 0;
  double epoch_seconds = 0;     // wall time of the last completed epoch
  std::string checkpoint_path;  // rank 0: the newest checkpoint written
  int checkpoint_epoch = 0;
  int64_t checkpoint_step = 0;  // steps of epoch checkpoint_epoch + 1 it holds (a drain's)
  bool drained = false;         // RunJob stopped for DrainRequested (Cancelled)
  // The dataset as opened (the test set: rank 0's), and corrupt images left
  // out (DataConfig::skip_corrupt).
  int64_t data_train_samples = 0;
  int64_t data_test_samples = 0;
  int64_t data_corrupt_skipped = 0;
};

// A step's wall time split by phase: waiting for the data loader, the
// communication queue's reduction work (it overlaps backward, so an upper
// bound of what communication cost), and the rest; and the step's phases as
// spans (step_phases.h: data_wait, forward_backward, comm_wait, optimizer,
// and every bucket's reduction).
struct StepTimes {
  double compute = 0;
  double communication = 0;
  double data_wait = 0;
  StepPhases phases;
  int64_t samples = 0;  // this rank's samples in the step
  // The data loader (libs/data/loader.h): batches ready ahead when the step
  // took its batch, and samples prepared per thread-second so far.
  int64_t data_queue_depth = 0;
  double data_decode_rate = 0;
};

// What RunJob tells its caller (services/trainer reports it). Called on
// RunJob's thread.
class JobObserver {
 public:
  virtual ~JobObserver() = default;
  // After every step.
  virtual void OnStep(const JobProgress& progress, const StepTimes& times) {}
  // After every epoch, once rank 0 has evaluated and checkpointed.
  virtual void OnEpoch(const JobProgress& progress) {}
  // On the rank that sent the state, after the first step completed since
  // a regroup: the seconds since the failed step, and the steps lost.
  virtual void OnRecovered(double seconds, int64_t steps_lost) {}
};

// What RunJob asks before every step, in this order, with the steps this
// RunJob call has done over all epochs. Every rank must answer
// DrainRequested and RegroupRequested true at the same count.
class JobControl {
 public:
  virtual ~JobControl() = default;
  // True stops the job (RunJob returns Cancelled).
  virtual bool StopRequested() { return false; }
  // True drains the job before the next step (see "Drain" above; RunJob
  // returns Cancelled with progress->drained).
  virtual bool DrainRequested(int64_t steps_done) { return false; }
  // True makes every rank regroup (Membership::Regroup(OkStatus())) before
  // the next step, so a new rank can join at a step boundary (jobs with a
  // communicator).
  virtual bool RegroupRequested(int64_t steps_done) { return false; }
};

// The transports of a membership (not owned: they must outlive RunJob).
struct MembershipTransports {
  // Carries the exchange of the state and, unless one of the next two is
  // set, the gradients; this rank's rank and the world size are its (an
  // elastic job that shrank renumbers its ranks).
  collective::Communicator* communicator = nullptr;
  // ALLREDUCE jobs over NCCL: the NCCL communicator of the same membership
  // for the gradients.
  collective::Communicator* device_communicator = nullptr;
  // KVSTORE jobs in synchronous rounds: the kvstore client of the
  // membership's own kvstore job, where the gradients' rounds continue.
  kvstore::ParameterServer* kvstore = nullptr;
};

// Recovery in place: how a rank meets the attempt's next membership
// (libs/agent waits for the scheduler's regroup and connects it).
class Membership {
 public:
  virtual ~Membership() = default;
  // A step failed with `failure` (a peer may be gone: the strategy says,
  // SyncStrategy::MayBePeerLoss), or `failure` is OK: RegroupRequested asked
  // for a regroup (an elastic job grows). Returns the transports of the
  // attempt's next membership, or an error (RunJob then returns `failure`,
  // or the error when `failure` is OK). Called again, with the regroup's
  // error, when a regroup fails.
  virtual absl::StatusOr<MembershipTransports> Regroup(const absl::Status& failure) {
    if (failure.ok()) return absl::UnimplementedError("no membership to regroup");
    return failure;
  }
};

// The caller's side of RunJob: any of the three may be null (defaults: no
// notifications, never stop, no regroup). A pointer to an object that
// implements several of the interfaces fills each it implements:
//   RunJob(config, &my_observer_and_control, &progress);
struct JobHooks {
  JobHooks() = default;
  JobHooks(std::nullptr_t) {}  // NOLINT: none
  template <typename T>
  JobHooks(T* hooks) {  // NOLINT: implicit, see above
    if constexpr (std::is_base_of_v<JobObserver, T>) observer = hooks;
    if constexpr (std::is_base_of_v<JobControl, T>) control = hooks;
    if constexpr (std::is_base_of_v<Membership, T>) membership = hooks;
  }
  JobObserver* observer = nullptr;
  JobControl* control = nullptr;
  Membership* membership = nullptr;
};

// Runs this rank's share of the job to its end. *progress holds the last
// progress, also on errors. Errors: InvalidArgument for a config that cannot
// run (naming the field); the data set's, the collectives' (UNAVAILABLE,
// ABORTED or DEADLINE_EXCEEDED when a peer failed) and the checkpoint's;
// FailedPrecondition when the loss diverges; Cancelled when the control
// asked to stop or to drain (then progress->drained is set, and on rank 0
// progress->checkpoint_* name the drain's checkpoint); InvalidArgument when
// resuming a mid-epoch checkpoint with another world_size; DataLoss when
// its partial statistics file is missing or malformed.
absl::Status RunJob(const JobConfig& config, JobHooks hooks, JobProgress* progress);

}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_JOB_H_
