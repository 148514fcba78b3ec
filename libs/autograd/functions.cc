#include "libs/autograd/functions.h"

#include <utility>

#include "libs/autograd/trace.h"
#include "libs/base/logging.h"

namespace dtrain {
namespace autograd {

namespace {

bool Needs(const Variable& v) { return v.defined() && v.requires_grad(); }

// A trace event for `op` with result `out` and Variable inputs `in` (see
// trace.h). Only built when a tracer is active.
TraceEvent Event(const char* op, const Variable& out, std::initializer_list<const Variable*> in) {
  TraceEvent e;
  e.op = op;
  for (const Variable* v : in) e.inputs[e.num_inputs++] = v;
  e.output = &out;
  return e;
}

}  // namespace

Variable Conv2d(const Variable& x, const Variable& w, const Variable& b, const ops::Conv2dParams& p,
                bool relu) {
  Tensor y = ops::Conv2d(x.value(), w.value(), b.defined() ? &b.value() : nullptr, p, relu);
  bool nx = Needs(x), nw = Needs(w), nb = Needs(b);
  Tensor xv = x.value(), wv = w.value();
  Tensor yv = relu ? y : Tensor();
  Variable r = MakeResult(y, relu ? "conv2d_relu" : "conv2d", {x, w, b},
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
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("conv2d", r, {&x, &w, &b});
    e.conv = p;
    e.relu = relu;
    t->Record(e);
  }
  return r;
}

Variable Linear(const Variable& x, const Variable& w, const Variable& b, bool relu) {
  Tensor y = ops::Linear(x.value(), w.value(), b.defined() ? &b.value() : nullptr, relu);
  bool nx = Needs(x), nw = Needs(w), nb = Needs(b);
  Tensor xv = x.value(), wv = w.value();
  Tensor yv = relu ? y : Tensor();
  Variable r = MakeResult(y, relu ? "linear_relu" : "linear", {x, w, b},
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
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("linear", r, {&x, &w, &b});
    e.relu = relu;
    t->Record(e);
  }
  return r;
}

Variable MatMul(const Variable& a, const Variable& b) {
  Tensor c = ops::MatMul(a.value(), b.value());
  bool na = Needs(a), nb = Needs(b);
  Tensor av = a.value(), bv = b.value();
  Variable r = MakeResult(c, "matmul", {a, b}, [=](const Tensor& dc, std::vector<Tensor>* g) {
    if (na) (*g)[0] = ops::MatMul(dc, bv, false, true);
    if (nb) (*g)[1] = ops::MatMul(av, dc, true, false);
  });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("matmul", r, {&a, &b});
    t->Record(e);
  }
  return r;
}

Variable Relu(const Variable& x) {
  Tensor y = ops::Relu(x.value());
  Variable r = MakeResult(y, "relu", {x}, [y](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = ops::ReluBackward(y, dy);
  });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("relu", r, {&x});
    t->Record(e);
  }
  return r;
}

Variable Add(const Variable& a, const Variable& b) {
  Tensor c = ops::Add(a.value(), b.value());
  Variable r = MakeResult(c, "add", {a, b}, [](const Tensor& dc, std::vector<Tensor>* g) {
    (*g)[0] = dc;
    (*g)[1] = dc;
  });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("add", r, {&a, &b});
    t->Record(e);
  }
  return r;
}

Variable AvgPool2d(const Variable& x, const ops::Pool2dParams& p) {
  Tensor y = ops::AvgPool2d(x.value(), p);
  Shape xs = x.shape();
  Variable r = MakeResult(y, "avg_pool2d", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = ops::AvgPool2dBackward(dy, xs, p);
  });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("avg_pool2d", r, {&x});
    e.pool = p;
    t->Record(e);
  }
  return r;
}

Variable MaxPool2d(const Variable& x, const ops::Pool2dParams& p) {
  Tensor indices;
  Tensor y = ops::MaxPool2d(x.value(), p, &indices);
  Shape xs = x.shape();
  Variable r = MakeResult(y, "max_pool2d", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = ops::MaxPool2dBackward(dy, indices, xs, p);
  });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("max_pool2d", r, {&x});
    e.pool = p;
    t->Record(e);
  }
  return r;
}

Variable GlobalAvgPool(const Variable& x) {
  Tensor y = ops::GlobalAvgPool(x.value());
  Shape xs = x.shape();
  Variable r = MakeResult(y, "global_avg_pool", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = ops::GlobalAvgPoolBackward(dy, xs);
  });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("global_avg_pool", r, {&x});
    t->Record(e);
  }
  return r;
}

Variable Reshape(const Variable& x, const Shape& shape) {
  Tensor y = x.value().Reshape(shape);
  Shape xs = x.shape();
  Variable r = MakeResult(y, "reshape", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = dy.Reshape(xs);
  });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("reshape", r, {&x});
    e.shape = shape;
    t->Record(e);
  }
  return r;
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
    Variable r = Variable(y, false);
    if (Tracer* t = ActiveTracer()) {
      TraceEvent e = Event("batch_norm", r, {&x, &gamma, &beta});
      e.tensors[0] = running_mean;
      e.tensors[1] = running_var;
      e.training = training;
      e.momentum = momentum;
      e.eps = eps;
      t->Record(e);
    }
    return r;
  }
  Tensor saved_mean, saved_inv_std;
  Tensor y = ops::BatchNormTrain(x.value(), gamma.value(), beta.value(), momentum, eps,
                                 running_mean, running_var, &saved_mean, &saved_inv_std);
  Tensor xv = x.value(), gv = gamma.value();
  bool nx = Needs(x), ng = Needs(gamma), nb = Needs(beta);
  Variable r =
      MakeResult(y, "batch_norm", {x, gamma, beta}, [=](const Tensor& dy, std::vector<Tensor>* g) {
        Tensor dx = Tensor::Empty(xv.shape(), xv.dtype(), xv.device());
        Tensor dgamma = Tensor::Empty(gv.shape(), gv.dtype(), gv.device());
        Tensor dbeta = Tensor::Empty(gv.shape(), gv.dtype(), gv.device());
        ops::BatchNormBackward(xv, dy, gv, saved_mean, saved_inv_std, &dx, &dgamma, &dbeta);
        if (nx) (*g)[0] = dx;
        if (ng) (*g)[1] = dgamma;
        if (nb) (*g)[2] = dbeta;
      });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("batch_norm", r, {&x, &gamma, &beta});
    e.tensors[0] = running_mean;
    e.tensors[1] = running_var;
    e.training = training;
    e.momentum = momentum;
    e.eps = eps;
    t->Record(e);
  }
  return r;
}

Variable SoftmaxCrossEntropy(const Variable& logits, const Tensor& labels) {
  Tensor dlogits;
  Tensor loss = ops::SoftmaxCrossEntropy(logits.value(), labels,
                                         Needs(logits) && GradEnabled() ? &dlogits : nullptr);
  Variable r = MakeResult(
      loss, "softmax_cross_entropy", {logits},
      [dlogits](const Tensor& dloss, std::vector<Tensor>* g) {
        (*g)[0] = IsUnitSeed(dloss) ? dlogits : ops::Scale(dlogits, ops::ScalarValue(dloss));
      });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("softmax_cross_entropy", r, {&logits});
    e.tensors[0] = &labels;
    t->Record(e);
  }
  return r;
}

Variable Sum(const Variable& x) {
  Tensor y = ops::Sum(x.value());
  Shape xs = x.shape();
  DType dt = x.value().dtype();
  Device dev = x.value().device();
  Variable r = MakeResult(y, "sum", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    Tensor grad = Tensor::Empty(xs, dt, dev);
    ops::Fill(&grad, IsUnitSeed(dy) ? 1.0f : ops::ScalarValue(dy));
    (*g)[0] = grad;
  });
  if (Tracer* t = ActiveTracer()) {
    TraceEvent e = Event("sum", r, {&x});
    t->Record(e);
  }
  return r;
}

}  // namespace autograd
}  // namespace dtrain
