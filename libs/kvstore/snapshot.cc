#include "libs/kvstore/snapshot.h"

#include <sys/stat.h>

#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/checkpoint/checkpoint.h"

namespace dtrain {
namespace kvstore {
namespace {

// Metadata keys. The snapshot's state lives in "name=value" lines (values
// C-escaped) and f32 tensor records named after the slice's index.
constexpr char kFormatKey[] = "kvstore.format";
constexpr char kFormat[] = "1";
constexpr char kShardKey[] = "kvstore.shard_index";
constexpr char kJobCountKey[] = "kvstore.jobs";

using Fields = std::map<std::string, std::string>;

std::string Join(const Fields& fields) {
  std::string out;
  for (const auto& [k, v] : fields) absl::StrAppend(&out, k, "=", absl::CEscape(v), "\n");
  return out;
}

absl::StatusOr<Fields> Split(absl::string_view text, absl::string_view what) {
  Fields fields;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    size_t eq = line.find('=');
    std::string value;
    if (eq == absl::string_view::npos || !absl::CUnescape(line.substr(eq + 1), &value)) {
      return absl::DataLossError(absl::StrCat(what, ": malformed line '", line, "'"));
    }
    fields[std::string(line.substr(0, eq))] = std::move(value);
  }
  return fields;
}

absl::StatusOr<std::string> Get(const Fields& f, const std::string& name, absl::string_view what) {
  auto it = f.find(name);
  if (it == f.end()) return absl::DataLossError(absl::StrCat(what, ": missing field ", name));
  return it->second;
}

absl::StatusOr<int64_t> GetInt(const Fields& f, const std::string& name, absl::string_view what) {
  DT_ASSIGN_OR_RETURN(std::string s, Get(f, name, what));
  int64_t v = 0;
  if (!absl::SimpleAtoi(s, &v)) {
    return absl::DataLossError(
        absl::StrCat(what, ": field ", name, "='", s, "' is not an integer"));
  }
  return v;
}

absl::StatusOr<double> GetDouble(const Fields& f, const std::string& name, absl::string_view what) {
  DT_ASSIGN_OR_RETURN(std::string s, Get(f, name, what));
  double v = 0;
  if (!absl::SimpleAtod(s, &v)) {
    return absl::DataLossError(absl::StrCat(what, ": field ", name, "='", s, "' is not a number"));
  }
  return v;
}

absl::StatusOr<std::vector<int64_t>> GetInts(const Fields& f, const std::string& name,
                                             absl::string_view what) {
  DT_ASSIGN_OR_RETURN(std::string s, Get(f, name, what));
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::DataLossError(absl::StrCat(what, ": field ", name, " has '", part, "'"));
    }
    out.push_back(v);
  }
  return out;
}

std::string Exact(double v) { return absl::StrFormat("%.17g", v); }

std::string EncodeConfig(const JobConfig& c) {
  return Join({{"job", c.job},
               {"num_workers", absl::StrCat(c.num_workers)},
               {"consistency", ConsistencyName(c.consistency)},
               {"max_staleness", absl::StrCat(c.max_staleness)},
               {"optimizer", OptimizerName(c.optimizer)},
               {"learning_rate", Exact(c.learning_rate)},
               {"momentum", Exact(c.momentum)},
               {"weight_decay", Exact(c.weight_decay)},
               {"gradient_scale", Exact(c.gradient_scale)},
               {"placement", c.placement}});
}

absl::StatusOr<JobConfig> DecodeConfig(absl::string_view text, absl::string_view what) {
  DT_ASSIGN_OR_RETURN(Fields f, Split(text, what));
  JobConfig c;
  DT_ASSIGN_OR_RETURN(c.job, Get(f, "job", what));
  DT_ASSIGN_OR_RETURN(int64_t workers, GetInt(f, "num_workers", what));
  c.num_workers = static_cast<int>(workers);
  DT_ASSIGN_OR_RETURN(std::string consistency, Get(f, "consistency", what));
  bool known = false;
  for (Consistency k : {Consistency::kSync, Consistency::kAsync, Consistency::kBoundedDelay}) {
    if (consistency == ConsistencyName(k)) {
      c.consistency = k;
      known = true;
    }
  }
  if (!known) return absl::DataLossError(absl::StrCat(what, ": consistency '", consistency, "'"));
  // Snapshots written before the field's rename call it max_delay.
  DT_ASSIGN_OR_RETURN(
      int64_t staleness,
      GetInt(f, f.count("max_staleness") > 0 ? "max_staleness" : "max_delay", what));
  c.max_staleness = static_cast<int>(staleness);
  DT_ASSIGN_OR_RETURN(std::string optimizer, Get(f, "optimizer", what));
  known = false;
  for (OptimizerKind k : {OptimizerKind::kNone, OptimizerKind::kSgd}) {
    if (optimizer == OptimizerName(k)) {
      c.optimizer = k;
      known = true;
    }
  }
  if (!known) return absl::DataLossError(absl::StrCat(what, ": optimizer '", optimizer, "'"));
  DT_ASSIGN_OR_RETURN(c.learning_rate, GetDouble(f, "learning_rate", what));
  DT_ASSIGN_OR_RETURN(c.momentum, GetDouble(f, "momentum", what));
  DT_ASSIGN_OR_RETURN(c.weight_decay, GetDouble(f, "weight_decay", what));
  DT_ASSIGN_OR_RETURN(c.gradient_scale, GetDouble(f, "gradient_scale", what));
  // Snapshots written before the field have none: not stated.
  if (f.count("placement") > 0) c.placement = f.at("placement");
  return c;
}

std::string EncodeSlice(const SliceState& s) {
  return Join({{"key", s.spec.key},
               {"slice", absl::StrCat(s.spec.slice)},
               {"num_slices", absl::StrCat(s.spec.num_slices)},
               {"dtype", absl::StrCat(static_cast<int>(s.spec.dtype))},
               {"shape", absl::StrJoin(s.spec.shape, ",")},
               {"offset", absl::StrCat(s.spec.offset)},
               {"count", absl::StrCat(s.spec.count)},
               {"completed", absl::StrCat(s.completed_round)},
               {"pending", absl::StrCat(s.pending)},
               {"pushed", absl::StrJoin(s.pushed, ",")}});
}

absl::StatusOr<SliceState> DecodeSlice(absl::string_view text, absl::string_view what) {
  DT_ASSIGN_OR_RETURN(Fields f, Split(text, what));
  SliceState s;
  DT_ASSIGN_OR_RETURN(s.spec.key, Get(f, "key", what));
  DT_ASSIGN_OR_RETURN(int64_t slice, GetInt(f, "slice", what));
  DT_ASSIGN_OR_RETURN(int64_t num_slices, GetInt(f, "num_slices", what));
  DT_ASSIGN_OR_RETURN(int64_t dtype, GetInt(f, "dtype", what));
  DT_ASSIGN_OR_RETURN(s.spec.shape, GetInts(f, "shape", what));
  DT_ASSIGN_OR_RETURN(s.spec.offset, GetInt(f, "offset", what));
  DT_ASSIGN_OR_RETURN(s.spec.count, GetInt(f, "count", what));
  DT_ASSIGN_OR_RETURN(s.completed_round, GetInt(f, "completed", what));
  DT_ASSIGN_OR_RETURN(int64_t pending, GetInt(f, "pending", what));
  DT_ASSIGN_OR_RETURN(s.pushed, GetInts(f, "pushed", what));
  absl::StatusOr<DType> d = DTypeFromCode(static_cast<int32_t>(dtype));
  if (!d.ok()) return absl::DataLossError(absl::StrCat(what, ": ", d.status().message()));
  s.spec.slice = static_cast<int32_t>(slice);
  s.spec.num_slices = static_cast<int32_t>(num_slices);
  s.spec.dtype = *d;
  s.pending = static_cast<int>(pending);
  return s;
}

checkpoint::TensorRecord FloatRecord(std::string name, const std::vector<float>& values) {
  checkpoint::TensorRecord r;
  r.name = std::move(name);
  r.dtype = static_cast<int32_t>(DType::kF32);
  r.shape = {static_cast<int64_t>(values.size())};
  r.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return r;
}

// The record `name` as floats; null when absent and `optional`.
absl::StatusOr<std::shared_ptr<const std::vector<float>>> ReadFloats(
    const checkpoint::Checkpoint& ckpt, const std::string& name, bool optional,
    absl::string_view what) {
  const checkpoint::TensorRecord* r = ckpt.Find(name);
  if (r == nullptr) {
    if (optional) return std::shared_ptr<const std::vector<float>>();
    return absl::DataLossError(absl::StrCat(what, ": tensor ", name, " is missing"));
  }
  if (r->dtype != static_cast<int32_t>(DType::kF32) || r->shape.size() != 1 ||
      !checkpoint::ValidateRecord(*r, sizeof(float)).ok()) {
    return absl::DataLossError(absl::StrCat(what, ": tensor ", name, " is not a f32 vector"));
  }
  auto out = std::make_shared<std::vector<float>>(static_cast<size_t>(r->shape[0]));
  std::memcpy(out->data(), r->data.data(), r->data.size());
  return std::shared_ptr<const std::vector<float>>(std::move(out));
}

}  // namespace

std::string SnapshotPath(const std::string& data_dir, int shard_index) {
  return absl::StrCat(data_dir, "/kvstore-shard-", shard_index, ".dtckpt");
}

checkpoint::Checkpoint EncodeState(const std::vector<JobState>& jobs, int shard_index) {
  checkpoint::Checkpoint ckpt;
  ckpt.metadata[kFormatKey] = kFormat;
  ckpt.metadata[kShardKey] = absl::StrCat(shard_index);
  ckpt.metadata[kJobCountKey] = absl::StrCat(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const JobState& job = jobs[j];
    ckpt.metadata[absl::StrCat("job.", j)] = EncodeConfig(job.config);
    ckpt.metadata[absl::StrCat("job.", j, ".slices")] = absl::StrCat(job.slices.size());
    for (size_t i = 0; i < job.slices.size(); ++i) {
      const SliceState& s = job.slices[i];
      std::string base = absl::StrCat("slice.", j, ".", i);
      ckpt.metadata[base] = EncodeSlice(s);
      ckpt.tensors.push_back(FloatRecord(base + ".value", *s.value));
      if (s.momentum) ckpt.tensors.push_back(FloatRecord(base + ".momentum", *s.momentum));
      if (s.accum) ckpt.tensors.push_back(FloatRecord(base + ".accum", *s.accum));
    }
  }
  return ckpt;
}

absl::StatusOr<std::vector<JobState>> DecodeState(const checkpoint::Checkpoint& ckpt,
                                                  int shard_index, const std::string& what) {
  auto meta = [&](const std::string& key) -> absl::StatusOr<std::string> {
    auto it = ckpt.metadata.find(key);
    if (it == ckpt.metadata.end()) {
      return absl::DataLossError(absl::StrCat(what, ": metadata ", key, " is missing"));
    }
    return it->second;
  };
  DT_ASSIGN_OR_RETURN(std::string format, meta(kFormatKey));
  if (format != kFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": format ", format, ", this build reads format ", kFormat));
  }
  DT_ASSIGN_OR_RETURN(std::string shard, meta(kShardKey));
  if (shard != absl::StrCat(shard_index)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": belongs to shard ", shard, ", this server is shard ", shard_index));
  }
  DT_ASSIGN_OR_RETURN(std::string job_count_text, meta(kJobCountKey));
  int64_t job_count = 0;
  if (!absl::SimpleAtoi(job_count_text, &job_count) || job_count < 0) {
    return absl::DataLossError(absl::StrCat(what, ": bad job count '", job_count_text, "'"));
  }
  std::vector<JobState> jobs;
  for (int64_t j = 0; j < job_count; ++j) {
    JobState job;
    DT_ASSIGN_OR_RETURN(std::string config_text, meta(absl::StrCat("job.", j)));
    DT_ASSIGN_OR_RETURN(job.config, DecodeConfig(config_text, what));
    DT_ASSIGN_OR_RETURN(std::string count_text, meta(absl::StrCat("job.", j, ".slices")));
    int64_t slices = 0;
    if (!absl::SimpleAtoi(count_text, &slices) || slices < 0) {
      return absl::DataLossError(absl::StrCat(what, ": bad slice count '", count_text, "'"));
    }
    for (int64_t i = 0; i < slices; ++i) {
      std::string base = absl::StrCat("slice.", j, ".", i);
      DT_ASSIGN_OR_RETURN(std::string slice_text, meta(base));
      DT_ASSIGN_OR_RETURN(SliceState s, DecodeSlice(slice_text, what));
      DT_ASSIGN_OR_RETURN(s.value, ReadFloats(ckpt, base + ".value", false, what));
      DT_ASSIGN_OR_RETURN(s.momentum, ReadFloats(ckpt, base + ".momentum", true, what));
      DT_ASSIGN_OR_RETURN(s.accum, ReadFloats(ckpt, base + ".accum", true, what));
      job.slices.push_back(std::move(s));
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::StatusOr<SnapshotInfo> WriteSnapshot(const Store& store, const std::string& data_dir) {
  SnapshotInfo info;
  info.version = store.version();
  checkpoint::Checkpoint ckpt;
  {
    std::vector<JobState> jobs = store.Export();
    for (const JobState& job : jobs) info.slices += static_cast<int64_t>(job.slices.size());
    ckpt = EncodeState(jobs, store.options().shard_index);
  }  // drop the shared buffers before the (slow) write
  info.path = SnapshotPath(data_dir, store.options().shard_index);
  DT_RETURN_IF_ERROR(checkpoint::WriteCheckpoint(info.path, ckpt));
  struct stat st;
  if (stat(info.path.c_str(), &st) == 0) info.bytes = static_cast<int64_t>(st.st_size);
  return info;
}

absl::StatusOr<bool> LoadSnapshot(const std::string& data_dir, Store* store) {
  const std::string path = SnapshotPath(data_dir, store->options().shard_index);
  absl::StatusOr<checkpoint::Checkpoint> read = checkpoint::ReadCheckpoint(path);
  if (absl::IsNotFound(read.status())) return false;
  if (!read.ok()) return read.status();
  const std::string what = absl::StrCat("kvstore snapshot ", path);
  DT_ASSIGN_OR_RETURN(std::vector<JobState> jobs,
                      DecodeState(*read, store->options().shard_index, what));
  absl::Status imported = store->Import(std::move(jobs));
  if (absl::IsInvalidArgument(imported) || absl::IsResourceExhausted(imported)) {
    return absl::DataLossError(absl::StrCat(what, ": ", imported.message()));
  }
  DT_RETURN_IF_ERROR(imported);
  return true;
}

Snapshotter::Snapshotter(Store* store, std::string data_dir, absl::Duration interval)
    : store_(store), data_dir_(std::move(data_dir)) {
  if (!data_dir_.empty() && interval > absl::ZeroDuration()) {
    thread_ = std::thread([this, interval] { Loop(interval); });
  }
}

Snapshotter::~Snapshotter() { Stop(); }

void Snapshotter::Stop() {
  absl::MutexLock lock(&stop_mu_);
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<SnapshotInfo> Snapshotter::WriteLocked() {
  DT_ASSIGN_OR_RETURN(SnapshotInfo info, WriteSnapshot(*store_, data_dir_));
  written_any_ = true;
  last_version_ = info.version;
  ++written_;
  return info;
}

absl::StatusOr<SnapshotInfo> Snapshotter::SnapshotNow() {
  if (data_dir_.empty()) return SnapshotInfo();
  absl::MutexLock lock(&mu_);
  return WriteLocked();
}

absl::StatusOr<bool> Snapshotter::SnapshotIfChanged() {
  if (data_dir_.empty()) return false;
  absl::MutexLock lock(&mu_);
  if (written_any_ && store_->version() == last_version_) return false;
  DT_RETURN_IF_ERROR(WriteLocked().status());
  return true;
}

int64_t Snapshotter::snapshots_written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

void Snapshotter::Loop(absl::Duration interval) {
  while (!stop_.WaitForNotificationWithTimeout(interval)) {
    absl::StatusOr<bool> wrote = SnapshotIfChanged();
    if (!wrote.ok()) {
      DT_LOG(ERROR) << "periodic snapshot failed: " << wrote.status();
    } else if (*wrote) {
      DT_LOG(DEBUG) << "snapshot written to "
                    << SnapshotPath(data_dir_, store_->options().shard_index);
    }
  }
}

}  // namespace kvstore
}  // namespace dtrain
