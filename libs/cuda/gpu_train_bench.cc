// gpu_train_bench: training throughput of a libs/nn model on a CUDA device.
//
//   gpu_train_bench --model=resnet18 --batch_size=256 --precision=bf16 --steps=30
//
// Each step is one SGD minibatch step (forward, mean softmax cross-entropy,
// backward, update) in train mode, as tests/bench/train_bench.cc does on the
// CPU and tools/gpu/torch_resnet_bench.py does in PyTorch. Data: 8 random
// batches of the model's input shape, generated on the device, cycled.
// Precisions:
//   fp32  f32 everywhere, no TF32 (cuDNN FMA algorithms, cuBLAS f32)
//   tf32  f32 tensors, TF32 tensor cores allowed in convolutions and products
//   bf16  bf16 activations and parameter copies, f32 master weights
//         (MixedPrecisionSgd), f32 loss
//   f16   as bf16 in f16, with dynamic loss scaling (LossScaler)
// The optimizer is the fused multi-tensor SGD (libs/cuda/amp.h) in all four.
//
// FLOPs: 2 x multiply-adds of the convolutions and linear layers of one
// forward pass, counted analytically for the model (ForwardFlops below), times
// 3 for forward + backward (the usual estimate: the backward pass computes a
// data and a weight gradient of the same cost). tflops = that times samples/s.
//
// Output: key=value lines; the last is samples_per_second=<n>. Exit status 3
// with "no CUDA device" on stderr when the machine has no GPU.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "libs/autograd/functions.h"
#include "libs/cuda/amp.h"
#include "libs/cuda/config.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/device_allocator.h"
#include "libs/nn/models.h"
#include "libs/ops/ops.h"

ABSL_FLAG(std::string, model, "resnet18", "mlp, lenet or resnet18");
ABSL_FLAG(int64_t, batch_size, 256, "minibatch size");
ABSL_FLAG(std::string, precision, "fp32", "fp32, tf32, bf16 or f16");
ABSL_FLAG(int, steps, 30, "timed steps");
ABSL_FLAG(int, warmup, 5, "untimed steps first (cuDNN algorithm search happens here)");
ABSL_FLAG(double, lr, 0.1, "learning rate");
ABSL_FLAG(double, momentum, 0.0, "SGD momentum");
ABSL_FLAG(std::string, device, "cuda:0", "CUDA device");
ABSL_FLAG(uint64_t, seed, 0, "seed");

namespace {

using namespace dtrain;  // NOLINT: a small program

// Multiply-adds of a k x k convolution producing [cout, h_out, w_out] from
// cin channels; updates *h (square inputs) to the output size.
int64_t ConvMacs(int64_t cin, int64_t cout, int k, int stride, int pad, int64_t* h) {
  const int64_t out = ops::ConvOutSize(*h, k, stride, pad);
  *h = out;
  return out * out * cout * cin * k * k;
}

// FLOPs (2 x multiply-adds) of one forward pass of one sample.
int64_t ForwardFlops(const std::string& model) {
  int64_t macs = 0;
  if (model == "mlp") {
    macs = 784 * 256 + 256 * 10;
  } else if (model == "mlp_chapter") {
    macs = 512 * 256 + 256 * 128 + 128 * 2;
  } else if (model == "lenet") {
    int64_t h = 28;
    macs += ConvMacs(1, 20, 3, 1, 0, &h);   // 26
    h /= 2;                                 // avg pool: 13
    macs += ConvMacs(20, 50, 5, 1, 0, &h);  // 9
    h /= 2;                                 // 4
    macs += 800 * 128 + 128 * 10;
  } else if (model == "resnet18") {
    // The d2l ResNet-18 of libs/nn/models.cc on 1 x 28 x 28 inputs.
    int64_t h = 28;
    macs += ConvMacs(1, 64, 3, 1, 1, &h);
    int64_t c = 64;
    for (int64_t out : {64, 128, 256, 512}) {
      for (int block = 0; block < 2; ++block) {
        const bool down = block == 0 && out != 64;
        int64_t hin = h, h1 = h;
        macs += ConvMacs(c, out, 3, down ? 2 : 1, 1, &h1);  // conv1
        int64_t h2 = h1;
        macs += ConvMacs(out, out, 3, 1, 1, &h2);           // conv2
        if (down) macs += ConvMacs(c, out, 1, 2, 0, &hin);  // conv3 (1x1 shortcut)
        h = h2;
        c = out;
      }
    }
    macs += 512 * 10;
  }
  return 2 * macs;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string model_name = absl::GetFlag(FLAGS_model);
  const std::string precision = absl::GetFlag(FLAGS_precision);
  const int64_t batch = absl::GetFlag(FLAGS_batch_size);
  const int steps = absl::GetFlag(FLAGS_steps), warmup = absl::GetFlag(FLAGS_warmup);
  if (batch <= 0 || steps <= 0 || warmup < 0) {
    std::fprintf(stderr, "gpu_train_bench: --batch_size and --steps must be positive\n");
    return 2;
  }
  DType compute;
  if (precision == "fp32" || precision == "tf32") {
    compute = DType::kF32;
  } else if (precision == "bf16") {
    compute = DType::kBF16;
  } else if (precision == "f16") {
    compute = DType::kF16;
  } else {
    std::fprintf(stderr, "gpu_train_bench: --precision=%s: expected fp32, tf32, bf16 or f16\n",
                 precision.c_str());
    return 2;
  }
  absl::StatusOr<Device> device = Device::Parse(absl::GetFlag(FLAGS_device));
  if (!device.ok() || !device->is_cuda()) {
    std::fprintf(stderr, "gpu_train_bench: --device=%s is not a CUDA device\n",
                 absl::GetFlag(FLAGS_device).c_str());
    return 2;
  }
  std::string reason;
  const int count = cuda::DeviceCount(&reason);
  if (count == 0) {
    std::fprintf(stderr, "gpu_train_bench: no CUDA device (%s); nothing to measure\n",
                 reason.c_str());
    std::printf("framework=dtrain status=skipped reason=no_cuda_device\n");
    return 3;
  }
  if (device->index >= count) {
    std::fprintf(stderr, "gpu_train_bench: %s does not exist (%d CUDA device(s))\n",
                 device->ToString().c_str(), count);
    return 2;
  }
  cuda::SetAllowTf32(precision == "tf32");

  absl::StatusOr<std::shared_ptr<nn::Module>> model = nn::MakeModel(model_name);
  absl::StatusOr<Shape> sample = nn::ModelInputShape(model_name);
  if (!model.ok() || !sample.ok()) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", std::string(model.status().message()).c_str());
    return 2;
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  nn::InitParameters(model->get(), nn::Init::kNormal, seed, 0.01f);
  absl::Status moved = (*model)->To(*device);
  if (!moved.ok()) {
    std::fprintf(stderr, "gpu_train_bench: moving the model to %s: %s\n",
                 device->ToString().c_str(), std::string(moved.message()).c_str());
    return 1;
  }
  cuda::MixedPrecisionSgd opt((*model)->NamedParameters(),
                              {static_cast<float>(absl::GetFlag(FLAGS_lr)),
                               static_cast<float>(absl::GetFlag(FLAGS_momentum))},
                              compute);
  std::unique_ptr<cuda::LossScaler> scaler;
  if (compute == DType::kF16) {
    absl::StatusOr<std::unique_ptr<cuda::LossScaler>> s = cuda::LossScaler::Create(*device);
    if (!s.ok()) {
      std::fprintf(stderr, "gpu_train_bench: %s\n", std::string(s.status().message()).c_str());
      return 1;
    }
    scaler = *std::move(s);
  }
  const int64_t classes = model_name == "mlp_chapter" ? 2 : 10;
  Shape shape = {batch};
  shape.insert(shape.end(), sample->begin(), sample->end());
  std::vector<Tensor> xs, ys;
  for (int i = 0; i < 8; ++i) {
    Tensor x = Tensor::Empty(shape, DType::kF32, *device);
    ops::RandomUniform(&x, 0.0f, 1.0f, seed + 1, static_cast<uint64_t>(i) << 32);
    std::vector<int32_t> labels(batch);
    for (int64_t j = 0; j < batch; ++j) labels[j] = static_cast<int32_t>((j * 7 + i) % classes);
    xs.push_back(ops::Cast(x, compute));
    ys.push_back(Tensor::FromVector(labels, {batch}, *device));
  }

  autograd::Variable last_loss;
  auto step = [&](int i) {
    autograd::Variable logits = (*model)->Forward(autograd::Variable(xs[i % 8]));
    autograd::Variable loss = autograd::SoftmaxCrossEntropy(logits, ys[i % 8]);
    opt.ZeroGrad();
    if (scaler) {
      loss.Backward(scaler->seed());
      scaler->UnscaleAndCheck(opt.Gradients());
      opt.Step(&scaler->found_inf());
      scaler->Update();
    } else {
      loss.Backward();
      opt.Step();
    }
    last_loss = loss;
  };
  Stream* stream = DefaultStream(*device);
  auto sync = [&] {
    absl::Status s = stream->Synchronize();
    if (!s.ok()) {
      std::fprintf(stderr, "gpu_train_bench: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  };
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < warmup; ++i) step(i);
  sync();
  const float first_loss = warmup > 0 ? ops::ScalarValue(last_loss.value()) : 0.0f;
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step(warmup + i);
  sync();
  auto t2 = std::chrono::steady_clock::now();
  const double warm_s = std::chrono::duration<double>(t1 - t0).count();
  const double secs = std::chrono::duration<double>(t2 - t1).count();
  const double sps = static_cast<double>(batch) * steps / secs;
  const int64_t fwd_flops = ForwardFlops(model_name);
  const double train_flops = 3.0 * static_cast<double>(fwd_flops);
  cuda::CachingAllocatorStats mem = cuda::DeviceMemoryStats(device->index);

  std::printf("framework=dtrain model=%s precision=%s batch_size=%lld device=%s\n",
              model_name.c_str(), precision.c_str(), static_cast<long long>(batch),
              device->ToString().c_str());
  std::printf("params=%lld\n", static_cast<long long>((*model)->NumParameters()));
  std::printf("warmup_steps=%d warmup_seconds=%.3f first_loss=%.4f\n", warmup, warm_s, first_loss);
  std::printf("steps=%d seconds=%.3f ms_per_step=%.3f last_loss=%.4f\n", steps, secs,
              1000 * secs / steps, ops::ScalarValue(last_loss.value()));
  if (scaler) std::printf("loss_scale=%.1f\n", scaler->scale_value());
  std::printf("forward_flops_per_sample=%lld train_flops_per_sample=%.0f\n",
              static_cast<long long>(fwd_flops), train_flops);
  std::printf("tflops=%.2f\n", train_flops * sps / 1e12);
  std::printf("peak_tensor_mb=%.1f reserved_mb=%.1f\n", mem.peak_bytes_in_use / 1048576.0,
              mem.peak_bytes_reserved / 1048576.0);
  std::printf("samples_per_second=%.1f\n", sps);
  return 0;
}
