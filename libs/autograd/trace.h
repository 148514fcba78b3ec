// Tracing hook: lets a graph compiler (libs/graph) observe the operations of
// a model run through the imperative API.
//
//   class MyTracer : public autograd::Tracer {
//     void Record(const autograd::TraceEvent& e) override { ... }
//   };
//   MyTracer tracer;
//   {
//     autograd::TraceScope scope(&tracer);   // this thread only
//     Variable y = model->Forward(x);        // every op in functions.h reports here
//   }
//
// Each function in functions.h computes its result as usual and then, when a
// tracer is active on the calling thread, reports one TraceEvent: the op, its
// input Variables (identify them with Variable::id()), extra tensors (batch
// norm running statistics, labels), attributes and the result. When no tracer
// is active the cost is one thread-local pointer load per op.
//
// A tracer observes; it must not call functions.h itself (events would nest).
// Thread-safety: the active tracer is per thread.
#ifndef DTRAIN_LIBS_AUTOGRAD_TRACE_H_
#define DTRAIN_LIBS_AUTOGRAD_TRACE_H_

#include "libs/autograd/variable.h"
#include "libs/ops/ops.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace autograd {

// One operation as functions.h ran it. Pointers are valid during Record only.
struct TraceEvent {
  // The op: "conv2d", "linear", "matmul", "relu", "add", "avg_pool2d",
  // "max_pool2d", "global_avg_pool", "reshape", "batch_norm",
  // "softmax_cross_entropy" or "sum".
  const char* op = "";
  // Variable inputs in the function's argument order; an undefined Variable
  // stands for an absent optional input (no bias).
  const Variable* inputs[3] = {nullptr, nullptr, nullptr};
  int num_inputs = 0;
  // Tensor arguments: batch_norm's running_mean and running_var (mutated in
  // training mode), softmax_cross_entropy's labels (tensors[0]).
  const Tensor* tensors[2] = {nullptr, nullptr};
  // The result.
  const Variable* output = nullptr;

  // Attributes (the ones the op takes; the rest keep their defaults).
  ops::Conv2dParams conv;  // conv2d
  ops::Pool2dParams pool;  // avg_pool2d, max_pool2d
  bool relu = false;       // conv2d, linear: fused relu
  Shape shape;             // reshape: the requested shape (may hold -1)
  bool training = false;   // batch_norm
  float momentum = 0.0f;   // batch_norm
  float eps = 0.0f;        // batch_norm
};

class Tracer {
 public:
  virtual ~Tracer() = default;
  // Called after each op has computed its result.
  virtual void Record(const TraceEvent& event) = 0;
};

namespace internal {
// The calling thread's active tracer (null: not tracing). __thread rather
// than thread_local: a constant-initialized pointer needs no TLS wrapper call.
extern __thread Tracer* tls_tracer;
}  // namespace internal

// The calling thread's active tracer, or null.
inline Tracer* ActiveTracer() { return internal::tls_tracer; }

// Makes `tracer` the calling thread's active tracer for the scope's lifetime
// (restoring the previous one afterwards). `tracer` may be null (pauses
// tracing).
class TraceScope {
 public:
  explicit TraceScope(Tracer* tracer) : prev_(internal::tls_tracer) {
    internal::tls_tracer = tracer;
  }
  ~TraceScope() { internal::tls_tracer = prev_; }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Tracer* prev_;
};

}  // namespace autograd
}  // namespace dtrain

#endif  // DTRAIN_LIBS_AUTOGRAD_TRACE_H_
