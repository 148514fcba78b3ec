// Single-process training on Fashion-MNIST: the entry point the trainer
// service calls, also usable alone (services/trainer:train_local).
//
//   TrainOptions o;
//   o.model = "lenet";
//   o.epochs = 10;
//   absl::StatusOr<TrainResult> r = Train(o, [](const Progress& p) { ... });
//
// Options are validated first; every problem is an InvalidArgument naming
// the option, so the caller can show it to the user as is.
#ifndef DTRAIN_LIBS_TRAIN_TRAIN_H_
#define DTRAIN_LIBS_TRAIN_TRAIN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/loader.h"
#include "libs/nn/module.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace train {

struct TrainOptions {
  std::string model = "lenet";  // mlp, lenet, resnet18
  // Builds the model instead of nn::MakeModel(model) (a model imported from a
  // file, libs/onnx); its input is one Fashion-MNIST image [1, 28, 28] and its
  // output 10 logits. `model` then only names it in checkpoints. Its
  // parameters are initialized with init/seed like a built-in model's.
  std::function<absl::StatusOr<std::shared_ptr<nn::Module>>()> model_factory;
  int64_t batch_size = 256;
  float lr = 0.2f;  // the chapter's LeNet setting
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  int epochs = 10;
  int threads = 0;              // CPU threads for kernels; 0 = all cores
  uint64_t seed = 0;            // data order and initialization
  std::string init = "normal";  // "normal" (std init_std) or "kaiming"
  float init_std = 0.01f;
  std::string device = "cpu";   // "cpu", "cuda:0", ... (the caller chooses; libs/cuda/devices.h
                                // turns "auto" into a device)
  std::string data_dir;         // empty: the Debian package's directory
  int64_t train_limit = 0;      // use only the first N training images (0 = all)
  int64_t test_limit = 0;       // ... test images
  std::string checkpoint_path;  // written atomically after every epoch when set
  bool resume = false;          // continue from checkpoint_path if it exists
  bool evaluate = true;         // test accuracy after every epoch
  // Stop after the first epoch whose test accuracy reaches this (0: run all
  // `epochs`): a test that promises an accuracy "within N epochs" ends as
  // soon as the promise is met. Needs evaluate.
  double stop_at_test_accuracy = 0;
  std::string save_initial_path;  // when set, the initialized model is saved
                                  // there before the first step (to start a
                                  // reference framework from the same weights)
};

absl::Status ValidateOptions(const TrainOptions& options);

struct EpochStats {
  int epoch = 0;  // 1-based
  double loss = 0;
  double train_accuracy = 0;
  double test_accuracy = -1;  // -1 when not evaluated
  double samples_per_second = 0;
  double seconds = 0;
};

struct TrainResult {
  std::vector<EpochStats> epochs;
  int64_t parameters = 0;
  int64_t peak_bytes = 0;  // peak tensor memory of the CPU allocator
  int64_t steps = 0;
};

// Reported after every step.
struct Progress {
  int epoch;  // 1-based
  int epochs;
  int64_t step;  // within the epoch, 1-based
  int64_t steps_per_epoch;
  double loss;  // running mean over the epoch so far
  double samples_per_second;
};

using ProgressFn = std::function<void(const Progress&)>;
// Reported after every epoch (after evaluation).
using EpochFn = std::function<void(const EpochStats&)>;

// A loader batch as tensors on `device`: images f32 [size, sample_shape...]
// and labels i32 [size].
struct BatchTensors {
  Tensor images;
  Tensor labels;
};
BatchTensors ToTensors(const data::Batch& batch, const Shape& sample_shape, const Device& device);

// The fraction of `test` a model gets right: `count_correct(images, labels)`
// (host tensors, batches of 1000 in order) returns how many of a batch it
// classifies correctly. 0 for an empty set; the loader's error if it cannot
// be created.
using CountCorrectFn = std::function<int64_t(const Tensor& images, const Tensor& labels)>;
absl::StatusOr<double> TestAccuracy(const data::Dataset& test, const Shape& sample_shape,
                                    const CountCorrectFn& count_correct);

absl::StatusOr<TrainResult> Train(const TrainOptions& options, const ProgressFn& on_progress = {},
                                  const EpochFn& on_epoch = {});

}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_TRAIN_H_
