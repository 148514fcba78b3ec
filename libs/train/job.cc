#include "libs/train/job.h"

#include <algorithm>
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
#include "libs/train/state_io.h"
#include "libs/train/step_trace.h"
#include "libs/train/train.h"

namespace dtrain {
namespace train {
namespace {

absl::Status Validate(const JobConfig& c) {
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
  // With kvstore-held weights a joiner continues a lost worker's rounds.
  const bool weights_on_kvstore =
      c.kvstore != nullptr && c.kvstore_consistency != kvstore::Consistency::kSync;
  if (c.join && ((c.communicator == nullptr && !weights_on_kvstore) || c.hybridize)) {
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
// data position and statistics.
// `failed`: this survivor's step failed (not a grow's regroup); `world`:
// the world size `here` counts steps in; `kvstore`: the new membership's
// kvstore job (KVSTORE jobs; see JobObserver::RegroupKvstore).
absl::StatusOr<RegroupResult> ExchangeState(const JobConfig& c, DataParallelTrainer* trainer,
                                            collective::Communicator* comm,
                                            collective::Communicator* gradients,
                                            kvstore::ParameterServer* kvstore, bool survivor,
                                            bool failed, const Partial& here,
                                            int64_t steps_per_epoch, int64_t steps_run, int world) {
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
  DT_RETURN_IF_ERROR(trainer->Regroup(comm, out.root, kvstore, gradients));
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
  if (survivor && root_epoch == here.epoch && root_step == here.step) {
    out.at.loss_sum = here.loss_sum;
    out.at.seen = here.seen;
    out.at.correct = here.correct;
  } else if (survivor || n == root_world) {
    // The lost rank's statistics are gone: the root's stand in for them.
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

// A survivor's regroup after `failure`: the observer's next membership,
// then the exchange; up to 3 memberships when an exchange fails transiently.
// `failure` OK: a grow's regroup (RegroupRequested), no step failed.
// *comm_out: the new membership's communicator.
absl::StatusOr<RegroupResult> RegroupSurvivor(const JobConfig& c, JobObserver* observer,
                                              DataParallelTrainer* trainer,
                                              const absl::Status& failure, const Partial& here,
                                              int64_t steps_per_epoch, int64_t steps_run, int world,
                                              collective::Communicator** comm_out,
                                              bool step_failed = true) {
  absl::Status last = failure;
  for (int tries = 0; tries < 3; ++tries) {
    absl::StatusOr<collective::Communicator*> comm = observer->Regroup(last);
    if (!comm.ok()) {
      DT_LOG(WARNING) << "job " << c.name << ": no recovery in place: " << comm.status();
      return failure.ok() ? comm.status() : failure;
    }
    absl::StatusOr<RegroupResult> done = ExchangeState(
        c, trainer, *comm, observer->RegroupDeviceCommunicator(), observer->RegroupKvstore(),
        /*survivor=*/true,
        /*failed=*/step_failed && !last.ok(), here, steps_per_epoch, steps_run, world);
    *comm_out = *comm;
    if (done.ok() || !IsTransient(done.status())) return done;
    DT_LOG(WARNING) << "job " << c.name << ": regroup failed (" << done.status()
                    << "); waiting for the next membership";
    last = done.status();
  }
  return failure.ok() ? last : failure;
}

absl::Status Run(const JobConfig& c, JobObserver* observer, JobProgress* progress) {
  DT_RETURN_IF_ERROR(Validate(c));
  // An elastic job's membership may change (see "Elastic jobs" in job.h).
  int world = c.world_size;
  int rank = c.rank;
  const int k = static_cast<int>(c.devices.size());
  const int64_t local_batch =
      c.local_batch_size > 0 ? c.local_batch_size : c.global_batch_size / world;
  if (c.threads > 0) ops::SetCpuThreads(c.threads);
  const int threads = c.threads > 0 ? c.threads : ops::CpuThreads();

  // Data: this rank's shard of the training set; the test set on rank 0.
  const std::string dir = c.data_dir.empty() ? data::kDefaultFashionMnistDir : c.data_dir;
  DT_ASSIGN_OR_RETURN(data::Dataset train_set, data::OpenDataset(c.data, data::Split::kTrain, dir));
  if (c.train_limit > 0 && c.train_limit < train_set.size) {
    train_set = data::Subset(train_set, c.train_limit);
  }
  data::Dataset test_set;
  bool test_loaded = false;
  // Rank 0's (and a rank that becomes rank 0 in a regroup).
  auto load_test_set = [&]() -> absl::Status {
    if (rank != 0 || test_loaded) return absl::OkStatus();
    DT_ASSIGN_OR_RETURN(test_set, data::OpenDataset(c.data, data::Split::kTest, dir));
    if (c.test_limit > 0 && c.test_limit < test_set.size) {
      test_set = data::Subset(test_set, c.test_limit);
    }
    test_loaded = true;
    return absl::OkStatus();
  };
  DT_RETURN_IF_ERROR(load_test_set());
  progress->data_train_samples = train_set.size;
  progress->data_test_samples = test_set.size;
  progress->data_corrupt_skipped = train_set.corrupt_skipped + test_set.corrupt_skipped;
  DT_ASSIGN_OR_RETURN(Shape sample_shape, nn::ModelInputShape(c.model));
  DT_RETURN_IF_ERROR(
      data::CheckInputShape(train_set, {sample_shape.begin(), sample_shape.end()}, c.model));
  DT_ASSIGN_OR_RETURN(nn::Init init, nn::ParseInit(c.init.empty() ? "normal" : c.init));
  data::LoaderOptions lo;
  lo.batch_size = local_batch;
  lo.shuffle = true;
  lo.seed = c.seed;
  lo.prefetch = 2;
  lo.threads = data::LoaderThreads(c.data);
  std::unique_ptr<data::DataLoader> loader;
  // This rank's shard of the current membership.
  auto make_loader = [&]() -> absl::Status {
    lo.rank = rank;
    lo.world_size = world;
    const int64_t tail = (train_set.size / world) % local_batch;
    lo.drop_last = tail != 0 && tail < k;  // a step needs a sample per device
    // A compiled step has one batch shape: the last partial batch is dropped.
    if (c.hybridize) lo.drop_last = true;
    loader.reset();
    DT_ASSIGN_OR_RETURN(loader, data::DataLoader::Create(&train_set, lo));
    return absl::OkStatus();
  };
  DT_RETURN_IF_ERROR(make_loader());

  DataParallelOptions o;
  o.model = c.model;
  o.devices = c.devices;
  o.threads_per_device = std::max(1, threads / k);
  o.sgd = c.sgd;
  o.init = init;
  o.seed = c.seed;
  // A joining rank meets the others in its first exchange, not at Create
  // (over NCCL its strategy is made for the communicator, without sharing
  // initial weights: its buckets live in device memory).
  o.communicator = c.join && c.exchange_communicator == nullptr ? nullptr : c.communicator;
  o.joining = c.join && c.exchange_communicator != nullptr;
  o.kvstore = c.kvstore;
  o.kvstore_workers = world;
  o.kvstore_consistency = c.kvstore_consistency;
  o.kvstore_max_staleness = c.kvstore_max_staleness;
  o.kvstore_compression = c.kvstore_compression;
  o.sync_batch_norm = c.sync_batch_norm;
  if (c.bucket_bytes > 0) o.bucket_bytes = static_cast<size_t>(c.bucket_bytes);
  // Resuming: every replica loads the checkpoint before the weights are
  // shared (with the other trainers, or the kvstore's shards).
  int first_epoch = 0;
  int64_t first_step = 0;
  // A joiner of a job with kvstore-held weights takes them from the kvstore
  // and counts its position from where the attempt started.
  const bool kvstore_joiner =
      c.join && c.kvstore != nullptr && c.kvstore_consistency != kvstore::Consistency::kSync;
  if (kvstore_joiner) {
    first_epoch = c.attempt_start_epoch;
    first_step = c.attempt_start_step;
  }
  if (!c.resume_from.empty() && !c.join) {
    o.restore = [&c, &first_epoch, &first_step, progress](nn::Module* model,
                                                          nn::Sgd* optimizer) -> absl::Status {
      DT_ASSIGN_OR_RETURN(first_epoch, LoadCheckpoint(c, model, optimizer, progress, &first_step));
      return absl::OkStatus();
    };
  }
  DT_ASSIGN_OR_RETURN(std::unique_ptr<DataParallelTrainer> trainer, DataParallelTrainer::Create(o));
  if (c.sync_batch_norm) {
    DT_LOG(INFO) << "job " << c.name << " rank " << rank << ": synchronized batch norm over " << k
                 << " devices x " << world << " trainers";
  }
  Partial resumed;  // the interrupted epoch's statistics so far
  if (!c.resume_from.empty() && !c.join) {
    progress->epoch = first_epoch;
    if (first_step > 0) {
      DT_ASSIGN_OR_RETURN(resumed,
                          ReadPartial(PartialPath(c.resume_from, rank), first_epoch, first_step));
    }
    DT_LOG(INFO) << "job " << c.name << " rank " << rank << ": resumed from " << c.resume_from
                 << " after epoch " << first_epoch << " step " << first_step;
    // The checkpoint this attempt holds is the one it loaded until it writes
    // a newer one: the file may be newer than the scheduler knows (an
    // earlier attempt went on writing while the scheduler was down).
    progress->checkpoint_path = c.resume_from;
    progress->checkpoint_epoch = first_epoch;
    progress->checkpoint_step = first_step;
  }
  // hybridize: the whole step as one compiled plan over replica 0's
  // parameters, which it updates in place (so evaluation and checkpoints see
  // them). The plan keeps its own momentum buffers: a resumed hybridized job
  // restarts them.
  std::unique_ptr<graph::TrainStep> hybrid;
  if (c.hybridize) {
    Shape input = sample_shape;
    input.insert(input.begin(), local_batch);
    DT_ASSIGN_OR_RETURN(hybrid,
                        graph::HybridizeTrainingStep(trainer->replica(0), input, 10, c.sgd));
    DT_LOG(INFO) << "job " << c.name << ": hybridized training step ("
                 << hybrid->module().graph().nodes().size() << " graph nodes, planned peak "
                 << hybrid->planned_peak_bytes() << " bytes)";
  }
  // MFU's numerator: the model's FLOPs per sample of a training step.
  double flops_per_sample = 0;
  const double rank_peak =
      c.devices[0].is_cpu() ? c.cpu_peak_flops_per_thread * o.threads_per_device * k : 0;
  if (absl::StatusOr<graph::TrainingFlops> f = graph::TrainingFlopsPerSample(c.model); f.ok()) {
    flops_per_sample = f->total();
  } else {
    DT_LOG(WARNING) << "job " << c.name << ": no FLOP count for " << c.model << " (" << f.status()
                    << "); MFU is not reported";
  }
  progress->steps_per_epoch = loader->batches_per_epoch();
  int64_t steps_per_epoch = loader->batches_per_epoch();
  int64_t joined_steps_run = 0;
  // A recovery in place waiting for its first completed step (the root
  // reports it).
  bool recovering = false;
  bool recovery_root = false;
  absl::Time failed_at;
  int64_t recovery_steps_lost = 0;
  if (kvstore_joiner) {
    // The lost worker's rounds are the steps it completed in this attempt:
    // continue after them, at the same place of the same epoch's order.
    DT_ASSIGN_OR_RETURN(const int64_t rounds, trainer->ResumeKvstoreWorker());
    const int64_t at = static_cast<int64_t>(first_epoch) * steps_per_epoch + first_step + rounds;
    first_epoch = static_cast<int>(std::min<int64_t>(at / steps_per_epoch, c.epochs));
    first_step = first_epoch < c.epochs ? at % steps_per_epoch : 0;
    joined_steps_run = rounds;
    resumed = Partial{first_epoch, first_step, 0, 0, 0};
    progress->epoch = first_epoch;
    progress->step = first_step;
    DT_LOG(INFO) << "job " << c.name << " rank " << rank << ": continuing kvstore worker " << rank
                 << " after its " << rounds << " steps, at epoch " << first_epoch + 1 << " step "
                 << first_step << " (weights from the kvstore)";
    // It reports the recovery once its first step is done (the scheduler
    // counts the seconds from the lost trainer's last heartbeat): the step
    // the lost worker was in, at most, is lost.
    recovering = true;
    recovery_root = true;
    failed_at = absl::Now();
    recovery_steps_lost = 1;
  } else if (c.join) {
    DT_ASSIGN_OR_RETURN(
        RegroupResult joined,
        ExchangeState(c, trainer.get(),
                      c.exchange_communicator != nullptr ? c.exchange_communicator : c.communicator,
                      c.exchange_communicator != nullptr ? c.communicator : nullptr, c.kvstore,
                      /*survivor=*/false,
                      /*failed=*/false, Partial{}, steps_per_epoch,
                      /*steps_run=*/0, world));
    joined_steps_run = joined.steps_run;
    first_epoch = joined.at.epoch;
    first_step = joined.at.step;
    resumed = joined.at;
    progress->epoch = first_epoch;
  }
  // Synchronous kvstore rounds between several ranks: recoverable in place.
  // (A joiner's communicator only carried its first exchange.)
  const bool kvstore_rounds =
      c.kvstore != nullptr && c.kvstore_consistency == kvstore::Consistency::kSync && world > 1;
  // Allreduce over NCCL (see "Recovery in place" in job.h).
  const bool device_collective = c.communicator != nullptr && c.communicator->options().transport ==
                                                                  collective::TransportKind::kNccl;

  // By this call, over all epochs (a joiner continues the root's count).
  int64_t steps_run = joined_steps_run;
  // Where the next epoch starts (a resumed checkpoint's or a regroup's step)
  // and its statistics so far.
  int64_t start_step = first_step;
  Partial resume_at = resumed;
  // Whether a failure of a collective (a step's, or the epoch's statistics
  // round) may be a lost peer's, worth a regroup.
  auto recoverable = [&](const absl::Status& s) {
    if ((c.communicator == nullptr && !kvstore_rounds) || hybrid) return false;
    // A KVSTORE job's survivor learns of the loss from its agent, which
    // cancels the kvstore client (see job.h); over NCCL the agent aborts the
    // communicator: any error may be a lost peer's.
    if (kvstore_rounds || device_collective) {
      return (device_collective || absl::IsCancelled(s)) && !observer->StopRequested();
    }
    return IsTransient(s);
  };
  // After a survivor's regroup: the new membership's rank and world (an
  // elastic job's shard changes), where the job continues (`*epoch`: the
  // one before the root's, for the epoch loop's ++epoch).
  auto adopt = [&](const RegroupResult& regroup, collective::Communicator* comm, absl::Time failed,
                   int* epoch) -> absl::Status {
    if (!recovering) failed_at = failed;  // a failure during a recovery: the first counts
    recovering = true;
    if (comm->rank() != rank || comm->size() != world) {
      // A smaller or larger membership: this rank's shard changes.
      rank = comm->rank();
      world = comm->size();
      DT_RETURN_IF_ERROR(make_loader());
      steps_per_epoch = loader->batches_per_epoch();
      progress->steps_per_epoch = steps_per_epoch;
      DT_RETURN_IF_ERROR(load_test_set());
    }
    recovery_root = regroup.root == rank;
    recovery_steps_lost += regroup.steps_lost;
    steps_run = regroup.steps_run;
    resume_at = regroup.at;
    start_step = regroup.at.step;
    *epoch = regroup.at.epoch - 1;
    return absl::OkStatus();
  };
  for (int epoch = first_epoch; epoch < c.epochs; ++epoch) {
    data::Batch b;
    double loss_sum = 0;
    int64_t correct = 0, seen = 0, step = 0;
    if (start_step > 0 || resume_at.seen > 0) {
      step = start_step;
      loss_sum = resume_at.loss_sum;
      seen = resume_at.seen;
      correct = resume_at.correct;
    }
    start_step = 0;
    resume_at = Partial{};
    bool regrouped = false;
    loader->StartEpoch(epoch, step);
    const absl::Time start = absl::Now();
    for (;;) {
      const absl::Time step_start = absl::Now();
      const int64_t step_start_ns = absl::ToUnixNanos(step_start);
      const double waited_before = loader->wait_seconds();
      if (!loader->Next(&b)) {
        DT_RETURN_IF_ERROR(loader->status());  // a sample failed to read or decode
        break;
      }
      const double data_wait = std::max(0.0, loader->wait_seconds() - waited_before);
      const int64_t data_end_ns = absl::GetCurrentTimeNanos();
      if (observer->StopRequested()) return absl::CancelledError("stopped");
      if (observer->DrainRequested(steps_run)) {
        progress->drained = true;
        JobConfig now = c;  // this rank's place in the current membership
        now.rank = rank;
        now.world_size = world;
        return Drain(now, trainer.get(), Partial{epoch, step, loss_sum, seen, correct}, progress);
      }
      auto [x, y] = ToTensors(b, sample_shape, Device::Cpu(0));
      absl::Status failure;  // OK: no step failed (a grow's regroup)
      bool regroup_now =
          c.communicator != nullptr && !hybrid && observer->RegroupRequested(steps_run);
      absl::StatusOr<float> stepped = 0.0f;
      if (!regroup_now) {
        stepped = hybrid ? hybrid->Run(x, y) : trainer->Step(x, y);
        if (!stepped.ok()) {
          failure = Annotate(stepped.status(), absl::StrCat("rank ", rank, ", epoch ", epoch + 1,
                                                            " step ", step + 1));
          if (!recoverable(stepped.status())) return failure;
          DT_LOG(WARNING) << "job " << c.name << ": " << failure << "; trying to recover in place";
          regroup_now = true;
        }
      }
      if (regroup_now) {
        // A KVSTORE job's step stalled from its start until the agent
        // cancelled it.
        // (Over NCCL too: a peer's loss may only show when the agent aborts
        // the communicator.)
        const absl::Time failed = kvstore_rounds || device_collective ? step_start : absl::Now();
        trace::ScopedSpan recovery_span(c.trace, "recovery", trace::kTrackStep, steps_run);
        collective::Communicator* comm = nullptr;
        DT_ASSIGN_OR_RETURN(RegroupResult regroup,
                            RegroupSurvivor(c, observer, trainer.get(), failure,
                                            Partial{epoch, step, loss_sum, seen, correct},
                                            steps_per_epoch, steps_run, world, &comm));
        // The loop's ++epoch makes it the root's epoch.
        DT_RETURN_IF_ERROR(adopt(regroup, comm, failed, &epoch));
        regrouped = true;
        break;
      }
      const float l = *stepped;
      if (!std::isfinite(l)) {
        return absl::FailedPreconditionError(
            absl::StrCat("training diverged: loss is ", l, " at epoch ", epoch + 1, " step ",
                         step + 1, "; lower the learning rate (lr=", c.sgd.lr, ")"));
      }
      StepTimes times;
      times.communication = trainer->last_comm_work_seconds();
      times.data_wait = data_wait;
      times.compute = std::max(
          0.0, absl::ToDoubleSeconds(absl::Now() - step_start) - data_wait - times.communication);
      // The phases (step_phases.h): the loader's wait, then the trainer's
      // own phases; the time between them (drain poll, the batch's copy)
      // counts as forward_backward.
      if (hybrid) {
        const int64_t end_ns = absl::GetCurrentTimeNanos();
        for (PhaseSpan& p : times.phases.phase) p = {end_ns, end_ns};
        times.phases.phase[static_cast<int>(StepPhase::kForwardBackward)] = {data_end_ns, end_ns};
        times.phases.step = {step_start_ns, end_ns};
      } else {
        times.phases = trainer->last_step_phases();
        times.phases.step.start_ns = step_start_ns;
        times.phases.phase[static_cast<int>(StepPhase::kForwardBackward)].start_ns = data_end_ns;
      }
      times.phases.phase[static_cast<int>(StepPhase::kDataWait)] = {step_start_ns, data_end_ns};
      times.samples = b.size;
      times.data_queue_depth = loader->queue_depth();
      if (loader->prepare_seconds() > 0) {
        times.data_decode_rate = loader->samples_prepared() / loader->prepare_seconds();
      }
      loss_sum += static_cast<double>(l) * b.size;
      correct += hybrid ? ops::CountCorrect(hybrid->logits(), y) : trainer->last_correct();
      seen += b.size;
      ++step;
      ++steps_run;
      progress->epoch = epoch;
      progress->step = step;
      progress->loss = loss_sum / seen;
      progress->train_accuracy = static_cast<double>(correct) / seen;
      const double secs = absl::ToDoubleSeconds(absl::Now() - start);
      // Samples of the whole job (every rank does the same work).
      progress->samples_per_second = secs > 0 ? seen * world / secs : 0;
      progress->achieved_flops = flops_per_sample * progress->samples_per_second;
      progress->mfu = rank_peak > 0 ? progress->achieved_flops / (rank_peak * world) : 0;
      if (recovering) {
        recovering = false;
        if (recovery_root) {
          observer->OnRecovered(absl::ToDoubleSeconds(absl::Now() - failed_at),
                                recovery_steps_lost);
        }
        recovery_steps_lost = 0;
      }
      RecordStepSpans(c.trace, times.phases, steps_run - 1,
                      hybrid ? "hybridized" : trainer->sync_name());
      observer->OnStep(*progress, times);
    }
    if (regrouped) continue;
    // The epoch's loss and training accuracy over every rank's samples (the
    // trainer's gradient sync knows how its trainers meet; with kvstore-held
    // weights this rank's share).
    float sums[3] = {static_cast<float>(loss_sum), static_cast<float>(seen),
                     static_cast<float>(correct)};
    absl::Status averaged;
    {
      trace::ScopedSpan span(c.trace, "epoch statistics", trace::kTrackStep, steps_run);
      averaged = Annotate(trainer->AverageStatistics(sums, 3),
                          absl::StrCat("rank ", rank, ": averaging the loss of epoch ", epoch + 1));
    }
    if (!averaged.ok()) {
      // A peer lost in the epoch's statistics round: regroup as after a
      // failed step (no step is lost: every survivor finished the epoch's
      // steps), then the new membership meets for this epoch's statistics
      // (the root's position is the epoch's end: no step is left to run).
      if (!recoverable(averaged)) return averaged;
      DT_LOG(WARNING) << "job " << c.name << ": " << averaged << "; trying to recover in place";
      const absl::Time failed = absl::Now();
      trace::ScopedSpan recovery_span(c.trace, "recovery", trace::kTrackStep, steps_run);
      collective::Communicator* comm = nullptr;
      DT_ASSIGN_OR_RETURN(RegroupResult regroup,
                          RegroupSurvivor(c, observer, trainer.get(), averaged,
                                          Partial{epoch, step, loss_sum, seen, correct},
                                          steps_per_epoch, steps_run, world, &comm,
                                          /*step_failed=*/false));
      DT_RETURN_IF_ERROR(adopt(regroup, comm, failed, &epoch));
      continue;
    }
    if (recovering) {
      // The statistics round of a regroup at the epoch's end completed it.
      recovering = false;
      if (recovery_root) {
        observer->OnRecovered(absl::ToDoubleSeconds(absl::Now() - failed_at), recovery_steps_lost);
      }
      recovery_steps_lost = 0;
    }
    if (sums[1] > 0) {
      progress->loss = sums[0] / sums[1];
      progress->train_accuracy = sums[2] / sums[1];
    }
    progress->epoch_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    progress->epoch = epoch + 1;
    progress->step = 0;
    if (rank == 0) {
      // Asynchronous kvstore modes: the server's weights, not the ones this
      // trainer's last pushes left.
      DT_RETURN_IF_ERROR(trainer->PullLatestWeights());
      {
        trace::ScopedSpan span(c.trace, "evaluate", trace::kTrackStep, steps_run);
        DT_ASSIGN_OR_RETURN(progress->test_accuracy,
                            Evaluate(trainer.get(), test_set, sample_shape));
      }
      DT_LOG(INFO) << "job " << c.name << " epoch " << epoch + 1 << ": loss " << progress->loss
                   << ", test accuracy " << progress->test_accuracy;
      if (c.checkpoint_interval_epochs > 0 && (epoch + 1) % c.checkpoint_interval_epochs == 0) {
        std::map<std::string, std::string> meta = c.checkpoint_metadata;
        meta["epochs_done"] = absl::StrCat(epoch + 1);
        meta["seed"] = absl::StrCat(c.seed);
        meta["world_size"] = absl::StrCat(world);
        meta["devices_per_trainer"] = absl::StrCat(k);
        meta["loss"] = absl::StrCat(progress->loss);
        meta["test_accuracy"] = absl::StrCat(progress->test_accuracy);
        trace::ScopedSpan span(c.trace, "checkpoint", trace::kTrackStep, steps_run);
        DT_RETURN_IF_ERROR(SaveTrainingState(c.checkpoint_path, c.model, trainer->replica(0),
                                             trainer->optimizer(0), meta));
        progress->checkpoint_path = c.checkpoint_path;
        progress->checkpoint_epoch = epoch + 1;
        progress->checkpoint_step = 0;
        DT_LOG(INFO) << "job " << c.name << ": checkpoint of epoch " << epoch + 1 << " in "
                     << c.checkpoint_path;
      }
    }
    observer->OnEpoch(*progress);
  }
  if (rank == 0 && progress->test_accuracy < 0) {
    // Resumed from the last epoch's checkpoint: nothing left to train.
    DT_ASSIGN_OR_RETURN(progress->test_accuracy, Evaluate(trainer.get(), test_set, sample_shape));
  }
  // The job is complete: a drain's partial statistics are of no more use.
  if (rank == 0 && !c.checkpoint_path.empty()) RemovePartials(c.checkpoint_path);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunJob(const JobConfig& config, JobObserver* observer, JobProgress* progress) {
  JobObserver none;
  return Run(config, observer != nullptr ? observer : &none, progress);
}

}  // namespace train
}  // namespace dtrain
