// End to end on a GPU: recovery in place of a CUDA job. Skips on a machine
// without a CUDA device, naming the reason (CI); the day a GPU machine with
// Bazel and the Fashion-MNIST package runs it, it is the must-show
// for CUDA. `trainctl cluster up` starts the scheduler (heartbeat timeout
// 3 s) and one CPU trainer (whose certificate the GPU trainers borrow); the
// test starts three GPU trainers: on three GPUs one each with NCCL
// between them, on fewer all on cuda:0 with the TCP collective (host
// staging). A two-trainer LeNet job (device_kind cuda, momentum) runs; rank
// 0's trainer is SIGKILLed mid-epoch: the survivor keeps its device-resident
// state (its NCCL communicator aborted by its agent when the scheduler
// offers the new membership), the third trainer joins in the lost rank's
// place and receives the state through host memory. The job must SUCCEED
// on attempt 1 with at least one recovery. The job trains on 12,800 images
// (100 steps an epoch); DTRAIN_E2E_DATA_DIR, when set, names the
// Fashion-MNIST directory (tools/gpu-check's bundle carries a slice of it).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/subprocess.h"
#include "libs/cuda/cuda_status.h"
#include "protos/scheduler.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

class RecoverCudaE2eTest : public ClusterTest {
 protected:
  void TearDown() override {
    for (auto& t : gpu_trainers_) {
      t->Signal(SIGKILL).IgnoreError();
      t->Wait(absl::Seconds(10)).status().IgnoreError();
    }
    ClusterTest::TearDown();
  }

  // Trainer id (from "registered as <id>;" in its log) -> the GPU trainer.
  std::map<std::string, Subprocess*> GpuTrainerIds() {
    std::map<std::string, Subprocess*> out;
    for (size_t i = 0; i < gpu_trainers_.size(); ++i) {
      std::ifstream log(absl::StrCat(dir(), "/gpu-", i, ".log"));
      std::stringstream text;
      text << log.rdbuf();
      const std::string t = text.str();
      const std::string key = "registered as ";
      for (size_t at = t.find(key); at != std::string::npos; at = t.find(key, at + 1)) {
        const size_t end = t.find(';', at);
        out[t.substr(at + key.size(), end - at - key.size())] = gpu_trainers_[i].get();
      }
    }
    return out;
  }

  std::vector<std::unique_ptr<Subprocess>> gpu_trainers_;
};

TEST_F(RecoverCudaE2eTest, KilledTrainerOfACudaJobIsReplacedInPlace) {
  std::string reason;
  const int gpus = cuda::DeviceCount(&reason);
  if (gpus == 0) GTEST_SKIP() << "no CUDA device (" << reason << "): test needs a GPU";
  const bool nccl = gpus >= 3;
  const char* data_dir = std::getenv("DTRAIN_E2E_DATA_DIR");
  ASSERT_NO_FATAL_FAILURE(Up({.name = "recover_cuda", .trainers = 1, .heartbeat_timeout_s = 3}));
  const std::string scheduler = this->scheduler();
  std::vector<ClusterProcess> cpu_trainers = cluster_->Processes("trainer");
  ASSERT_EQ(cpu_trainers.size(), 1u) << cluster_->up_output();
  const std::string cert_name = cpu_trainers[0].name;
  for (int i = 0; i < 3; ++i) {
    SubprocessOptions o;
    o.argv = {Runfile("services/trainer/trainer"),
              "--scheduler=" + scheduler,
              absl::StrCat("--name=gpu-", i),
              absl::StrCat("--devices=cuda:", nccl ? i : 0),
              absl::StrCat("--cuda_collective=", nccl ? "nccl" : "tcp"),
              absl::StrCat("--work_dir=", dir(), "/gpu-", i),
              absl::StrCat("--checkpoint_dir=", dir(), "/checkpoints"),
              "--collective_host=127.0.0.1",
              absl::StrCat("--ca=", dir(), "/certs/ca.pem"),
              absl::StrCat("--cert=", dir(), "/certs/", cert_name, ".pem"),
              absl::StrCat("--key=", dir(), "/certs/", cert_name, ".key")};
    if (data_dir != nullptr) o.argv.push_back(absl::StrCat("--data_roots=", data_dir));
    o.output_file = absl::StrCat(dir(), "/gpu-", i, ".log");
    absl::StatusOr<std::unique_ptr<Subprocess>> t = Subprocess::Start(o);
    ASSERT_TRUE(t.ok()) << t.status();
    gpu_trainers_.push_back(*std::move(t));
  }
  v1::SubmitRequest r;
  v1::JobSpec* s = r.mutable_spec();
  s->set_name("cuda-disturbed");
  s->set_model("lenet");
  s->set_epochs(3);
  s->set_global_batch_size(128);
  s->set_lr(0.05);
  s->set_momentum(0.9);  // the state sent to the replacement includes momentum
  s->set_init("kaiming");
  s->set_seed(3);
  s->set_train_limit(12800);
  s->set_test_limit(2000);
  if (data_dir != nullptr) s->set_data_dir(data_dir);
  s->set_threads(1);
  s->set_num_trainers(2);
  s->set_device_kind("cuda");
  s->set_checkpoint_interval_epochs(1);
  const v1::JobStatus submitted = Submit(r);
  ASSERT_FALSE(submitted.id().empty());
  // Mid-epoch 2 or 3 (100 steps an epoch).
  absl::StatusOr<v1::JobStatus> mid =
      cluster_->WaitMidEpoch(submitted.id(), {.first_epoch = 2,
                                              .last_epoch = 3,
                                              .min_step = 20,
                                              .min_steps_left = 20,
                                              .timeout = absl::Seconds(240)});
  ASSERT_TRUE(mid.ok()) << mid.status();
  const v1::JobStatus job = *mid;
  ASSERT_EQ(job.trainers_size(), 2);
  std::map<std::string, Subprocess*> ids = GpuTrainerIds();
  auto victim = ids.find(job.trainers(0));
  ASSERT_NE(victim, ids.end()) << job.trainers(0);
  std::fprintf(stderr, "cuda (%s): killing rank 0 (%s) at epoch %d step %lld\n",
               nccl ? "nccl" : "tcp", victim->first.c_str(), job.epoch() + 1,
               static_cast<long long>(job.step()));
  ASSERT_TRUE(victim->second->Signal(SIGKILL).ok());
  const absl::Time killed = absl::Now();

  absl::StatusOr<v1::JobStatus> done = cluster_->WatchToEnd(job.id(), absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status();
  std::fprintf(stderr,
               "cuda: %s in %s after the kill, attempts %d, recoveries %d, last recovery %.2f s, "
               "steps lost %lld, test accuracy %.4f\n",
               v1::JobState_Name(done->state()).c_str(),
               absl::FormatDuration(absl::Now() - killed).c_str(), done->attempts(),
               done->recoveries(), done->last_recovery_seconds(),
               static_cast<long long>(done->steps_lost()), done->test_accuracy());
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->DebugString();
  EXPECT_EQ(done->attempts(), 1) << done->DebugString();
  EXPECT_GE(done->recoveries(), 1) << done->DebugString();
  EXPECT_GE(done->generation(), 1);
  EXPECT_GT(done->last_recovery_seconds(), 0);
  EXPECT_EQ(done->epoch(), 3);
  ASSERT_EQ(done->trainers_size(), 2);
  EXPECT_NE(done->trainers(0), victim->first);
  EXPECT_EQ(done->trainers(1), job.trainers(1));
  EXPECT_GT(done->test_accuracy(), 0.6) << done->DebugString();
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
