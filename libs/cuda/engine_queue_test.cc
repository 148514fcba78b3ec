#include "libs/cuda/engine_queue.h"

#include <vector>

#include "gtest/gtest.h"
#include "libs/cuda/cuda_status.h"
#include "libs/engine/engine.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace cuda {
namespace {

TEST(EngineQueueTest, MissingDeviceIsAClearError) {
  std::string reason;
  int count = DeviceCount(&reason);
  absl::StatusOr<std::unique_ptr<engine::WorkQueue>> q = MakeStreamQueue(count);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(q.status().message().find("no CUDA device"), std::string::npos);
}

// Device ops pushed on the stream queue, a host op reading their result on a
// CPU queue: the host op must see the finished device work.
TEST(EngineQueueTest, DeviceWorkCompletesBeforeDependentHostOp) {
  std::string reason;
  if (DeviceCount(&reason) == 0) GTEST_SKIP() << "no CUDA device: " << reason;
  auto eng = engine::Engine::Create({});
  absl::StatusOr<std::unique_ptr<engine::WorkQueue>> q = MakeStreamQueue(0);
  ASSERT_TRUE(q.ok()) << q.status();
  engine::QueueId gpu = eng->AddQueue(*std::move(q));
  engine::QueueId cpu = eng->AddQueue("cpu", 1);
  engine::VarHandle vx = eng->NewVar("x"), vy = eng->NewVar("y");
  const int64_t n = 1 << 22;
  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 7) - 3.0f;
  Tensor x = *Tensor::FromVector(host, {n}).To(Device::Cuda(0));
  Tensor y;
  std::vector<float> seen;
  eng->Push(
      [&] {
        y = ops::Relu(x);
        for (int i = 0; i < 20; ++i) y = ops::Add(y, y);  // long enough to notice
        return absl::OkStatus();
      },
      {vx}, {vy}, gpu, "relu_and_adds");
  eng->Push(
      [&] {
        seen = y.ToVector<float>();
        return absl::OkStatus();
      },
      {vy}, {}, cpu, "read_back");
  ASSERT_TRUE(eng->WaitAll().ok());
  ASSERT_EQ(seen.size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 4099) {
    EXPECT_EQ(seen[i], std::max(host[i], 0.0f) * static_cast<float>(1 << 20)) << i;
  }
}

TEST(EngineQueueTest, ErrorsNameTheOperation) {
  std::string reason;
  if (DeviceCount(&reason) == 0) GTEST_SKIP() << "no CUDA device: " << reason;
  auto eng = engine::Engine::Create({});
  engine::QueueId gpu = eng->AddQueue(*MakeStreamQueue(0));
  engine::VarHandle v = eng->NewVar("v");
  eng->Push([] { return absl::InternalError("boom"); }, {}, {v}, gpu, "failing_launch");
  absl::Status s = eng->WaitToRead(v);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("failing_launch"), std::string::npos) << s;
}

}  // namespace
}  // namespace cuda
}  // namespace dtrain
