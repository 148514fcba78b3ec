#include "libs/ops/testing/gradcheck.h"

#include <cmath>
#include <random>
#include <vector>

namespace dtrain {
namespace ops {
namespace testing {
namespace {

double Dot(const Tensor& a, const std::vector<float>& b) {
  std::vector<float> av = a.ToVector<float>();
  double s = 0;
  for (size_t i = 0; i < av.size(); ++i) s += static_cast<double>(av[i]) * b[i];
  return s;
}

}  // namespace

Tensor NumericGradient(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                       const Tensor& dy, double eps) {
  std::vector<float> dyv = dy.ToVector<float>();
  Tensor xc = x.Clone();
  Tensor host = *xc.To(Device::Cpu());
  Tensor grad = Tensor::Empty(x.shape());
  float* g = grad.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    float orig = host.data<float>()[i];
    host.data<float>()[i] = static_cast<float>(orig + eps);
    double lp = Dot(f(*host.To(x.device())), dyv);
    host.data<float>()[i] = static_cast<float>(orig - eps);
    double lm = Dot(f(*host.To(x.device())), dyv);
    host.data<float>()[i] = orig;
    g[i] = static_cast<float>((lp - lm) / (2 * eps));
  }
  return grad;
}

Tensor RandomTensor(const Shape& shape, uint64_t seed, float low, float high) {
  Tensor t = Tensor::Empty(shape);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(low, high);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

::testing::AssertionResult TensorsNear(const Tensor& actual, const Tensor& expected, double rtol,
                                       double atol, const std::string& what) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << what << ": shape " << ShapeToString(actual.shape())
                                         << " vs expected " << ShapeToString(expected.shape());
  }
  std::vector<float> a = actual.ToVector<float>();
  std::vector<float> e = expected.ToVector<float>();
  double worst = 0;
  int64_t worst_i = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    double err = std::fabs(static_cast<double>(a[i]) - e[i]);
    double tol = atol + rtol * std::fabs(static_cast<double>(e[i]));
    if (!(err <= tol) && (worst_i < 0 || err - tol > worst)) {
      worst = err - tol;
      worst_i = static_cast<int64_t>(i);
    }
  }
  if (worst_i >= 0) {
    return ::testing::AssertionFailure()
           << what << ": mismatch at flat index " << worst_i << ": got " << a[worst_i]
           << ", expected " << e[worst_i] << " (rtol " << rtol << ", atol " << atol << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing
}  // namespace ops
}  // namespace dtrain
