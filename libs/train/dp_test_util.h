// Shared by the data-parallel tests: a single-device reference run and
// deterministic synthetic batches.
#ifndef DTRAIN_LIBS_TRAIN_DP_TEST_UTIL_H_
#define DTRAIN_LIBS_TRAIN_DP_TEST_UTIL_H_

#include <string>
#include <vector>

#include "libs/autograd/functions.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace train {
namespace testing {

// Batch `step` of a deterministic stream: images uniform in [0, 1).
inline void SyntheticBatch(int64_t n, int step, Tensor* x, Tensor* y) {
  *x = Tensor::Empty({n, 1, 28, 28});
  ops::RandomUniform(x, 0.0f, 1.0f, 1234, static_cast<uint64_t>(step) << 32);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i * 7 + step * 3) % 10);
  *y = Tensor::FromVector(labels, {n});
}

// The chapter's settings: lr 0.2, plain SGD, normal(0, 0.01) init. The
// comparison measures how far float summation order (which differs between
// one large batch and k slices) moves the trajectory, and on synthetic data
// some settings amplify it chaotically: after 20 LeNet steps the difference
// is 7e-6 here, 2.5e-5 with kaiming init + momentum 0.9, and ~1 with kaiming
// + lr 0.1 without momentum (ReLU units flipping), while the first steps
// agree to 1e-7 in every setting.
inline constexpr float kLr = 0.2f;
inline constexpr float kMomentum = 0.0f;
inline constexpr nn::Init kInit = nn::Init::kNormal;

// Parameters after `steps` steps of one device on the full global batch.
inline std::vector<std::vector<float>> ReferenceRun(const std::string& model, int64_t batch,
                                                    int steps, uint64_t seed, float lr = kLr,
                                                    float momentum = kMomentum,
                                                    nn::Init init = kInit,
                                                    float weight_decay = 0.0f) {
  // The replicas run their kernels with one thread each; so does the
  // reference, so both use the same kernel implementations (oneDNN picks
  // implementations, and with them summation orders, by thread count).
  int threads = ops::CpuThreads();
  ops::SetCpuThreads(1);
  auto m = *nn::MakeModel(model);
  nn::InitParameters(m.get(), init, seed);
  nn::Sgd opt(m->NamedParameters(), {.lr = lr, .momentum = momentum, .weight_decay = weight_decay});
  for (int s = 0; s < steps; ++s) {
    Tensor x, y;
    SyntheticBatch(batch, s, &x, &y);
    opt.ZeroGrad();
    autograd::SoftmaxCrossEntropy(m->Forward(autograd::Variable(x)), y).Backward();
    opt.Step();
  }
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : m->NamedParameters()) out.push_back(p.value().ToVector<float>());
  ops::SetCpuThreads(threads);
  return out;
}

// Largest relative difference over the parameter tensors, each measured as
// ||a - b||_2 / ||b||_2 (elementwise ratios are dominated by elements that
// happen to be near zero).
inline double MaxRelativeDifference(const std::vector<std::vector<float>>& a,
                                    const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t p = 0; p < a.size(); ++p) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a[p].size(); ++i) {
      double d = static_cast<double>(a[p][i]) - b[p][i];
      diff += d * d;
      norm += static_cast<double>(b[p][i]) * b[p][i];
    }
    worst = std::max(worst, std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30));
  }
  return worst;
}

}  // namespace testing
}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_DP_TEST_UTIL_H_
