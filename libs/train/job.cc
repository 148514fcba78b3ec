#include "libs/train/job.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/base/logging.h"
#include "libs/base/retry.h"
#include "libs/base/status.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/loader.h"
#include "libs/data/open.h"
#include "libs/graph/flops.h"
#include "libs/graph/hybridize.h"
#include "libs/nn/models.h"
#include "libs/train/data_parallel.h"
#include "libs/train/gradient_sync.h"
#include "libs/train/job_model.h"
#include "libs/train/state_io.h"
#include "libs/train/step_trace.h"
#include "libs/train/train.h"

namespace dtrain {
namespace train {
namespace {

absl::Status Validate(const JobConfig& c, const SyncStrategy& strategy) {
  auto bad = [](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
  };
  if (c.world_size < 1) return bad("world_size", absl::StrCat("must be >= 1, got ", c.world_size));
  if (c.rank < 0 || c.rank >= c.world_size) {
    return bad("rank", absl::StrCat("must be in 0..", c.world_size - 1, ", got ", c.rank));
  }
  if (c.devices.empty()) return bad("devices", "at least one");
  if (c.epochs < 1) return bad("epochs", absl::StrCat("must be >= 1, got ", c.epochs));
  if (c.local_batch_size < 0) {
    return bad("local_batch_size", absl::StrCat("must be >= 0, got ", c.local_batch_size));
  }
  if (c.local_batch_size == 0 &&
      (c.global_batch_size <= 0 || c.global_batch_size % c.world_size != 0)) {
    return bad("global_batch_size",
               absl::StrCat("must be a positive multiple of the ", c.world_size, " trainers, got ",
                            c.global_batch_size));
  }
  const int64_t k = static_cast<int64_t>(c.devices.size());
  if (c.local_batch_size > 0 && c.local_batch_size < k) {
    return bad("local_batch_size",
               absl::StrCat(c.local_batch_size, " leaves fewer than ", k, " samples per device"));
  }
  if (c.local_batch_size == 0 && c.global_batch_size / c.world_size < k) {
    return bad("global_batch_size",
               absl::StrCat(c.global_batch_size, " leaves fewer than ", k, " samples per device"));
  }
  if (c.hybridize && (c.world_size != 1 || k != 1 || !c.devices[0].is_cpu())) {
    return bad("hybridize", "needs one trainer with one CPU device");
  }
  if (c.world_size > 1 && c.communicator == nullptr && c.kvstore == nullptr) {
    return bad("communicator", "several ranks need a communicator or a kvstore client");
  }
  if (c.checkpoint_interval_epochs < 0) {
    return bad("checkpoint_interval_epochs", "must be >= 0");
  }
  // A joiner receives the survivors' state over its communicator, or
  // continues a lost worker's rounds (the strategy says which).
  if (c.join &&
      ((c.communicator == nullptr && !strategy.replacement_continues_rounds()) || c.hybridize)) {
    return bad("join",
               "a joining rank needs a communicator (allreduce, synchronous kvstore rounds) or "
               "kvstore-held weights, and no hybridize");
  }
  if (c.checkpoint_interval_epochs > 0 && c.checkpoint_path.empty()) {
    return bad("checkpoint_path", "needed with checkpoint_interval_epochs");
  }
  return absl::OkStatus();
}

// Loads `c.resume_from` into one replica (parameters, buffers, momentum);
// returns the epochs it holds, sets *steps_done to the steps of the next
// epoch it holds (a drain's checkpoint; 0 otherwise) and restores that
// epoch's loss and test accuracy into *progress.
absl::StatusOr<int> LoadCheckpoint(const JobConfig& c, nn::Module* model, nn::Sgd* optimizer,
                                   JobProgress* progress, int64_t* steps_done) {
  absl::StatusOr<std::map<std::string, std::string>> meta =
      LoadTrainingState(c.resume_from, c.model, model, optimizer);
  if (!meta.ok()) {
    return Annotate(meta.status(),
                    absl::StrCat("rank ", c.rank, " resuming from the checkpoint ", c.resume_from,
                                 " (the trainers need a shared checkpoint directory)"));
  }
  int epochs_done = 0;
  auto it = meta->find("epochs_done");
  if (it == meta->end() || !absl::SimpleAtoi(it->second, &epochs_done) || epochs_done < 0 ||
      epochs_done > c.epochs) {
    return absl::DataLossError(
        absl::StrCat(c.resume_from, ": no valid epochs_done in the checkpoint"));
  }
  *steps_done = 0;
  if (auto st = meta->find("steps_done"); st != meta->end()) {
    if (!absl::SimpleAtoi(st->second, steps_done) || *steps_done < 0) {
      return absl::DataLossError(
          absl::StrCat(c.resume_from, ": steps_done '", st->second, "' is not a step count"));
    }
    int world = 0;
    auto w = meta->find("world_size");
    if (*steps_done > 0 &&
        (w == meta->end() || !absl::SimpleAtoi(w->second, &world) || world != c.world_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("world_size: ", c.resume_from, " was taken mid-epoch by ",
                       w == meta->end() ? "?" : w->second,
                       " trainers; it resumes only on as many, not ", c.world_size));
    }
  }
  double value = 0;
  if (auto l = meta->find("loss"); l != meta->end() && absl::SimpleAtod(l->second, &value)) {
    progress->loss = value;
  }
  if (auto t = meta->find("test_accuracy");
      t != meta->end() && absl::SimpleAtod(t->second, &value)) {
    progress->test_accuracy = value;
  }
  return epochs_done;
}

// A rank's partial statistics of the epoch a drain interrupted.
struct Partial {
  int epoch = 0;
  int64_t step = 0;
  double loss_sum = 0;
  int64_t seen = 0;
  int64_t correct = 0;
};

std::string PartialPath(const std::string& checkpoint, int rank) {
  return absl::StrCat(checkpoint, ".rank", rank, ".partial");
}

// Removes every rank's partial statistics next to `checkpoint` (and a
// ".tmp" a failed write left): once the job has completed no resume reads
// them. A file that cannot be removed is logged, not an error.
void RemovePartials(const std::string& checkpoint) {
  const std::filesystem::path ckpt(checkpoint);
  const std::string prefix = ckpt.filename().string() + ".rank";
  std::error_code ec;
  std::filesystem::path dir = ckpt.parent_path();
  if (dir.empty()) dir = ".";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, prefix) ||
        !(absl::EndsWith(name, ".partial") || absl::EndsWith(name, ".partial.tmp"))) {
      continue;
    }
    std::error_code rm;
    if (!std::filesystem::remove(entry.path(), rm) && rm) {
      DT_LOG(WARNING) << "removing " << entry.path().string() << ": " << rm.message();
    }
  }
}

absl::Status WritePartial(const std::string& path, const Partial& p) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    char loss[64];
    std::snprintf(loss, sizeof(loss), "%.17g", p.loss_sum);
    out << p.epoch << " " << p.step << " " << loss << " " << p.seen << " " << p.correct << "\n";
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("writing ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("renaming ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<Partial> ReadPartial(const std::string& path, int epoch, int64_t step) {
  std::ifstream in(path);
  if (!in) {
    return absl::DataLossError(
        absl::StrCat(path, ": missing (the partial epoch statistics of a drained job)"));
  }
  Partial p;
  if (!(in >> p.epoch >> p.step >> p.loss_sum >> p.seen >> p.correct)) {
    return absl::DataLossError(absl::StrCat(path, ": not partial epoch statistics"));
  }
  if (p.epoch != epoch || p.step != step) {
    // Ranks that are not in lockstep (asynchronous kvstore modes) drain at
    // different steps: the epoch's statistics restart with the resumed steps.
    DT_LOG(WARNING) << path << " holds the statistics of epoch " << p.epoch + 1 << " step "
                    << p.step << ", not of the checkpoint's epoch " << epoch + 1 << " step " << step
                    << "; the epoch's loss and accuracy count the resumed steps only";
    return Partial{epoch, step, 0, 0, 0};
  }
  return p;
}

// Test accuracy of replica 0 (0 for an empty test set). A failed evaluation
// fails the job with its reason: it is never reported as accuracy 0.
absl::StatusOr<double> Evaluate(DataParallelTrainer* trainer, const data::Dataset& test,
                                const Shape& sample_shape) {
  absl::StatusOr<double> accuracy = TestAccuracy(
      test, sample_shape,
      [trainer](const Tensor& x, const Tensor& y) { return trainer->CountCorrect(x, y); });
  if (!accuracy.ok()) return Annotate(accuracy.status(), "evaluating on the test set");
  return accuracy;
}

// Every rank at the same step `at` (see "Drain" in job.h): partial
// statistics, one meeting, rank 0's checkpoint. Returns Cancelled.
absl::Status Drain(const JobConfig& c, DataParallelTrainer* trainer, const Partial& at,
                   JobProgress* progress) {
  const std::string where = absl::StrCat("epoch ", at.epoch + 1, " step ", at.step);
  if (c.checkpoint_path.empty()) {
    return absl::CancelledError(absl::StrCat("drained at ", where, " without a checkpoint"));
  }
  DT_RETURN_IF_ERROR(Annotate(WritePartial(PartialPath(c.checkpoint_path, c.rank), at),
                              absl::StrCat("rank ", c.rank, " draining at ", where)));
  // One more statistics round (the synchronous kvstore takes exactly three
  // values): a meeting of the ranks.
  float meet[3] = {0, 0, 1};
  DT_RETURN_IF_ERROR(Annotate(trainer->AverageStatistics(meet, 3),
                              absl::StrCat("rank ", c.rank, " draining at ", where)));
  if (c.rank == 0) {
    DT_RETURN_IF_ERROR(trainer->PullLatestWeights());
    std::map<std::string, std::string> meta = c.checkpoint_metadata;
    meta["epochs_done"] = absl::StrCat(at.epoch);
    meta["steps_done"] = absl::StrCat(at.step);
    meta["seed"] = absl::StrCat(c.seed);
    meta["world_size"] = absl::StrCat(c.world_size);
    meta["devices_per_trainer"] = absl::StrCat(c.devices.size());
    meta["test_accuracy"] = absl::StrCat(progress->test_accuracy);
    DT_RETURN_IF_ERROR(SaveTrainingState(c.checkpoint_path, c.model, trainer->replica(0),
                                         trainer->optimizer(0), meta));
    progress->checkpoint_path = c.checkpoint_path;
    progress->checkpoint_epoch = at.epoch;
    progress->checkpoint_step = at.step;
    DT_LOG(INFO) << "job " << c.name << ": drained at " << where << "; checkpoint in "
                 << c.checkpoint_path;
  }
  return absl::CancelledError(absl::StrCat("drained at ", where));
}

// The position of a recovered job: the root's epoch, step and partial
// statistics (see "Recovery in place" in job.h).
struct RegroupResult {
  Partial at;  // in the new membership's steps
  int root = 0;
  int64_t steps_lost = 0;
  // The root's steps of this RunJob call: every rank continues counting
  // from it, so that they agree on a drain step (JobObserver::DrainRequested).
  int64_t steps_run = 0;
};

// One exchange of the new membership: positions, the root's state, its
// data position and statistics, over `t.communicator`.
// `failed`: this survivor's step failed (not a grow's regroup); `world`:
// the world size `here` counts steps in.
absl::StatusOr<RegroupResult> ExchangeState(const JobConfig& c, DataParallelTrainer* trainer,
                                            const MembershipTransports& t, bool survivor,
                                            bool failed, const Partial& here,
                                            int64_t steps_per_epoch, int64_t steps_run, int world) {
  collective::Communicator* comm = t.communicator;
  const int n = comm->size();
  const int64_t done = here.epoch * steps_per_epoch + here.step;
  // survivor, epoch, step, steps attempted (a failed survivor tried the next)
  int64_t mine[4] = {survivor ? 1 : 0, here.epoch, here.step,
                     survivor ? done + (failed ? 1 : 0) : -1};
  std::vector<int64_t> all(4 * static_cast<size_t>(n));
  DT_RETURN_IF_ERROR(Annotate(comm->Allgather(mine, all.data(), sizeof(mine), DType::kU8),
                              "regroup: exchanging positions"));
  RegroupResult out;
  out.root = -1;
  int64_t furthest = -1;
  for (int r = 0; r < n; ++r) {
    if (all[4 * r] != 1) continue;
    if (out.root < 0) out.root = r;
    furthest = std::max(furthest, all[4 * r + 3]);
  }
  if (out.root < 0) {
    return absl::FailedPreconditionError(
        "regroup: no rank of the new membership holds the job's state");
  }
  DT_RETURN_IF_ERROR(trainer->Regroup(comm, out.root, t.kvstore, t.device_communicator));
  double pos[7] = {static_cast<double>(here.epoch),
                   static_cast<double>(here.step),
                   here.loss_sum,
                   static_cast<double>(here.seen),
                   static_cast<double>(here.correct),
                   static_cast<double>(steps_run),
                   static_cast<double>(world)};
  DT_RETURN_IF_ERROR(Annotate(comm->Broadcast(pos, sizeof(pos), DType::kU8, out.root),
                              "regroup: broadcast of the data position"));
  const int root_epoch = static_cast<int>(pos[0]);
  const int64_t root_step = static_cast<int64_t>(pos[1]);
  const int root_world = static_cast<int>(pos[6]);
  out.at.epoch = root_epoch;
  // The same share of the epoch's samples in the new membership's steps
  // (the loader shards the epoch's order by striding over the ranks, so the
  // first s steps of W ranks are its first s * batch * W samples): rounded
  // down, nothing is skipped.
  out.at.step = root_world == n ? root_step : root_step * root_world / n;
  out.steps_run = static_cast<int64_t>(pos[5]);
  // (Statistics summed in every step are the whole job's: the root's are
  // every rank's, a lost rank's share included.)
  const bool job_stats = trainer->sums_step_statistics();
  if (survivor && root_epoch == here.epoch && root_step == here.step) {
    out.at.loss_sum = here.loss_sum;
    out.at.seen = here.seen;
    out.at.correct = here.correct;
  } else if (job_stats || survivor || n == root_world) {
    // Else the lost rank's statistics are gone: the root's stand in for them.
    out.at.loss_sum = pos[2];
    out.at.seen = static_cast<int64_t>(pos[3]);
    out.at.correct = static_cast<int64_t>(pos[4]);
  }
  // (A rank joining a larger membership lost nothing: its statistics of
  // the epoch start at zero.)
  const int64_t resumed = all[4 * out.root + 1] * steps_per_epoch + all[4 * out.root + 2];
  out.steps_lost = std::max<int64_t>(0, furthest - resumed);
  DT_LOG(INFO) << "job " << c.name << " rank " << comm->rank() << ": regrouped with " << n
               << " ranks (from " << root_world << "); state from rank " << out.root
               << ", continuing at epoch " << out.at.epoch + 1 << " step " << out.at.step << " ("
               << out.steps_lost << " steps lost)";
  return out;
}

// A survivor's regroup after `failure`: the membership's next transports,
// then the exchange; up to 3 memberships when an exchange fails transiently.
// `failure` OK: a grow's regroup (RegroupRequested), no step failed.
// *comm_out: the new membership's communicator.
absl::StatusOr<RegroupResult> RegroupSurvivor(const JobConfig& c, Membership* membership,
                                              DataParallelTrainer* trainer,
                                              const absl::Status& failure, const Partial& here,
                                              int64_t steps_per_epoch, int64_t steps_run, int world,
                                              collective::Communicator** comm_out,
                                              bool step_failed) {
  absl::Status last = failure;
  for (int tries = 0; tries < 3; ++tries) {
    absl::StatusOr<MembershipTransports> next = membership->Regroup(last);
    if (!next.ok()) {
      DT_LOG(WARNING) << "job " << c.name << ": no recovery in place: " << next.status();
      return failure.ok() ? next.status() : failure;
    }
    absl::StatusOr<RegroupResult> done = ExchangeState(c, trainer, *next, /*survivor=*/true,
                                                       /*failed=*/step_failed && !last.ok(), here,
                                                       steps_per_epoch, steps_run, world);
    *comm_out = next->communicator;
    if (done.ok() || !IsTransient(done.status())) return done;
    DT_LOG(WARNING) << "job " << c.name << ": regroup failed (" << done.status()
                    << "); waiting for the next membership";
    last = done.status();
  }
  return failure.ok() ? last : failure;
}

// The job's strategy (gradient_sync.h), chosen from the transports that
// carry its gradients as DataParallelTrainer chooses it: a KVSTORE job's
// communicator (a joiner's) only carries the exchange of the state.
absl::StatusOr<const SyncStrategy*> JobStrategy(const JobConfig& c) {
  DataParallelOptions o;
  o.devices = c.devices;
  o.kvstore = c.kvstore;
  o.kvstore_consistency = c.kvstore_consistency;
  o.communicator = c.kvstore != nullptr && c.join ? nullptr : c.communicator;
  return ChooseSyncStrategy(o);
}

// One RunJob call: the training loop (Run) and its named steps. An elastic
// job's rank, world size and data shard change with its membership (see
// "Elastic jobs" in job.h).
class JobRun {
 public:
  JobRun(const JobConfig& c, const SyncStrategy* strategy, JobHooks hooks, JobProgress* progress)
      : c_(c),
        strategy_(*strategy),
        observer_(hooks.observer != nullptr ? hooks.observer : &no_observer_),
        control_(hooks.control != nullptr ? hooks.control : &no_control_),
        membership_(hooks.membership != nullptr ? hooks.membership : &no_membership_),
        progress_(progress),
        rank_(c.rank),
        world_(c.world_size),
        k_(static_cast<int>(c.devices.size())),
        local_batch_(c.local_batch_size > 0 ? c.local_batch_size
                                            : c.global_batch_size / c.world_size) {}

  // The training loop: epochs of steps, each epoch ended by its statistics,
  // evaluation and checkpoint; a lost peer's failure regroups in place.
  absl::Status Run() {
    DT_RETURN_IF_ERROR(LoadData());
    DT_RETURN_IF_ERROR(MakeTrainer());
    DT_RETURN_IF_ERROR(JoinOrResume());
    for (int epoch = first_epoch_; epoch < c_.epochs; ++epoch) {
      Partial at = BeginEpoch(epoch);
      const absl::Time start = absl::Now();
      bool regrouped = false;
      data::Batch b;
      for (;;) {
        const absl::Time step_start = absl::Now();
        const double waited_before = loader_->wait_seconds();
        if (!loader_->Next(&b)) {
          DT_RETURN_IF_ERROR(loader_->status());  // a sample failed to read or decode
          break;
        }
        const double data_wait = std::max(0.0, loader_->wait_seconds() - waited_before);
        const int64_t data_end_ns = absl::GetCurrentTimeNanos();
        if (control_->StopRequested()) return absl::CancelledError("stopped");
        if (control_->DrainRequested(steps_run_)) return DrainAt(at);
        auto [x, y] = ToTensors(b, sample_shape_, Device::Cpu(0));
        absl::Status failure;  // OK: no step failed (a grow's regroup)
        bool regroup_now =
            c_.communicator != nullptr && !hybrid_ && control_->RegroupRequested(steps_run_);
        absl::StatusOr<float> stepped = 0.0f;
        if (!regroup_now) {
          stepped = hybrid_ ? hybrid_->Run(x, y) : trainer_->Step(x, y);
          if (!stepped.ok()) {
            failure = Annotate(stepped.status(), absl::StrCat("rank ", rank_, ", epoch ", epoch + 1,
                                                              " step ", at.step + 1));
            if (!Recoverable(stepped.status())) return failure;
            DT_LOG(WARNING) << "job " << c_.name << ": " << failure
                            << "; trying to recover in place";
            regroup_now = true;
          }
        }
        if (regroup_now) {
          // A silent loss (the strategy's): the step stalled from its start
          // until the agent interrupted it.
          const absl::Time failed = strategy_.loss_is_silent() ? step_start : absl::Now();
          DT_RETURN_IF_ERROR(Recover(failure, at, failed, /*step_failed=*/true, &epoch));
          regrouped = true;
          break;
        }
        DT_RETURN_IF_ERROR(Stepped(*stepped, b, y, start, step_start, data_wait, data_end_ns, &at));
      }
      if (regrouped) continue;
      DT_ASSIGN_OR_RETURN(const bool complete, EpochStatistics(at, &epoch));
      if (!complete) continue;  // regrouped: the new membership meets again
      progress_->epoch_seconds = absl::ToDoubleSeconds(absl::Now() - start);
      progress_->epoch = epoch + 1;
      progress_->step = 0;
      if (rank_ == 0) DT_RETURN_IF_ERROR(EvaluateAndCheckpoint(epoch));
      observer_->OnEpoch(*progress_);
    }
    return Finish();
  }

 private:
  // Data: this rank's shard of the training set; the test set on rank 0.
  absl::Status LoadData() {
    if (c_.threads > 0) ops::SetCpuThreads(c_.threads);
    data_dir_ = c_.data_dir.empty() ? data::kDefaultFashionMnistDir : c_.data_dir;
    DT_ASSIGN_OR_RETURN(train_set_,
                        data::OpenDataset(c_.data, data::Split::kTrain, data_dir_, c_.train_limit));
    DT_RETURN_IF_ERROR(LoadTestSet());
    progress_->data_train_samples = train_set_.size;
    progress_->data_test_samples = test_set_.size;
    progress_->data_corrupt_skipped = train_set_.corrupt_skipped + test_set_.corrupt_skipped;
    // The model's channels and classes follow the data (Fashion-MNIST: 1
    // and 10); resnet18 takes the data's height and width too.
    nn::ModelOptions options;
    options.in_channels = train_set_.channels;
    options.height = train_set_.rows;
    options.width = train_set_.cols;
    if (train_set_.num_classes > 0) options.num_classes = train_set_.num_classes;
    DT_ASSIGN_OR_RETURN(model_, OpenJobModel(c_, options));
    sample_shape_ = model_.sample_shape;
    DT_RETURN_IF_ERROR(
        data::CheckInputShape(train_set_, {sample_shape_.begin(), sample_shape_.end()}, c_.model));
    return MakeLoader();
  }

  // Rank 0's (and a rank that becomes rank 0 in a regroup).
  absl::Status LoadTestSet() {
    if (rank_ != 0 || test_loaded_) return absl::OkStatus();
    DT_ASSIGN_OR_RETURN(test_set_,
                        data::OpenDataset(c_.data, data::Split::kTest, data_dir_, c_.test_limit));
    test_loaded_ = true;
    return absl::OkStatus();
  }

  // This rank's shard of the current membership.
  absl::Status MakeLoader() {
    data::LoaderOptions lo;
    lo.batch_size = local_batch_;
    lo.shuffle = true;
    lo.seed = c_.seed;
    lo.prefetch = 2;
    lo.threads = data::LoaderThreads(c_.data, c_.threads > 0 ? c_.threads : ops::CpuThreads());
    lo.rank = rank_;
    lo.world_size = world_;
    const int64_t tail = (train_set_.size / world_) % local_batch_;
    lo.drop_last = tail != 0 && tail < k_;  // a step needs a sample per device
    // A compiled step has one batch shape: the last partial batch is dropped.
    if (c_.hybridize) lo.drop_last = true;
    loader_.reset();
    DT_ASSIGN_OR_RETURN(loader_, data::DataLoader::Create(&train_set_, lo));
    steps_per_epoch_ = loader_->batches_per_epoch();
    progress_->steps_per_epoch = steps_per_epoch_;
    return absl::OkStatus();
  }

  // The data-parallel trainer (and the hybridized step), from the initial
  // weights or the checkpoint resumed.
  absl::Status MakeTrainer() {
    const int threads = c_.threads > 0 ? c_.threads : ops::CpuThreads();
    DT_ASSIGN_OR_RETURN(nn::Init init, nn::ParseInit(model_.init));
    DataParallelOptions o;
    o.model = c_.model;
    o.model_options = model_.options;
    o.model_factory = model_.factory;
    if (c_.resume_from.empty() && !c_.join) o.restore = model_.init_from_model;
    o.devices = c_.devices;
    o.threads_per_device = std::max(1, threads / k_);
    o.sgd = c_.sgd;
    o.init = init;
    o.seed = c_.seed;
    // A joining rank meets the others in its first exchange, not at Create
    // (over NCCL its strategy is made for the communicator, without sharing
    // initial weights: its buckets live in device memory).
    o.communicator = c_.join && c_.exchange_communicator == nullptr ? nullptr : c_.communicator;
    o.joining = c_.join && c_.exchange_communicator != nullptr;
    o.kvstore = c_.kvstore;
    o.kvstore_workers = world_;
    o.kvstore_consistency = c_.kvstore_consistency;
    o.kvstore_max_staleness = c_.kvstore_max_staleness;
    o.kvstore_compression = c_.kvstore_compression;
    o.sync_batch_norm = c_.sync_batch_norm;
    if (c_.bucket_bytes > 0) o.bucket_bytes = static_cast<size_t>(c_.bucket_bytes);
    // Resuming: every replica loads the checkpoint before the weights are
    // shared (with the other trainers, or the kvstore's shards).
    if (!c_.resume_from.empty() && !c_.join) {
      o.restore = [this](nn::Module* model, nn::Sgd* optimizer) -> absl::Status {
        DT_ASSIGN_OR_RETURN(first_epoch_,
                            LoadCheckpoint(c_, model, optimizer, progress_, &first_step_));
        return absl::OkStatus();
      };
    }
    DT_ASSIGN_OR_RETURN(trainer_, DataParallelTrainer::Create(o));
    if (c_.sync_batch_norm) {
      DT_LOG(INFO) << "job " << c_.name << " rank " << rank_ << ": synchronized batch norm over "
                   << k_ << " devices x " << world_ << " trainers";
    }
    // hybridize: the whole step as one compiled plan over replica 0's
    // parameters, which it updates in place (so evaluation and checkpoints
    // see them). The plan keeps its own momentum buffers: a resumed
    // hybridized job restarts them.
    if (c_.hybridize) {
      Shape input = sample_shape_;
      input.insert(input.begin(), local_batch_);
      DT_ASSIGN_OR_RETURN(hybrid_,
                          graph::HybridizeTrainingStep(trainer_->replica(0), input,
                                                       model_.options.num_classes, c_.sgd));
      DT_LOG(INFO) << "job " << c_.name << ": hybridized training step ("
                   << hybrid_->module().graph().nodes().size() << " graph nodes, planned peak "
                   << hybrid_->planned_peak_bytes() << " bytes)";
    }
    // MFU's numerator: the model's FLOPs per sample of a training step.
    rank_peak_ =
        c_.devices[0].is_cpu() ? c_.cpu_peak_flops_per_thread * o.threads_per_device * k_ : 0;
    if (absl::StatusOr<graph::TrainingFlops> f = model_.flops(); f.ok()) {
      flops_per_sample_ = f->total();
    } else {
      DT_LOG(WARNING) << "job " << c_.name << ": no FLOP count for " << c_.model << " ("
                      << f.status() << "); MFU is not reported";
    }
    return absl::OkStatus();
  }

  // Where this rank starts: a resumed checkpoint's position, a replaced
  // kvstore worker's rounds, or the survivors' state (a joiner's first
  // exchange).
  absl::Status JoinOrResume() {
    if (!c_.resume_from.empty() && !c_.join) {
      progress_->epoch = first_epoch_;
      if (first_step_ > 0) {
        DT_ASSIGN_OR_RETURN(
            resume_at_, ReadPartial(PartialPath(c_.resume_from, rank_), first_epoch_, first_step_));
      }
      start_step_ = first_step_;
      DT_LOG(INFO) << "job " << c_.name << " rank " << rank_ << ": resumed from " << c_.resume_from
                   << " after epoch " << first_epoch_ << " step " << first_step_;
      // The checkpoint this attempt holds is the one it loaded until it
      // writes a newer one: the file may be newer than the scheduler knows
      // (an earlier attempt went on writing while the scheduler was down).
      progress_->checkpoint_path = c_.resume_from;
      progress_->checkpoint_epoch = first_epoch_;
      progress_->checkpoint_step = first_step_;
      return absl::OkStatus();
    }
    if (!c_.join) return absl::OkStatus();
    if (strategy_.replacement_continues_rounds()) return ContinueLostWorker();
    DT_ASSIGN_OR_RETURN(
        RegroupResult joined,
        ExchangeState(c_, trainer_.get(), JoinerTransports(), /*survivor=*/false,
                      /*failed=*/false, Partial{}, steps_per_epoch_, /*steps_run=*/0, world_));
    steps_run_ = joined.steps_run;
    first_epoch_ = joined.at.epoch;
    start_step_ = joined.at.step;
    resume_at_ = joined.at;
    progress_->epoch = first_epoch_;
    return absl::OkStatus();
  }

  // A joiner's first exchange: over NCCL the state travels over the host
  // communicator (exchange_communicator) and the gradients over the NCCL
  // one; a KVSTORE job's rounds continue in its kvstore job.
  MembershipTransports JoinerTransports() const {
    MembershipTransports t;
    t.communicator =
        c_.exchange_communicator != nullptr ? c_.exchange_communicator : c_.communicator;
    t.device_communicator = c_.exchange_communicator != nullptr ? c_.communicator : nullptr;
    t.kvstore = c_.kvstore;
    return t;
  }

  // A replacement of a worker whose weights are on the kvstore: the lost
  // worker's rounds are the steps it completed in this attempt, which
  // started at attempt_start_*: continue after them, at the same place of
  // the same epoch's order, the epoch's statistics from zero.
  absl::Status ContinueLostWorker() {
    DT_ASSIGN_OR_RETURN(const int64_t rounds, trainer_->ResumeKvstoreWorker());
    const int64_t at = static_cast<int64_t>(c_.attempt_start_epoch) * steps_per_epoch_ +
                       c_.attempt_start_step + rounds;
    first_epoch_ = static_cast<int>(std::min<int64_t>(at / steps_per_epoch_, c_.epochs));
    start_step_ = first_epoch_ < c_.epochs ? at % steps_per_epoch_ : 0;
    steps_run_ = rounds;
    resume_at_ = Partial{first_epoch_, start_step_, 0, 0, 0};
    progress_->epoch = first_epoch_;
    progress_->step = start_step_;
    DT_LOG(INFO) << "job " << c_.name << " rank " << rank_ << ": continuing kvstore worker "
                 << rank_ << " after its " << rounds << " steps, at epoch " << first_epoch_ + 1
                 << " step " << start_step_ << " (weights from the kvstore)";
    // It reports the recovery once its first step is done (the scheduler
    // counts the seconds from the lost trainer's last heartbeat): the step
    // the lost worker was in, at most, is lost.
    recovering_ = true;
    recovery_root_ = true;
    failed_at_ = absl::Now();
    recovery_steps_lost_ = 1;
    return absl::OkStatus();
  }

  // The epoch's position and statistics so far (a resumed checkpoint's or a
  // regroup's step), then none for the next epoch.
  Partial BeginEpoch(int epoch) {
    Partial at{epoch, 0, 0, 0, 0};
    if (start_step_ > 0 || resume_at_.seen > 0) {
      at.step = start_step_;
      at.loss_sum = resume_at_.loss_sum;
      at.seen = resume_at_.seen;
      at.correct = resume_at_.correct;
    }
    start_step_ = 0;
    resume_at_ = Partial{};
    loader_->StartEpoch(epoch, at.step);
    return at;
  }

  // Every rank at the same step (see "Drain" in job.h), in its current
  // place in the membership.
  absl::Status DrainAt(const Partial& at) {
    progress_->drained = true;
    JobConfig now = c_;
    now.rank = rank_;
    now.world_size = world_;
    return Drain(now, trainer_.get(), at, progress_);
  }

  // Whether a failure of a collective (a step's, or the epoch's statistics
  // round) may be a lost peer's, worth a regroup: the strategy's answer
  // (a silent loss's: unless the job was asked to stop).
  bool Recoverable(const absl::Status& s) {
    if (hybrid_ || !strategy_.RegroupsInPlace(initial_world_)) return false;
    if (!strategy_.MayBePeerLoss(s)) return false;
    return !strategy_.loss_is_silent() || !control_->StopRequested();
  }

  // A survivor's recovery in place from `at`: the next membership's state
  // and position, which the epoch loop continues from (`*epoch`: the one
  // before the root's, for its ++epoch).
  absl::Status Recover(const absl::Status& failure, const Partial& at, absl::Time failed,
                       bool step_failed, int* epoch) {
    trace::ScopedSpan recovery_span(c_.trace, "recovery", trace::kTrackStep, steps_run_);
    collective::Communicator* comm = nullptr;
    DT_ASSIGN_OR_RETURN(RegroupResult regroup,
                        RegroupSurvivor(c_, membership_, trainer_.get(), failure, at,
                                        steps_per_epoch_, steps_run_, world_, &comm, step_failed));
    if (!recovering_) failed_at_ = failed;  // a failure during a recovery: the first counts
    recovering_ = true;
    if (comm->rank() != rank_ || comm->size() != world_) {
      // A smaller or larger membership: this rank's shard changes.
      rank_ = comm->rank();
      world_ = comm->size();
      DT_RETURN_IF_ERROR(MakeLoader());
      DT_RETURN_IF_ERROR(LoadTestSet());
    }
    recovery_root_ = regroup.root == rank_;
    recovery_steps_lost_ += regroup.steps_lost;
    steps_run_ = regroup.steps_run;
    resume_at_ = regroup.at;
    start_step_ = regroup.at.step;
    *epoch = regroup.at.epoch - 1;
    return absl::OkStatus();
  }

  // The root reports a recovery once the first step (or statistics round)
  // after it completed.
  void RecoveryDone() {
    if (!recovering_) return;
    recovering_ = false;
    if (recovery_root_) {
      observer_->OnRecovered(absl::ToDoubleSeconds(absl::Now() - failed_at_), recovery_steps_lost_);
    }
    recovery_steps_lost_ = 0;
  }

  // A completed step with loss `l`: the epoch's statistics, the step's times
  // and phases, progress.
  absl::Status Stepped(float l, const data::Batch& b, const Tensor& y, absl::Time epoch_start,
                       absl::Time step_start, double data_wait, int64_t data_end_ns, Partial* at) {
    if (!std::isfinite(l)) {
      return absl::FailedPreconditionError(
          absl::StrCat("training diverged: loss is ", l, " at epoch ", at->epoch + 1, " step ",
                       at->step + 1, "; lower the learning rate (lr=", c_.sgd.lr, ")"));
    }
    StepTimes times;
    times.communication = trainer_->last_comm_work_seconds();
    times.data_wait = data_wait;
    times.compute = std::max(
        0.0, absl::ToDoubleSeconds(absl::Now() - step_start) - data_wait - times.communication);
    // The phases (step_phases.h): the loader's wait, then the trainer's own
    // phases; the time between them (drain poll, the batch's copy) counts as
    // forward_backward.
    const int64_t step_start_ns = absl::ToUnixNanos(step_start);
    if (hybrid_) {
      const int64_t end_ns = absl::GetCurrentTimeNanos();
      for (PhaseSpan& p : times.phases.phase) p = {end_ns, end_ns};
      times.phases.phase[static_cast<int>(StepPhase::kForwardBackward)] = {data_end_ns, end_ns};
      times.phases.step = {step_start_ns, end_ns};
    } else {
      times.phases = trainer_->last_step_phases();
      times.phases.step.start_ns = step_start_ns;
      times.phases.phase[static_cast<int>(StepPhase::kForwardBackward)].start_ns = data_end_ns;
    }
    times.phases.phase[static_cast<int>(StepPhase::kDataWait)] = {step_start_ns, data_end_ns};
    times.samples = b.size;
    times.data_queue_depth = loader_->queue_depth();
    if (loader_->prepare_seconds() > 0) {
      times.data_decode_rate = loader_->samples_prepared() / loader_->prepare_seconds();
    }
    // The epoch's running statistics: the whole job's where the step sums
    // them over the trainers (every rank then holds the same bits, and a
    // recovery in place carries them exactly), else this rank's.
    const double* job_stats = hybrid_ ? nullptr : trainer_->last_step_statistics();
    if (job_stats != nullptr) {
      at->loss_sum += job_stats[0];
      at->seen += static_cast<int64_t>(job_stats[1]);
      at->correct += static_cast<int64_t>(job_stats[2]);
    } else {
      at->loss_sum += static_cast<double>(l) * b.size;
      at->correct += hybrid_ ? ops::CountCorrect(hybrid_->logits(), y) : trainer_->last_correct();
      at->seen += b.size;
    }
    ++at->step;
    ++steps_run_;
    progress_->epoch = at->epoch;
    progress_->step = at->step;
    progress_->loss = at->loss_sum / at->seen;
    progress_->step_loss = l;
    progress_->job_step = static_cast<int64_t>(at->epoch) * steps_per_epoch_ + at->step - 1;
    progress_->train_accuracy = static_cast<double>(at->correct) / at->seen;
    const double secs = absl::ToDoubleSeconds(absl::Now() - epoch_start);
    // Samples of the whole job (every rank does the same work).
    const double job_seen = job_stats != nullptr ? at->seen : at->seen * world_;
    progress_->samples_per_second = secs > 0 ? job_seen / secs : 0;
    progress_->achieved_flops = flops_per_sample_ * progress_->samples_per_second;
    progress_->mfu = rank_peak_ > 0 ? progress_->achieved_flops / (rank_peak_ * world_) : 0;
    RecoveryDone();
    RecordStepSpans(c_.trace, times.phases, steps_run_ - 1,
                    hybrid_ ? "hybridized" : trainer_->sync_name());
    observer_->OnStep(*progress_, times);
    return absl::OkStatus();
  }

  // The epoch's loss and training accuracy over every rank's samples (the
  // trainer's gradient sync knows how its trainers meet; with kvstore-held
  // weights this rank's share). False: a peer was lost in the round and the
  // job regrouped (as after a failed step, with no step lost: every
  // survivor finished the epoch's steps); the new membership then meets for
  // this epoch's statistics (the root's position is the epoch's end).
  // Where every step summed the statistics over the trainers (`at` holds
  // the job's), the round is only the meeting.
  absl::StatusOr<bool> EpochStatistics(const Partial& at, int* epoch) {
    const bool job_stats = !hybrid_ && trainer_->sums_step_statistics();
    float sums[3] = {static_cast<float>(at.loss_sum), static_cast<float>(at.seen),
                     static_cast<float>(at.correct)};
    absl::Status averaged;
    {
      trace::ScopedSpan span(c_.trace, "epoch statistics", trace::kTrackStep, steps_run_);
      averaged =
          Annotate(trainer_->AverageStatistics(sums, 3),
                   absl::StrCat("rank ", rank_, ": averaging the loss of epoch ", at.epoch + 1));
    }
    if (!averaged.ok()) {
      if (!Recoverable(averaged)) return averaged;
      DT_LOG(WARNING) << "job " << c_.name << ": " << averaged << "; trying to recover in place";
      DT_RETURN_IF_ERROR(Recover(averaged, at, absl::Now(), /*step_failed=*/false, epoch));
      return false;
    }
    RecoveryDone();  // the statistics round of a regroup at the epoch's end
    if (job_stats) {
      if (at.seen > 0) {
        progress_->loss = at.loss_sum / static_cast<double>(at.seen);
        progress_->train_accuracy = static_cast<double>(at.correct) / static_cast<double>(at.seen);
      }
    } else if (sums[1] > 0) {
      progress_->loss = sums[0] / sums[1];
      progress_->train_accuracy = sums[2] / sums[1];
    }
    return true;
  }

  // Rank 0 at an epoch's end: test accuracy, and the checkpoint when due.
  absl::Status EvaluateAndCheckpoint(int epoch) {
    // Asynchronous kvstore modes: the server's weights, not the ones this
    // trainer's last pushes left.
    DT_RETURN_IF_ERROR(trainer_->PullLatestWeights());
    {
      trace::ScopedSpan span(c_.trace, "evaluate", trace::kTrackStep, steps_run_);
      DT_ASSIGN_OR_RETURN(progress_->test_accuracy,
                          Evaluate(trainer_.get(), test_set_, sample_shape_));
    }
    DT_LOG(INFO) << "job " << c_.name << " epoch " << epoch + 1 << ": loss " << progress_->loss
                 << ", test accuracy " << progress_->test_accuracy;
    if (c_.checkpoint_interval_epochs <= 0 || (epoch + 1) % c_.checkpoint_interval_epochs != 0) {
      return absl::OkStatus();
    }
    std::map<std::string, std::string> meta = c_.checkpoint_metadata;
    meta["epochs_done"] = absl::StrCat(epoch + 1);
    meta["seed"] = absl::StrCat(c_.seed);
    meta["world_size"] = absl::StrCat(world_);
    meta["devices_per_trainer"] = absl::StrCat(k_);
    meta["loss"] = absl::StrCat(progress_->loss);
    meta["test_accuracy"] = absl::StrCat(progress_->test_accuracy);
    trace::ScopedSpan span(c_.trace, "checkpoint", trace::kTrackStep, steps_run_);
    DT_RETURN_IF_ERROR(SaveTrainingState(c_.checkpoint_path, c_.model, trainer_->replica(0),
                                         trainer_->optimizer(0), meta));
    if (c_.keep_epoch_checkpoints) {
      const std::string kept = EpochCheckpointPath(c_.checkpoint_path, epoch + 1);
      unlink(kept.c_str());  // a resumed job writes the epoch again
      if (link(c_.checkpoint_path.c_str(), kept.c_str()) != 0) {
        return ErrnoToStatus(
            errno, absl::StrCat("keeping the checkpoint of epoch ", epoch + 1, " as ", kept));
      }
    }
    progress_->checkpoint_path = c_.checkpoint_path;
    progress_->checkpoint_epoch = epoch + 1;
    progress_->checkpoint_step = 0;
    DT_LOG(INFO) << "job " << c_.name << ": checkpoint of epoch " << epoch + 1 << " in "
                 << c_.checkpoint_path;
    return absl::OkStatus();
  }

  // Every epoch is done.
  absl::Status Finish() {
    if (rank_ == 0 && progress_->test_accuracy < 0) {
      // Resumed from the last epoch's checkpoint: nothing left to train.
      DT_ASSIGN_OR_RETURN(progress_->test_accuracy,
                          Evaluate(trainer_.get(), test_set_, sample_shape_));
    }
    // The job is complete: a drain's partial statistics are of no more use.
    if (rank_ == 0 && !c_.checkpoint_path.empty()) RemovePartials(c_.checkpoint_path);
    return absl::OkStatus();
  }

  const JobConfig& c_;
  const SyncStrategy& strategy_;
  JobObserver no_observer_;
  JobControl no_control_;
  Membership no_membership_;
  JobObserver* const observer_;
  JobControl* const control_;
  Membership* const membership_;
  JobProgress* const progress_;

  // This rank's place in the current membership.
  int rank_;
  int world_;
  const int initial_world_ = world_;
  const int k_;  // devices
  const int64_t local_batch_;

  std::string data_dir_;
  data::Dataset train_set_;
  data::Dataset test_set_;
  bool test_loaded_ = false;
  JobModel model_;
  Shape sample_shape_;
  std::unique_ptr<data::DataLoader> loader_;
  int64_t steps_per_epoch_ = 0;

  std::unique_ptr<DataParallelTrainer> trainer_;
  std::unique_ptr<graph::TrainStep> hybrid_;
  double flops_per_sample_ = 0;
  double rank_peak_ = 0;

  // Where the first epoch starts (a resumed checkpoint's or a joiner's).
  int first_epoch_ = 0;
  int64_t first_step_ = 0;
  // Steps by this call, over all epochs (a joiner continues the root's
  // count).
  int64_t steps_run_ = 0;
  // Where the next epoch starts (a resumed checkpoint's or a regroup's step)
  // and its statistics so far.
  int64_t start_step_ = 0;
  Partial resume_at_;
  // A recovery in place waiting for its first completed step (the root
  // reports it).
  bool recovering_ = false;
  bool recovery_root_ = false;
  absl::Time failed_at_;
  int64_t recovery_steps_lost_ = 0;
};

}  // namespace

absl::Status RunJob(const JobConfig& config, JobHooks hooks, JobProgress* progress) {
  DT_ASSIGN_OR_RETURN(const SyncStrategy* strategy, JobStrategy(config));
  DT_RETURN_IF_ERROR(Validate(config, *strategy));
  JobRun run(config, strategy, hooks, progress);
  return run.Run();
}

}  // namespace train
}  // namespace dtrain
