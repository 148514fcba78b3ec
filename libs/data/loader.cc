#include "libs/data/loader.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/data/sampler.h"
#include "libs/data/transforms.h"

namespace dtrain::data {
namespace {

absl::Status OptionError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("DataLoader: ", message));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(const Dataset* data,
                                                               LoaderOptions options) {
  if (data == nullptr) return OptionError("data is null");
  if (data->size < 0 || data->rows <= 0 || data->cols <= 0 || data->channels <= 0) {
    return OptionError(absl::StrCat("invalid dataset shape: size ", data->size, ", channels ",
                                    data->channels, ", rows ", data->rows, ", cols ", data->cols));
  }
  if (data->source != nullptr) {
    if (data->size > data->source->size()) {
      return OptionError(absl::StrCat("inconsistent dataset: ", data->size,
                                      " samples but its source has ", data->source->size()));
    }
  } else {
    const int64_t pixels = int64_t{data->channels} * data->rows * data->cols;
    if (static_cast<int64_t>(data->images.size()) / pixels != data->size ||
        static_cast<int64_t>(data->images.size()) % pixels != 0 ||
        static_cast<int64_t>(data->labels.size()) != data->size) {
      return OptionError(absl::StrCat("inconsistent dataset: ", data->size, " samples of ",
                                      data->channels, " x ", data->rows, " x ", data->cols,
                                      " need ", data->size, " x ", pixels, " pixels and ",
                                      data->size, " labels, but it has ", data->images.size(),
                                      " pixels and ", data->labels.size(), " labels"));
    }
  }
  if (options.batch_size <= 0) {
    return OptionError(absl::StrCat("batch_size must be positive, got ", options.batch_size));
  }
  if (options.world_size < 1) {
    return OptionError(absl::StrCat("world_size must be at least 1, got ", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return OptionError(absl::StrCat("rank must be in [0, world_size) = [0, ", options.world_size,
                                    "), got ", options.rank));
  }
  if (options.prefetch < 0) {
    return OptionError(
        absl::StrCat("prefetch must be >= 0 (0 = no background thread), got ", options.prefetch));
  }
  if (options.threads < 1) {
    return OptionError(absl::StrCat("threads must be >= 1, got ", options.threads));
  }
  const int64_t samples = data->size / options.world_size;
  const int64_t full = samples / options.batch_size;
  const int64_t batches = options.drop_last ? full : full + (samples % options.batch_size != 0);
  if (batches == 0) {
    if (samples == 0) {
      return OptionError(absl::StrCat("the dataset has ", data->size,
                                      " samples, too few to give each of ", options.world_size,
                                      " ranks one sample"));
    }
    return OptionError(absl::StrCat("each rank gets ", samples,
                                    " samples per epoch, fewer than batch_size ",
                                    options.batch_size,
                                    ", and drop_last is set: no batches; lower batch_size or "
                                    "unset drop_last"));
  }
  std::unique_ptr<DataLoader> loader(new DataLoader(data, options, samples, batches));
  if (options.prefetch > 0) {
    for (int t = 0; t < options.threads; ++t) {
      loader->producers_.emplace_back([raw = loader.get()] { raw->ProducerLoop(); });
    }
  }
  return loader;
}

DataLoader::DataLoader(const Dataset* data, const LoaderOptions& options, int64_t samples_per_epoch,
                       int64_t batches_per_epoch)
    : data_(data),
      options_(options),
      samples_per_epoch_(samples_per_epoch),
      batches_per_epoch_(batches_per_epoch),
      depth_(std::max(options.prefetch, options.threads)) {
  for (int p = 0; p < 256; ++p) pixel_value_[p] = static_cast<float>(p) / 255.0f;
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : producers_) t.join();
}

void DataLoader::StartEpoch(int64_t epoch, int64_t first_batch) {
  absl::StatusOr<std::vector<int64_t>> order =
      ShardOrder(EpochOrder(data_->size, options_.seed, epoch, options_.shuffle), options_.rank,
                 options_.world_size);
  DT_CHECK(order.ok()) << order.status();  // Create validated rank and world_size.
  DT_CHECK(static_cast<int64_t>(order->size()) == samples_per_epoch_);
  auto shared = std::make_shared<const std::vector<int64_t>>(*std::move(order));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
    started_ = true;
    order_ = std::move(shared);
    epoch_ = epoch;
    next_to_fill_ = std::clamp<int64_t>(first_batch, 0, batches_per_epoch_);
    next_to_return_ = next_to_fill_;
    for (auto& [index, batch] : ready_) spare_.push_back(std::move(batch));
    ready_.clear();
  }
  work_cv_.notify_all();
}

bool DataLoader::Next(Batch* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_ || next_to_return_ >= batches_per_epoch_ || !failure_.ok()) return false;
  const auto start = std::chrono::steady_clock::now();
  if (options_.prefetch == 0) {
    // Synchronous: no other thread touches the batch or the order.
    std::shared_ptr<const std::vector<int64_t>> order = order_;
    const int64_t epoch = epoch_;
    const int64_t index = next_to_return_++;
    lock.unlock();
    absl::Status filled = Fill(*order, epoch, index, out);
    const double seconds = SecondsSince(start);
    lock.lock();
    wait_seconds_ += seconds;
    prepare_seconds_ += seconds;
    if (!filled.ok()) {
      if (failure_.ok()) failure_ = filled;
      return false;
    }
    samples_prepared_ += out->size;
    return true;
  }
  auto ready = [this] { return ready_.count(next_to_return_) != 0 || !failure_.ok(); };
  if (!ready()) {
    ready_cv_.wait(lock, ready);
    wait_seconds_ += SecondsSince(start);
  }
  auto it = ready_.find(next_to_return_);
  if (it == ready_.end()) return false;  // failed
  Batch batch = std::move(it->second);
  ready_.erase(it);
  ++next_to_return_;
  std::swap(*out, batch);
  // `batch` now holds the caller's previous buffers; keep them for reuse.
  if (batch.images.capacity() > 0 && static_cast<int64_t>(spare_.size()) < depth_ + 2) {
    spare_.push_back(std::move(batch));
  }
  lock.unlock();
  work_cv_.notify_one();
  return true;
}

absl::Status DataLoader::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

int64_t DataLoader::samples_prepared() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_prepared_;
}

double DataLoader::prepare_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prepare_seconds_;
}

int64_t DataLoader::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(ready_.size());
}

double DataLoader::wait_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wait_seconds_;
}

absl::Status DataLoader::Fill(const std::vector<int64_t>& order, int64_t epoch, int64_t index,
                              Batch* out) const {
  const int64_t begin = index * options_.batch_size;
  const int64_t count = std::min<int64_t>(options_.batch_size, order.size() - begin);
  const int64_t pixels = int64_t{data_->channels} * data_->rows * data_->cols;
  out->size = count;
  out->index = index;
  out->images.resize(count * pixels);
  out->labels.resize(count);
  if (data_->source != nullptr) {
    Image image;
    // Encoded images: read, then decoded and transformed in one pass.
    const DecodeOptions* decode = data_->source->decode_options();
    thread_local std::string bytes;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t sample = order[begin + k];
      const uint64_t seed = SampleSeed(options_.seed, epoch, sample);
      float* dst = out->images.data() + k * pixels;
      absl::Status s;
      if (decode != nullptr) {
        s = data_->source->ReadEncoded(sample, &bytes);
        if (s.ok()) {
          s = DecodeAndTransform(bytes, *decode, data_->transforms, seed, data_->channels,
                                 data_->rows, data_->cols, &image, dst);
          if (!s.ok()) s = Annotate(s, data_->source->Describe(sample));
        }
      } else {
        s = data_->source->Read(sample, &image);
        if (s.ok()) {
          s = ApplyTransforms(image, data_->transforms, seed, data_->channels, data_->rows,
                              data_->cols, dst);
          if (!s.ok()) s = Annotate(s, data_->source->Describe(sample));
        }
      }
      if (!s.ok()) return s;
      out->labels[k] = data_->source->label(sample);
    }
    return absl::OkStatus();
  }
  for (int64_t k = 0; k < count; ++k) {
    const int64_t sample = order[begin + k];
    const uint8_t* src = data_->images.data() + sample * pixels;
    float* dst = out->images.data() + k * pixels;
    for (int64_t p = 0; p < pixels; ++p) dst[p] = pixel_value_[src[p]];
    out->labels[k] = data_->labels[sample];
  }
  return absl::OkStatus();
}

bool DataLoader::ProducerHasWork() const {
  return started_ && failure_.ok() && next_to_fill_ < batches_per_epoch_ &&
         next_to_fill_ - next_to_return_ < depth_;
}

void DataLoader::ProducerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [this] { return shutdown_ || ProducerHasWork(); });
    if (shutdown_) return;
    const uint64_t generation = generation_;
    const int64_t index = next_to_fill_++;
    const int64_t epoch = epoch_;
    std::shared_ptr<const std::vector<int64_t>> order = order_;
    Batch batch;
    if (!spare_.empty()) {
      batch = std::move(spare_.back());
      spare_.pop_back();
    }
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    absl::Status filled = Fill(*order, epoch, index, &batch);
    const double seconds = SecondsSince(start);
    lock.lock();
    prepare_seconds_ += seconds;
    if (generation != generation_) {  // StartEpoch ran meanwhile: discard.
      spare_.push_back(std::move(batch));
      continue;
    }
    if (!filled.ok()) {
      if (failure_.ok()) failure_ = filled;
      ready_cv_.notify_all();
      continue;
    }
    samples_prepared_ += batch.size;
    ready_.emplace(index, std::move(batch));
    ready_cv_.notify_all();
  }
}

}  // namespace dtrain::data
