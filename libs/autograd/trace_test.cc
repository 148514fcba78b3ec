#include "libs/autograd/trace.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "libs/autograd/functions.h"

namespace dtrain {
namespace autograd {
namespace {

struct Recorded {
  std::string op;
  std::vector<const void*> inputs;
  const void* output;
  bool relu;
  Shape shape;
};

class RecordingTracer : public Tracer {
 public:
  void Record(const TraceEvent& e) override {
    Recorded r{e.op, {}, e.output->id(), e.relu, e.shape};
    for (int i = 0; i < e.num_inputs; ++i) r.inputs.push_back(e.inputs[i]->id());
    events.push_back(r);
  }
  std::vector<Recorded> events;
};

TEST(TraceTest, RecordsOpsInOrderWithVariableIdentities) {
  Variable x(Tensor::Full({2, 3}, 1.0f));
  Variable w(Tensor::Full({4, 3}, 0.5f), true);
  Variable b(Tensor::Zeros({4}), true);
  RecordingTracer tracer;
  Variable y, z;
  {
    TraceScope scope(&tracer);
    y = Linear(x, w, b, /*relu=*/true);
    z = Reshape(y, {-1});
  }
  Relu(z);  // after the scope: not recorded
  ASSERT_EQ(tracer.events.size(), 2u);
  EXPECT_EQ(tracer.events[0].op, "linear");
  EXPECT_TRUE(tracer.events[0].relu);
  EXPECT_EQ(tracer.events[0].inputs, (std::vector<const void*>{x.id(), w.id(), b.id()}));
  EXPECT_EQ(tracer.events[0].output, y.id());
  EXPECT_EQ(tracer.events[1].op, "reshape");
  EXPECT_EQ(tracer.events[1].inputs, (std::vector<const void*>{y.id()}));
  EXPECT_EQ(tracer.events[1].shape, (Shape{-1}));
  EXPECT_EQ(ActiveTracer(), nullptr);
}

TEST(TraceTest, ScopesNestAndRestore) {
  RecordingTracer outer, inner;
  Variable x(Tensor::Full({2}, 1.0f));
  {
    TraceScope a(&outer);
    Relu(x);
    {
      TraceScope b(&inner);
      Relu(x);
      Relu(x);
    }
    EXPECT_EQ(ActiveTracer(), &outer);
  }
  EXPECT_EQ(outer.events.size(), 1u);
  EXPECT_EQ(inner.events.size(), 2u);
}

TEST(TraceTest, BatchNormReportsRunningStatisticsInBothModes) {
  Variable x(Tensor::Full({4, 2}, 1.0f));
  Variable g(Tensor::Full({2}, 1.0f), true), b(Tensor::Zeros({2}), true);
  Tensor rm = Tensor::Zeros({2}), rv = Tensor::Full({2}, 1.0f);
  for (bool training : {false, true}) {
    const Tensor* seen[2] = {nullptr, nullptr};
    struct T : Tracer {
      const Tensor** seen;
      bool training = false;
      void Record(const TraceEvent& e) override {
        seen[0] = e.tensors[0];
        seen[1] = e.tensors[1];
        training = e.training;
      }
    } t;
    t.seen = seen;
    {
      TraceScope scope(&t);
      BatchNorm(x, g, b, &rm, &rv, training, 0.1f, 1e-5f);
    }
    EXPECT_EQ(seen[0], &rm);
    EXPECT_EQ(seen[1], &rv);
    EXPECT_EQ(t.training, training);
  }
}

}  // namespace
}  // namespace autograd
}  // namespace dtrain
