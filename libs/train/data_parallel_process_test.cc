// 2 trainer processes x 2 CPU devices each, synchronized by TCP allreduce
// through libs/collective, end with the same parameters as one device on the
// same global batch. The trainers are real processes (this binary
// re-executed with DP_TRAINER_RANK set) that meet through a FileStore in
// TEST_TMPDIR. Re-executing, rather than forking a process that already ran
// OpenMP code, keeps the children free of the parent's thread-pool state.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/train/data_parallel.h"
#include "libs/train/dp_test_util.h"

namespace dtrain {
namespace train {

constexpr int kTrainers = 2;
constexpr int64_t kGlobalBatch = 32;
constexpr int kSteps = 20;

std::string Dir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d ? d : "/tmp";
}

// Runs one trainer; writes its final parameters to a file. Returns an exit code.
int RunTrainer(int rank, const std::string& model, const std::string& store_dir) {
  collective::FileStore store(store_dir);
  collective::CommunicatorOptions co;
  co.transport = collective::TransportKind::kTcp;
  co.timeout = absl::Seconds(60);
  auto comm = collective::Communicator::Create(rank, kTrainers, &store, co);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(comm.status().message()).c_str());
    return 10;
  }
  DataParallelOptions o;
  o.model = model;
  o.devices = {Device::Cpu(0), Device::Cpu(1)};
  o.sgd = {.lr = testing::kLr, .momentum = testing::kMomentum};
  o.init = testing::kInit;
  o.seed = rank == 0 ? 11 : 999;  // rank 0's weights must win the broadcast
  o.bucket_bytes = 64 << 10;
  o.communicator = comm->get();
  auto trainer = DataParallelTrainer::Create(o);
  if (!trainer.ok()) return 11;
  int64_t share = kGlobalBatch / kTrainers;
  for (int s = 0; s < kSteps; ++s) {
    Tensor x, y;
    testing::SyntheticBatch(kGlobalBatch, s, &x, &y);
    absl::StatusOr<float> loss =
        (*trainer)->Step(x.Slice(rank * share, (rank + 1) * share).Clone(),
                         y.Slice(rank * share, (rank + 1) * share).Clone());
    if (!loss.ok()) {
      std::fprintf(stderr, "rank %d step %d: %s\n", rank, s,
                   std::string(loss.status().message()).c_str());
      return 12;
    }
  }
  std::ofstream out(store_dir + "/params." + std::to_string(rank), std::ios::binary);
  for (auto& [name, p] : (*trainer)->replica(1)->NamedParameters()) {
    std::vector<float> v = p.value().ToVector<float>();
    out.write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  return out.good() ? 0 : 13;
}

namespace {

void CheckTwoTrainers(const std::string& model) {
  std::string dir = Dir() + "/dp_" + model;
  ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  pid_t pids[kTrainers];
  for (int r = 0; r < kTrainers; ++r) {
    pids[r] = fork();
    ASSERT_GE(pids[r], 0);
    if (pids[r] == 0) {
      std::string rank = std::to_string(r);
      setenv("DP_TRAINER_RANK", rank.c_str(), 1);
      setenv("DP_TRAINER_MODEL", model.c_str(), 1);
      setenv("DP_TRAINER_DIR", dir.c_str(), 1);
      execl("/proc/self/exe", "data_parallel_process_test", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  auto want = testing::ReferenceRun(model, kGlobalBatch, kSteps, 11);
  for (int r = 0; r < kTrainers; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "trainer " << r << " exit status " << status;
    std::ifstream in(dir + "/params." + std::to_string(r), std::ios::binary);
    std::vector<std::vector<float>> got;
    for (const auto& w : want) {
      std::vector<float> v(w.size());
      in.read(reinterpret_cast<char*>(v.data()), v.size() * sizeof(float));
      got.push_back(v);
    }
    ASSERT_TRUE(in.good()) << "short parameter file from trainer " << r;
    EXPECT_LT(testing::MaxRelativeDifference(got, want), 1e-5) << model << " trainer " << r;
  }
}

TEST(DataParallelProcessTest, TwoTrainersTimesTwoDevicesMlp) { CheckTwoTrainers("mlp"); }
TEST(DataParallelProcessTest, TwoTrainersTimesTwoDevicesLeNet) { CheckTwoTrainers("lenet"); }

}  // namespace
}  // namespace train
}  // namespace dtrain

int main(int argc, char** argv) {
  if (const char* rank = std::getenv("DP_TRAINER_RANK")) {
    return dtrain::train::RunTrainer(std::atoi(rank), std::getenv("DP_TRAINER_MODEL"),
                                     std::getenv("DP_TRAINER_DIR"));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
