// End to end: your own data (docs/data.md) on a `trainctl cluster up`
// cluster (mutual TLS, trainers with --data_roots=/usr/share/datasets and the
// test's directory).
//
// Formats: the test writes the first 12,288 + 1,000 Fashion-MNIST images as
// .npy arrays and packs them with `trainctl data pack` into WebDataset PNG
// shards (both keep the IDX order). The same 2-trainer LeNet job (momentum,
// ALLREDUCE, 3 epochs of 96 steps) on IDX, WebDataset and npy: every epoch's
// loss, training accuracy and test accuracy (rank 0's "epoch E/N loss ..."
// trainer log lines, printed with every bit) equal the IDX run's bit for bit.
// Then the WebDataset job again with rank 0's trainer SIGKILLed mid-epoch:
// the spare takes its place in the same attempt (recovery in place) and
// trains the same model as the IDX run, bit for bit (two ranks: the
// allreduce's sum does not depend on the order; the replacement gets the
// state and the data position): every epoch's loss, training accuracy and
// test accuracy equal the IDX run's, the epoch of the kill's too (every
// step sums its statistics over the ranks, so the survivor's running sums
// hold the killed rank's share, and the replacement receives them).
//
// Bad input: on one trainer, jobs whose data is missing, outside the
// trainer's --data_roots, labelled beyond num_classes, a corrupt PNG, a
// decompression bomb or a tar with a '../' member each FAIL on their first
// attempt within seconds, the reason naming the problem; the same trainer
// process then trains a job on the corrupt folder with skip_corrupt: the
// job's status, `trainctl get`, `-o json get` and the trainer's
// dtrain_trainer_data_corrupt_skipped show the dataset's sizes and the
// images left out.
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/image.h"
#include "libs/data/pack.h"
#include "libs/data/tar.h"
#include "protos/scheduler.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

constexpr int64_t kTrain = 12288;  // 96 steps of 128 an epoch
constexpr int64_t kTest = 1000;
constexpr int kEpochs = 3;

// One epoch as rank 0's trainer logged it (libs/agent: "job J rank 0: epoch
// E/N loss L train_accuracy A test_accuracy T", %.17g).
struct Epoch {
  double loss = 0, train_accuracy = 0, test_accuracy = 0;
};

// Every epoch of job `id` in the cluster's trainer logs, by epoch number
// (a recovered job's rank 0 may have moved to another trainer).
std::map<int, Epoch> LoggedEpochs(const std::string& dir, const std::string& id) {
  std::map<int, Epoch> out;
  for (const std::string& line : TrainerLogLines(dir, {"job " + id + " rank 0: epoch "})) {
    const std::string tail = line.substr(line.find(" rank 0: epoch ") + 15);
    std::vector<std::string> w = absl::StrSplit(tail, ' ');
    int epoch = 0;
    Epoch e;
    if (w.size() < 7 || w[1] != "loss" || w[3] != "train_accuracy" || w[5] != "test_accuracy" ||
        !absl::SimpleAtoi(w[0].substr(0, w[0].find('/')), &epoch) ||
        !absl::SimpleAtod(w[2], &e.loss) || !absl::SimpleAtod(w[4], &e.train_accuracy) ||
        !absl::SimpleAtod(w[6], &e.test_accuracy)) {
      ADD_FAILURE() << "unexpected epoch line: " << line;
      continue;
    }
    EXPECT_EQ(out.count(epoch), 0u) << "epoch " << epoch << " logged twice: " << line;
    out[epoch] = e;
  }
  return out;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every epoch's figures bit for bit.
void ExpectSameEpochs(const std::map<int, Epoch>& got, const std::map<int, Epoch>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), static_cast<size_t>(kEpochs)) << what;
  ASSERT_EQ(want.size(), static_cast<size_t>(kEpochs)) << what;
  for (const auto& [epoch, w] : want) {
    const Epoch& g = got.at(epoch);
    EXPECT_TRUE(SameBits(g.test_accuracy, w.test_accuracy))
        << what << " epoch " << epoch << ": test accuracy " << g.test_accuracy << " vs "
        << w.test_accuracy;
    EXPECT_TRUE(SameBits(g.loss, w.loss))
        << what << " epoch " << epoch << ": loss " << g.loss << " vs " << w.loss;
    EXPECT_TRUE(SameBits(g.train_accuracy, w.train_accuracy))
        << what << " epoch " << epoch << ": train accuracy " << g.train_accuracy << " vs "
        << w.train_accuracy;
  }
}

v1::DataSpec Fmnist(const std::string& format, const std::string& train, const std::string& test) {
  v1::DataSpec d;
  d.set_format(format);
  d.set_train(train);
  d.set_test(test);
  d.set_channels(1);
  d.set_height(28);
  d.set_width(28);
  d.set_num_classes(10);
  return d;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

class DataE2eTest : public ClusterTest {
 protected:
  // The test's data directory (under the trainers' --data_roots).
  std::string Root() {
    static const std::string root = TmpDir("data");
    return root;
  }

  void Up(int trainers, double heartbeat_timeout_s = 0) {
    ClusterTest::Up({.trainers = trainers,
                     .heartbeat_timeout_s = heartbeat_timeout_s,
                     .flags = "--data_roots=/usr/share/datasets," + Root()});
  }

  // The first n images of Fashion-MNIST's `split`.
  static data::Dataset FashionMnist(data::Split split, int64_t n) {
    absl::StatusOr<data::Dataset> d = data::LoadFashionMnist(data::kDefaultFashionMnistDir, split);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? data::Subset(*d, n) : data::Dataset{};
  }

  // Submits `r`, waits for its end; the final status.
  JobStatus Run(const v1::SubmitRequest& r, absl::Duration timeout = absl::Seconds(300)) {
    JobStatus job = Submit(r);
    if (job.id().empty()) return job;
    return WatchToEnd(job.id(), timeout);
  }
};

TEST_F(DataE2eTest, WebDatasetAndNpyTrainBitForBitAsIdxAlsoAfterARecoveryInPlace) {
  // Fashion-MNIST as .npy (the library's writer) and as WebDataset shards
  // (`trainctl data pack` of the .npy job file).
  const std::string npy_train = Root() + "/npy-train", npy_test = Root() + "/npy-test";
  ASSERT_TRUE(data::WriteNpyDataset(FashionMnist(data::Split::kTrain, kTrain), npy_train).ok());
  ASSERT_TRUE(data::WriteNpyDataset(FashionMnist(data::Split::kTest, kTest), npy_test).ok());
  const std::string job_file = Root() + "/npy-job.yaml";
  WriteFile(job_file, absl::StrCat("name: npy\ndata:\n  format: npy\n  train: ", npy_train,
                                   "\n  test: ", npy_test, "\n"));
  int rc = -1;
  const std::string packed =
      Trainctl(absl::StrCat("data pack --format=webdataset --shard_size=2048 ", job_file, " ",
                            Root(), "/wds"),
               &rc);
  ASSERT_EQ(rc, 0) << packed;
  const std::string wds_train = Root() + "/wds/train-{000000..000005}.tar";
  const std::string wds_test = Root() + "/wds/test-{000000..000000}.tar";
  EXPECT_NE(packed.find("train: 12288 samples in 6 shards: " + wds_train), std::string::npos)
      << packed;
  EXPECT_NE(packed.find("test: 1000 samples in 1 shards: " + wds_test), std::string::npos)
      << packed;

  // Three trainers: two for the job, a spare for the recovery.
  ASSERT_NO_FATAL_FAILURE(Up(/*trainers=*/3, /*heartbeat_timeout_s=*/3));
  auto job = [&](const std::string& name, const v1::DataSpec* data) {
    v1::SubmitRequest r = MomentumLenetJob(name, kEpochs, kTrain);
    r.mutable_spec()->set_test_limit(kTest);
    if (data != nullptr) *r.mutable_spec()->mutable_data() = *data;
    return r;
  };
  const v1::DataSpec wds = Fmnist("webdataset", wds_train, wds_test);
  const v1::DataSpec npy = Fmnist("npy", npy_train, npy_test);

  std::map<std::string, std::map<int, Epoch>> runs;
  for (const auto& [name, spec] : std::vector<std::pair<std::string, const v1::DataSpec*>>{
           {"idx", nullptr}, {"webdataset", &wds}, {"npy", &npy}}) {
    const absl::Time start = absl::Now();
    const JobStatus done = Run(job(name, spec));
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
    EXPECT_EQ(done.data_train_samples(), kTrain);
    EXPECT_EQ(done.data_test_samples(), kTest);
    runs[name] = LoggedEpochs(dir(), done.id());
    std::fprintf(stderr, "%s: %s in %s, loss %.17g, test accuracy %.4f\n", name.c_str(),
                 done.id().c_str(), absl::FormatDuration(absl::Now() - start).c_str(), done.loss(),
                 done.test_accuracy());
    // The final status carries the last epoch's figures.
    ASSERT_EQ(runs[name].count(kEpochs), 1u);
    EXPECT_TRUE(SameBits(done.loss(), runs[name][kEpochs].loss));
    EXPECT_TRUE(SameBits(done.test_accuracy(), runs[name][kEpochs].test_accuracy));
  }
  ExpectSameEpochs(runs["webdataset"], runs["idx"], "webdataset");
  ExpectSameEpochs(runs["npy"], runs["idx"], "npy");
  // It learned (equal figures are not those of two broken runs).
  EXPECT_LT(runs["idx"][kEpochs].loss, runs["idx"][1].loss);
  EXPECT_GT(runs["idx"][kEpochs].test_accuracy, 0.7);

  // WebDataset again; rank 0's trainer SIGKILLed in the middle of an epoch.
  JobStatus running = Submit(job("webdataset-killed", &wds));
  ASSERT_FALSE(running.id().empty());
  // (Epoch 2 or 3: an idle machine runs an epoch in about 2 s, and rank 0
  // reports once a second.)
  running = WaitMidEpoch(running.id(), {.first_epoch = 2,
                                        .last_epoch = 3,
                                        .min_step = 10,
                                        .min_steps_left = 10,
                                        .timeout = absl::Seconds(120)});
  ASSERT_EQ(running.state(), v1::RUNNING) << running.DebugString();
  ASSERT_EQ(running.trainers_size(), 2);
  const std::map<std::string, int> pids = TrainerPids();
  auto victim = pids.find(running.trainers(0));
  ASSERT_NE(victim, pids.end()) << running.trainers(0);
  std::fprintf(stderr, "killing rank 0 (%s, pid %d) at epoch %d step %lld\n", victim->first.c_str(),
               victim->second, running.epoch() + 1, static_cast<long long>(running.step()));
  ASSERT_EQ(kill(victim->second, SIGKILL), 0);
  const JobStatus done = WatchToEnd(running.id(), absl::Seconds(300));
  std::fprintf(stderr,
               "killed: %s, attempts %d, recoveries %d, steps lost %lld, loss %.17g, test "
               "accuracy %.4f\n",
               v1::JobState_Name(done.state()).c_str(), done.attempts(), done.recoveries(),
               static_cast<long long>(done.steps_lost()), done.loss(), done.test_accuracy());
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.attempts(), 1) << done.DebugString();
  EXPECT_EQ(done.recoveries(), 1) << done.DebugString();
  ASSERT_EQ(done.trainers_size(), 2);
  EXPECT_NE(done.trainers(0), victim->first);  // rank 0 moved to the spare
  EXPECT_EQ(done.trainers(1), running.trainers(1));
  EXPECT_EQ(TrainerLogLines(dir(), {"job " + done.id() + " rank", "resumed from"}).size(), 0u);
  // The same model and the same statistics: every epoch bit for bit, the
  // epoch of the kill included.
  const std::map<int, Epoch> killed = LoggedEpochs(dir(), done.id());
  ExpectSameEpochs(killed, runs["idx"], "webdataset after the kill");
  const int kill_epoch = running.epoch() + 1;
  if (killed.count(kill_epoch) == 1) {
    std::fprintf(stderr, "epoch %d (the kill): loss %.17g vs the IDX run's %.17g\n", kill_epoch,
                 killed.at(kill_epoch).loss, runs["idx"][kill_epoch].loss);
  }
}

TEST_F(DataE2eTest, BadDataFailsTheJobFastNamingTheProblemAndTheTrainerServesOn) {
  // A PNG image folder of 20 Fashion-MNIST images with one of them truncated.
  const std::string folder = Root() + "/folder";
  ASSERT_TRUE(data::WriteImageFolder(FashionMnist(data::Split::kTrain, 20), folder, {}).ok());
  std::string victim;
  for (int c = 0; c < 10 && victim.empty(); ++c) {
    const std::string p = absl::StrCat(folder, "/0000", c, "/000003.png");
    if (!ReadFile(p).empty()) victim = p;
  }
  ASSERT_FALSE(victim.empty());
  const std::string png = ReadFile(victim);
  WriteFile(victim, png.substr(0, png.size() - 30));
  // .npy arrays (labels 0..9).
  const std::string npy = Root() + "/npy-small";
  ASSERT_TRUE(data::WriteNpyDataset(FashionMnist(data::Split::kTrain, 64), npy).ok());
  // A shard whose image is 4000 x 4000 pixels (a decompression bomb at a
  // 1 Mi-pixel cap): a few KiB of PNG.
  mkdir((Root() + "/bomb").c_str(), 0755);
  data::Image big;
  big.channels = 1;
  big.height = big.width = 4000;
  big.u8.assign(4000 * 4000, 0);
  data::TarWriter bomb;
  bomb.Add("000000000.png", *data::EncodePng(big));
  bomb.Add("000000000.cls", "0");
  WriteFile(Root() + "/bomb/bomb-000000.tar", bomb.Finish());
  // A shard with a member named ../../etc/000000000.png.
  mkdir((Root() + "/evil").c_str(), 0755);
  data::TarWriter evil;
  evil.Add("000000000.cls", "1");
  evil.Add("../../etc/000000000.png", "x");
  WriteFile(Root() + "/evil/evil-000000.tar", evil.Finish());

  ASSERT_NO_FATAL_FAILURE(Up(/*trainers=*/1));
  // (A trainer is listed once it has logged its registration.)
  ASSERT_TRUE(PollUntil(absl::Seconds(30), [&] { return TrainerPids().size() == 1; }));
  const std::map<std::string, int> trainer = TrainerPids();

  auto job = [&](const std::string& name, const v1::DataSpec& data) {
    v1::SubmitRequest r = MomentumLenetJob(name, 1, 0);
    r.mutable_spec()->set_num_trainers(1);
    r.mutable_spec()->set_global_batch_size(8);
    r.mutable_spec()->set_test_limit(0);
    *r.mutable_spec()->mutable_data() = data;
    return r;
  };
  v1::DataSpec labels = Fmnist("npy", npy, "");
  labels.set_num_classes(3);
  v1::DataSpec bomb_spec = Fmnist("webdataset", Root() + "/bomb/bomb-000000.tar", "");
  bomb_spec.set_max_image_pixels(1 << 20);
  bomb_spec.set_skip_corrupt(true);  // a bomb is refused, never skipped
  struct Case {
    std::string name;
    v1::DataSpec data;
    std::vector<std::string> message;  // parts of the failure's reason
  };
  const std::vector<Case> cases = {
      {"missing", Fmnist("npy", Root() + "/nowhere", ""), {Root() + "/nowhere/x.npy"}},
      {"outside-roots",
       Fmnist("npy", "/var/tmp/elsewhere", ""),
       {"'/var/tmp/elsewhere' is outside them", "--data_roots"}},
      {"label-out-of-range", labels, {"out of range (num_classes is 3)", npy + "/x.npy row"}},
      {"corrupt-png",
       Fmnist("image_folder", folder, ""),
       {victim, "corrupt PNG", "skip_corrupt: true"}},
      {"decompression-bomb",
       bomb_spec,
       {"decompression bomb", Root() + "/bomb/bomb-000000.tar member 000000000.png"}},
      {"dot-dot-member",
       Fmnist("webdataset", Root() + "/evil/evil-000000.tar", ""),
       {Root() + "/evil/evil-000000.tar", "'..' component; refused"}},
  };
  for (const Case& c : cases) {
    const absl::Time start = absl::Now();
    const JobStatus done = Run(job(c.name, c.data), absl::Seconds(60));
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(done.events().empty()) << c.name;
    const std::string& reason = done.events(done.events_size() - 1).reason();
    std::fprintf(stderr, "%s: %s in %s: %s\n", c.name.c_str(),
                 v1::JobState_Name(done.state()).c_str(), absl::FormatDuration(took).c_str(),
                 reason.c_str());
    EXPECT_EQ(done.state(), v1::FAILED) << c.name << ": " << done.DebugString();
    EXPECT_EQ(done.attempts(), 1) << c.name << ": not retried";
    for (const std::string& part : c.message) {
      EXPECT_NE(reason.find(part), std::string::npos)
          << c.name << ": '" << part << "' in " << reason;
    }
    // Fast: the trainer's checks, not a timeout (a loaded 2-core machine
    // takes about a second).
    EXPECT_LT(took, absl::Seconds(15)) << c.name;
  }

  // The same trainer process trains on: the corrupt folder with skip_corrupt.
  v1::DataSpec skip = Fmnist("image_folder", folder, folder);
  skip.set_skip_corrupt(true);
  const JobStatus done = Run(job("skip-corrupt", skip), absl::Seconds(120));
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(TrainerPids(), trainer);  // neither restarted nor replaced
  EXPECT_EQ(done.data_train_samples(), 19);
  EXPECT_EQ(done.data_test_samples(), 19);
  EXPECT_EQ(done.data_corrupt_skipped(), 2);  // the training and the test set's
  // And the trainer's metric (its job's series stay until the next job).
  EXPECT_EQ(cluster_->Metric("trainer-0", "dtrain_trainer_data_corrupt_skipped{job_id=\"" +
                                              done.id() + "\",rank=\"0\"}"),
            2);
  int rc = -1;
  const std::string get = cluster_->TrainctlAs("admin", "get " + done.id(), &rc);
  EXPECT_EQ(rc, 0) << get;
  EXPECT_NE(get.find("  data: image_folder, 19 training and 19 test samples, 2 corrupt images "
                     "skipped"),
            std::string::npos)
      << get;
  const std::string json = cluster_->TrainctlAs("admin", "-o json get " + done.id(), &rc);
  EXPECT_EQ(rc, 0) << json;
  // (Protobuf's JSON writes int64 values as strings.)
  EXPECT_NE(json.find(R"("data_train_samples":"19")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("data_test_samples":"19")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("data_corrupt_skipped":"2")"), std::string::npos) << json;
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
