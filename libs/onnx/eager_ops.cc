#include "libs/onnx/eager_ops.h"

#include <cmath>
#include <utility>

#include "libs/autograd/trace.h"
#include "libs/base/logging.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace onnx {
namespace {

using autograd::MakeResult;
using autograd::TraceEvent;
using autograd::Tracer;

bool Needs(const Variable& v) { return v.defined() && v.requires_grad(); }

void CheckCpu(const char* op, const Tensor& t) {
  DT_CHECK(t.device().is_cpu() && t.dtype() == DType::kF32)
      << "onnx op " << op << " runs on f32 CPU tensors only, got " << t.DebugString()
      << " (OnnxModel::cpu_only_ops lists such ops; hybridize and CUDA need libs/autograd ops)";
}

// Reports `op` to an active tracer so hybridize refuses it by name.
void Report(const char* op, const Variable& out, const std::vector<const Variable*>& in) {
  if (Tracer* t = autograd::ActiveTracer()) {
    TraceEvent e;
    e.op = op;
    for (const Variable* v : in) {
      if (e.num_inputs < 3) e.inputs[e.num_inputs++] = v;
    }
    e.output = &out;
    t->Record(e);
  }
}

std::vector<int64_t> Strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

// Strides of `in` broadcast to `out` (0 on broadcast axes), aligned right.
std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  std::vector<int64_t> own = Strides(in);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) st[off + i] = in[i] == 1 ? 0 : own[i];
  return st;
}

// Calls f(out_index, a_index, b_index) for every element of `out`.
template <typename F>
void ForEachBroadcast(const Shape& out, const std::vector<int64_t>& sa,
                      const std::vector<int64_t>& sb, F f) {
  const int r = static_cast<int>(out.size());
  const int64_t n = NumElements(out);
  std::vector<int64_t> idx(r, 0);
  int64_t ia = 0, ib = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, ia, ib);
    for (int d = r - 1; d >= 0; --d) {
      if (++idx[d] < out[d]) {
        ia += sa[d];
        ib += sb[d];
        break;
      }
      ia -= sa[d] * (out[d] - 1);
      ib -= sb[d] * (out[d] - 1);
      idx[d] = 0;
    }
  }
}

const char* BinaryName(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "onnx_add";
    case BinaryOp::kSub:
      return "onnx_sub";
    case BinaryOp::kMul:
      return "onnx_mul";
    case BinaryOp::kDiv:
      return "onnx_div";
  }
  return "onnx_binary";
}

}  // namespace

bool BroadcastShape(const Shape& a, const Shape& b, Shape* out) {
  size_t r = std::max(a.size(), b.size());
  Shape s(r, 1);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    s[i] = da == 1 ? db : da;
  }
  *out = s;
  return true;
}

Variable Binary(BinaryOp op, const Variable& a, const Variable& b) {
  const char* name = BinaryName(op);
  CheckCpu(name, a.value());
  CheckCpu(name, b.value());
  Shape out;
  DT_CHECK(BroadcastShape(a.shape(), b.shape(), &out))
      << name << ": shapes " << ShapeToString(a.shape()) << " and " << ShapeToString(b.shape())
      << " do not broadcast";
  Tensor y = Tensor::Empty(out);
  Tensor av = a.value(), bv = b.value();
  auto sa = BroadcastStrides(av.shape(), out), sb = BroadcastStrides(bv.shape(), out);
  const float* pa = av.data<float>();
  const float* pb = bv.data<float>();
  float* py = y.data<float>();
  ForEachBroadcast(out, sa, sb, [&](int64_t i, int64_t ia, int64_t ib) {
    float x = pa[ia], z = pb[ib];
    switch (op) {
      case BinaryOp::kAdd:
        py[i] = x + z;
        break;
      case BinaryOp::kSub:
        py[i] = x - z;
        break;
      case BinaryOp::kMul:
        py[i] = x * z;
        break;
      case BinaryOp::kDiv:
        py[i] = x / z;
        break;
    }
  });
  bool na = Needs(a), nb = Needs(b);
  Variable r = MakeResult(y, name, {a, b}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    Tensor da, db;
    float* pda = nullptr;
    float* pdb = nullptr;
    if (na) {
      da = Tensor::Zeros(av.shape());
      pda = da.data<float>();
    }
    if (nb) {
      db = Tensor::Zeros(bv.shape());
      pdb = db.data<float>();
    }
    const float* pa = av.data<float>();
    const float* pb = bv.data<float>();
    const float* pdy = dy.data<float>();
    ForEachBroadcast(out, sa, sb, [&](int64_t i, int64_t ia, int64_t ib) {
      float d = pdy[i];
      switch (op) {
        case BinaryOp::kAdd:
          if (pda) pda[ia] += d;
          if (pdb) pdb[ib] += d;
          break;
        case BinaryOp::kSub:
          if (pda) pda[ia] += d;
          if (pdb) pdb[ib] -= d;
          break;
        case BinaryOp::kMul:
          if (pda) pda[ia] += d * pb[ib];
          if (pdb) pdb[ib] += d * pa[ia];
          break;
        case BinaryOp::kDiv:
          if (pda) pda[ia] += d / pb[ib];
          if (pdb) pdb[ib] -= d * pa[ia] / (pb[ib] * pb[ib]);
          break;
      }
    });
    (*g)[0] = da;
    (*g)[1] = db;
  });
  Report(name, r, {&a, &b});
  return r;
}

Variable Unary(UnaryOp op, const Variable& x, float alpha) {
  const char* name = op == UnaryOp::kLeakyRelu ? "onnx_leaky_relu"
                     : op == UnaryOp::kSigmoid ? "onnx_sigmoid"
                     : op == UnaryOp::kTanh    ? "onnx_tanh"
                                               : "onnx_erf";
  CheckCpu(name, x.value());
  Tensor xv = x.value();
  Tensor y = Tensor::Empty(xv.shape());
  const float* px = xv.data<float>();
  float* py = y.data<float>();
  const int64_t n = xv.numel();
  for (int64_t i = 0; i < n; ++i) {
    float v = px[i];
    switch (op) {
      case UnaryOp::kLeakyRelu:
        py[i] = v >= 0 ? v : alpha * v;
        break;
      case UnaryOp::kSigmoid:
        py[i] = 1.0f / (1.0f + std::exp(-v));
        break;
      case UnaryOp::kTanh:
        py[i] = std::tanh(v);
        break;
      case UnaryOp::kErf:
        py[i] = std::erf(v);
        break;
    }
  }
  Variable r = MakeResult(y, name, {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    Tensor dx = Tensor::Empty(xv.shape());
    const float* px = xv.data<float>();
    const float* py = y.data<float>();
    const float* pdy = dy.data<float>();
    float* pdx = dx.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      float d;
      switch (op) {
        case UnaryOp::kLeakyRelu:
          d = px[i] >= 0 ? 1.0f : alpha;
          break;
        case UnaryOp::kSigmoid:
          d = py[i] * (1.0f - py[i]);
          break;
        case UnaryOp::kTanh:
          d = 1.0f - py[i] * py[i];
          break;
        default:
          d = 1.1283791670955126f * std::exp(-px[i] * px[i]);
          break;
      }
      pdx[i] = pdy[i] * d;
    }
    (*g)[0] = dx;
  });
  Report(name, r, {&x});
  return r;
}

int64_t ConvOut(int64_t in, int64_t kernel, int stride, int pad_begin, int pad_end, int dilation) {
  int64_t span = dilation * (kernel - 1) + 1;
  int64_t padded = in + pad_begin + pad_end;
  if (padded < span || stride <= 0) return 0;
  return (padded - span) / stride + 1;
}

Variable ConvGeneral(const Variable& x, const Variable& w, const Variable& b, const ConvParams& p) {
  CheckCpu("onnx_conv", x.value());
  CheckCpu("onnx_conv", w.value());
  Tensor xv = x.value(), wv = w.value();
  Tensor bv = b.defined() ? b.value() : Tensor();
  const int64_t N = xv.dim(0), C = xv.dim(1), H = xv.dim(2), W = xv.dim(3);
  const int64_t O = wv.dim(0), Cg = wv.dim(1), KH = wv.dim(2), KW = wv.dim(3);
  const int64_t G = p.groups, Og = O / G;
  DT_CHECK(Cg * G == C && Og * G == O) << "onnx_conv: channels do not split into groups";
  const int64_t OH = ConvOut(H, KH, p.stride[0], p.pads[0], p.pads[2], p.dilation[0]);
  const int64_t OW = ConvOut(W, KW, p.stride[1], p.pads[1], p.pads[3], p.dilation[1]);
  Tensor y = Tensor::Zeros({N, O, OH, OW});
  // Visits every (output element, input element, weight element) triple.
  auto visit = [=](auto f) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < O; ++o) {
        const int64_t g = o / Og;
        for (int64_t c = 0; c < Cg; ++c) {
          const int64_t ci = g * Cg + c;
          for (int64_t kh = 0; kh < KH; ++kh) {
            for (int64_t kw = 0; kw < KW; ++kw) {
              const int64_t wi = ((o * Cg + c) * KH + kh) * KW + kw;
              for (int64_t oh = 0; oh < OH; ++oh) {
                const int64_t ih = oh * p.stride[0] - p.pads[0] + kh * p.dilation[0];
                if (ih < 0 || ih >= H) continue;
                for (int64_t ow = 0; ow < OW; ++ow) {
                  const int64_t iw = ow * p.stride[1] - p.pads[1] + kw * p.dilation[1];
                  if (iw < 0 || iw >= W) continue;
                  f(((n * O + o) * OH + oh) * OW + ow, ((n * C + ci) * H + ih) * W + iw, wi);
                }
              }
            }
          }
        }
      }
    }
  };
  {
    const float* px = xv.data<float>();
    const float* pw = wv.data<float>();
    float* py = y.data<float>();
    visit([&](int64_t yi, int64_t xi, int64_t wi) { py[yi] += px[xi] * pw[wi]; });
    if (bv.defined()) {
      const float* pb = bv.data<float>();
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t o = 0; o < O; ++o) {
          float* row = py + (n * O + o) * OH * OW;
          for (int64_t i = 0; i < OH * OW; ++i) row[i] += pb[o];
        }
      }
    }
  }
  bool nx = Needs(x), nw = Needs(w), nb = Needs(b);
  Variable r = MakeResult(y, "onnx_conv", {x, w, b}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    const float* pdy = dy.data<float>();
    if (nx || nw) {
      Tensor dx = Tensor::Zeros(xv.shape()), dw = Tensor::Zeros(wv.shape());
      float* pdx = dx.data<float>();
      float* pdw = dw.data<float>();
      const float* px = xv.data<float>();
      const float* pw = wv.data<float>();
      visit([&](int64_t yi, int64_t xi, int64_t wi) {
        pdx[xi] += pdy[yi] * pw[wi];
        pdw[wi] += pdy[yi] * px[xi];
      });
      if (nx) (*g)[0] = dx;
      if (nw) (*g)[1] = dw;
    }
    if (nb) {
      Tensor db = Tensor::Zeros({O});
      float* pdb = db.data<float>();
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t o = 0; o < O; ++o) {
          const float* row = pdy + (n * O + o) * OH * OW;
          for (int64_t i = 0; i < OH * OW; ++i) pdb[o] += row[i];
        }
      }
      (*g)[2] = db;
    }
  });
  Report("onnx_conv", r, {&x, &w, &b});
  return r;
}

namespace {

// y = x with axes permuted: y.shape[i] = x.shape[perm[i]].
Tensor Permute(const Tensor& x, const std::vector<int>& perm) {
  const Shape& xs = x.shape();
  Shape ys(xs.size());
  for (size_t i = 0; i < perm.size(); ++i) ys[i] = xs[perm[i]];
  std::vector<int64_t> xst = Strides(xs);
  // Strides of x in y's axis order.
  std::vector<int64_t> st(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) st[i] = xst[perm[i]];
  Tensor y = Tensor::Empty(ys);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  std::vector<int64_t> zero(perm.size(), 0);
  ForEachBroadcast(ys, st, zero, [&](int64_t i, int64_t ix, int64_t) { py[i] = px[ix]; });
  return y;
}

}  // namespace

Variable Transpose(const Variable& x, const std::vector<int>& perm) {
  CheckCpu("onnx_transpose", x.value());
  Tensor y = Permute(x.value(), perm);
  std::vector<int> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int>(i);
  Variable r = MakeResult(y, "onnx_transpose", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    (*g)[0] = Permute(dy, inv);
  });
  Report("onnx_transpose", r, {&x});
  return r;
}

Variable Concat(const std::vector<Variable>& xs, int axis) {
  DT_CHECK(!xs.empty()) << "onnx_concat of nothing";
  Shape ys = xs[0].shape();
  ys[axis] = 0;
  for (const Variable& v : xs) {
    CheckCpu("onnx_concat", v.value());
    ys[axis] += v.shape()[axis];
  }
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= ys[i];
  for (size_t i = axis + 1; i < ys.size(); ++i) inner *= ys[i];
  Tensor y = Tensor::Empty(ys);
  std::vector<int64_t> widths;
  std::vector<Tensor> vals;
  int64_t pos = 0;
  for (const Variable& v : xs) {
    const int64_t wdt = v.shape()[axis] * inner;
    widths.push_back(wdt);
    vals.push_back(v.value());
    const float* pv = v.value().data<float>();
    float* py = y.data<float>();
    for (int64_t o = 0; o < outer; ++o) {
      std::copy(pv + o * wdt, pv + (o + 1) * wdt, py + o * ys[axis] * inner + pos);
    }
    pos += wdt;
  }
  const int64_t row = ys[axis] * inner;
  Variable r = MakeResult(y, "onnx_concat", xs, [=](const Tensor& dy, std::vector<Tensor>* g) {
    int64_t pos = 0;
    for (size_t k = 0; k < vals.size(); ++k) {
      Tensor d = Tensor::Empty(vals[k].shape());
      const float* pdy = dy.data<float>();
      float* pd = d.data<float>();
      for (int64_t o = 0; o < outer; ++o) {
        std::copy(pdy + o * row + pos, pdy + o * row + pos + widths[k], pd + o * widths[k]);
      }
      (*g)[k] = d;
      pos += widths[k];
    }
  });
  std::vector<const Variable*> in;
  for (const Variable& v : xs) in.push_back(&v);
  Report("onnx_concat", r, in);
  return r;
}

Variable Dropout(const Variable& x, float ratio, uint64_t seed, uint64_t offset) {
  CheckCpu("onnx_dropout", x.value());
  Tensor mask = Tensor::Empty(x.shape());
  ops::RandomUniform(&mask, 0.0f, 1.0f, seed, offset);
  const float keep = 1.0f - ratio;
  const float scale = keep > 0 ? 1.0f / keep : 0.0f;
  float* pm = mask.data<float>();
  const int64_t n = mask.numel();
  for (int64_t i = 0; i < n; ++i) pm[i] = pm[i] < ratio ? 0.0f : scale;
  Tensor y = Tensor::Empty(x.shape());
  const float* px = x.value().data<float>();
  float* py = y.data<float>();
  for (int64_t i = 0; i < n; ++i) py[i] = px[i] * pm[i];
  Variable r = MakeResult(y, "onnx_dropout", {x}, [=](const Tensor& dy, std::vector<Tensor>* g) {
    Tensor dx = Tensor::Empty(dy.shape());
    const float* pdy = dy.data<float>();
    const float* pm = mask.data<float>();
    float* pdx = dx.data<float>();
    for (int64_t i = 0; i < n; ++i) pdx[i] = pdy[i] * pm[i];
    (*g)[0] = dx;
  });
  Report("onnx_dropout", r, {&x});
  return r;
}

}  // namespace onnx
}  // namespace dtrain
