#include "libs/nn/sync_batch_norm.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "libs/autograd/functions.h"
#include "libs/ops/ops.h"
#include "libs/ops/testing/gradcheck.h"

namespace dtrain {
namespace nn {
namespace {

using autograd::Variable;
using ops::testing::RandomTensor;
using ops::testing::TensorsNear;

constexpr float kEps = 1e-5f, kMomentum = 0.1f;

struct MemberResult {
  Tensor y, dx, dgamma, dbeta, running_mean, running_var;
};

// Runs sync batch norm on every member's input at once (one thread each);
// with `dys`, also backward from those seeds.
std::vector<MemberResult> RunGroup(const std::vector<Tensor>& xs, const Tensor& gamma,
                                   const Tensor& beta, const std::vector<double>& weights,
                                   const std::vector<Tensor>* dys = nullptr) {
  const int k = static_cast<int>(xs.size());
  auto group = std::make_shared<SyncBatchNormGroup>(k, absl::Seconds(30));
  for (int r = 0; r < k; ++r) group->set_loss_weight(r, weights[r]);
  std::vector<MemberResult> out(k);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      const int64_t c = gamma.numel();
      MemberResult& m = out[r];
      m.running_mean = Tensor::Zeros({c});
      m.running_var = Tensor::Full({c}, 1.0f);
      Variable x(xs[r].Clone(), true), g(gamma.Clone(), true), b(beta.Clone(), true);
      Variable y =
          SyncBatchNorm(x, g, b, &m.running_mean, &m.running_var, kMomentum, kEps, group, r);
      m.y = y.value();
      if (dys != nullptr) {
        y.Backward((*dys)[r]);
        m.dx = x.grad();
        m.dgamma = g.grad();
        m.dbeta = b.grad();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(group->status().ok()) << group->status();
  return out;
}

Tensor Concat(const std::vector<Tensor>& parts) {
  Shape shape = parts[0].shape();
  std::vector<float> all;
  shape[0] = 0;
  for (const Tensor& p : parts) {
    shape[0] += p.dim(0);
    std::vector<float> v = p.ToVector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return Tensor::FromVector(all, shape);
}

// Uneven members (1 and 3 rows; 2 and 5 rows), 4-d and 2-d inputs.
const std::vector<std::vector<Shape>> kCases = {
    {{1, 2, 3, 3}, {3, 2, 3, 3}},
    {{2, 3}, {5, 3}},
};

TEST(SyncBatchNormTest, ForwardEqualsBatchNormOverTheConcatenatedBatch) {
  uint64_t seed = 10;
  for (const auto& shapes : kCases) {
    const int64_t c = shapes[0][1];
    std::vector<Tensor> xs;
    for (const Shape& s : shapes) xs.push_back(RandomTensor(s, seed++, -1.0f, 3.0f));
    Tensor gamma = RandomTensor({c}, seed++, 0.5f, 1.5f), beta = RandomTensor({c}, seed++);
    std::vector<MemberResult> got = RunGroup(xs, gamma, beta, {0.5, 0.5});
    Tensor rm = Tensor::Zeros({c}), rv = Tensor::Full({c}, 1.0f), sm, si;
    Tensor want = ops::BatchNormTrain(Concat(xs), gamma, beta, kMomentum, kEps, &rm, &rv, &sm, &si);
    std::vector<Tensor> ys;
    for (const MemberResult& m : got) ys.push_back(m.y);
    EXPECT_TRUE(TensorsNear(Concat(ys), want, 1e-5, 1e-5, "y"));
    for (const MemberResult& m : got) {
      EXPECT_TRUE(TensorsNear(m.running_mean, rm, 1e-6, 1e-6, "running_mean"));
      EXPECT_TRUE(TensorsNear(m.running_var, rv, 1e-6, 1e-6, "running_var"));
    }
  }
}

// L = sum_r w_r * sum(dy_r * y_r): member r's backward returns
// (1 / w_r) dL/dx_r, and sum_r w_r * dgamma_r is dL/dgamma.
TEST(SyncBatchNormTest, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 100;
  for (const auto& shapes : kCases) {
    const int64_t c = shapes[0][1];
    const std::vector<double> w = {0.3, 0.7};
    std::vector<Tensor> xs, dys;
    for (const Shape& s : shapes) {
      xs.push_back(RandomTensor(s, seed++, -1.0f, 2.0f));
      dys.push_back(RandomTensor(s, seed++));
    }
    Tensor gamma = RandomTensor({c}, seed++, 0.5f, 1.5f), beta = RandomTensor({c}, seed++);
    auto loss = [&](const std::vector<Tensor>& xv, const Tensor& g, const Tensor& b) {
      std::vector<MemberResult> out = RunGroup(xv, g, b, w);
      double l = 0;
      for (size_t r = 0; r < out.size(); ++r) {
        std::vector<float> y = out[r].y.ToVector<float>(), dy = dys[r].ToVector<float>();
        for (size_t i = 0; i < y.size(); ++i) l += w[r] * y[i] * dy[i];
      }
      return l;
    };
    const double h = 1e-2;
    auto numeric = [&](Tensor* t, const std::function<double()>& f) {
      Tensor grad = Tensor::Empty(t->shape());
      for (int64_t i = 0; i < t->numel(); ++i) {
        float saved = t->data<float>()[i];
        t->data<float>()[i] = saved + static_cast<float>(h);
        double up = f();
        t->data<float>()[i] = saved - static_cast<float>(h);
        double down = f();
        t->data<float>()[i] = saved;
        grad.data<float>()[i] = static_cast<float>((up - down) / (2 * h));
      }
      return grad;
    };
    std::vector<MemberResult> got = RunGroup(xs, gamma, beta, w, &dys);
    Tensor dgamma = Tensor::Zeros({c}), dbeta = Tensor::Zeros({c});
    for (size_t r = 0; r < xs.size(); ++r) {
      SCOPED_TRACE(::testing::Message() << "member " << r << " of " << ShapeToString(shapes[r]));
      Tensor want = numeric(&xs[r], [&] { return loss(xs, gamma, beta); });
      Tensor scaled = got[r].dx.Clone();
      for (int64_t i = 0; i < scaled.numel(); ++i) scaled.data<float>()[i] *= w[r];
      EXPECT_TRUE(TensorsNear(scaled, want, 1e-2, 2e-3, "w_r * dx_r"));
      for (int64_t i = 0; i < c; ++i) {
        dgamma.data<float>()[i] += w[r] * got[r].dgamma.data<float>()[i];
        dbeta.data<float>()[i] += w[r] * got[r].dbeta.data<float>()[i];
      }
    }
    EXPECT_TRUE(TensorsNear(dgamma, numeric(&gamma, [&] { return loss(xs, gamma, beta); }), 1e-2,
                            2e-3, "dgamma"));
    EXPECT_TRUE(TensorsNear(dbeta, numeric(&beta, [&] { return loss(xs, gamma, beta); }), 1e-2,
                            2e-3, "dbeta"));
  }
}

// One member on the concatenated batch is plain batch norm, gradients too.
TEST(SyncBatchNormTest, OneMemberBackwardEqualsBatchNorm) {
  Tensor x = RandomTensor({4, 3, 2, 5}, 300), dy = RandomTensor({4, 3, 2, 5}, 301);
  Tensor gamma = RandomTensor({3}, 302, 0.5f, 1.5f), beta = RandomTensor({3}, 303);
  std::vector<Tensor> dys = {dy};
  MemberResult got = RunGroup({x}, gamma, beta, {1.0}, &dys)[0];
  Tensor rm = Tensor::Zeros({3}), rv = Tensor::Full({3}, 1.0f);
  Variable vx(x, true), vg(gamma.Clone(), true), vb(beta.Clone(), true);
  autograd::BatchNorm(vx, vg, vb, &rm, &rv, true, kMomentum, kEps).Backward(dy);
  EXPECT_TRUE(TensorsNear(got.dx, vx.grad(), 1e-4, 1e-5, "dx"));
  EXPECT_TRUE(TensorsNear(got.dgamma, vg.grad(), 1e-4, 1e-5, "dgamma"));
  EXPECT_TRUE(TensorsNear(got.dbeta, vb.grad(), 1e-4, 1e-5, "dbeta"));
}

TEST(SyncBatchNormGroupTest, AMissingMemberTimesOut) {
  SyncBatchNormGroup group(2, absl::Milliseconds(100));
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<double>> r = group.Gather(0, {1.0});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // The error sticks (the other member would not wait either) until Reset.
  EXPECT_EQ(group.Gather(1, {1.0}).status().code(), absl::StatusCode::kDeadlineExceeded);
  group.Reset();
  EXPECT_TRUE(group.status().ok());
}

TEST(SyncBatchNormGroupTest, AbortReleasesWaiters) {
  SyncBatchNormGroup group(3, absl::Minutes(10));
  absl::Status got;
  std::thread waiter([&] { got = group.Gather(1, {2.0}).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group.Abort(absl::AbortedError("replica 0 failed"));
  waiter.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(group.status().code(), absl::StatusCode::kAborted);
}

TEST(SyncBatchNormGroupTest, GathersInMemberAndTrainerOrder) {
  // A stand-in for another trainer: the cross gather appends its block.
  SyncBatchNormGroup group(2, absl::Seconds(10),
                           [](const std::vector<double>& local, std::vector<double>* all) {
                             *all = local;
                             all->insert(all->end(), {7.0, 8.0});
                             return absl::OkStatus();
                           });
  std::vector<double> r0, r1;
  std::thread t([&] { r1 = *group.Gather(1, {2.0}); });
  r0 = *group.Gather(0, {1.0});
  t.join();
  EXPECT_EQ(r0, (std::vector<double>{1, 2, 7, 8}));
  EXPECT_EQ(r1, r0);
}

}  // namespace
}  // namespace nn
}  // namespace dtrain
