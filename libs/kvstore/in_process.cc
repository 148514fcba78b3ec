#include "libs/kvstore/in_process.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/kvstore/codec.h"
#include "libs/kvstore/thread_pool.h"

namespace dtrain {
namespace kvstore {

struct InProcessKVStore::Shards {
  InProcessOptions options;
  std::vector<std::unique_ptr<Store>> stores;
};

// ---------------------------------------------------------------------------
// InProcessKVStore

InProcessKVStore::InProcessKVStore(std::shared_ptr<Shards> shards) : shards_(std::move(shards)) {}

InProcessKVStore::~InProcessKVStore() = default;

absl::StatusOr<std::unique_ptr<InProcessKVStore>> InProcessKVStore::Create(
    InProcessOptions options) {
  if (options.num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-process kvstore: num_shards=", options.num_shards, " must be at least 1"));
  }
  if (options.pull_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "in-process kvstore: pull_timeout=", absl::FormatDuration(options.pull_timeout),
        " must be positive"));
  }
  auto shards = std::make_shared<Shards>();
  for (int i = 0; i < options.num_shards; ++i) {
    StoreOptions store = options.store;
    store.shard_index = i;
    shards->stores.push_back(std::make_unique<Store>(store));
  }
  shards->options = std::move(options);
  return std::unique_ptr<InProcessKVStore>(new InProcessKVStore(std::move(shards)));
}

absl::StatusOr<std::unique_ptr<InProcessParameterServer>> InProcessKVStore::Connect(
    const std::string& job, int worker) {
  if (job.empty() || job.size() > kMaxJobNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-process kvstore: job name must have 1 to ", kMaxJobNameLength, " bytes"));
  }
  if (worker < 0 || worker >= kMaxWorkers) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-process kvstore: worker ", worker, " is out of range"));
  }
  return std::unique_ptr<InProcessParameterServer>(
      new InProcessParameterServer(shards_, job, worker));
}

int InProcessKVStore::num_shards() const { return static_cast<int>(shards_->stores.size()); }

Store& InProcessKVStore::shard(int index) {
  DT_CHECK(index >= 0 && index < num_shards()) << "shard " << index << " of " << num_shards();
  return *shards_->stores[static_cast<size_t>(index)];
}

// ---------------------------------------------------------------------------
// InProcessParameterServer

namespace {

int64_t SliceBytes(const SliceSpec& spec) {
  return spec.count * static_cast<int64_t>(DTypeSize(spec.dtype));
}

// Runs fn(i) for every shard; returns the first error.
absl::Status ForEachShard(int n, const std::function<absl::Status(int)>& fn) {
  absl::Status first;
  for (int i = 0; i < n; ++i) first.Update(fn(i));
  return first;
}

}  // namespace

InProcessParameterServer::InProcessParameterServer(std::shared_ptr<InProcessKVStore::Shards> shards,
                                                   std::string job, int worker)
    : shards_(std::move(shards)),
      job_(std::move(job)),
      worker_(worker),
      keys_(absl::StrCat("worker ", worker)),
      pool_(std::make_unique<ElasticThreadPool>()) {}

InProcessParameterServer::~InProcessParameterServer() {
  pool_.reset();  // finishes operations in flight while keys_ exist
}

absl::Status InProcessParameterServer::CreateJob(const JobConfig& config) {
  if (config.job != job_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CreateJob of job '", config.job, "' from a parameter server of job '", job_, "'"));
  }
  DT_ASSIGN_OR_RETURN(JobConfig stated, StatePlacement(config, shards_->options.placement));
  DT_RETURN_IF_ERROR(ValidateJobConfig(stated));
  return ForEachShard(static_cast<int>(shards_->stores.size()), [&](int i) {
    return shards_->stores[static_cast<size_t>(i)]->CreateJob(stated).status();
  });
}

absl::Status InProcessParameterServer::DeleteJob() {
  return ForEachShard(static_cast<int>(shards_->stores.size()), [&](int i) {
    return shards_->stores[static_cast<size_t>(i)]->DeleteJob(job_);
  });
}

absl::Status InProcessParameterServer::LeaveJob() {
  return ForEachShard(static_cast<int>(shards_->stores.size()), [&](int i) {
    return shards_->stores[static_cast<size_t>(i)]->LeaveJob(job_, worker_).status();
  });
}

void InProcessParameterServer::Cancel(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (!cancelled_.ok()) return;
  cancelled_ =
      absl::CancelledError(absl::StrCat("kvstore job ", job_, " worker ", worker_, ": ", reason));
  is_cancelled_ = true;
}

absl::Status InProcessParameterServer::Init(const std::vector<KeySpec>& keys) {
  const int num_shards = static_cast<int>(shards_->stores.size());
  // Place every key and check it against what this worker knows.
  DT_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Key>> placed,
                      keys_.Place(job_, keys, num_shards, shards_->options.placement));
  // Each shard creates its slices, with their initial values.
  const std::vector<std::vector<WorkerKeys::InitSlice>> per_shard =
      WorkerKeys::SlicesByServer(keys, placed, num_shards);
  DT_RETURN_IF_ERROR(ForEachShard(num_shards, [&](int i) -> absl::Status {
    std::vector<InitItem> items;
    for (const WorkerKeys::InitSlice& s : per_shard[static_cast<size_t>(i)]) {
      InitItem item;
      item.spec = s.slice->spec;
      if (s.initial != nullptr) {
        item.data.emplace_back(s.initial, static_cast<size_t>(SliceBytes(s.slice->spec)));
      }
      items.push_back(std::move(item));
    }
    if (items.empty()) return absl::OkStatus();
    return shards_->stores[static_cast<size_t>(i)]->Init(job_, items).status();
  }));
  keys_.Add(std::move(placed));
  return absl::OkStatus();
}

Work InProcessParameterServer::Issue(Op op, std::vector<CallItem> requests, bool run_one_inline) {
  if (absl::Status bad = CheckCallItems(op, requests); !bad.ok()) return Work::Done(bad);
  auto state = std::make_shared<Work::State>();
  absl::StatusOr<WorkerKeys::Plan> plan = keys_.PlanCall(op, requests, state);
  if (!plan.ok()) return Work::Done(plan.status());
  std::map<int, std::vector<SliceOp>> by_shard;
  for (const SliceOp& w : plan->ops) by_shard[w.slice->server].push_back(w);
  {
    absl::MutexLock lock(&state->mu);
    state->remaining = static_cast<int>(by_shard.size());
  }
  auto shared_deps =
      std::make_shared<const std::vector<std::shared_ptr<Work::State>>>(std::move(plan->after));
  std::function<void()> inline_task;
  for (auto& [shard, shard_work] : by_shard) {
    std::function<void()> task = [this, op, shard = shard, w = std::move(shard_work), state,
                                  shared_deps]() {
      // Operations on the same keys run in the order they were issued.
      for (const auto& dep : *shared_deps) dep->WaitTasks();
      absl::Status s = RunOnShard(op, shard, w);
      // Every key was Init'ed through this worker: NOT_FOUND means the
      // shard dropped the job or key since.
      state->Finish(absl::IsNotFound(s) ? LostJobStateError(s) : s);
    };
    if (run_one_inline && !inline_task) {
      inline_task = std::move(task);
    } else {
      pool_->Schedule(std::move(task));
    }
  }
  if (inline_task) inline_task();
  return Work(std::move(state));
}

absl::Status InProcessParameterServer::RunOnShard(Op op, int shard,
                                                  const std::vector<SliceOp>& work) {
  auto cancelled = [this] {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  };
  if (is_cancelled_) return cancelled();
  Store& store = *shards_->stores[static_cast<size_t>(shard)];
  if (op != Op::kPull) {
    const CompressionSpec compression = encoder_.compression();
    std::vector<PushItem> items(work.size());
    // As the gRPC client sends them (client.cc WireSlice).
    std::vector<std::shared_ptr<const std::string>> encoded(work.size());
    for (size_t i = 0; i < work.size(); ++i) {
      const SliceSpec& spec = work[i].slice->spec;
      items[i].key = spec.key;
      items[i].slice = spec.slice;
      items[i].round = work[i].round;
      items[i].dtype = spec.dtype;
      items[i].shape = spec.shape;
      DT_ASSIGN_OR_RETURN(encoded[i],
                          encoder_.Encode(compression, spec, work[i].round, work[i].src));
      if (encoded[i] == nullptr) {
        items[i].data.emplace_back(work[i].src, static_cast<size_t>(SliceBytes(spec)));
      } else {
        items[i].data.emplace_back(*encoded[i]);
      }
    }
    DT_RETURN_IF_ERROR(store.Push(job_, worker_, compression, items).status());
    if (op == Op::kPush) return absl::OkStatus();
  }
  std::vector<PullRequestItem> items(work.size());
  for (size_t i = 0; i < work.size(); ++i) {
    items[i].key = work[i].slice->spec.key;
    items[i].slice = work[i].slice->spec.slice;
    items[i].round = work[i].round;
  }
  PullOptions options;
  options.deadline = absl::Now() + shards_->options.pull_timeout;
  options.cancelled = [this] { return is_cancelled_.load(); };
  absl::StatusOr<std::vector<PulledValue>> pulled = store.Pull(job_, worker_, items, options);
  if (absl::IsCancelled(pulled.status())) return cancelled();
  DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values, std::move(pulled));
  DT_CHECK(values.size() == work.size()) << values.size() << " values for " << work.size();
  for (size_t i = 0; i < work.size(); ++i) {
    const SliceSpec& spec = work[i].slice->spec;
    DT_CHECK(values[i].dtype == spec.dtype &&
             values[i].bytes.size == static_cast<size_t>(SliceBytes(spec)))
        << DescribeSlice(spec) << " pulled as " << values[i].bytes.size << " bytes";
    std::memcpy(work[i].dst, values[i].bytes.data, values[i].bytes.size);
  }
  return absl::OkStatus();
}

absl::Status InProcessParameterServer::SetPushCompression(const CompressionSpec& compression) {
  return encoder_.SetCompression(compression);
}

absl::StatusOr<int64_t> InProcessParameterServer::PushedRound(const std::string& key) const {
  return keys_.PushedRound(key);
}

absl::StatusOr<int64_t> InProcessParameterServer::ResumeRounds() {
  const int num_shards = static_cast<int>(shards_->stores.size());
  std::vector<JobStatus> states(static_cast<size_t>(num_shards));
  DT_RETURN_IF_ERROR(ForEachShard(num_shards, [&](int i) -> absl::Status {
    DT_ASSIGN_OR_RETURN(states[static_cast<size_t>(i)],
                        shards_->stores[static_cast<size_t>(i)]->GetJob(job_, worker_,
                                                                        /*include_slices=*/true));
    return absl::OkStatus();
  }));
  return keys_.SetPushedRounds(states);
}

}  // namespace kvstore
}  // namespace dtrain
