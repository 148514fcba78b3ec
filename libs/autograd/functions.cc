#include "libs/autograd/functions.h"

#include <utility>

#include "libs/base/logging.h"

namespace dtrain {
namespace autograd {

namespace {

bool Needs(const Variable& v) { return v.defined() && v.requires_grad(); }

}  // namespace

Variable Conv2d(const Variable& x, const Variable& w, const Variable& b, const ops::Conv2dParams& p,
                bool relu) {
  Tensor y = ops::Conv2d(x.value(), w.value(), b.defined() ? &b.value() : nullptr, p, relu);
  bool nx = Needs(x), nw = Needs(w), nb = Needs(b);
  Tensor xv = x.value(), wv = w.value();
  Tensor yv = relu ? y : Tensor();
  return MakeResult(y, relu ? "conv2d_relu" : "conv2d", {x, w, b},
                    [=](const Tensor& dy_in, std::vector<Tensor>* g) {
                      Tensor dy = relu ? ops::ReluBackward(yv, dy_in) : dy_in;
                      if (nx) (*g)[0] = ops::Conv2dBackwardData(dy, wv, xv.shape(), p);
                      if (nw || nb) {
                        Tensor dw = Tensor::Empty(wv.shape(), wv.dtype(), wv.device());
                        Tensor db;
                        if (nb) db = Tensor::Empty({wv.dim(0)}, wv.dtype(), wv.device());
                        ops::Conv2dBackwardWeights(xv, dy, p, &dw, nb ? &db : nullptr);
                        if (nw) (*g)[1] = dw;
                        if (nb) (*g)[2] = db;
                      }
                    });
}

Variable Linear(const Variable& x, const Variable& w, const Variable& b, bool relu) {
  Tensor y = ops::Linear(x.value(), w.value(), b.defined() ? &b.value() : nullptr, relu);
  bool nx = Needs(x), nw = Needs(w), nb = Needs(b);
  Tensor xv = x.value(), wv = w.value();
  Tensor yv = relu ? y : Tensor();
  return MakeResult(y, relu ? "linear_relu" : "linear", {x, w, b},
                    [=](const Tensor& dy_in, std::vector<Tensor>* g) {
                      Tensor dy = relu ? ops::ReluBackward(yv, dy_in) : dy_in;
                      Tensor dx, dw, db;
                      if (nx) dx = Tensor::Empty(xv.shape(), xv.dtype(), xv.device());
                      if (nw) dw = Tensor::Empty(wv.shape(), wv.dtype(), wv.device());
                      if (nb) db = Tensor::Empty({wv.dim(0)}, wv.dtype(), wv.device());
                      ops::LinearBackward(xv, wv, dy, nx ? &dx : nullptr, nw ? &dw : nullptr,
                                          nb ? &db : nullptr);
                      (*g)[0] = dx;
                      (*g)[1] = dw;
                      (*g)[2] = db;
                    });
}

Variable MatMul(const Variable& a, const Variable& b) {
  Tensor c = ops::MatMul(a.value(), b.value());
  bool na = Needs(a), nb = Needs(b);
  Tensor av = a.value(), bv = b.value();
  return MakeResult(c, "matmul", {a, b}, [=](const Tensor& dc, std::vector<Tensor>* g) {
    if (na) (*g)[0] = ops::MatMul(dc, bv, false, true);
    if (nb) (*g)[1] = ops::MatMul(av, dc, true, false);
  });
}

Variable Relu(const Variable& x) {
  Tensor y = ops::Relu(x.value());
  return MakeResult(y, "relu", {x}, [y](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = ops::ReluBackward(y, dy);
  });
}

Variable Add(const Variable& a, const Variable& b) {
  Tensor c = ops::Add(a.value(), b.value());
  return MakeResult(c, "add", {a, b}, [](const Tensor& dc, std::vector<Tensor>* g) {
    (*g)[0] = dc;
    (*g)[1] = dc;
  });
}

Variable AvgPool2d(const Variable& x, const ops::Pool2dParams& p) {
  Tensor y = ops::AvgPool2d(x.value(), p);
  Shape xs = x.shape();
  return MakeResult(y, "avg_pool2d", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = ops::AvgPool2dBackward(dy, xs, p);
  });
}

Variable MaxPool2d(const Variable& x, const ops::Pool2dParams& p) {
  Tensor indices;
  Tensor y = ops::MaxPool2d(x.value(), p, &indices);
  Shape xs = x.shape();
  return MakeResult(y, "max_pool2d", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = ops::MaxPool2dBackward(dy, indices, xs, p);
  });
}

Variable GlobalAvgPool(const Variable& x) {
  Tensor y = ops::GlobalAvgPool(x.value());
  Shape xs = x.shape();
  return MakeResult(y, "global_avg_pool", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = ops::GlobalAvgPoolBackward(dy, xs);
  });
}

Variable Reshape(const Variable& x, const Shape& shape) {
  Tensor y = x.value().Reshape(shape);
  Shape xs = x.shape();
  return MakeResult(y, "reshape", {x},
                    [=](const Tensor& dy, std::vector<Tensor>* g) { (*g)[0] = dy.Reshape(xs); });
}

Variable Flatten(const Variable& x) { return Reshape(x, {x.value().dim(0), -1}); }

Variable BatchNorm(const Variable& x, const Variable& gamma, const Variable& beta,
                   Tensor* running_mean, Tensor* running_var, bool training, float momentum,
                   float eps) {
  if (!training) {
    // Inference: a fixed affine map per channel; gradients (rarely wanted)
    // are not supported in this mode.
    Tensor y = ops::BatchNormInference(x.value(), gamma.value(), beta.value(), *running_mean,
                                       *running_var, eps);
    return Variable(y, false);
  }
  Tensor saved_mean, saved_inv_std;
  Tensor y = ops::BatchNormTrain(x.value(), gamma.value(), beta.value(), momentum, eps,
                                 running_mean, running_var, &saved_mean, &saved_inv_std);
  Tensor xv = x.value(), gv = gamma.value();
  bool nx = Needs(x), ng = Needs(gamma), nb = Needs(beta);
  return MakeResult(
      y, "batch_norm", {x, gamma, beta}, [=](const Tensor& dy, std::vector<Tensor>* g) {
        Tensor dx = Tensor::Empty(xv.shape(), xv.dtype(), xv.device());
        Tensor dgamma = Tensor::Empty(gv.shape(), gv.dtype(), gv.device());
        Tensor dbeta = Tensor::Empty(gv.shape(), gv.dtype(), gv.device());
        ops::BatchNormBackward(xv, dy, gv, saved_mean, saved_inv_std, &dx, &dgamma, &dbeta);
        if (nx) (*g)[0] = dx;
        if (ng) (*g)[1] = dgamma;
        if (nb) (*g)[2] = dbeta;
      });
}

Variable SoftmaxCrossEntropy(const Variable& logits, const Tensor& labels) {
  Tensor dlogits;
  Tensor loss = ops::SoftmaxCrossEntropy(logits.value(), labels,
                                         Needs(logits) && GradEnabled() ? &dlogits : nullptr);
  return MakeResult(loss, "softmax_cross_entropy", {logits},
                    [dlogits](const Tensor& dloss, std::vector<Tensor>* g) {
                      float s = ops::ScalarValue(dloss);
                      (*g)[0] = s == 1.0f ? dlogits : ops::Scale(dlogits, s);
                    });
}

Variable Sum(const Variable& x) {
  Tensor y = ops::Sum(x.value());
  Shape xs = x.shape();
  DType dt = x.value().dtype();
  Device dev = x.value().device();
  return MakeResult(y, "sum", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = Tensor::Full(xs, ops::ScalarValue(dy), dt, dev);
  });
}

}  // namespace autograd
}  // namespace dtrain
