// The CUDA runtime layer: device choice, backend registration, the caching
// allocator on a real device, streams and events, pinned memory and copies
// (including a host-to-device copy overlapping compute). Tests that need a
// GPU skip with the reason on machines without one.
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "libs/cuda/backend.h"
#include "libs/cuda/copy.h"
#include "libs/cuda/device_allocator.h"
#include "libs/cuda/devices.h"
#include "libs/cuda/gpu_test_util.h"
#include "libs/cuda/kernels.h"
#include "libs/cuda/stream.h"
#include "libs/ops/ops.h"
#include "libs/ops/registry.h"

namespace dtrain {
namespace cuda {
namespace {

using Clock = std::chrono::steady_clock;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- everywhere ----

TEST(ChooseDevicesTest, AutoUsesEveryGpuOrFallsBackToCpu) {
  std::string reason;
  const int count = DeviceCount(&reason);
  ::testing::internal::CaptureStderr();
  absl::StatusOr<std::vector<Device>> d = ChooseDevices("auto");
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(d.ok()) << d.status();
  if (count == 0) {
    EXPECT_EQ(*d, std::vector<Device>{Device::Cpu()});
    EXPECT_TRUE(Contains(log, "devices: cpu (no CUDA device: ")) << log;
  } else {
    ASSERT_EQ(d->size(), static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) EXPECT_EQ((*d)[i], Device::Cuda(i));
    EXPECT_TRUE(Contains(log, "devices: cuda:0")) << log;
  }
  absl::StatusOr<std::vector<Device>> empty = ChooseDevices("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, *d);
}

TEST(ChooseDevicesTest, ExplicitRequests) {
  absl::StatusOr<std::vector<Device>> cpu = ChooseDevices("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, std::vector<Device>{Device::Cpu()});
  absl::StatusOr<std::vector<Device>> cpus = ChooseDevices("cpu:0, cpu:1");
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(*cpus, (std::vector<Device>{Device::Cpu(0), Device::Cpu(1)}));

  struct Bad {
    const char* request;
    absl::StatusCode code;
    const char* says;
  };
  for (const Bad& b :
       {Bad{"cuda:0,cuda:0", absl::StatusCode::kInvalidArgument, "listed twice"},
        Bad{"cpu,cuda:0", absl::StatusCode::kInvalidArgument, "mixing CPU and CUDA"},
        Bad{"gpu", absl::StatusCode::kInvalidArgument, "bad device 'gpu'"},
        Bad{"cuda:63", absl::StatusCode::kFailedPrecondition, "cuda:63 does not exist"}}) {
    SCOPED_TRACE(b.request);
    absl::StatusOr<std::vector<Device>> d = ChooseDevices(b.request);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), b.code) << d.status();
    EXPECT_TRUE(Contains(std::string(d.status().message()), b.says)) << d.status();
  }
}

TEST(ChooseDevicesTest, CudaWithoutAGpuIsAnError) {
  std::string reason;
  if (DeviceCount(&reason) > 0) GTEST_SKIP() << "this machine has a GPU";
  absl::StatusOr<std::vector<Device>> d = ChooseDevices("cuda");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(d.status().message()), "no CUDA device")) << d.status();
}

TEST(BackendTest, EveryOpHasACudaKernel) {
  std::set<std::string> cpu, cuda;
  for (const ops::KernelInfo& k : ops::KernelRegistry::Global().List()) {
    (k.device == DeviceType::kCPU ? cpu : cuda).insert(k.op);
  }
  EXPECT_GE(cpu.size(), 29u);
  for (const std::string& op : cpu) EXPECT_TRUE(cuda.count(op)) << "no CUDA kernel for " << op;
}

TEST(BackendTest, WithoutAGpuCudaTensorsFailCleanlyAndCpuStillWorks) {
  std::string reason;
  if (DeviceCount(&reason) > 0) GTEST_SKIP() << "this machine has a GPU";
  absl::StatusOr<Tensor> t = Tensor::TryEmpty({4}, DType::kF32, Device::Cuda(0));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(t.status().message()), "not available")) << t.status();
  Tensor x = Tensor::FromVector<float>({-1, 2, -3, 4}, {4});
  EXPECT_EQ(ops::Relu(x).ToVector<float>(), (std::vector<float>{0, 2, 0, 4}));
}

// ---- with a GPU ----

class GpuRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { DT_SKIP_WITHOUT_GPU(); }
};

TEST_F(GpuRuntimeTest, AllocatorReusesMemoryAcrossSteps) {
  auto step = [] {
    std::vector<Tensor> held;
    for (int64_t n : {1000, 256 * 64 * 28 * 28, 7, 100000}) {
      held.push_back(Tensor::Empty({n}, DType::kF32, Device::Cuda(0)));
    }
  };
  step();
  const CachingAllocatorStats before = DeviceMemoryStats(0);
  for (int i = 0; i < 5; ++i) step();
  const CachingAllocatorStats after = DeviceMemoryStats(0);
  EXPECT_EQ(after.num_backend_mallocs, before.num_backend_mallocs)
      << "steps with the same shapes must be served from the cache";
  EXPECT_EQ(after.num_cache_hits - before.num_cache_hits, 20);
  absl::StatusOr<Allocator*> a = GetAllocator(Device::Cuda(0));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->device(), Device::Cuda(0));
  EXPECT_GE((*a)->stats().bytes_cached, 256 * 64 * 28 * 28 * 4);
}

TEST_F(GpuRuntimeTest, OutOfMemoryIsAClearError) {
  absl::StatusOr<Tensor> t =
      Tensor::TryEmpty({int64_t{1} << 48}, DType::kF32, Device::Cuda(0));  // 1 PiB
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
  const std::string msg(t.status().message());
  EXPECT_TRUE(Contains(msg, "cuda:0: out of memory allocating 1125899906842624 bytes")) << msg;
  EXPECT_TRUE(Contains(msg, "in use by tensors")) << msg;
  EXPECT_TRUE(Contains(msg, "cuda:0 reports")) << msg;
  // The device is still usable.
  Tensor ok = Tensor::Full({3}, 2.0f, DType::kF32, Device::Cuda(0));
  EXPECT_EQ(ok.ToVector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST_F(GpuRuntimeTest, StreamsEventsAndTheCurrentStream) {
  absl::StatusOr<std::unique_ptr<CudaStream>> s = CudaStream::Create(0);
  ASSERT_TRUE(s.ok()) << s.status();
  Stream* def = CurrentStream(0);
  ASSERT_NE(def, nullptr);
  EXPECT_EQ(def, DefaultStream(Device::Cuda(0)));
  {
    StreamGuard g(s->get());
    EXPECT_EQ(CurrentStream(0), s->get());
    EXPECT_EQ(CurrentCudaStream(0), (*s)->get());
  }
  EXPECT_EQ(CurrentStream(0), def);

  auto start = CudaEvent::Create(0, /*timing=*/true);
  auto end = CudaEvent::Create(0, /*timing=*/true);
  ASSERT_TRUE(start.ok() && end.ok());
  ASSERT_TRUE((*start)->Record((*s)->get()).ok());
  ASSERT_EQ(kernels::Spin(50'000'000, (*s)->get()), cudaSuccess);  // 50 ms
  ASSERT_TRUE((*end)->Record((*s)->get()).ok());
  absl::StatusOr<bool> done = (*end)->Query();
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done) << "the spin kernel cannot have finished yet";
  // Another stream waits for it.
  ASSERT_TRUE(static_cast<CudaStream*>(def)->Wait(s->get()).ok());
  ASSERT_TRUE(def->Synchronize().ok());
  done = (*end)->Query();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  absl::StatusOr<float> ms = CudaEvent::ElapsedMs(**start, **end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 45.0f);
}

TEST_F(GpuRuntimeTest, CopiesRoundTrip) {
  for (int64_t n : {0, 1, 1000, 1 << 20}) {
    SCOPED_TRACE(n);
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f - 3.0f;
    Tensor host = Tensor::FromVector(v, {n});
    absl::StatusOr<Tensor> dev = host.To(Device::Cuda(0));
    ASSERT_TRUE(dev.ok()) << dev.status();
    Tensor dev2 = dev->Clone();  // device to device
    EXPECT_EQ(dev2.ToVector<float>(), v);
    absl::StatusOr<Tensor> back = dev2.To(Device::Cpu());
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->ToVector<float>(), v);
  }
}

TEST_F(GpuRuntimeTest, PinnedBuffersAreReusedOnlyAfterTheirCopies) {
  absl::StatusOr<std::unique_ptr<CudaStream>> s = CudaStream::Create(0);
  ASSERT_TRUE(s.ok());
  void* first = nullptr;
  {
    absl::StatusOr<PinnedBuffer> b = PinnedBuffer::Allocate(1 << 20);
    ASSERT_TRUE(b.ok()) << b.status();
    first = b->data();
    ASSERT_EQ(kernels::Spin(200'000'000, (*s)->get()), cudaSuccess);
    b->RecordStream(s->get());  // "a copy on s uses it"
  }
  absl::StatusOr<PinnedBuffer> c = PinnedBuffer::Allocate(1 << 20);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->data(), first) << "reused while the stream may still copy from it";
  ASSERT_TRUE((*s)->Synchronize().ok());
  absl::StatusOr<PinnedBuffer> d = PinnedBuffer::Allocate(1 << 20);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->data(), first);
}

TEST_F(GpuRuntimeTest, RecordStreamKeepsDeviceMemoryUntilTheOtherStreamIsDone) {
  absl::StatusOr<std::unique_ptr<CudaStream>> side = CudaStream::Create(0);
  ASSERT_TRUE(side.ok());
  void* old = nullptr;
  {
    Tensor t = Tensor::Empty({1 << 18}, DType::kF32, Device::Cuda(0));
    old = t.raw_data();
    ASSERT_EQ(kernels::Spin(200'000'000, (*side)->get()), cudaSuccess);
    RecordStream(t, side->get());
  }
  Tensor u = Tensor::Empty({1 << 18}, DType::kF32, Device::Cuda(0));
  EXPECT_NE(u.raw_data(), old);
  ASSERT_TRUE((*side)->Synchronize().ok());
  Tensor w = Tensor::Empty({1 << 18}, DType::kF32, Device::Cuda(0));
  EXPECT_EQ(w.raw_data(), old);
}

TEST_F(GpuRuntimeTest, HostToDeviceCopiesOverlapCompute) {
  absl::StatusOr<std::unique_ptr<HostToDeviceCopier>> copier = HostToDeviceCopier::Create(0);
  ASSERT_TRUE(copier.ok()) << copier.status();
  const int64_t n = 16 << 20;  // 64 MiB
  Tensor host = Tensor::Empty({n});
  float* h = host.data<float>();
  for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>(i % 1000);
  Stream* compute = CurrentStream(0);
  // Warm up the copy path (pinned allocation, first-use costs).
  ASSERT_TRUE((*copier)->Copy(host).ok());
  ASSERT_TRUE(compute->Synchronize().ok());

  ASSERT_EQ(kernels::Spin(500'000'000, NativeStream(compute)), cudaSuccess);  // 0.5 s busy
  const auto t0 = Clock::now();
  absl::StatusOr<Tensor> dev = (*copier)->Copy(host, compute);
  ASSERT_TRUE(dev.ok()) << dev.status();
  bool idle = false;
  while (Clock::now() - t0 < std::chrono::milliseconds(400)) {
    absl::StatusOr<bool> i = (*copier)->Idle();
    ASSERT_TRUE(i.ok());
    if (*i) {
      idle = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(idle) << "the copy did not finish while compute was busy";
  EXPECT_EQ(cudaStreamQuery(NativeStream(compute)), cudaErrorNotReady)
      << "compute finished early; the test proves nothing";
  cudaGetLastError();
  std::vector<float> got = dev->ToVector<float>();  // waits on the compute stream
  ASSERT_EQ(static_cast<int64_t>(got.size()), n);
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(got[i], static_cast<float>(i % 1000)) << i;
}

TEST(MultiGpuRuntimeTest, PeerCopy) {
  DT_SKIP_WITHOUT_GPUS(2);
  Tensor a = Tensor::FromVector<float>({1, 2, 3}, {3}, Device::Cuda(0));
  absl::StatusOr<Tensor> b = a.To(Device::Cuda(1));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->ToVector<float>(), (std::vector<float>{1, 2, 3}));
}

}  // namespace
}  // namespace cuda
}  // namespace dtrain
