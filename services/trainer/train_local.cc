// train_local: trains one model on Fashion-MNIST in this process.
//
//   train_local --model=lenet --epochs=10 --batch_size=256 --lr=0.2
//   train_local --model=mlp --epochs=5 -o json
//
// Prints one line per epoch (or, with -o json, one JSON document at the end)
// and a progress bar on stderr when it is a terminal. Exit status 0 on
// success, 2 for bad options, 1 for other failures (with the reason on stderr).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "libs/base/logging.h"
#include "libs/cuda/devices.h"
#include "libs/train/train.h"

ABSL_FLAG(std::string, model, "lenet", "model: mlp, lenet or resnet18");
ABSL_FLAG(int64_t, batch_size, 256, "minibatch size");
ABSL_FLAG(double, lr, 0.2, "learning rate");
ABSL_FLAG(double, momentum, 0.0, "SGD momentum");
ABSL_FLAG(double, weight_decay, 0.0, "SGD weight decay");
ABSL_FLAG(int, epochs, 10, "epochs to train");
ABSL_FLAG(int, threads, 0, "CPU threads for kernels (0 = all cores)");
ABSL_FLAG(uint64_t, seed, 0, "seed for initialization and data order");
ABSL_FLAG(std::string, init, "normal", "initialization: normal (std --init_std) or kaiming");
ABSL_FLAG(double, init_std, 0.01, "standard deviation of --init=normal");
ABSL_FLAG(std::string, device, "auto",
          "device: auto (a CUDA device if there is one, else cpu), cpu, cuda, cuda:N");
ABSL_FLAG(std::string, data_dir, "", "Fashion-MNIST directory (default: Debian's)");
ABSL_FLAG(int64_t, train_limit, 0, "use only the first N training images (0 = all)");
ABSL_FLAG(int64_t, test_limit, 0, "use only the first N test images (0 = all)");
ABSL_FLAG(std::string, checkpoint, "", "checkpoint file, written after every epoch");
ABSL_FLAG(bool, resume, false, "continue from --checkpoint if it exists");
ABSL_FLAG(std::string, save_initial, "",
          "also save the initialized model here before training (checkpoint format)");
ABSL_FLAG(std::string, o, "text", "output format: text or json");

namespace {

void DrawBar(const dtrain::train::Progress& p) {
  const int width = 30;
  double frac = p.steps_per_epoch ? static_cast<double>(p.step) / p.steps_per_epoch : 1.0;
  int filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\repoch %d/%d [%s] %3d%% loss %.4f %.0f samples/s ", p.epoch, p.epochs,
               bar.c_str(), static_cast<int>(frac * 100), p.loss, p.samples_per_second);
  if (p.step == p.steps_per_epoch) std::fprintf(stderr, "\r%*s\r", width + 60, "");
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Trains a model on Fashion-MNIST in this process.");
  absl::ParseCommandLine(argc, argv);
  std::string format = absl::GetFlag(FLAGS_o);
  if (format != "text" && format != "json") {
    std::cerr << "train_local: -o must be text or json, got '" << format << "'\n";
    return 2;
  }
  dtrain::train::TrainOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  o.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  o.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  o.epochs = absl::GetFlag(FLAGS_epochs);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.init = absl::GetFlag(FLAGS_init);
  o.init_std = static_cast<float>(absl::GetFlag(FLAGS_init_std));
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  absl::StatusOr<std::vector<dtrain::Device>> devices =
      dtrain::cuda::ChooseDevices(absl::GetFlag(FLAGS_device));
  if (!devices.ok()) {
    std::cerr << "train_local: --device: " << devices.status().message() << "\n";
    return 2;
  }
  // One process trains on one device; data parallelism across devices is
  // the trainer service's job (libs/train/data_parallel.h).
  o.device = devices->front().ToString();
  o.train_limit = absl::GetFlag(FLAGS_train_limit);
  o.test_limit = absl::GetFlag(FLAGS_test_limit);
  o.checkpoint_path = absl::GetFlag(FLAGS_checkpoint);
  o.resume = absl::GetFlag(FLAGS_resume);
  o.save_initial_path = absl::GetFlag(FLAGS_save_initial);
  absl::Status valid = dtrain::train::ValidateOptions(o);
  if (!valid.ok()) {
    std::cerr << "train_local: " << valid.message() << "\n";
    return 2;
  }
  bool tty = isatty(STDERR_FILENO);
  bool text = format == "text";
  if (text) {
    std::printf("training %s on Fashion-MNIST: batch %lld, lr %g, %d epochs\n", o.model.c_str(),
                static_cast<long long>(o.batch_size), o.lr, o.epochs);
    std::fflush(stdout);
  }
  absl::StatusOr<dtrain::train::TrainResult> r = dtrain::train::Train(
      o,
      [&](const dtrain::train::Progress& p) {
        if (tty) DrawBar(p);
      },
      [&](const dtrain::train::EpochStats& e) {
        if (!text) return;
        std::printf("epoch %2d  loss %.4f  train_acc %.4f  test_acc %.4f  %8.0f samples/s  %.1fs\n",
                    e.epoch, e.loss, e.train_accuracy, e.test_accuracy, e.samples_per_second,
                    e.seconds);
        std::fflush(stdout);
      });
  if (!r.ok()) {
    std::cerr << "train_local: " << r.status().message() << "\n";
    return 1;
  }
  if (text) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    std::printf("parameters %lld, peak tensor memory %.1f MiB, peak RSS %.1f MiB\n",
                static_cast<long long>(r->parameters), r->peak_bytes / 1048576.0,
                ru.ru_maxrss / 1024.0);
  } else {
    std::string json = absl::StrFormat(
        "{\"model\": \"%s\", \"batch_size\": %d, \"lr\": %g, \"parameters\": %d, "
        "\"peak_bytes\": %d, \"steps\": %d, \"epochs\": [",
        o.model, o.batch_size, o.lr, r->parameters, r->peak_bytes, r->steps);
    for (size_t i = 0; i < r->epochs.size(); ++i) {
      const auto& e = r->epochs[i];
      absl::StrAppendFormat(&json,
                            "%s{\"epoch\": %d, \"loss\": %.6f, \"train_accuracy\": %.6f, "
                            "\"test_accuracy\": %.6f, \"samples_per_second\": %.1f, "
                            "\"seconds\": %.3f}",
                            i ? ", " : "", e.epoch, e.loss, e.train_accuracy, e.test_accuracy,
                            e.samples_per_second, e.seconds);
    }
    json += "]}";
    std::printf("%s\n", json.c_str());
  }
  return 0;
}
