// Mixed precision (loss scaling, f32 master weights with f16/bf16 compute),
// whole training steps on the GPU against the CPU, and CUDA graph capture and
// replay. The loss-scale rule runs everywhere; the rest skips without a GPU.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/autograd/functions.h"
#include "libs/cuda/amp.h"
#include "libs/cuda/device_allocator.h"
#include "libs/cuda/gpu_test_util.h"
#include "libs/cuda/graph.h"
#include "libs/cuda/loss_scale_rule.h"
#include "libs/cuda/stream.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/ops/ops.h"
#include "libs/ops/testing/gradcheck.h"

namespace dtrain {
namespace cuda {
namespace {

using autograd::Variable;
using ops::testing::RandomTensor;
using ops::testing::TensorsNear;

const Device kGpu = Device::Cuda(0);

// ---- the loss-scale rule (host) ----

TEST(LossScaleRuleTest, BacksOffOnOverflowAndGrowsAfterAnInterval) {
  float scale = 1024.0f;
  int32_t tracker = 0;
  UpdateLossScaleRule(true, 2.0f, 0.5f, 3, &scale, &tracker);
  EXPECT_EQ(scale, 512.0f);
  EXPECT_EQ(tracker, 0);
  UpdateLossScaleRule(false, 2.0f, 0.5f, 3, &scale, &tracker);
  UpdateLossScaleRule(false, 2.0f, 0.5f, 3, &scale, &tracker);
  EXPECT_EQ(scale, 512.0f);
  EXPECT_EQ(tracker, 2);
  UpdateLossScaleRule(false, 2.0f, 0.5f, 3, &scale, &tracker);
  EXPECT_EQ(scale, 1024.0f);
  EXPECT_EQ(tracker, 0);
  UpdateLossScaleRule(false, 2.0f, 0.5f, 3, &scale, &tracker);
  UpdateLossScaleRule(true, 2.0f, 0.5f, 3, &scale, &tracker);  // resets the streak
  EXPECT_EQ(scale, 512.0f);
  EXPECT_EQ(tracker, 0);
}

TEST(LossScaleRuleTest, NeverGrowsToInfinity) {
  float scale = FLT_MAX / 1.5f;
  int32_t tracker = 0;
  UpdateLossScaleRule(false, 2.0f, 0.5f, 1, &scale, &tracker);
  EXPECT_EQ(scale, FLT_MAX / 1.5f);
  EXPECT_TRUE(std::isfinite(scale));
}

TEST(LossScalerTest, RejectsBadOptionsAndDevices) {
  EXPECT_EQ(LossScaler::Create(Device::Cpu()).status().code(), absl::StatusCode::kInvalidArgument);
  LossScalerOptions o;
  o.backoff_factor = 1.5f;
  EXPECT_EQ(LossScaler::Create(kGpu, o).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- on the GPU ----

class GpuAmpTest : public ::testing::Test {
 protected:
  void SetUp() override { DT_SKIP_WITHOUT_GPU(); }
};

TEST_F(GpuAmpTest, LossScalerUnscalesDetectsOverflowAndAdapts) {
  LossScalerOptions o;
  o.init_scale = 1024.0f;
  o.growth_interval = 2;
  auto scaler = LossScaler::Create(kGpu, o);
  ASSERT_TRUE(scaler.ok()) << scaler.status();
  LossScaler& s = **scaler;
  EXPECT_EQ(s.seed().shape(), Shape{});
  EXPECT_EQ(s.scale_value(), 1024.0f);

  Tensor g32 = Tensor::FromVector<float>({1024.0f, -2048.0f, 512.0f}, {3}, kGpu);
  Tensor g16 = ops::Cast(Tensor::FromVector<float>({4096.0f, 0.0f}, {2}, kGpu), DType::kF16);
  s.UnscaleAndCheck({&g32, &g16});
  EXPECT_EQ(g32.ToVector<float>(), (std::vector<float>{1.0f, -2.0f, 0.5f}));
  EXPECT_EQ(ops::Cast(g16, DType::kF32).ToVector<float>(), (std::vector<float>{4.0f, 0.0f}));
  EXPECT_FALSE(s.found_inf_value());
  s.Update();
  s.Update();
  EXPECT_EQ(s.scale_value(), 2048.0f) << "grows after growth_interval good steps";

  Tensor bad = ops::Cast(Tensor::FromVector<float>({60000.0f, 1.0f}, {2}, kGpu), DType::kF16);
  Tensor inf = Tensor::FromVector<float>({INFINITY}, {1}, kGpu);
  s.UnscaleAndCheck({&bad, &inf});
  EXPECT_TRUE(s.found_inf_value());
  s.Update();
  EXPECT_EQ(s.scale_value(), 1024.0f) << "backs off after an overflow";
  EXPECT_FALSE(s.found_inf_value()) << "Update clears the flag";
}

std::vector<std::pair<std::string, Variable>> Params(const std::vector<Tensor>& values) {
  std::vector<std::pair<std::string, Variable>> out;
  for (size_t i = 0; i < values.size(); ++i) {
    out.emplace_back(absl::StrCat("p", i), Variable(values[i], true));
  }
  return out;
}

TEST_F(GpuAmpTest, MixedPrecisionSgdKeepsF32MastersAndLowPrecisionCopies) {
  const ops::SgdParams p{0.05f, 0.9f, 1e-4f, false};
  for (DType compute : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(compute));
    std::vector<Tensor> cpu = {RandomTensor({1000}, 1), RandomTensor({7, 33}, 2),
                               RandomTensor({70000}, 3)};
    std::vector<Tensor> gpu, bufs;
    for (const Tensor& t : cpu) {
      gpu.push_back(*t.To(kGpu));
      bufs.push_back(Tensor::Zeros(t.shape()));
    }
    auto params = Params(gpu);
    MixedPrecisionSgd opt(params, p, compute);
    for (auto& [name, v] : params) EXPECT_EQ(v.value().dtype(), compute);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < cpu.size(); ++i) {
        Tensor g = testing::RoundTo(RandomTensor(cpu[i].shape(), 10 + step * 3 + i), compute);
        ops::SgdUpdate(&cpu[i], g, &bufs[i], p);
        params[i].second.mutable_grad() = testing::ToCuda(g, compute);
      }
      opt.Step();
    }
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_TRUE(TensorsNear(*opt.master_weights()[i].To(Device::Cpu()), cpu[i], 1e-5, 1e-6));
      // The copy is exactly the master rounded to the compute dtype.
      Tensor copy = testing::ToCpuF32(params[i].second.value());
      Tensor master = *opt.master_weights()[i].To(Device::Cpu());
      EXPECT_TRUE(TensorsNear(copy, testing::RoundTo(master, compute), 0, 0, "copy"));
    }
    // A skipped step changes nothing.
    Tensor before = *opt.master_weights()[0].To(Device::Cpu());
    Tensor found = Tensor::Full({1}, 1.0f, DType::kF32, kGpu);
    opt.Step(&found);
    EXPECT_TRUE(TensorsNear(*opt.master_weights()[0].To(Device::Cpu()), before, 0, 0, "skipped"));
  }
}

// Forward and backward of `model` on (x, labels), gradients left in the
// parameters; returns the loss.
float ForwardBackward(nn::Module* model, nn::Sgd* opt, const Tensor& x, const Tensor& labels) {
  Variable loss = autograd::SoftmaxCrossEntropy(model->Forward(Variable(x)), labels);
  opt->ZeroGrad();
  loss.Backward();
  return ops::ScalarValue(loss.value());
}

// ||got - want|| / max(||want||, floor) of two f32 tensors (got on any device).
double RelativeL2(const Tensor& got, const Tensor& want, double floor) {
  std::vector<float> g = got.To(Device::Cpu())->ToVector<float>(), w = want.ToVector<float>();
  if (g.size() != w.size()) return INFINITY;
  double d = 0, n = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    d += (static_cast<double>(g[i]) - w[i]) * (static_cast<double>(g[i]) - w[i]);
    n += static_cast<double>(w[i]) * w[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(n), floor);
}

// Three SGD steps (momentum 0.9) on one batch, the GPU against the CPU:
// the first step's gradients (1e-2 relative L2 per parameter), every
// step's loss, and (LeNet, MLP) the parameters after the three steps.
//
// ResNet-18 is compared by its first step's gradients only, at 5e-2
// relative L2 per parameter: at batch 8 its 17 batch norms turn rounding
// differences into large ones. Measured on the CPU alone with
// op_harness_test's ResNet18Steps (which prints these controls next to the
// GPU's): oneDNN's plain-layout convolutions against its usual layouts (two
// correct convolution implementations, as cuDNN's and oneDNN's are) give
// first-step gradients up to 0.92% apart (the batch-norm biases of block 1)
// and, after the three steps, 50,110 parameter elements beyond rtol 5e-3 /
// atol 5e-4, the check this test made before (and issue 34's GPU run
// failed: `resnet_block1.1.bn1.bias` is the worst parameter there too).
// Gradients of conv biases that feed batch norm are exactly 0 (rounding
// noise); a floor of 1e-3 of the model's largest gradient norm keeps them
// from dividing by nothing. A wrong kernel is off by O(1).
TEST_F(GpuAmpTest, TrainingStepsOnTheGpuMatchTheCpu) {
  for (const char* name : {"lenet", "resnet18", "mlp"}) {
    SCOPED_TRACE(name);
    auto cpu_model = nn::MakeModel(name);
    auto gpu_model = nn::MakeModel(name);
    ASSERT_TRUE(cpu_model.ok() && gpu_model.ok());
    nn::InitParameters(cpu_model->get(), nn::Init::kKaiming, 5);
    nn::InitParameters(gpu_model->get(), nn::Init::kKaiming, 5);
    ASSERT_TRUE((*gpu_model)->To(kGpu).ok());
    nn::Sgd cpu_opt((*cpu_model)->NamedParameters(), {0.05f, 0.9f});
    nn::Sgd gpu_opt((*gpu_model)->NamedParameters(), {0.05f, 0.9f});
    const int64_t batch = 8;
    Tensor x = RandomTensor({batch, 1, 28, 28}, 7, 0.0f, 1.0f);
    std::vector<int32_t> l(batch);
    for (int64_t i = 0; i < batch; ++i) l[i] = static_cast<int32_t>(i % 10);
    Tensor labels = Tensor::FromVector(l, {batch});
    Tensor gx = *x.To(kGpu), glabels = *labels.To(kGpu);
    auto cp = (*cpu_model)->NamedParameters();
    auto gp = (*gpu_model)->NamedParameters();
    ASSERT_EQ(cp.size(), gp.size());
    for (int step = 0; step < 3; ++step) {
      float lc = ForwardBackward(cpu_model->get(), &cpu_opt, x, labels);
      float lg = ForwardBackward(gpu_model->get(), &gpu_opt, gx, glabels);
      EXPECT_NEAR(lg, lc, 1e-3 * (1 + std::fabs(lc))) << "step " << step;
      if (step == 0) {
        double largest = 0;
        const double tol = std::string(name) == "resnet18" ? 5e-2 : 1e-2;
        for (auto& [pname, v] : cp) {
          double norm = 0;
          for (float g : v.grad().ToVector<float>()) norm += static_cast<double>(g) * g;
          largest = std::max(largest, std::sqrt(norm));
        }
        for (size_t i = 0; i < cp.size(); ++i) {
          EXPECT_LT(RelativeL2(gp[i].second.grad(), cp[i].second.grad(), 1e-3 * largest), tol)
              << cp[i].first << " gradient";
        }
      }
      cpu_opt.Step();
      gpu_opt.Step();
    }
    if (std::string(name) == "resnet18") continue;  // see above
    for (size_t i = 0; i < cp.size(); ++i) {
      EXPECT_TRUE(TensorsNear(*gp[i].second.value().To(Device::Cpu()), cp[i].second.value(), 5e-3,
                              5e-4, cp[i].first));
    }
  }
}

TEST_F(GpuAmpTest, LowPrecisionTrainingLearns) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dt));
    auto model = nn::MakeModel("resnet18");
    ASSERT_TRUE(model.ok());
    nn::InitParameters(model->get(), nn::Init::kKaiming, 3);
    ASSERT_TRUE((*model)->To(kGpu).ok());
    MixedPrecisionSgd opt((*model)->NamedParameters(), {0.05f, 0.9f}, dt);
    std::unique_ptr<LossScaler> scaler;
    if (dt == DType::kF16) {
      LossScalerOptions o;
      o.init_scale = 1024.0f;
      scaler = *LossScaler::Create(kGpu, o);
    }
    const int64_t batch = 32;
    Tensor x = ops::Cast(*RandomTensor({batch, 1, 28, 28}, 9, 0.0f, 1.0f).To(kGpu), dt);
    std::vector<int32_t> l(batch);
    for (int64_t i = 0; i < batch; ++i) l[i] = static_cast<int32_t>((i * 7) % 10);
    Tensor labels = Tensor::FromVector(l, {batch}, kGpu);
    float first = 0, last = 0;
    for (int step = 0; step < 25; ++step) {
      Variable loss = autograd::SoftmaxCrossEntropy((*model)->Forward(Variable(x)), labels);
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
      last = ops::ScalarValue(loss.value());
      if (step == 0) first = last;
      ASSERT_TRUE(std::isfinite(last)) << "step " << step;
    }
    EXPECT_LT(last, 0.5f * first) << "a fixed batch must be fitted";
    if (scaler) {
      EXPECT_TRUE(std::isfinite(scaler->scale_value()));
    }
  }
}

// ---- CUDA graphs ----

// A fixed-shape training step of a linear classifier written against the op
// kernels, as the hybridized executor calls them.
struct LinearStep {
  Tensor x, labels, w, b, loss;
  void Run() {
    Tensor dlogits;
    Tensor logits = ops::Linear(x, w, &b);
    loss = ops::SoftmaxCrossEntropy(logits, labels, &dlogits);
    Tensor dw = Tensor::Empty(w.shape(), w.dtype(), w.device());
    Tensor db = Tensor::Empty(b.shape(), b.dtype(), b.device());
    ops::LinearBackward(x, w, dlogits, nullptr, &dw, &db);
    ops::SgdUpdate(&w, dw, nullptr, {0.5f});
    ops::SgdUpdate(&b, db, nullptr, {0.5f});
  }
};

LinearStep MakeStep() {
  LinearStep s;
  s.x = *RandomTensor({64, 32}, 1).To(kGpu);
  std::vector<int32_t> l(64);
  for (int i = 0; i < 64; ++i) l[i] = i % 10;
  s.labels = Tensor::FromVector(l, {64}, kGpu);
  s.w = *RandomTensor({10, 32}, 2, -0.1f, 0.1f).To(kGpu);
  s.b = Tensor::Zeros({10}, DType::kF32, kGpu);
  return s;
}

TEST_F(GpuAmpTest, GraphReplayMatchesEagerSteps) {
  auto stream = CudaStream::Create(0);
  ASSERT_TRUE(stream.ok());
  LinearStep eager = MakeStep(), graphed = MakeStep();
  {
    StreamGuard g(stream->get());
    for (int i = 0; i < 5; ++i) eager.Run();
    graphed.Run();  // warm-up outside the capture
  }
  const CachingAllocatorStats before = DeviceMemoryStats(0);
  auto graph = CudaGraph::Capture(stream->get(), [&] {
    graphed.Run();
    return absl::OkStatus();
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_GT((*graph)->num_nodes(), 5u);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*graph)->Replay().ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  // The same kernels on the same data: equal up to cuBLAS's choice of
  // kernel, which may differ under capture.
  EXPECT_TRUE(
      TensorsNear(*graphed.w.To(Device::Cpu()), *eager.w.To(Device::Cpu()), 1e-6, 1e-7, "w"));
  EXPECT_TRUE(
      TensorsNear(*graphed.b.To(Device::Cpu()), *eager.b.To(Device::Cpu()), 1e-6, 1e-7, "b"));
  EXPECT_NEAR(ops::ScalarValue(graphed.loss), ops::ScalarValue(eager.loss), 1e-6);
  // The capture took its memory from the device once; replays allocate nothing.
  EXPECT_LE(DeviceMemoryStats(0).num_backend_mallocs - before.num_backend_mallocs, 16);
  const int64_t after_capture = DeviceMemoryStats(0).num_allocs;
  ASSERT_TRUE((*graph)->Replay().ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  EXPECT_EQ(DeviceMemoryStats(0).num_allocs, after_capture);
  graph->reset();  // releases the pool
}

TEST_F(GpuAmpTest, CaptureReportsIllegalCalls) {
  auto stream = CudaStream::Create(0);
  ASSERT_TRUE(stream.ok());
  auto graph = CudaGraph::Capture(stream->get(), [&] {
    cudaStreamSynchronize((*stream)->get());  // not allowed while capturing
    return absl::OkStatus();
  });
  ASSERT_FALSE(graph.ok());
  EXPECT_NE(std::string(graph.status().message()).find("capturing a CUDA graph on cuda:0"),
            std::string::npos)
      << graph.status();
  cudaGetLastError();
  // The stream is usable again.
  Tensor t = Tensor::Full({4}, 1.0f, DType::kF32, kGpu);
  EXPECT_EQ(t.ToVector<float>(), std::vector<float>(4, 1.0f));
}

TEST_F(GpuAmpTest, CaptureReturnsTheBodysError) {
  auto stream = CudaStream::Create(0);
  ASSERT_TRUE(stream.ok());
  auto graph = CudaGraph::Capture(stream->get(), [] { return absl::InternalError("boom"); });
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(graph.status().message()).find("boom"), std::string::npos);
}

}  // namespace
}  // namespace cuda
}  // namespace dtrain
