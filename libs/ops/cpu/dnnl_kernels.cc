// oneDNN (DNNL 2.6) CPU kernels: convolution, linear, matmul, average pooling
// and batch norm, registered for DeviceType::kCPU.
//
// Execution model
//  - Every calling thread owns a dnnl::engine, a dnnl::stream (streams are not
//    thread-safe), a cache of primitives and a few growable workspace buffers
//    (ThreadContext below, a thread_local). Nothing is shared between threads
//    except two statistics counters, so concurrent calls need no locks.
//  - A cache entry holds the primitive, dnnl::memory objects over the
//    caller's plain buffers (nchw / oihw / nc / oi, rebound with
//    set_data_handle only when a pointer changes), reorder primitives and
//    internal memories where a primitive wants another layout, and the
//    execution arguments (run through the C API, which takes an array). Keys are the op, the
//    shapes, the parameters and the OpenMP thread count (oneDNN sizes its work split when a
//    primitive is created). After the first call a kernel allocates nothing.
//  - Scratchpads are user-managed (scratchpad_mode::user) and live in the
//    thread's workspace, as do the internal (blocked) copies: memory grows to
//    the largest layer and is reused by all of them.
//  - oneDNN parallelizes with OpenMP; every kernel calls CpuThreads() first so
//    that the calling thread's omp_set_num_threads setting is in place.
//  - Two places bypass oneDNN where it measured slow: average pooling with
//    non-overlapping windows and no padding (LeNet's 2x2 pools) runs plain
//    OpenMP loops (see IsTiledPool), and relu after a plain-layout (gemm)
//    convolution is a separate pass instead of a post-op (see DnnlConv2d).
//
// Layout choice for convolutions (ConvLayout::kAuto, see ChooseConvLayout).
// Each pass (forward, backward-data, backward-weights) picks its own layout:
// plain = nchw/oihw on the caller's buffers (oneDNN runs gemm:jit); blocked =
// format `any` (nChw16c / OIhw16i16o, jit:avx512_core) with cached reorders
// from and to the plain buffers; nhwc = nhwc activations (brgconv forward)
// and `any` weights, again with reorders. Reorder costs are included.
// Measured with `bazel run //libs/ops:dnnl_layer_bench -- layouts` on
// the 2-core AVX-512 development VM (AMD EPYC), oneDNN 2.6.3. The machine is
// shared, so wall times were noisy; the table gives the best-of-20 CPU time
// with one thread (ms, fwd / bwd_data / bwd_weights), which ranked the
// layouts the same way as the quieter 2-thread runs:
//
//   shape (batch)                   plain              blocked            nhwc
//   LeNet conv1 1->20 3x3 (256)     1.75/ 2.00/ 4.73   2.70/ 9.24/ 2.32   3.35/ 6.06/ 3.96
//   LeNet conv2 20->50 5x5 (256)    9.08/11.47/ 9.59  10.37/10.11/11.18   6.26/ 8.24/ 6.73
//   ResNet stem 1->64 3x3 (32)      0.45/ 0.27/ 1.00   0.73/ 2.23/ 0.42   0.67/ 2.32/ 0.94
//   ResNet 64->64 28x28 (32)       13.47/14.91/18.19   8.67/ 8.59/ 8.93   8.59/ 8.97/11.00
//   ResNet 64->128 s2 (32)          7.40/ 6.30/ 6.99   6.61/ 5.17/ 4.77   5.17/ 5.04/ 6.04
//   ResNet 1x1 64->128 s2 (32)      0.87/ 1.10/ 1.25   1.05/ 1.16/ 1.17   1.65/ 1.42/ 1.85
//   ResNet 128->128 14x14 (32)     11.27/12.04/11.02   8.13/ 8.08/ 8.26   8.09/ 8.23/ 8.61
//   ResNet 128->256 s2 (32)         5.47/ 6.73/ 5.82   4.57/ 5.45/ 5.12   4.77/ 5.00/ 5.52
//   ResNet 256->256 7x7 (32)        9.64/12.96/10.18   7.85/ 7.71/ 8.65   7.02/ 7.61/ 7.73
//   ResNet 256->512 s2 (32)         6.99/ 7.52/ 7.12   4.42/ 7.14/ 6.96   6.15/ 6.24/ 7.43
//   ResNet 512->512 4x4 (32, 2 thr. wall)
//                                   6.87/ 8.52/11.85   5.53/ 4.53/ 6.60   8.76/ 6.05/ 5.62
//
// Hence: one input channel -> plain, except blocked for the weight gradient;
// channel counts that are not multiples of 16 -> nhwc (blocked layouts pad
// 20 -> 32 and 50 -> 64); 1x1 -> plain; ResNet's 3x3 layers -> blocked (nhwc
// is within noise of it; blocked is steadier on the weight gradient).
// With 2 threads (best of 20, wall) the choice gives LeNet conv1 0.90 / 1.10
// / 1.29 ms against plain 0.87 / 1.07 / 3.52, and LeNet conv2 3.05 / 4.00 /
// 3.22 ms against plain 4.56 / 5.74 / 4.75 and blocked 5.15 / 5.06 / 5.62.
//
// Per-op timings at LeNet's shapes (tests/reference/models.py), batch 256,
// 2 threads, best of 5 (the LeNetBatch256TwoThreads test prints them):
//   conv1 1->20 3x3 +bias+relu   fwd 1.08  bwd_data 0.78  bwd_weights 1.20
//   conv2 20->50 5x5 +bias+relu  fwd 3.18  bwd_data 4.39  bwd_weights 3.28
//   avg_pool2d [256,20,26,26]    fwd 0.27  bwd 0.26
//   avg_pool2d [256,50,9,9]      fwd 0.07  bwd 0.18
//   linear 800->128 +relu        fwd 0.11  bwd 0.23 (dx, dw, db)
//   linear 128->10               fwd 0.004 bwd 0.007
//   sum (without conv1's input gradient): 14.2 ms per training step.
// ResNet-18 (28x28 input), batch 32, 2 threads: convolutions and batch norm
// of one training step add up to 230 ms (~139 samples/s); per 3x3 layer
// fwd / bwd_data / bwd_weights: 64@28x28 4.5/4.6/4.7, 64->128 s2
// 2.4/2.6/2.3, 128@14x14 4.1/4.0/4.2, 128->256 s2 2.2/2.7/2.4, 256@7x7
// 3.9/3.9/4.3, 256->512 s2 2.0/3.4/3.3, 512@4x4 5.5/4.7/6.5
// (`bazel run //libs/ops:dnnl_layer_bench -- resnet18`).
//
// Linear / matmul: dnnl::matmul (brgemm) with strided (transposed) memory
// descriptors beat both inner_product (gemm:jit) and dnnl_sgemm at
// [256,784]x[784,256] (fwd incl. bias+relu: matmul 0.21 ms, inner_product
// 0.26 ms, sgemm + bias/relu loop 0.30 ms; [256,800]x[800,128]: 0.11 / 0.13 /
// 0.14 ms), and are on par for the backward products, so every matrix product
// here is a cached dnnl::matmul. The bias gradient is a column sum.
#include "libs/ops/cpu/dnnl_kernels.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "libs/base/logging.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"

namespace dtrain {
namespace ops {
namespace cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dims = memory::dims;

std::atomic<int64_t> g_created{0};
std::atomic<int64_t> g_reused{0};
std::atomic<int> g_conv_layout{static_cast<int>(ConvLayout::kAuto)};

// ---- per-thread state ----

// A growable, 64-byte aligned host buffer.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(ptr_); }

  void* Get(size_t bytes) {
    if (bytes > size_) {
      std::free(ptr_);
      size_ = (bytes + 4095) / 4096 * 4096;
      ptr_ = std::aligned_alloc(64, size_);
      DT_CHECK(ptr_ != nullptr) << "oneDNN kernels: cannot allocate " << size_
                                << " bytes of workspace";
    }
    return ptr_;
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Workspace buffers that one kernel call may use at the same time.
enum Slot : int {
  kSlotNone = -1,  // an operand that must keep the caller's layout
  kSlotSrc,
  kSlotWeights,
  kSlotDst,
  kSlotAux0,
  kSlotAux1,
  kSlotAux2,
  kSlotScratch,
  kNumSlots,
};

// Op identifiers, the first element of every cache key.
enum class OpId : int64_t {
  kConv = 1,
  kConvBwdData,
  kConvBwdWeights,
  kMatMul,
  kAvgPool,
  kAvgPoolBwd,
  kBnTrain,
  kBnInference,
  kBnBwd,
};

constexpr size_t kKeyLen = 16;
using Key = std::array<int64_t, kKeyLen>;

template <typename... Ts>
Key MakeKey(OpId op, Ts... values) {
  static_assert(sizeof...(Ts) < kKeyLen, "cache key too long");
  Key key{};
  size_t i = 0;
  key[i++] = static_cast<int64_t>(op);
  ((key[i++] = static_cast<int64_t>(values)), ...);
  return key;
}

// The bit pattern of a float, for cache keys.
int64_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

struct ThreadContext;

void SetHandle(const memory& mem, void** current, void* data) {
  if (*current != data) {
    mem.set_data_handle(data);
    *current = data;
  }
}

// Executes `prim` through the C API with a prebuilt argument array: the C++
// wrapper's execute() builds a std::vector from its map on every call.
void Execute(const dnnl::primitive& prim, const dnnl::stream& stream,
             const std::vector<dnnl_exec_arg_t>& args) {
  dnnl::error::wrap_c_api(
      dnnl_primitive_execute(prim.get(), stream.get(), static_cast<int>(args.size()), args.data()),
      "could not execute a primitive");
}

// One tensor argument of a primitive. `user` views the caller's plain buffer.
// When the primitive wants another layout, `internal` holds a copy in a
// workspace slot, converted by a cached reorder: before the primitive runs for
// inputs, after it for outputs.
class Operand {
 public:
  Operand(int arg, const dnnl::engine& engine, const memory::desc& user_md,
          const memory::desc& prim_md, bool output, Slot slot)
      : arg_(arg), output_(output), slot_(slot) {
    user_ = memory(user_md, engine, DNNL_MEMORY_NONE);
    if (prim_md != user_md) {
      DT_CHECK(slot != kSlotNone) << "oneDNN kernels: argument " << arg
                                  << " unexpectedly needs a layout other than the caller's";
      internal_ = memory(prim_md, engine, DNNL_MEMORY_NONE);
      bytes_ = prim_md.get_size();
      const memory& from = output ? internal_ : user_;
      const memory& to = output ? user_ : internal_;
      reorder_ = dnnl::reorder(from, to);
      reorder_args_ = {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}};
    }
  }

  int arg() const { return arg_; }
  bool reordered() const { return bytes_ > 0; }
  // The memory the primitive reads or writes.
  const memory& mem() const { return reordered() ? internal_ : user_; }

  inline void Bind(void* data, ThreadContext& ctx);
  void Before(dnnl::stream& s) {
    if (reordered() && !output_) Execute(reorder_, s, reorder_args_);
  }
  void After(dnnl::stream& s) {
    if (reordered() && output_) Execute(reorder_, s, reorder_args_);
  }

 private:
  int arg_;
  bool output_;
  Slot slot_;
  memory user_;
  void* user_ptr_ = nullptr;
  memory internal_;
  void* internal_ptr_ = nullptr;
  size_t bytes_ = 0;
  dnnl::reorder reorder_;
  std::vector<dnnl_exec_arg_t> reorder_args_;
};

// A cached primitive with its operands, scratchpad and argument array.
struct Entry {
  dnnl::primitive prim;
  std::vector<Operand> operands;  // in the order Run() binds the buffers
  memory scratchpad;
  size_t scratchpad_bytes = 0;
  void* scratchpad_ptr = nullptr;
  std::vector<dnnl_exec_arg_t> args;

  void Add(int arg, const dnnl::engine& engine, const memory::desc& user_md,
           const memory::desc& prim_md, bool output, Slot slot) {
    operands.emplace_back(arg, engine, user_md, prim_md, output, slot);
  }
  // Call after adding all operands.
  void Finish(const dnnl::engine& engine, const dnnl::primitive_desc_base& pd) {
    for (const Operand& op : operands) args.push_back({op.arg(), op.mem().get()});
    memory::desc sd = pd.scratchpad_desc();
    scratchpad_bytes = sd.get_size();
    if (scratchpad_bytes > 0) {
      scratchpad = memory(sd, engine, DNNL_MEMORY_NONE);
      args.push_back({DNNL_ARG_SCRATCHPAD, scratchpad.get()});
    }
  }
  // Executes on the given buffers, one per operand in order.
  void Run(ThreadContext& ctx, std::initializer_list<void*> data);
};

constexpr size_t kMaxCachedPrimitives = 1024;

struct ThreadContext {
  // Declared first so that it is destroyed last.
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  Buffer slots[kNumSlots];
  absl::flat_hash_map<Key, std::unique_ptr<Entry>> cache;

  // The entry for `key`, built by `make` (returning std::unique_ptr<Entry>)
  // on a miss.
  template <typename Make>
  Entry& Get(const Key& key, Make make) {
    auto it = cache.find(key);
    if (it != cache.end()) {
      g_reused.fetch_add(1, std::memory_order_relaxed);
      return *it->second;
    }
    // Shapes that never repeat (a bug upstream, or a sweep): start over
    // rather than grow without bound.
    if (cache.size() >= kMaxCachedPrimitives) cache.clear();
    std::unique_ptr<Entry> entry = make();
    g_created.fetch_add(1, std::memory_order_relaxed);
    Entry& ref = *entry;
    cache.emplace(key, std::move(entry));
    return ref;
  }
};

ThreadContext& Context() {
  thread_local ThreadContext ctx;
  return ctx;
}

void Operand::Bind(void* data, ThreadContext& ctx) {
  SetHandle(user_, &user_ptr_, data);
  if (reordered()) SetHandle(internal_, &internal_ptr_, ctx.slots[slot_].Get(bytes_));
}

void Entry::Run(ThreadContext& ctx, std::initializer_list<void*> data) {
  DT_CHECK(data.size() == operands.size())
      << "oneDNN kernels: " << data.size() << " buffers for " << operands.size() << " operands";
  size_t i = 0;
  for (void* d : data) operands[i++].Bind(d, ctx);
  if (scratchpad_bytes > 0) {
    SetHandle(scratchpad, &scratchpad_ptr, ctx.slots[kSlotScratch].Get(scratchpad_bytes));
  }
  for (Operand& op : operands) op.Before(ctx.stream);
  Execute(prim, ctx.stream, args);
  for (Operand& op : operands) op.After(ctx.stream);
  ctx.stream.wait();
}

// ---- helpers ----

memory::desc Md(const Dims& dims, Tag tag) {
  return memory::desc(dims, memory::data_type::f32, tag);
}

memory::desc StridedMd(const Dims& dims, const Dims& strides) {
  return memory::desc(dims, memory::data_type::f32, strides);
}

dnnl::primitive_attr MakeAttr(bool relu) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (relu) {
    dnnl::post_ops po;
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(po);
  }
  return attr;
}

void* Ptr(const Tensor& t) { return t.raw_data(); }

void CheckF32(const char* op, const char* name, const Tensor& t) {
  DT_CHECK(t.defined()) << op << ": " << name << " is undefined";
  DT_CHECK(t.dtype() == DType::kF32) << op << ": " << name << " is " << t.DebugString()
                                     << "; the oneDNN CPU kernels support f32 only";
  DT_CHECK(t.device().is_cpu()) << op << ": " << name << " is " << t.DebugString()
                                << ", not a CPU tensor";
}

// Runs `body`, turning oneDNN (and any other) exceptions into a fatal error
// that names the op: no exception leaves a kernel.
template <typename Body>
void Guarded(const char* op, Body body) {
  try {
    body();
  } catch (const dnnl::error& e) {
    DT_CHECK(false) << op << ": oneDNN error (status " << static_cast<int>(e.status)
                    << "): " << e.what();
  } catch (const std::exception& e) {
    DT_CHECK(false) << op << ": " << e.what();
  }
}

// Below this many elements, loops run on the calling thread alone.
constexpr int64_t kMinParallelElements = 1 << 15;

void ReluInPlace(float* p, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) p[i] = p[i] > 0.0f ? p[i] : 0.0f;
}

// ---- convolution ----

struct ConvGeom {
  int64_t n, c, h, w, o, kh, kw, ho, wo;
  int64_t stride, pad;

  Dims src() const { return {n, c, h, w}; }
  Dims weights() const { return {o, c, kh, kw}; }
  Dims bias() const { return {o}; }
  Dims dst() const { return {n, o, ho, wo}; }
  Dims strides() const { return {stride, stride}; }
  Dims padding() const { return {pad, pad}; }
};

ConvGeom MakeConvGeom(const char* op, const Shape& x, const Shape& w, const Conv2dParams& p) {
  DT_CHECK(x.size() == 4 && w.size() == 4 && x[1] == w[1])
      << op << ": x " << ShapeToString(x) << ", w " << ShapeToString(w)
      << " (want x [N,C,H,W] and w [O,C,kh,kw])";
  DT_CHECK(p.stride >= 1 && p.padding >= 0)
      << op << ": stride " << p.stride << ", padding " << p.padding;
  ConvGeom g;
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.o = w[0];
  g.kh = w[2];
  g.kw = w[3];
  g.stride = p.stride;
  g.pad = p.padding;
  g.ho = ConvOutSize(g.h, static_cast<int>(g.kh), p.stride, p.padding);
  g.wo = ConvOutSize(g.w, static_cast<int>(g.kw), p.stride, p.padding);
  DT_CHECK(g.c > 0 && g.kh > 0 && g.kw > 0)
      << op << ": x " << ShapeToString(x) << ", w " << ShapeToString(w) << " (empty filters)";
  DT_CHECK(g.ho > 0 && g.wo > 0) << op << ": x " << ShapeToString(x) << ", w " << ShapeToString(w)
                                 << ", stride " << p.stride << ", padding " << p.padding
                                 << " give an empty output";
  return g;
}

void CheckShape(const char* op, const char* name, const Tensor& t, const Dims& want) {
  Shape s(want.begin(), want.end());
  DT_CHECK(t.shape() == s) << op << ": " << name << " is " << ShapeToString(t.shape()) << ", want "
                           << ShapeToString(s);
}

ConvLayout LayoutFor(ConvPass pass, const ConvGeom& g) {
  ConvLayout layout = static_cast<ConvLayout>(g_conv_layout.load(std::memory_order_relaxed));
  if (layout == ConvLayout::kAuto) {
    layout = ChooseConvLayout(pass, g.n, g.c, g.h, g.w, g.o, std::max(g.kh, g.kw),
                              static_cast<int>(g.stride));
  }
  return layout;
}

// Tags the primitive is created with for activations and weights.
Tag ActivationTag(ConvLayout layout) {
  switch (layout) {
    case ConvLayout::kBlocked:
      return Tag::any;
    case ConvLayout::kChannelsLast:
      return Tag::nhwc;
    default:
      return Tag::nchw;
  }
}
Tag WeightsTag(ConvLayout layout) { return layout == ConvLayout::kPlain ? Tag::oihw : Tag::any; }

dnnl::convolution_forward::primitive_desc ConvFwdPd(const ConvGeom& g, ConvLayout layout, bool bias,
                                                    bool relu, const dnnl::engine& engine) {
  memory::desc src = Md(g.src(), ActivationTag(layout));
  memory::desc wei = Md(g.weights(), WeightsTag(layout));
  memory::desc dst = Md(g.dst(), ActivationTag(layout));
  using Desc = dnnl::convolution_forward::desc;
  const auto prop = dnnl::prop_kind::forward_training;
  const auto alg = dnnl::algorithm::convolution_direct;
  Desc d = bias ? Desc(prop, alg, src, wei, Md(g.bias(), Tag::x), dst, g.strides(), g.padding(),
                       g.padding())
                : Desc(prop, alg, src, wei, dst, g.strides(), g.padding(), g.padding());
  return dnnl::convolution_forward::primitive_desc(d, MakeAttr(relu), engine);
}

void DnnlConv2d(const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dParams& p, bool relu,
                Tensor* y) {
  const int nthr = CpuThreads();
  CheckF32("conv2d", "x", x);
  CheckF32("conv2d", "w", w);
  CheckF32("conv2d", "y", *y);
  const ConvGeom g = MakeConvGeom("conv2d", x.shape(), w.shape(), p);
  CheckShape("conv2d", "y", *y, g.dst());
  if (b != nullptr) {
    CheckF32("conv2d", "b", *b);
    CheckShape("conv2d", "b", *b, g.bias());
  }
  if (y->numel() == 0) return;
  Guarded("conv2d", [&] {
    ThreadContext& ctx = Context();
    const ConvLayout layout = LayoutFor(ConvPass::kForward, g);
    const bool has_bias = b != nullptr;
    // The gemm-based convolution that oneDNN uses for plain layouts applies
    // eltwise post-ops slowly (LeNet conv1 at batch 256: 0.8 ms without relu,
    // 1.5 ms with it); a separate pass over y costs 0.15 ms. The direct
    // (blocked / nhwc) kernels fuse relu for free.
    const bool separate_relu = relu && layout == ConvLayout::kPlain;
    Key key = MakeKey(OpId::kConv, nthr, layout, g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.stride,
                      g.pad, has_bias, relu);
    Entry& e = ctx.Get(key, [&] {
      auto pd = ConvFwdPd(g, layout, has_bias, relu && !separate_relu, ctx.engine);
      auto e = std::make_unique<Entry>();
      e->prim = dnnl::convolution_forward(pd);
      e->Add(DNNL_ARG_SRC, ctx.engine, Md(g.src(), Tag::nchw), pd.src_desc(), false, kSlotSrc);
      e->Add(DNNL_ARG_WEIGHTS, ctx.engine, Md(g.weights(), Tag::oihw), pd.weights_desc(), false,
             kSlotWeights);
      e->Add(DNNL_ARG_DST, ctx.engine, Md(g.dst(), Tag::nchw), pd.dst_desc(), true, kSlotDst);
      if (has_bias) {
        e->Add(DNNL_ARG_BIAS, ctx.engine, Md(g.bias(), Tag::x), pd.bias_desc(), false, kSlotAux0);
      }
      e->Finish(ctx.engine, pd);
      return e;
    });
    if (has_bias) {
      e.Run(ctx, {Ptr(x), Ptr(w), Ptr(*y), Ptr(*b)});
    } else {
      e.Run(ctx, {Ptr(x), Ptr(w), Ptr(*y)});
    }
    if (separate_relu) ReluInPlace(y->data<float>(), y->numel());
  });
}

void DnnlConv2dBackwardData(const Tensor& dy, const Tensor& w, const Conv2dParams& p, Tensor* dx) {
  const int nthr = CpuThreads();
  CheckF32("conv2d_backward_data", "dy", dy);
  CheckF32("conv2d_backward_data", "w", w);
  CheckF32("conv2d_backward_data", "dx", *dx);
  const ConvGeom g = MakeConvGeom("conv2d_backward_data", dx->shape(), w.shape(), p);
  CheckShape("conv2d_backward_data", "dy", dy, g.dst());
  if (dx->numel() == 0) return;
  if (g.o == 0) {
    std::fill_n(dx->data<float>(), dx->numel(), 0.0f);
    return;
  }
  Guarded("conv2d_backward_data", [&] {
    ThreadContext& ctx = Context();
    const ConvLayout layout = LayoutFor(ConvPass::kBackwardData, g);
    Key key = MakeKey(OpId::kConvBwdData, nthr, layout, g.n, g.c, g.h, g.w, g.o, g.kh, g.kw,
                      g.stride, g.pad);
    Entry& e = ctx.Get(key, [&] {
      auto hint = ConvFwdPd(g, layout, false, false, ctx.engine);
      dnnl::convolution_backward_data::desc d(
          dnnl::algorithm::convolution_direct, Md(g.src(), ActivationTag(layout)),
          Md(g.weights(), WeightsTag(layout)), Md(g.dst(), ActivationTag(layout)), g.strides(),
          g.padding(), g.padding());
      dnnl::convolution_backward_data::primitive_desc pd(d, MakeAttr(false), ctx.engine, hint);
      auto e = std::make_unique<Entry>();
      e->prim = dnnl::convolution_backward_data(pd);
      e->Add(DNNL_ARG_DIFF_DST, ctx.engine, Md(g.dst(), Tag::nchw), pd.diff_dst_desc(), false,
             kSlotDst);
      e->Add(DNNL_ARG_WEIGHTS, ctx.engine, Md(g.weights(), Tag::oihw), pd.weights_desc(), false,
             kSlotWeights);
      e->Add(DNNL_ARG_DIFF_SRC, ctx.engine, Md(g.src(), Tag::nchw), pd.diff_src_desc(), true,
             kSlotSrc);
      e->Finish(ctx.engine, pd);
      return e;
    });
    e.Run(ctx, {Ptr(dy), Ptr(w), Ptr(*dx)});
  });
}

void DnnlConv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p, Tensor* dw,
                               Tensor* db) {
  const int nthr = CpuThreads();
  CheckF32("conv2d_backward_weights", "x", x);
  CheckF32("conv2d_backward_weights", "dy", dy);
  CheckF32("conv2d_backward_weights", "dw", *dw);
  const ConvGeom g = MakeConvGeom("conv2d_backward_weights", x.shape(), dw->shape(), p);
  CheckShape("conv2d_backward_weights", "dy", dy, g.dst());
  if (db != nullptr) {
    CheckF32("conv2d_backward_weights", "db", *db);
    CheckShape("conv2d_backward_weights", "db", *db, g.bias());
  }
  if (g.o == 0) return;
  if (g.n == 0) {
    std::fill_n(dw->data<float>(), dw->numel(), 0.0f);
    if (db != nullptr) std::fill_n(db->data<float>(), db->numel(), 0.0f);
    return;
  }
  Guarded("conv2d_backward_weights", [&] {
    ThreadContext& ctx = Context();
    const ConvLayout layout = LayoutFor(ConvPass::kBackwardWeights, g);
    const bool has_bias = db != nullptr;
    Key key = MakeKey(OpId::kConvBwdWeights, nthr, layout, g.n, g.c, g.h, g.w, g.o, g.kh, g.kw,
                      g.stride, g.pad, has_bias);
    Entry& e = ctx.Get(key, [&] {
      auto hint = ConvFwdPd(g, layout, has_bias, false, ctx.engine);
      memory::desc src = Md(g.src(), ActivationTag(layout));
      memory::desc wei = Md(g.weights(), WeightsTag(layout));
      memory::desc dst = Md(g.dst(), ActivationTag(layout));
      using Desc = dnnl::convolution_backward_weights::desc;
      const auto alg = dnnl::algorithm::convolution_direct;
      Desc d = has_bias ? Desc(alg, src, wei, Md(g.bias(), Tag::x), dst, g.strides(), g.padding(),
                               g.padding())
                        : Desc(alg, src, wei, dst, g.strides(), g.padding(), g.padding());
      dnnl::convolution_backward_weights::primitive_desc pd(d, MakeAttr(false), ctx.engine, hint);
      auto e = std::make_unique<Entry>();
      e->prim = dnnl::convolution_backward_weights(pd);
      e->Add(DNNL_ARG_SRC, ctx.engine, Md(g.src(), Tag::nchw), pd.src_desc(), false, kSlotSrc);
      e->Add(DNNL_ARG_DIFF_DST, ctx.engine, Md(g.dst(), Tag::nchw), pd.diff_dst_desc(), false,
             kSlotDst);
      e->Add(DNNL_ARG_DIFF_WEIGHTS, ctx.engine, Md(g.weights(), Tag::oihw), pd.diff_weights_desc(),
             true, kSlotWeights);
      if (has_bias) {
        e->Add(DNNL_ARG_DIFF_BIAS, ctx.engine, Md(g.bias(), Tag::x), pd.diff_bias_desc(), true,
               kSlotAux0);
      }
      e->Finish(ctx.engine, pd);
      return e;
    });
    if (has_bias) {
      e.Run(ctx, {Ptr(x), Ptr(dy), Ptr(*dw), Ptr(*db)});
    } else {
      e.Run(ctx, {Ptr(x), Ptr(dy), Ptr(*dw)});
    }
  });
}

// ---- matrix products ----

// Memory descriptor of a row-major [rows, cols] matrix, or of the transpose
// of a row-major [cols, rows] matrix.
memory::desc MatrixMd(int64_t rows, int64_t cols, bool transposed) {
  return StridedMd({rows, cols}, transposed ? Dims{1, rows} : Dims{cols, 1});
}

// A cached dnnl::matmul computing c[m,n] = op(a)[m,k] * op(b)[k,n] (+ bias[n],
// relu). `tag` tells apart products with equal geometry used for different
// purposes (they would share the entry safely, but keys stay readable).
Entry& MatMulEntry(ThreadContext& ctx, int nthr, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                   bool bias, bool relu) {
  Key key = MakeKey(OpId::kMatMul, nthr, m, n, k, ta, tb, bias, relu);
  return ctx.Get(key, [&] {
    memory::desc a = MatrixMd(m, k, ta);
    memory::desc b = MatrixMd(k, n, tb);
    memory::desc c = MatrixMd(m, n, false);
    memory::desc bias_md = MatrixMd(1, n, false);
    dnnl::matmul::desc d =
        bias ? dnnl::matmul::desc(a, b, bias_md, c) : dnnl::matmul::desc(a, b, c);
    dnnl::matmul::primitive_desc pd(d, MakeAttr(relu), ctx.engine);
    auto e = std::make_unique<Entry>();
    e->prim = dnnl::matmul(pd);
    e->Add(DNNL_ARG_SRC, ctx.engine, a, pd.src_desc(), false, kSlotNone);
    e->Add(DNNL_ARG_WEIGHTS, ctx.engine, b, pd.weights_desc(), false, kSlotNone);
    e->Add(DNNL_ARG_DST, ctx.engine, c, pd.dst_desc(), true, kSlotNone);
    if (bias) e->Add(DNNL_ARG_BIAS, ctx.engine, bias_md, pd.bias_desc(), false, kSlotNone);
    e->Finish(ctx.engine, pd);
    return e;
  });
}

void DnnlMatMul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, Tensor* c) {
  const int nthr = CpuThreads();
  CheckF32("matmul", "a", a);
  CheckF32("matmul", "b", b);
  CheckF32("matmul", "c", *c);
  DT_CHECK(a.ndim() == 2 && b.ndim() == 2 && c->ndim() == 2)
      << "matmul: a " << a.DebugString() << ", b " << b.DebugString() << ", c " << c->DebugString();
  const int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  const int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  const int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  const int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  DT_CHECK(k == kb && c->dim(0) == m && c->dim(1) == n)
      << "matmul: a " << ShapeToString(a.shape()) << (transpose_a ? "^T" : "") << " * b "
      << ShapeToString(b.shape()) << (transpose_b ? "^T" : "") << " into c "
      << ShapeToString(c->shape());
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill_n(c->data<float>(), c->numel(), 0.0f);
    return;
  }
  Guarded("matmul", [&] {
    ThreadContext& ctx = Context();
    MatMulEntry(ctx, nthr, m, n, k, transpose_a, transpose_b, false, false)
        .Run(ctx, {Ptr(a), Ptr(b), Ptr(*c)});
  });
}

void DnnlLinear(const Tensor& x, const Tensor& w, const Tensor* b, bool relu, Tensor* y) {
  const int nthr = CpuThreads();
  CheckF32("linear", "x", x);
  CheckF32("linear", "w", w);
  CheckF32("linear", "y", *y);
  DT_CHECK(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1))
      << "linear: x " << x.DebugString() << ", w " << w.DebugString()
      << " (want x [N,K] and w [M,K])";
  const int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  CheckShape("linear", "y", *y, {n, m});
  if (b != nullptr) {
    CheckF32("linear", "b", *b);
    CheckShape("linear", "b", *b, {m});
  }
  if (n == 0 || m == 0) return;
  DT_CHECK(k > 0) << "linear: empty inner dimension, x " << x.DebugString();
  Guarded("linear", [&] {
    ThreadContext& ctx = Context();
    // y[n,m] = x[n,k] * w[m,k]^T: w is the transposed weights operand.
    Entry& e = MatMulEntry(ctx, nthr, n, m, k, false, true, b != nullptr, relu);
    if (b != nullptr) {
      e.Run(ctx, {Ptr(x), Ptr(w), Ptr(*y), Ptr(*b)});
    } else {
      e.Run(ctx, {Ptr(x), Ptr(w), Ptr(*y)});
    }
  });
}

void DnnlLinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                        Tensor* db) {
  const int nthr = CpuThreads();
  CheckF32("linear_backward", "x", x);
  CheckF32("linear_backward", "w", w);
  CheckF32("linear_backward", "dy", dy);
  DT_CHECK(x.ndim() == 2 && w.ndim() == 2 && dy.ndim() == 2 && x.dim(1) == w.dim(1) &&
           dy.dim(0) == x.dim(0) && dy.dim(1) == w.dim(0))
      << "linear_backward: x " << x.DebugString() << ", w " << w.DebugString() << ", dy "
      << dy.DebugString();
  const int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  if (dx != nullptr) {
    CheckF32("linear_backward", "dx", *dx);
    CheckShape("linear_backward", "dx", *dx, {n, k});
  }
  if (dw != nullptr) {
    CheckF32("linear_backward", "dw", *dw);
    CheckShape("linear_backward", "dw", *dw, {m, k});
  }
  if (db != nullptr) {
    CheckF32("linear_backward", "db", *db);
    CheckShape("linear_backward", "db", *db, {m});
  }
  Guarded("linear_backward", [&] {
    ThreadContext& ctx = Context();
    if (n == 0) {
      if (dw != nullptr) std::fill_n(dw->data<float>(), dw->numel(), 0.0f);
    } else if (m == 0) {
      if (dx != nullptr) std::fill_n(dx->data<float>(), dx->numel(), 0.0f);
    } else {
      // dx[n,k] = dy[n,m] * w[m,k]
      if (dx != nullptr && k > 0) {
        MatMulEntry(ctx, nthr, n, k, m, false, false, false, false)
            .Run(ctx, {Ptr(dy), Ptr(w), Ptr(*dx)});
      }
      // dw[m,k] = dy[n,m]^T * x[n,k]
      if (dw != nullptr && k > 0) {
        MatMulEntry(ctx, nthr, m, k, n, true, false, false, false)
            .Run(ctx, {Ptr(dy), Ptr(x), Ptr(*dw)});
      }
    }
    if (db != nullptr) {
      // Column sums of dy, accumulated in rows so that the inner loop
      // vectorizes over m.
      float* out = db->data<float>();
      const float* g = dy.data<float>();
      std::fill_n(out, m, 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float* row = g + i * m;
        for (int64_t j = 0; j < m; ++j) out[j] += row[j];
      }
    }
  });
}

// ---- average pooling ----

struct PoolGeom {
  int64_t n, c, h, w, ho, wo;
  int64_t kernel, stride, pad;
  Dims src() const { return {n, c, h, w}; }
  Dims dst() const { return {n, c, ho, wo}; }
};

PoolGeom MakePoolGeom(const char* op, const Shape& x, const Pool2dParams& p) {
  DT_CHECK(x.size() == 4) << op << ": x " << ShapeToString(x) << " (want [N,C,H,W])";
  DT_CHECK(p.kernel >= 1 && p.stride >= 1 && p.padding >= 0 && 2 * p.padding <= p.kernel)
      << op << ": kernel " << p.kernel << ", stride " << p.stride << ", padding " << p.padding
      << " (padding must be at most half the kernel)";
  PoolGeom g{x[0], x[1], x[2], x[3], 0, 0, p.kernel, p.stride, p.padding};
  g.ho = ConvOutSize(g.h, p.kernel, p.stride, p.padding);
  g.wo = ConvOutSize(g.w, p.kernel, p.stride, p.padding);
  DT_CHECK(g.ho > 0 && g.wo > 0) << op << ": x " << ShapeToString(x) << " with kernel " << p.kernel
                                 << ", stride " << p.stride << ", padding " << p.padding
                                 << " gives an empty output";
  return g;
}

// Non-overlapping windows without padding (kernel == stride, padding 0, as in
// LeNet) use plain loops over the nchw planes, which read and write each
// element once. oneDNN 2.6's nchw pooling (jit:avx512_core with internal
// transposes) measured 1.1 ms forward and 0.9-1.3 ms backward for
// [256,20,26,26] with k2 s2, against 0.12 and 0.18 ms for these loops; other
// configurations (overlapping windows, padding) go to oneDNN.
bool IsTiledPool(const PoolGeom& g) { return g.pad == 0 && g.kernel == g.stride; }

void TiledPoolForward(const float* x, float* y, const PoolGeom& g) {
  const int64_t planes = g.n * g.c, k = g.kernel, h = g.h, w = g.w, ho = g.ho, wo = g.wo;
  const float inv = 1.0f / static_cast<float>(k * k);
#pragma omp parallel for schedule(static) if (planes * h * w >= kMinParallelElements)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* xp = x + pl * h * w;
    float* yp = y + pl * ho * wo;
    for (int64_t oy = 0; oy < ho; ++oy) {
      const float* r0 = xp + oy * k * w;
      float* out = yp + oy * wo;
      if (k == 2) {
        const float* r1 = r0 + w;
        for (int64_t ox = 0; ox < wo; ++ox) {
          out[ox] = inv * ((r0[2 * ox] + r0[2 * ox + 1]) + (r1[2 * ox] + r1[2 * ox + 1]));
        }
      } else {
        for (int64_t ox = 0; ox < wo; ++ox) {
          float sum = 0.0f;
          for (int64_t ky = 0; ky < k; ++ky) {
            for (int64_t kx = 0; kx < k; ++kx) sum += r0[ky * w + ox * k + kx];
          }
          out[ox] = inv * sum;
        }
      }
    }
  }
}

void TiledPoolBackward(const float* dy, float* dx, const PoolGeom& g) {
  const int64_t planes = g.n * g.c, k = g.kernel, h = g.h, w = g.w, ho = g.ho, wo = g.wo;
  const float inv = 1.0f / static_cast<float>(k * k);
#pragma omp parallel for schedule(static) if (planes * h * w >= kMinParallelElements)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* gp = dy + pl * ho * wo;
    float* xp = dx + pl * h * w;
    for (int64_t oy = 0; oy < ho; ++oy) {
      const float* grad = gp + oy * wo;
      float* r0 = xp + oy * k * w;
      if (k == 2) {
        for (int64_t ox = 0; ox < wo; ++ox) {
          const float v = inv * grad[ox];
          r0[2 * ox] = v;
          r0[2 * ox + 1] = v;
        }
      } else {
        for (int64_t ox = 0; ox < wo; ++ox) {
          const float v = inv * grad[ox];
          for (int64_t kx = 0; kx < k; ++kx) r0[ox * k + kx] = v;
        }
      }
      // Columns past the last window get no gradient.
      for (int64_t ix = wo * k; ix < w; ++ix) r0[ix] = 0.0f;
      for (int64_t ky = 1; ky < k; ++ky) std::copy_n(r0, w, r0 + ky * w);
    }
    // Nor do rows past the last window.
    std::fill(xp + ho * k * w, xp + h * w, 0.0f);
  }
}

dnnl::pooling_forward::primitive_desc PoolFwdPd(const PoolGeom& g, const dnnl::engine& engine) {
  dnnl::pooling_forward::desc d(
      dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_avg_exclude_padding,
      Md(g.src(), Tag::nchw), Md(g.dst(), Tag::nchw), {g.stride, g.stride}, {g.kernel, g.kernel},
      {g.pad, g.pad}, {g.pad, g.pad});
  return dnnl::pooling_forward::primitive_desc(d, MakeAttr(false), engine);
}

void DnnlAvgPool2d(const Tensor& x, const Pool2dParams& p, Tensor* y) {
  const int nthr = CpuThreads();
  CheckF32("avg_pool2d", "x", x);
  CheckF32("avg_pool2d", "y", *y);
  const PoolGeom g = MakePoolGeom("avg_pool2d", x.shape(), p);
  CheckShape("avg_pool2d", "y", *y, g.dst());
  if (x.numel() == 0) return;
  if (IsTiledPool(g)) {
    TiledPoolForward(x.data<float>(), y->data<float>(), g);
    return;
  }
  Guarded("avg_pool2d", [&] {
    ThreadContext& ctx = Context();
    Key key = MakeKey(OpId::kAvgPool, nthr, g.n, g.c, g.h, g.w, g.kernel, g.stride, g.pad);
    Entry& e = ctx.Get(key, [&] {
      auto pd = PoolFwdPd(g, ctx.engine);
      auto e = std::make_unique<Entry>();
      e->prim = dnnl::pooling_forward(pd);
      e->Add(DNNL_ARG_SRC, ctx.engine, Md(g.src(), Tag::nchw), pd.src_desc(), false, kSlotNone);
      e->Add(DNNL_ARG_DST, ctx.engine, Md(g.dst(), Tag::nchw), pd.dst_desc(), true, kSlotNone);
      e->Finish(ctx.engine, pd);
      return e;
    });
    e.Run(ctx, {Ptr(x), Ptr(*y)});
  });
}

void DnnlAvgPool2dBackward(const Tensor& dy, const Pool2dParams& p, Tensor* dx) {
  const int nthr = CpuThreads();
  CheckF32("avg_pool2d_backward", "dy", dy);
  CheckF32("avg_pool2d_backward", "dx", *dx);
  const PoolGeom g = MakePoolGeom("avg_pool2d_backward", dx->shape(), p);
  CheckShape("avg_pool2d_backward", "dy", dy, g.dst());
  if (dx->numel() == 0) return;
  if (IsTiledPool(g)) {
    TiledPoolBackward(dy.data<float>(), dx->data<float>(), g);
    return;
  }
  Guarded("avg_pool2d_backward", [&] {
    ThreadContext& ctx = Context();
    Key key = MakeKey(OpId::kAvgPoolBwd, nthr, g.n, g.c, g.h, g.w, g.kernel, g.stride, g.pad);
    Entry& e = ctx.Get(key, [&] {
      auto hint = PoolFwdPd(g, ctx.engine);
      dnnl::pooling_backward::desc d(dnnl::algorithm::pooling_avg_exclude_padding,
                                     Md(g.src(), Tag::nchw), Md(g.dst(), Tag::nchw),
                                     {g.stride, g.stride}, {g.kernel, g.kernel}, {g.pad, g.pad},
                                     {g.pad, g.pad});
      dnnl::pooling_backward::primitive_desc pd(d, MakeAttr(false), ctx.engine, hint);
      auto e = std::make_unique<Entry>();
      e->prim = dnnl::pooling_backward(pd);
      e->Add(DNNL_ARG_DIFF_DST, ctx.engine, Md(g.dst(), Tag::nchw), pd.diff_dst_desc(), false,
             kSlotDst);
      e->Add(DNNL_ARG_DIFF_SRC, ctx.engine, Md(g.src(), Tag::nchw), pd.diff_src_desc(), true,
             kSlotSrc);
      e->Finish(ctx.engine, pd);
      return e;
    });
    e.Run(ctx, {Ptr(dy), Ptr(*dx)});
  });
}

// ---- batch norm ----

// x is [N,C,H,W] or [N,C]; statistics are per channel over the other axes.
struct BnGeom {
  Dims dims;
  int64_t c = 0;
  int64_t count = 0;  // elements per channel
  Tag tag() const { return dims.size() == 4 ? Tag::nchw : Tag::nc; }
  // The primitive cache key of batch-norm op `id` on this geometry.
  Key CacheKey(OpId id, int nthr, float eps) const {
    return MakeKey(id, nthr, dims.size(), dims[0], dims[1], dims.size() == 4 ? dims[2] : 1,
                   dims.size() == 4 ? dims[3] : 1, FloatBits(eps));
  }
};

// Checks a batch-norm op's x, gamma and beta (f32, gamma and beta one value
// per channel of x) and returns x's geometry.
BnGeom MakeBnGeom(const char* op, const Tensor& x, const Tensor& gamma, const Tensor& beta) {
  CheckF32(op, "x", x);
  CheckF32(op, "gamma", gamma);
  CheckF32(op, "beta", beta);
  DT_CHECK(x.ndim() == 4 || x.ndim() == 2)
      << op << ": x " << x.DebugString() << " (want [N,C,H,W] or [N,C])";
  BnGeom g;
  g.dims.assign(x.shape().begin(), x.shape().end());
  g.c = x.dim(1);
  g.count = x.numel() / std::max<int64_t>(g.c, 1);
  DT_CHECK(gamma.numel() == g.c && beta.numel() == g.c)
      << op << ": gamma " << gamma.DebugString() << ", beta " << beta.DebugString() << " for x "
      << x.DebugString();
  return g;
}

// An f32 tensor of x's shape (y, dy, dx).
void CheckLikeX(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  CheckF32(op, name, t);
  DT_CHECK(t.shape() == x.shape())
      << op << ": " << name << " " << t.DebugString() << " for x " << x.DebugString();
}

void CheckChannels(const char* op, const char* name, const Tensor& t, int64_t c) {
  CheckF32(op, name, t);
  DT_CHECK(t.numel() == c) << op << ": " << name << " is " << t.DebugString() << ", want " << c
                           << " elements";
}

const dnnl::normalization_flags kScaleShift =
    dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;

dnnl::batch_normalization_forward::primitive_desc BnTrainPd(const BnGeom& g, float eps,
                                                            const dnnl::engine& engine) {
  dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_training, Md(g.dims, g.tag()),
                                            eps, kScaleShift);
  return dnnl::batch_normalization_forward::primitive_desc(d, MakeAttr(false), engine);
}

void DnnlBatchNormTrain(const Tensor& x, const Tensor& gamma, const Tensor& beta, float momentum,
                        float eps, Tensor* running_mean, Tensor* running_var, Tensor* y,
                        Tensor* saved_mean, Tensor* saved_inv_std) {
  const int nthr = CpuThreads();
  const char* op = "batch_norm_train";
  const BnGeom g = MakeBnGeom(op, x, gamma, beta);
  CheckLikeX(op, "y", *y, x);
  CheckChannels(op, "saved_mean", *saved_mean, g.c);
  CheckChannels(op, "saved_inv_std", *saved_inv_std, g.c);
  if (running_mean != nullptr) CheckChannels(op, "running_mean", *running_mean, g.c);
  if (running_var != nullptr) CheckChannels(op, "running_var", *running_var, g.c);
  DT_CHECK(g.count > 1) << op << ": x " << x.DebugString()
                        << " has one value per channel; training needs more";
  Guarded(op, [&] {
    ThreadContext& ctx = Context();
    Key key = g.CacheKey(OpId::kBnTrain, nthr, eps);
    Entry& e = ctx.Get(key, [&] {
      auto pd = BnTrainPd(g, eps, ctx.engine);
      auto e = std::make_unique<Entry>();
      e->prim = dnnl::batch_normalization_forward(pd);
      memory::desc data = Md(g.dims, g.tag());
      memory::desc stat = Md({g.c}, Tag::x);
      e->Add(DNNL_ARG_SRC, ctx.engine, data, pd.src_desc(), false, kSlotNone);
      e->Add(DNNL_ARG_SCALE, ctx.engine, stat, stat, false, kSlotNone);
      e->Add(DNNL_ARG_SHIFT, ctx.engine, stat, stat, false, kSlotNone);
      e->Add(DNNL_ARG_DST, ctx.engine, data, pd.dst_desc(), true, kSlotNone);
      e->Add(DNNL_ARG_MEAN, ctx.engine, stat, pd.mean_desc(), true, kSlotNone);
      e->Add(DNNL_ARG_VARIANCE, ctx.engine, stat, pd.variance_desc(), true, kSlotNone);
      e->Finish(ctx.engine, pd);
      return e;
    });
    // The biased batch variance goes to a workspace buffer; saved_inv_std
    // and the running statistics are derived from it below.
    float* var = static_cast<float*>(ctx.slots[kSlotAux1].Get(g.c * sizeof(float)));
    e.Run(ctx, {Ptr(x), Ptr(gamma), Ptr(beta), Ptr(*y), Ptr(*saved_mean), var});
    const float* mean = saved_mean->data<float>();
    float* inv_std = saved_inv_std->data<float>();
    float* rm = running_mean != nullptr ? running_mean->data<float>() : nullptr;
    float* rv = running_var != nullptr ? running_var->data<float>() : nullptr;
    const double unbias = static_cast<double>(g.count) / static_cast<double>(g.count - 1);
    for (int64_t c = 0; c < g.c; ++c) {
      inv_std[c] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(var[c]) + eps));
      if (rm != nullptr) rm[c] = (1.0f - momentum) * rm[c] + momentum * mean[c];
      if (rv != nullptr) {
        rv[c] = (1.0f - momentum) * rv[c] + momentum * static_cast<float>(var[c] * unbias);
      }
    }
  });
}

void DnnlBatchNormInference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& running_mean, const Tensor& running_var, float eps,
                            Tensor* y) {
  const int nthr = CpuThreads();
  const char* op = "batch_norm_inference";
  const BnGeom g = MakeBnGeom(op, x, gamma, beta);
  CheckLikeX(op, "y", *y, x);
  CheckChannels(op, "running_mean", running_mean, g.c);
  CheckChannels(op, "running_var", running_var, g.c);
  if (x.numel() == 0) return;
  Guarded(op, [&] {
    ThreadContext& ctx = Context();
    Key key = g.CacheKey(OpId::kBnInference, nthr, eps);
    Entry& e = ctx.Get(key, [&] {
      dnnl::batch_normalization_forward::desc d(
          dnnl::prop_kind::forward_inference, Md(g.dims, g.tag()), eps,
          kScaleShift | dnnl::normalization_flags::use_global_stats);
      dnnl::batch_normalization_forward::primitive_desc pd(d, MakeAttr(false), ctx.engine);
      auto e = std::make_unique<Entry>();
      e->prim = dnnl::batch_normalization_forward(pd);
      memory::desc data = Md(g.dims, g.tag());
      memory::desc stat = Md({g.c}, Tag::x);
      e->Add(DNNL_ARG_SRC, ctx.engine, data, pd.src_desc(), false, kSlotNone);
      e->Add(DNNL_ARG_SCALE, ctx.engine, stat, stat, false, kSlotNone);
      e->Add(DNNL_ARG_SHIFT, ctx.engine, stat, stat, false, kSlotNone);
      e->Add(DNNL_ARG_MEAN, ctx.engine, stat, pd.mean_desc(), false, kSlotNone);
      e->Add(DNNL_ARG_VARIANCE, ctx.engine, stat, pd.variance_desc(), false, kSlotNone);
      e->Add(DNNL_ARG_DST, ctx.engine, data, pd.dst_desc(), true, kSlotNone);
      e->Finish(ctx.engine, pd);
      return e;
    });
    e.Run(ctx, {Ptr(x), Ptr(gamma), Ptr(beta), Ptr(running_mean), Ptr(running_var), Ptr(*y)});
  });
}

void DnnlBatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                           const Tensor& saved_mean, const Tensor& saved_inv_std, Tensor* dx,
                           Tensor* dgamma, Tensor* dbeta) {
  const int nthr = CpuThreads();
  const char* op = "batch_norm_backward";
  const BnGeom g = MakeBnGeom(op, x, gamma, gamma);
  CheckLikeX(op, "dy", dy, x);
  CheckChannels(op, "saved_mean", saved_mean, g.c);
  CheckChannels(op, "saved_inv_std", saved_inv_std, g.c);
  if (dx != nullptr) CheckLikeX(op, "dx", *dx, x);
  if (dgamma != nullptr) CheckChannels(op, "dgamma", *dgamma, g.c);
  if (dbeta != nullptr) CheckChannels(op, "dbeta", *dbeta, g.c);
  if (dx == nullptr && dgamma == nullptr && dbeta == nullptr) return;
  DT_CHECK(g.count > 0) << op << ": empty batch " << x.DebugString();
  Guarded(op, [&] {
    ThreadContext& ctx = Context();
    // oneDNN takes a variance and eps and recomputes 1/sqrt(var + eps). Pass
    // eps = 0 and var = 1 / inv_std^2 (the forward's var + eps), so that the
    // backward uses the forward's inv_std up to rounding, whatever its eps.
    constexpr float kEps = 0.0f;
    Key key = g.CacheKey(OpId::kBnBwd, nthr, kEps);
    Entry& e = ctx.Get(key, [&] {
      auto hint = BnTrainPd(g, kEps, ctx.engine);
      memory::desc data = Md(g.dims, g.tag());
      dnnl::batch_normalization_backward::desc d(dnnl::prop_kind::backward, data, data, kEps,
                                                 kScaleShift);
      dnnl::batch_normalization_backward::primitive_desc pd(d, MakeAttr(false), ctx.engine, hint);
      auto e = std::make_unique<Entry>();
      e->prim = dnnl::batch_normalization_backward(pd);
      memory::desc stat = Md({g.c}, Tag::x);
      e->Add(DNNL_ARG_SRC, ctx.engine, data, pd.src_desc(), false, kSlotNone);
      e->Add(DNNL_ARG_DIFF_DST, ctx.engine, data, pd.diff_dst_desc(), false, kSlotNone);
      e->Add(DNNL_ARG_SCALE, ctx.engine, stat, stat, false, kSlotNone);
      e->Add(DNNL_ARG_SHIFT, ctx.engine, stat, stat, false, kSlotNone);
      e->Add(DNNL_ARG_MEAN, ctx.engine, stat, pd.mean_desc(), false, kSlotNone);
      e->Add(DNNL_ARG_VARIANCE, ctx.engine, stat, pd.variance_desc(), false, kSlotNone);
      e->Add(DNNL_ARG_DIFF_SRC, ctx.engine, data, pd.diff_src_desc(), true, kSlotNone);
      e->Add(DNNL_ARG_DIFF_SCALE, ctx.engine, stat, stat, true, kSlotNone);
      e->Add(DNNL_ARG_DIFF_SHIFT, ctx.engine, stat, stat, true, kSlotNone);
      e->Finish(ctx.engine, pd);
      return e;
    });
    // Workspace for the reconstructed variance and for outputs not asked for
    // (the slots are distinct from those the entry's operands use).
    float* var = static_cast<float*>(ctx.slots[kSlotAux1].Get(4 * g.c * sizeof(float)));
    float* spare_dgamma = var + g.c;
    float* spare_dbeta = var + 2 * g.c;
    float* unused_shift = var + 3 * g.c;
    const float* inv_std = saved_inv_std.data<float>();
    for (int64_t c = 0; c < g.c; ++c) {
      const double s = inv_std[c];
      var[c] = static_cast<float>(1.0 / (s * s) - kEps);
    }
    void* dx_ptr = dx != nullptr ? Ptr(*dx) : ctx.slots[kSlotAux2].Get(x.nbytes());
    e.Run(ctx, {Ptr(x), Ptr(dy), Ptr(gamma), unused_shift, Ptr(saved_mean), var, dx_ptr,
                dgamma != nullptr ? Ptr(*dgamma) : spare_dgamma,
                dbeta != nullptr ? Ptr(*dbeta) : spare_dbeta});
  });
}

}  // namespace

DnnlCacheStats GetDnnlCacheStats() {
  DnnlCacheStats s;
  s.created = g_created.load(std::memory_order_relaxed);
  s.reused = g_reused.load(std::memory_order_relaxed);
  return s;
}

int64_t DnnlThreadCacheSize() { return static_cast<int64_t>(Context().cache.size()); }

void SetConvLayoutForTesting(ConvLayout layout) {
  g_conv_layout.store(static_cast<int>(layout), std::memory_order_relaxed);
}

ConvLayout ChooseConvLayout(ConvPass pass, int64_t n, int64_t c, int64_t h, int64_t w, int64_t o,
                            int64_t k, int stride) {
  // From the measurements at the top of this file.
  if (c < 4) {
    // First layer (LeNet conv1, ResNet stem): oneDNN's direct kernels read
    // nchw input here; gemm on plain buffers wins forward and backward-data,
    // the blocked kernel wins the weight gradient by 2-4x.
    return pass == ConvPass::kBackwardWeights ? ConvLayout::kBlocked : ConvLayout::kPlain;
  }
  if (c % 16 != 0 || o % 16 != 0) {
    // Channel counts that blocked layouts would pad to 16 (LeNet conv2:
    // 20 -> 32, 50 -> 64): nhwc kernels (brgconv forward) waste nothing.
    return ConvLayout::kChannelsLast;
  }
  if (k == 1) return ConvLayout::kPlain;  // 1x1 shortcut: gemm, no reorders
  return ConvLayout::kBlocked;
}

DT_REGISTER_KERNEL(conv2d, DeviceType::kCPU, Conv2dFn, DnnlConv2d);
DT_REGISTER_KERNEL(conv2d_backward_data, DeviceType::kCPU, Conv2dBackwardDataFn,
                   DnnlConv2dBackwardData);
DT_REGISTER_KERNEL(conv2d_backward_weights, DeviceType::kCPU, Conv2dBackwardWeightsFn,
                   DnnlConv2dBackwardWeights);
DT_REGISTER_KERNEL(linear, DeviceType::kCPU, LinearFn, DnnlLinear);
DT_REGISTER_KERNEL(linear_backward, DeviceType::kCPU, LinearBackwardFn, DnnlLinearBackward);
DT_REGISTER_KERNEL(matmul, DeviceType::kCPU, MatMulFn, DnnlMatMul);
DT_REGISTER_KERNEL(avg_pool2d, DeviceType::kCPU, AvgPool2dFn, DnnlAvgPool2d);
DT_REGISTER_KERNEL(avg_pool2d_backward, DeviceType::kCPU, AvgPool2dBackwardFn,
                   DnnlAvgPool2dBackward);
DT_REGISTER_KERNEL(batch_norm_train, DeviceType::kCPU, BatchNormTrainFn, DnnlBatchNormTrain);
DT_REGISTER_KERNEL(batch_norm_inference, DeviceType::kCPU, BatchNormInferenceFn,
                   DnnlBatchNormInference);
DT_REGISTER_KERNEL(batch_norm_backward, DeviceType::kCPU, BatchNormBackwardFn,
                   DnnlBatchNormBackward);

}  // namespace cpu
}  // namespace ops
}  // namespace dtrain
