#include "libs/kvstore/store.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/kvstore/codec.h"

namespace dtrain {
namespace kvstore {

using FloatBuffer = std::vector<float>;

struct Store::Slice {
  explicit Slice(SliceSpec s, int64_t bytes) : spec(std::move(s)), held_bytes(bytes) {}

  const SliceSpec spec;
  const int64_t held_bytes;

  mutable absl::Mutex mu;
  // Copy on write: a buffer is changed in place only while nobody else holds
  // a reference (see Exclusive/Fresh).
  std::shared_ptr<FloatBuffer> value ABSL_GUARDED_BY(mu);
  std::shared_ptr<FloatBuffer> momentum ABSL_GUARDED_BY(mu);
  std::shared_ptr<FloatBuffer> accum ABSL_GUARDED_BY(mu);
  int pending ABSL_GUARDED_BY(mu) = 0;
  int64_t completed ABSL_GUARDED_BY(mu) = 0;
  std::vector<int64_t> pushed ABSL_GUARDED_BY(mu);
  // TryPull continuations: (completed round needed, wake), called by the
  // push that reaches it.
  std::vector<std::pair<int64_t, std::function<void()>>> waiters ABSL_GUARDED_BY(mu);
};

struct Store::Job {
  explicit Job(JobConfig c) : config(std::move(c)) {}

  const JobConfig config;
  mutable absl::Mutex mu;
  std::map<std::pair<std::string, int32_t>, std::shared_ptr<Slice>> slices ABSL_GUARDED_BY(mu);
  int64_t held_bytes ABSL_GUARDED_BY(mu) = 0;
  std::atomic<int64_t> rounds_completed{0};
  // When a call last named the job (absl::ToUnixNanos), for DropIdleJobs.
  std::atomic<int64_t> last_used_ns{absl::ToUnixNanos(absl::Now())};
  // Workers that called LeaveJob (guarded by Store::mu_).
  std::vector<bool> left;
};

namespace {

// `buf` made safe to change in place, keeping its contents.
float* Exclusive(std::shared_ptr<FloatBuffer>& buf) {
  if (buf.use_count() > 1) buf = std::make_shared<FloatBuffer>(*buf);
  return buf->data();
}

// `buf` made safe to overwrite: `n` floats with unspecified contents.
float* Fresh(std::shared_ptr<FloatBuffer>& buf, int64_t n) {
  if (!buf || buf.use_count() > 1 || static_cast<int64_t>(buf->size()) != n) {
    buf = std::make_shared<FloatBuffer>(static_cast<size_t>(n));
  }
  return buf->data();
}

std::string SliceName(absl::string_view job, const SliceSpec& spec) {
  return absl::StrCat("job '", job, "' key '", spec.key, "' slice ", spec.slice);
}

// Workers that have not pushed `round` yet, as "[1, 3]".
std::string Missing(const std::vector<int64_t>& pushed, int64_t round) {
  std::vector<int> missing;
  for (size_t w = 0; w < pushed.size(); ++w) {
    if (pushed[w] < round) missing.push_back(static_cast<int>(w));
  }
  return absl::StrCat("[", absl::StrJoin(missing, ", "), "]");
}

// Holds several slice locks, taken in address order (so two batches can
// never deadlock), and releases them on destruction.
class MultiLock {
 public:
  explicit MultiLock(std::vector<absl::Mutex*> mus) ABSL_NO_THREAD_SAFETY_ANALYSIS
      : mus_(std::move(mus)) {
    std::sort(mus_.begin(), mus_.end());
    for (absl::Mutex* mu : mus_) mu->Lock();
  }
  ~MultiLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = mus_.rbegin(); it != mus_.rend(); ++it) (*it)->Unlock();
  }
  MultiLock(const MultiLock&) = delete;
  MultiLock& operator=(const MultiLock&) = delete;

 private:
  std::vector<absl::Mutex*> mus_;
};

// Runs the functions it collected on destruction: declared before a lock,
// it runs them after the lock is released.
class RunOnExit {
 public:
  RunOnExit() = default;
  ~RunOnExit() {
    for (std::function<void()>& f : fns_) f();
  }
  RunOnExit(const RunOnExit&) = delete;
  RunOnExit& operator=(const RunOnExit&) = delete;
  void Add(std::function<void()> f) { fns_.push_back(std::move(f)); }

 private:
  std::vector<std::function<void()>> fns_;
};

}  // namespace

Store::Store(StoreOptions options) : options_(std::move(options)) {}

Store::~Store() = default;

int64_t Store::SliceBytes(const JobConfig& config, int64_t count) const {
  int64_t buffers = 1;  // value
  if (config.optimizer == OptimizerKind::kSgd && config.momentum != 0) ++buffers;
  if (config.consistency == Consistency::kSync || config.optimizer == OptimizerKind::kSgd) {
    ++buffers;  // round accumulator / decoded gradient
  }
  return buffers * count * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<std::shared_ptr<Store::Job>> Store::FindJob(absl::string_view job,
                                                           bool touch) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job, "' not found on kvstore shard ",
                                            options_.shard_index, " (CreateJob first)"));
  }
  if (touch) {
    it->second->last_used_ns.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
  }
  return it->second;
}

absl::Status Store::CheckWorker(const Job& job, int worker) const {
  if (worker < 0 || worker >= job.config.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker, " is not a worker of job '",
                                                   job.config.job, "' (it has workers 0..",
                                                   job.config.num_workers - 1, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Store::Slice>> Store::FindSlice(const Job& job,
                                                               absl::string_view key,
                                                               int32_t slice) const {
  absl::MutexLock lock(&job.mu);
  auto it = job.slices.find(std::make_pair(std::string(key), slice));
  if (it == job.slices.end()) {
    return absl::NotFoundError(absl::StrCat("key '", key, "' slice ", slice, " of job '",
                                            job.config.job, "' not found on kvstore shard ",
                                            options_.shard_index, " (Init it first)"));
  }
  return it->second;
}

absl::StatusOr<bool> Store::CreateJob(const JobConfig& config) {
  DT_RETURN_IF_ERROR(ValidateJobConfig(config));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(config.job);
  if (it != jobs_.end()) {
    it->second->last_used_ns.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
    if (it->second->config == config) return false;
    return absl::AlreadyExistsError(absl::StrCat(
        "job '", config.job, "' exists with another configuration (",
        DescribeJobConfig(it->second->config), "); requested ", DescribeJobConfig(config)));
  }
  if (options_.max_jobs > 0 && jobs_.size() >= static_cast<size_t>(options_.max_jobs)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kvstore shard ", options_.shard_index, " already holds ", jobs_.size(),
                     " jobs, its limit (--max_jobs=", options_.max_jobs, "); job '", config.job,
                     "' was not created: wait for jobs to finish or add shards"));
  }
  jobs_.emplace(config.job, std::make_shared<Job>(config));
  Bump();
  return true;
}

absl::Status Store::DeleteJob(absl::string_view job) {
  absl::MutexLock lock(&mu_);
  if (jobs_.erase(job) == 0) {
    return absl::NotFoundError(
        absl::StrCat("job '", job, "' not found on kvstore shard ", options_.shard_index));
  }
  Bump();
  return absl::OkStatus();
}

absl::StatusOr<bool> Store::LeaveJob(absl::string_view job, int worker) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job '", job, "' not found on kvstore shard ", options_.shard_index));
  }
  Job& j = *it->second;
  DT_RETURN_IF_ERROR(CheckWorker(j, worker));
  j.last_used_ns.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
  j.left.resize(static_cast<size_t>(j.config.num_workers), false);
  j.left[static_cast<size_t>(worker)] = true;
  if (std::find(j.left.begin(), j.left.end(), false) != j.left.end()) return false;
  jobs_.erase(it);
  Bump();
  return true;
}

std::vector<std::string> Store::DropIdleJobs(absl::Time idle_since) {
  const int64_t cutoff = absl::ToUnixNanos(idle_since);
  std::vector<std::string> dropped;
  absl::MutexLock lock(&mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second->last_used_ns.load(std::memory_order_relaxed) < cutoff) {
      dropped.push_back(it->first);
      jobs_.erase(it++);
    } else {
      ++it;
    }
  }
  if (!dropped.empty()) Bump();
  std::sort(dropped.begin(), dropped.end());
  return dropped;
}

absl::StatusOr<Store::InitPlan> Store::PlanInit(const Job& job,
                                                absl::Span<const SliceSpec> specs) const {
  const absl::string_view job_name = job.config.job;
  InitPlan plan;
  plan.create.assign(specs.size(), false);
  plan.bytes.assign(specs.size(), 0);
  std::map<std::pair<std::string, int32_t>, size_t> seen;
  job.mu.AssertHeld();
  for (size_t i = 0; i < specs.size(); ++i) {
    const SliceSpec& spec = specs[i];
    DT_RETURN_IF_ERROR(Annotate(ValidateSliceSpec(spec), absl::StrCat("job '", job_name, "'")));
    if (spec.count > options_.max_slice_bytes / static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(absl::StrCat(
          SliceName(job_name, spec), ": ", spec.count * 4, " bytes is over the shard's limit of ",
          options_.max_slice_bytes, " bytes per slice"));
    }
    auto id = std::make_pair(spec.key, spec.slice);
    auto [where, inserted] = seen.emplace(id, i);
    if (!inserted) {
      if (specs[where->second] != spec) {
        return absl::InvalidArgumentError(absl::StrCat(
            SliceName(job_name, spec), " appears twice in one Init with different specs"));
      }
      continue;  // Same spec twice: the first one counts.
    }
    auto it = job.slices.find(id);
    if (it != job.slices.end()) {
      if (it->second->spec != spec) {
        return absl::AlreadyExistsError(absl::StrCat(SliceName(job_name, spec), " exists as ",
                                                     DescribeSlice(it->second->spec),
                                                     "; this Init asks for ", DescribeSlice(spec)));
      }
      ++plan.existing;
      continue;
    }
    plan.create[i] = true;
    plan.bytes[i] = SliceBytes(job.config, spec.count);
    plan.new_bytes += plan.bytes[i];
  }
  if (options_.quota_bytes_per_job > 0 &&
      job.held_bytes + plan.new_bytes > options_.quota_bytes_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", job_name, "' would hold ", job.held_bytes + plan.new_bytes,
        " bytes on kvstore shard ", options_.shard_index, " (", job.held_bytes, " held + ",
        plan.new_bytes, " for this Init), over its quota of ", options_.quota_bytes_per_job,
        " bytes per job per shard (raise it with kvstore_server "
        "--quota_bytes_per_job, or spread the job over more shards)"));
  }
  return plan;
}

absl::Status Store::CheckInit(absl::string_view job_name, absl::Span<const SliceSpec> specs) const {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_name));
  absl::MutexLock lock(&job->mu);
  return PlanInit(*job, specs).status();
}

absl::StatusOr<InitResult> Store::Init(absl::string_view job_name,
                                       absl::Span<const InitItem> items) {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_name));
  const JobConfig& config = job->config;
  std::vector<SliceSpec> specs;
  for (const InitItem& item : items) {
    const SliceSpec& spec = item.spec;
    size_t got = TotalBytes(item.data);
    size_t want = static_cast<size_t>(std::max<int64_t>(spec.count, 0)) * DTypeSize(spec.dtype);
    if (got != 0 && got != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(SliceName(job_name, spec), ": initial value has ", got, " bytes, expected ",
                       want, " (", spec.count, " ", DTypeName(spec.dtype), " elements)"));
    }
    specs.push_back(spec);
  }

  absl::MutexLock lock(&job->mu);
  DT_ASSIGN_OR_RETURN(InitPlan plan, PlanInit(*job, specs));
  InitResult result;
  result.existing = plan.existing;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!plan.create[i]) continue;
    const SliceSpec& spec = items[i].spec;
    auto slice = std::make_shared<Slice>(spec, plan.bytes[i]);
    absl::MutexLock slice_lock(&slice->mu);
    slice->value = std::make_shared<FloatBuffer>(static_cast<size_t>(spec.count), 0.0f);
    if (TotalBytes(items[i].data) > 0) {
      absl::Status decoded =
          DecodeValue(items[i].data, spec.dtype, spec.count, slice->value->data(), false);
      DT_CHECK(decoded.ok()) << decoded;  // sizes were checked above
    }
    if (config.optimizer == OptimizerKind::kSgd && config.momentum != 0) {
      slice->momentum = std::make_shared<FloatBuffer>(static_cast<size_t>(spec.count), 0.0f);
    }
    slice->pushed.assign(static_cast<size_t>(config.num_workers), 0);
    job->slices.emplace(std::make_pair(spec.key, spec.slice), std::move(slice));
    ++result.created;
  }
  job->held_bytes += plan.new_bytes;
  if (result.created > 0) Bump();
  return result;
}

absl::StatusOr<int64_t> Store::ExpectedPushBytes(absl::string_view job_name, absl::string_view key,
                                                 int32_t slice,
                                                 const CompressionSpec& compression) const {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_name));
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Slice> s, FindSlice(*job, key, slice));
  return PushValueBytes(compression, s->spec.dtype, s->spec.count);
}

namespace {

// The SGD step of protos/kvstore.proto on `n` elements, reading the
// gradient `g` (before gradient_scale), writing the weights to `w_out`
// (which may be `w_in`).
void SgdStep(const JobConfig& c, int64_t n, const float* g, const float* w_in, float* w_out,
             float* momentum) {
  const float lr = static_cast<float>(c.learning_rate);
  const float mu = static_cast<float>(c.momentum);
  const float wd = static_cast<float>(c.weight_decay);
  const float scale = static_cast<float>(c.gradient_scale);
  if (momentum != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      float d = scale * g[i] + wd * w_in[i];
      float v = mu * momentum[i] + d;
      momentum[i] = v;
      w_out[i] = w_in[i] - lr * v;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      float d = scale * g[i] + wd * w_in[i];
      w_out[i] = w_in[i] - lr * d;
    }
  }
}

}  // namespace

void Store::ApplySgd(const JobConfig& config, Slice& s, const float* g) {
  const int64_t n = s.spec.count;
  std::shared_ptr<FloatBuffer> in = s.value;  // keeps the old weights alive if replaced
  if (in.use_count() > 2) {
    // A reader (a pull in flight, a snapshot) shares the weights: write new ones.
    s.value = std::make_shared<FloatBuffer>(static_cast<size_t>(n));
  }
  SgdStep(config, n, g, in->data(), s.value->data(), s.momentum ? Exclusive(s.momentum) : nullptr);
}

absl::StatusOr<PushResult> Store::Push(absl::string_view job_name, int worker,
                                       const CompressionSpec& compression,
                                       absl::Span<const PushItem> items) {
  DT_RETURN_IF_ERROR(ValidateCompression(compression));
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_name));
  DT_RETURN_IF_ERROR(CheckWorker(*job, worker));
  const JobConfig& config = job->config;
  std::vector<std::shared_ptr<Slice>> slices(items.size());
  std::vector<absl::Mutex*> mus(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    DT_ASSIGN_OR_RETURN(slices[i], FindSlice(*job, items[i].key, items[i].slice));
    mus[i] = &slices[i]->mu;
  }
  {
    std::vector<absl::Mutex*> sorted = mus;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size(); ++i) {
      if (sorted[i] == sorted[i - 1]) {
        for (size_t j = 0; j < items.size(); ++j) {
          if (mus[j] == sorted[i]) {
            return absl::InvalidArgumentError(
                absl::StrCat(SliceName(job_name, slices[j]->spec), " appears twice in one push"));
          }
        }
      }
    }
  }

  PushResult result;
  RunOnExit wakes;  // TryPull continuations of the rounds this push completes
  MultiLock lock(mus);
  // Validate every item before changing anything.
  std::vector<bool> apply(items.size(), false);
  for (size_t i = 0; i < items.size(); ++i) {
    const PushItem& item = items[i];
    Slice& s = *slices[i];
    const SliceSpec& spec = s.spec;
    s.mu.AssertHeld();
    if (item.dtype != spec.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(SliceName(job_name, spec), ": push has dtype ", DTypeName(item.dtype),
                       " but the key was initialized as ", DTypeName(spec.dtype)));
    }
    if (item.shape != spec.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(SliceName(job_name, spec), ": push has shape ", ShapeString(item.shape),
                       " but the key was initialized with shape ", ShapeString(spec.shape)));
    }
    absl::Status value_ok = CheckPushValue(item.data, compression, spec.dtype, spec.count);
    if (!value_ok.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(SliceName(job_name, spec), ": ", value_ok.message()));
    }
    if (item.round < 1) {
      return absl::InvalidArgumentError(absl::StrCat(SliceName(job_name, spec), ": round ",
                                                     item.round, " is invalid; rounds start at 1"));
    }
    const int64_t last = s.pushed[static_cast<size_t>(worker)];
    if (item.round <= last) {
      ++result.duplicates;  // a retry of a push already applied
      continue;
    }
    if (item.round > last + 1) {
      return absl::OutOfRangeError(absl::StrCat(SliceName(job_name, spec), ": worker ", worker,
                                                " pushed round ", item.round,
                                                " but its last push was round ", last,
                                                "; rounds are pushed in order (GetJob tells "
                                                "where the shard is)"));
    }
    if (config.consistency == Consistency::kSync && item.round > s.completed + 1) {
      return absl::OutOfRangeError(absl::StrCat(SliceName(job_name, spec), ": round ", item.round,
                                                " is too far ahead: round ", s.completed + 1,
                                                " is not complete (waiting for workers ",
                                                Missing(s.pushed, s.completed + 1), ")"));
    }
    if (config.consistency == Consistency::kBoundedDelay &&
        item.round > s.completed + config.max_staleness + 1) {
      return absl::OutOfRangeError(absl::StrCat(
          SliceName(job_name, spec), ": round ", item.round, " is too far ahead: the slowest ",
          "workers ", Missing(s.pushed, s.completed + 1), " have pushed round ", s.completed,
          " and the job allows ", config.max_staleness, " rounds of delay"));
    }
    apply[i] = true;
  }

  for (size_t i = 0; i < items.size(); ++i) {
    if (!apply[i]) continue;
    const PushItem& item = items[i];
    Slice& s = *slices[i];
    s.mu.AssertHeld();
    const int64_t n = s.spec.count;
    const DType key_dtype = s.spec.dtype;
    if (config.consistency == Consistency::kSync) {
      if (s.pending == 0) {
        DecodePush(item.data, compression, key_dtype, n, Fresh(s.accum, n), /*accumulate=*/false);
      } else {
        DecodePush(item.data, compression, key_dtype, n, Exclusive(s.accum), /*accumulate=*/true);
      }
      s.pushed[static_cast<size_t>(worker)] = item.round;
      if (++s.pending == config.num_workers) {
        if (config.optimizer == OptimizerKind::kSgd) {
          ApplySgd(config, s, s.accum->data());
        } else if (config.gradient_scale == 1) {
          std::swap(s.value, s.accum);  // the round's sum becomes the value
        } else {
          float* out = Fresh(s.value, n);
          const float scale = static_cast<float>(config.gradient_scale);
          const float* acc = s.accum->data();
          for (int64_t k = 0; k < n; ++k) out[k] = scale * acc[k];
        }
        s.completed = item.round;
        s.pending = 0;
        job->rounds_completed.fetch_add(1, std::memory_order_relaxed);
      } else {
        ++result.incomplete;
      }
    } else {
      if (config.optimizer == OptimizerKind::kNone) {
        float* value = Exclusive(s.value);
        if (config.gradient_scale == 1) {
          DecodePush(item.data, compression, key_dtype, n, value, /*accumulate=*/true);
        } else {
          float* g = Fresh(s.accum, n);
          DecodePush(item.data, compression, key_dtype, n, g, /*accumulate=*/false);
          const float scale = static_cast<float>(config.gradient_scale);
          for (int64_t k = 0; k < n; ++k) value[k] += scale * g[k];
          s.accum.reset();
        }
      } else {
        float* g = Fresh(s.accum, n);
        DecodePush(item.data, compression, key_dtype, n, g, /*accumulate=*/false);
        ApplySgd(config, s, g);
      }
      s.pushed[static_cast<size_t>(worker)] = item.round;
      int64_t low = *std::min_element(s.pushed.begin(), s.pushed.end());
      if (low > s.completed) {
        job->rounds_completed.fetch_add(low - s.completed, std::memory_order_relaxed);
        s.completed = low;
      }
    }
    ++result.applied;
    if (!s.waiters.empty()) {
      auto ready =
          std::partition(s.waiters.begin(), s.waiters.end(),
                         [&s](const std::pair<int64_t, std::function<void()>>& w)
                             ABSL_NO_THREAD_SAFETY_ANALYSIS { return w.first > s.completed; });
      for (auto it = ready; it != s.waiters.end(); ++it) wakes.Add(std::move(it->second));
      s.waiters.erase(ready, s.waiters.end());
    }
  }
  if (result.applied > 0) Bump();
  return result;
}

absl::StatusOr<std::vector<std::shared_ptr<Store::Slice>>> Store::PullSlices(
    absl::string_view job_name, int worker, absl::Span<const PullRequestItem> items,
    std::shared_ptr<Job>* job) const {
  DT_ASSIGN_OR_RETURN(*job, FindJob(job_name));
  DT_RETURN_IF_ERROR(CheckWorker(**job, worker));
  std::vector<std::shared_ptr<Slice>> slices(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    DT_ASSIGN_OR_RETURN(slices[i], FindSlice(**job, items[i].key, items[i].slice));
    const int64_t round = items[i].round;
    if (round < 0) {
      return absl::InvalidArgumentError(absl::StrCat(SliceName(job_name, slices[i]->spec),
                                                     ": pull of round ", round, " is invalid"));
    }
    absl::MutexLock lock(&slices[i]->mu);
    const int64_t own = slices[i]->pushed[static_cast<size_t>(worker)];
    if (round > own) {
      return absl::OutOfRangeError(
          absl::StrCat(SliceName(job_name, slices[i]->spec), ": pull of round ", round,
                       " is too far ahead: worker ", worker, " has pushed up to round ", own));
    }
  }
  return slices;
}

namespace {

// The completed round a pull of `round` waits for.
int64_t NeededRound(const JobConfig& config, int64_t round) {
  if (config.consistency == Consistency::kSync) return round;
  if (config.consistency == Consistency::kBoundedDelay) return round - config.max_staleness;
  return 0;
}

}  // namespace

void Store::ReadValue(const Slice& s, PulledValue* v) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  s.mu.AssertHeld();
  v->round = s.completed;
  v->dtype = s.spec.dtype;
  if (s.spec.dtype == DType::kF32) {
    std::shared_ptr<const FloatBuffer> value = s.value;
    v->bytes.data = reinterpret_cast<const char*>(value->data());
    v->bytes.size = value->size() * sizeof(float);
    v->bytes.owner = std::move(value);
  } else {
    auto encoded =
        std::make_shared<std::string>(EncodeToString(s.value->data(), s.spec.count, s.spec.dtype));
    v->bytes.data = encoded->data();
    v->bytes.size = encoded->size();
    v->bytes.owner = std::move(encoded);
  }
}

absl::StatusOr<std::vector<PulledValue>> Store::Pull(absl::string_view job_name, int worker,
                                                     absl::Span<const PullRequestItem> items,
                                                     const PullOptions& options) {
  std::shared_ptr<Job> job;
  DT_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Slice>> slices,
                      PullSlices(job_name, worker, items, &job));
  const JobConfig& config = job->config;
  std::vector<PulledValue> out(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    Slice& s = *slices[i];
    const int64_t need = NeededRound(config, items[i].round);
    absl::MutexLock lock(&s.mu);
    auto ready = [&s, need]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return s.completed >= need; };
    while (!ready()) {
      absl::Time now = absl::Now();
      if (now >= options.deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            SliceName(job_name, s.spec), ": round ", need, " did not complete before the ",
            "deadline (waiting for workers ", Missing(s.pushed, need), ")"));
      }
      if (options.cancelled && options.cancelled()) {
        return absl::CancelledError(absl::StrCat(SliceName(job_name, s.spec), ": pull cancelled"));
      }
      absl::Time until = options.cancelled
                             ? std::min(options.deadline, now + absl::Milliseconds(20))
                             : options.deadline;
      s.mu.AwaitWithDeadline(absl::Condition(&ready), until);
    }
    ReadValue(s, &out[i]);
  }
  return out;
}

absl::StatusOr<bool> Store::TryPull(absl::string_view job_name, int worker,
                                    absl::Span<const PullRequestItem> items,
                                    std::function<void()> wake, std::vector<PulledValue>* out) {
  std::shared_ptr<Job> job;
  DT_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Slice>> slices,
                      PullSlices(job_name, worker, items, &job));
  out->assign(items.size(), PulledValue());
  for (size_t i = 0; i < items.size(); ++i) {
    Slice& s = *slices[i];
    const int64_t need = NeededRound(job->config, items[i].round);
    absl::MutexLock lock(&s.mu);
    if (s.completed < need) {
      s.waiters.emplace_back(need, std::move(wake));
      out->clear();
      return false;
    }
    ReadValue(s, &(*out)[i]);
  }
  return true;
}

absl::StatusOr<JobStatus> Store::GetJob(absl::string_view job_name, int worker,
                                        bool include_slices) const {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_name, /*touch=*/false));
  JobStatus status;
  status.config = job->config;
  status.shard_index = options_.shard_index;
  status.quota_bytes = options_.quota_bytes_per_job;
  status.rounds_completed = job->rounds_completed.load(std::memory_order_relaxed);
  std::vector<std::shared_ptr<Slice>> slices;
  {
    absl::MutexLock lock(&job->mu);
    status.num_slices = static_cast<int64_t>(job->slices.size());
    status.held_bytes = job->held_bytes;
    const std::string* previous = nullptr;
    for (const auto& [id, slice] : job->slices) {  // sorted by (key, slice)
      if (previous == nullptr || *previous != id.first) ++status.num_keys;
      previous = &id.first;
      if (include_slices) slices.push_back(slice);
    }
  }
  for (const auto& slice : slices) {
    absl::MutexLock lock(&slice->mu);
    SliceStatus s;
    s.spec = slice->spec;
    s.completed_round = slice->completed;
    if (worker >= 0 && worker < job->config.num_workers) {
      s.pushed_round = slice->pushed[static_cast<size_t>(worker)];
    }
    status.slices.push_back(std::move(s));
  }
  return status;
}

std::vector<std::string> Store::JobNames() const {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, job] : jobs_) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<JobState> Store::Export() const {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, job] : jobs_) jobs.push_back(job);
  }
  std::sort(jobs.begin(), jobs.end(),
            [](const auto& a, const auto& b) { return a->config.job < b->config.job; });
  std::vector<JobState> out;
  for (const auto& job : jobs) {
    JobState state;
    state.config = job->config;
    std::vector<std::shared_ptr<Slice>> slices;
    {
      absl::MutexLock lock(&job->mu);
      for (const auto& [id, slice] : job->slices) slices.push_back(slice);
    }
    for (const auto& slice : slices) {
      absl::MutexLock lock(&slice->mu);
      SliceState s;
      s.spec = slice->spec;
      s.completed_round = slice->completed;
      s.pushed = slice->pushed;
      s.pending = slice->pending;
      s.value = slice->value;
      s.momentum = slice->momentum;
      if (slice->pending > 0) s.accum = slice->accum;
      state.slices.push_back(std::move(s));
    }
    out.push_back(std::move(state));
  }
  return out;
}

absl::Status Store::ReplaceAll(std::vector<JobState> jobs) {
  {
    absl::MutexLock lock(&mu_);
    jobs_.clear();
  }
  Bump();
  return Import(std::move(jobs));
}

absl::Status Store::Import(std::vector<JobState> jobs) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Validate everything first.
  std::map<std::string, int> names;
  for (const JobState& job : jobs) {
    const JobConfig& c = job.config;
    DT_RETURN_IF_ERROR(ValidateJobConfig(c));
    if (++names[c.job] > 1) {
      return absl::InvalidArgumentError(absl::StrCat("job '", c.job, "' appears twice"));
    }
    std::map<std::pair<std::string, int32_t>, int> ids;
    int64_t held = 0;
    for (const SliceState& s : job.slices) {
      auto bad = [&](auto&&... parts) {
        return absl::InvalidArgumentError(
            absl::StrCat(SliceName(c.job, s.spec), ": inconsistent state: ", parts...));
      };
      DT_RETURN_IF_ERROR(Annotate(ValidateSliceSpec(s.spec), absl::StrCat("job '", c.job, "'")));
      if (++ids[std::make_pair(s.spec.key, s.spec.slice)] > 1) return bad("it appears twice");
      const size_t n = static_cast<size_t>(s.spec.count);
      if (!s.value || s.value->size() != n) return bad("value has the wrong size");
      bool want_momentum = c.optimizer == OptimizerKind::kSgd && c.momentum != 0;
      if (want_momentum != (s.momentum != nullptr) || (s.momentum && s.momentum->size() != n)) {
        return bad("momentum buffer does not match the optimizer");
      }
      if (s.pushed.size() != static_cast<size_t>(c.num_workers)) {
        return bad(s.pushed.size(), " pushed rounds for ", c.num_workers, " workers");
      }
      int64_t low = *std::min_element(s.pushed.begin(), s.pushed.end());
      if (c.consistency == Consistency::kSync) {
        int ahead = 0;
        for (int64_t p : s.pushed) {
          if (p != s.completed_round && p != s.completed_round + 1) {
            return bad("pushed round ", p, " with completed round ", s.completed_round);
          }
          ahead += p == s.completed_round + 1;
        }
        if (ahead != s.pending || ahead == c.num_workers) return bad("pending count ", s.pending);
        if ((s.pending > 0) != (s.accum != nullptr) || (s.accum && s.accum->size() != n)) {
          return bad("round accumulator does not match the pending pushes");
        }
      } else if (low != s.completed_round || s.pending != 0 || s.accum) {
        return bad("completed round ", s.completed_round, " is not the lowest pushed round ", low);
      }
      held += SliceBytes(c, s.spec.count);
    }
    if (options_.quota_bytes_per_job > 0 && held > options_.quota_bytes_per_job) {
      return absl::ResourceExhaustedError(absl::StrCat("job '", c.job, "' holds ", held,
                                                       " bytes, over the quota of ",
                                                       options_.quota_bytes_per_job));
    }
  }
  absl::MutexLock lock(&mu_);
  for (const JobState& job : jobs) {
    if (jobs_.contains(job.config.job)) {
      return absl::AlreadyExistsError(absl::StrCat("job '", job.config.job, "' exists already"));
    }
  }
  for (JobState& state : jobs) {
    auto job = std::make_shared<Job>(state.config);
    absl::MutexLock job_lock(&job->mu);
    for (SliceState& s : state.slices) {
      int64_t bytes = SliceBytes(state.config, s.spec.count);
      auto slice = std::make_shared<Slice>(s.spec, bytes);
      absl::MutexLock slice_lock(&slice->mu);
      // Buffers are shared with the caller; copy on write protects them.
      slice->value = std::const_pointer_cast<FloatBuffer>(s.value);
      slice->momentum = std::const_pointer_cast<FloatBuffer>(s.momentum);
      slice->accum = std::const_pointer_cast<FloatBuffer>(s.accum);
      slice->pending = s.pending;
      slice->completed = s.completed_round;
      slice->pushed = s.pushed;
      job->held_bytes += bytes;
      job->slices.emplace(std::make_pair(s.spec.key, s.spec.slice), std::move(slice));
    }
    jobs_.emplace(state.config.job, std::move(job));
  }
  Bump();
  return absl::OkStatus();
}

}  // namespace kvstore
}  // namespace dtrain
