#include "libs/train/train.h"

#include <sys/stat.h>

#include <chrono>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/autograd/functions.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/loader.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/ops/ops.h"
#include "libs/train/state_io.h"

namespace dtrain {
namespace train {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Test accuracy in evaluation mode (batch norm uses running statistics).
double Evaluate(nn::Module* model, const data::Dataset& test, const Shape& sample_shape,
                const Device& device) {
  autograd::NoGradGuard no_grad;
  model->Eval();
  absl::StatusOr<double> accuracy =
      TestAccuracy(test, sample_shape, [&](const Tensor& x, const Tensor& y) {
        absl::StatusOr<Tensor> xd = x.To(device);
        absl::StatusOr<Tensor> yd = y.To(device);
        DT_CHECK(xd.ok() && yd.ok()) << "copy to " << device.ToString();
        return ops::CountCorrect(model->Forward(autograd::Variable(*xd)).value(), *yd);
      });
  DT_CHECK(accuracy.ok()) << accuracy.status().message();
  model->Train();
  return *accuracy;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

BatchTensors ToTensors(const data::Batch& batch, const Shape& sample_shape, const Device& device) {
  Shape shape = {batch.size};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  return {Tensor::FromHost(batch.images.data(), batch.images.size(), shape, DType::kF32, device),
          Tensor::FromHost(batch.labels.data(), batch.labels.size(), {batch.size}, DType::kI32,
                           device)};
}

absl::StatusOr<double> TestAccuracy(const data::Dataset& test, const Shape& sample_shape,
                                    const CountCorrectFn& count_correct) {
  if (test.size == 0) return 0.0;
  DT_ASSIGN_OR_RETURN(
      std::unique_ptr<data::DataLoader> loader,
      data::DataLoader::Create(&test, {.batch_size = 1000, .shuffle = false, .prefetch = 1}));
  loader->StartEpoch(0);
  data::Batch b;
  int64_t correct = 0, total = 0;
  while (loader->Next(&b)) {
    auto [x, y] = ToTensors(b, sample_shape, Device::Cpu(0));
    correct += count_correct(x, y);
    total += b.size;
  }
  DT_RETURN_IF_ERROR(loader->status());
  return total == 0 ? 0.0 : static_cast<double>(correct) / total;
}

absl::Status ValidateOptions(const TrainOptions& o) {
  if (!o.model_factory) DT_RETURN_IF_ERROR(nn::ModelInputShape(o.model).status());
  if (!o.model_factory && o.model == "mlp_chapter") {
    return absl::InvalidArgumentError(
        "model mlp_chapter has 512 inputs and 2 classes: it is for the hybridize benchmark, not "
        "for Fashion-MNIST training; use mlp, lenet or resnet18");
  }
  if (o.batch_size <= 0 || o.batch_size > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size must be in 1..65536, got ", o.batch_size));
  }
  if (!(o.lr > 0) || o.lr > 100) {
    return absl::InvalidArgumentError(absl::StrCat("lr must be in (0, 100], got ", o.lr));
  }
  if (o.momentum < 0 || o.momentum >= 1) {
    return absl::InvalidArgumentError(absl::StrCat("momentum must be in [0, 1), got ", o.momentum));
  }
  if (o.weight_decay < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay must be >= 0, got ", o.weight_decay));
  }
  if (o.epochs <= 0 || o.epochs > 10000) {
    return absl::InvalidArgumentError(absl::StrCat("epochs must be in 1..10000, got ", o.epochs));
  }
  if (o.threads < 0 || o.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be in 0..1024 (0 = all cores), got ", o.threads));
  }
  if (o.train_limit < 0 || o.test_limit < 0) {
    return absl::InvalidArgumentError("train_limit and test_limit must be >= 0 (0 = all)");
  }
  if (!(o.init_std > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("init_std must be > 0, got ", o.init_std));
  }
  if (o.resume && o.checkpoint_path.empty()) {
    return absl::InvalidArgumentError("resume needs checkpoint_path");
  }
  if (!(o.stop_at_test_accuracy >= 0 && o.stop_at_test_accuracy <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stop_at_test_accuracy must be in [0, 1] (0: off), got ", o.stop_at_test_accuracy));
  }
  if (o.stop_at_test_accuracy > 0 && !o.evaluate) {
    return absl::InvalidArgumentError("stop_at_test_accuracy needs evaluate (the test accuracy)");
  }
  DT_RETURN_IF_ERROR(nn::ParseInit(o.init).status());
  return Device::Parse(o.device).status();
}

absl::StatusOr<TrainResult> Train(const TrainOptions& o, const ProgressFn& on_progress,
                                  const EpochFn& on_epoch) {
  DT_RETURN_IF_ERROR(ValidateOptions(o));
  if (o.threads > 0) ops::SetCpuThreads(o.threads);
  ops::CpuThreads();

  std::string dir = o.data_dir.empty() ? data::kDefaultFashionMnistDir : o.data_dir;
  DT_ASSIGN_OR_RETURN(data::Dataset train_set,
                      data::LoadFashionMnist(dir, data::Split::kTrain, o.train_limit));
  DT_ASSIGN_OR_RETURN(data::Dataset test_set,
                      data::LoadFashionMnist(dir, data::Split::kTest, o.test_limit));

  std::shared_ptr<nn::Module> model;
  Shape sample_shape = {1, 28, 28};  // a Fashion-MNIST image
  if (o.model_factory) {
    DT_ASSIGN_OR_RETURN(model, o.model_factory());
  } else {
    DT_ASSIGN_OR_RETURN(model, nn::MakeModel(o.model));
    DT_ASSIGN_OR_RETURN(sample_shape, nn::ModelInputShape(o.model));
  }
  DT_ASSIGN_OR_RETURN(nn::Init init, nn::ParseInit(o.init));
  DT_ASSIGN_OR_RETURN(Device device, Device::Parse(o.device));
  nn::InitParameters(model.get(), init, o.seed, o.init_std);
  DT_RETURN_IF_ERROR(Annotate(model->To(device), absl::StrCat("moving the model to ", o.device)));
  nn::Sgd optimizer(model->NamedParameters(),
                    {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});

  if (!o.save_initial_path.empty()) {
    DT_RETURN_IF_ERROR(SaveTrainingState(o.save_initial_path, o.model, model.get(), nullptr,
                                         {{"epochs_done", "0"}, {"seed", absl::StrCat(o.seed)}}));
  }
  int first_epoch = 0;
  if (o.resume && FileExists(o.checkpoint_path)) {
    DT_ASSIGN_OR_RETURN(auto meta,
                        LoadTrainingState(o.checkpoint_path, o.model, model.get(), &optimizer));
    int done = 0;
    if (!absl::SimpleAtoi(meta["epochs_done"], &done) || done < 0) {
      return absl::DataLossError(
          absl::StrCat(o.checkpoint_path, ": metadata epochs_done is missing or invalid"));
    }
    first_epoch = done;
    DT_LOG(INFO) << "resumed from " << o.checkpoint_path << " after epoch " << done;
  }

  DT_ASSIGN_OR_RETURN(
      std::unique_ptr<data::DataLoader> loader,
      data::DataLoader::Create(
          &train_set,
          {.batch_size = o.batch_size, .shuffle = true, .seed = o.seed, .prefetch = 2}));
  Allocator* alloc = *GetAllocator(device);
  alloc->ResetPeak();

  TrainResult result;
  result.parameters = model->NumParameters();
  model->Train();
  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    loader->StartEpoch(epoch);
    data::Batch b;
    double loss_sum = 0;
    int64_t correct = 0, seen = 0, step = 0;
    Clock::time_point start = Clock::now();
    while (loader->Next(&b)) {
      auto [x, y] = ToTensors(b, sample_shape, device);
      autograd::Variable logits = model->Forward(autograd::Variable(x));
      autograd::Variable loss = autograd::SoftmaxCrossEntropy(logits, y);
      optimizer.ZeroGrad();
      loss.Backward();
      optimizer.Step();
      float l = ops::ScalarValue(loss.value());
      if (!std::isfinite(l)) {
        return absl::FailedPreconditionError(
            absl::StrCat("training diverged: loss is ", l, " at epoch ", epoch + 1, " step ",
                         step + 1, "; lower the learning rate (lr=", o.lr, ")"));
      }
      loss_sum += static_cast<double>(l) * b.size;
      correct += ops::CountCorrect(logits.value(), y);
      seen += b.size;
      ++step;
      ++result.steps;
      if (on_progress) {
        double secs = Seconds(start, Clock::now());
        on_progress(Progress{epoch + 1, o.epochs, step, loader->batches_per_epoch(),
                             loss_sum / seen, secs > 0 ? seen / secs : 0});
      }
    }
    double train_seconds = Seconds(start, Clock::now());
    EpochStats stats;
    stats.epoch = epoch + 1;
    stats.loss = seen ? loss_sum / seen : 0;
    stats.train_accuracy = seen ? static_cast<double>(correct) / seen : 0;
    stats.samples_per_second = train_seconds > 0 ? seen / train_seconds : 0;
    if (o.evaluate) stats.test_accuracy = Evaluate(model.get(), test_set, sample_shape, device);
    stats.seconds = Seconds(start, Clock::now());
    result.epochs.push_back(stats);
    if (on_epoch) on_epoch(stats);
    if (!o.checkpoint_path.empty()) {
      DT_RETURN_IF_ERROR(SaveTrainingState(
          o.checkpoint_path, o.model, model.get(), &optimizer,
          {{"epochs_done", absl::StrCat(epoch + 1)}, {"seed", absl::StrCat(o.seed)}}));
    }
    if (o.stop_at_test_accuracy > 0 && stats.test_accuracy >= o.stop_at_test_accuracy) break;
  }
  result.peak_bytes = alloc->stats().peak_bytes_in_use;
  return result;
}

}  // namespace train
}  // namespace dtrain
