// End to end across emulated hosts (tests/netlab, tools/netlab): the
// scheduler, two kvstore shards and two trainers each in a network
// namespace of their own on a bridge, links shaped to 1 Gbit/s, mutual TLS
// with the hosts' addresses in the certificates. The test process is the
// console on the bridge (trainctl talks to the scheduler's address).
//   - the key jobs succeed: 2 trainers ALLREDUCE, 2 trainers through the 2
//     kvstore shards (KVSTORE);
//   - a link cut mid-job: trainer-1's host is partitioned (every packet
//     dropped) while an ALLREDUCE job runs, the scheduler notices the lost
//     trainer, the link heals, and the job SUCCEEDS on a later attempt.
// Skips, naming the reason, where the kernel refuses network namespaces.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/subprocess.h"
#include "libs/security/certs.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"
#include "tests/netlab/netlab.h"

namespace dtrain {
namespace e2e {
namespace {

constexpr int kScheduler = 0, kShard0 = 1, kShard1 = 2, kTrainer0 = 3, kTrainer1 = 4;

class NetlabE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = netlab::PrivateNetwork(); !s.ok()) GTEST_SKIP() << s;
    auto lab = netlab::Lab::Create(Runfile("tools/netlab"), 5, "1gbit");
    ASSERT_TRUE(lab.ok()) << lab.status();
    lab_ = std::move(*lab);
    dir_ = TmpDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    certs_ = dir_ + "/certs";
    // Every host's address in the service certificates (and each trainer's
    // in its own): clients check the server's certificate against the
    // address they dial.
    security::InitOptions init;
    for (int h = 0; h < lab_->hosts(); ++h) init.service_sans.push_back(lab_->Ip(h));
    ASSERT_TRUE(security::InitCertDir(certs_, init).ok());
    for (int t : {0, 1}) {
      security::CertRequest r;
      r.name = absl::StrCat("trainer-", t);
      r.role = security::Role::kTrainer;
      r.extra_sans = {lab_->Ip(kTrainer0 + t)};
      ASSERT_TRUE(security::IssueCert(certs_, r).ok());
    }
    UseClusterCredentials(dir_);  // the test and trainctl: admin
    scheduler_ = lab_->Ip(kScheduler) + ":7000";

    for (int s : {0, 1}) {
      const int host = s == 0 ? kShard0 : kShard1;
      Start(host, absl::StrCat("kvstore-", s), "kvstore",
            {Runfile("services/kvstore/kvstore_server"),
             absl::StrCat("--listen=", lab_->Ip(host), ":7070"), absl::StrCat("--shard_index=", s),
             absl::StrCat("--data_dir=", TmpDir(absl::StrCat("kv", s, Name()))),
             "--cluster_secret_file=" + certs_ + "/cluster.secret"},
            true);
    }
    Start(kScheduler, "scheduler", "scheduler",
          {Runfile("services/scheduler/scheduler_server"), "--listen=" + scheduler_,
           "--data_dir=" + TmpDir("sched" + Name()), "--heartbeat_timeout_s=3",
           "--cluster_secret_file=" + certs_ + "/cluster.secret"},
          true);
    const std::string kvstore =
        absl::StrCat(lab_->Ip(kShard0), ":7070,", lab_->Ip(kShard1), ":7070");
    const std::string checkpoints = TmpDir("checkpoints" + Name());
    for (int t : {0, 1}) {
      const std::string name = absl::StrCat("trainer-", t);
      Start(kTrainer0 + t, name, name,
            {Runfile("services/trainer/trainer"), "--scheduler=" + scheduler_, "--name=" + name,
             "--work_dir=" + TmpDir(name + Name()), "--checkpoint_dir=" + checkpoints,
             "--collective_host=" + lab_->Ip(kTrainer0 + t), "--kvstore=" + kvstore,
             "--collective_timeout_s=5", "--rpc_timeout_s=2"},
            false);
    }
    // Both trainers registered (through the scheduler's address, across the
    // bridge).
    int rc = 1;
    std::string out;
    PollUntil(
        absl::Seconds(30),
        [&] {
          out = Trainctl("--scheduler=" + scheduler_ + " trainers", &rc);
          return rc == 0 && out.find("trainer-0") != std::string::npos &&
                 out.find("trainer-1") != std::string::npos;
        },
        absl::Milliseconds(200));
    ASSERT_EQ(rc, 0) << out;
    ASSERT_NE(out.find("trainer-1"), std::string::npos) << out << Logs();
  }

  void TearDown() override {
    for (auto& c : children_) (void)c->Signal(SIGKILL);
    children_.clear();
    lab_.reset();
  }

  static std::string Name() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  // Starts `argv` in `host` with `cert`'s credentials; servers: waits until
  // they wrote their port.
  void Start(int host, const std::string& name, const std::string& cert,
             std::vector<std::string> argv, bool server) {
    argv.push_back("--ca=" + certs_ + "/ca.pem");
    argv.push_back("--cert=" + certs_ + "/" + cert + ".pem");
    argv.push_back("--key=" + certs_ + "/" + cert + ".key");
    const std::string port_file = dir_ + "/" + name + ".port";
    if (server) argv.push_back("--port_file=" + port_file);
    SubprocessOptions options;
    options.argv = lab_->InHost(host, argv);
    options.output_file = dir_ + "/" + name + ".log";
    logs_.push_back(options.output_file);
    auto child = Subprocess::Start(options);
    ASSERT_TRUE(child.ok()) << child.status();
    children_.push_back(std::move(*child));
    if (!server) return;
    for (absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;) {
      std::ifstream in(port_file);
      int port = 0;
      if (in >> port && port > 0) return;
      ASSERT_TRUE(children_.back()->Running()) << name << " exited:\n" << Logs();
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << name << " did not start\n" << Logs();
  }

  // The last lines of every process's log.
  std::string Logs() const {
    std::string out;
    for (const std::string& log : logs_) {
      int rc;
      absl::StrAppend(&out, "--- ", log, "\n", e2e::Run("tail -n 15 " + log, &rc));
    }
    return out;
  }

  std::string Submit(const std::string& flags, int* rc) {
    return Trainctl(absl::StrCat("--scheduler=", scheduler_, " --timeout_s=20 submit ", flags), rc);
  }

  std::unique_ptr<netlab::Lab> lab_;
  std::string dir_, certs_, scheduler_;
  std::vector<std::unique_ptr<Subprocess>> children_;
  std::vector<std::string> logs_;
};

constexpr char kSmallJob[] =
    "--model=mlp --epochs=2 --batch_size=128 --lr=0.1 --init=kaiming --train_limit=4096"
    " --test_limit=1000 --threads=1 --num_trainers=2";

TEST_F(NetlabE2eTest, AllreduceAcrossHosts) {
  int rc;
  std::string out = Submit(absl::StrCat("--name=ar ", kSmallJob, " --sync=ALLREDUCE --wait"), &rc);
  ASSERT_EQ(rc, 0) << out << Logs();
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  const std::string json = JobJson(scheduler_, out);
  // Placed on both trainers, and learning: better than chance (0.1) by far.
  const size_t list = json.find("\"trainers\":[");
  ASSERT_NE(list, std::string::npos) << json;
  const std::string trainers = json.substr(list, json.find(']', list) - list);
  EXPECT_EQ(std::count(trainers.begin(), trainers.end(), ','), 1) << trainers;
  EXPECT_GT(JsonNumber(json, "test_accuracy", -1), 0.6) << json;
}

TEST_F(NetlabE2eTest, KvstoreShardsAcrossHosts) {
  int rc;
  std::string out = Submit(absl::StrCat("--name=kv ", kSmallJob, " --sync=KVSTORE --wait"), &rc);
  ASSERT_EQ(rc, 0) << out << Logs();
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  const std::string json = JobJson(scheduler_, out);
  EXPECT_GT(JsonNumber(json, "test_accuracy", -1), 0.6) << json;
  // The gradients went through both shards' hosts: each shard's log names
  // the job it created.
  int rc2;
  for (const char* shard : {"kvstore-0", "kvstore-1"}) {
    std::string log = e2e::Run(absl::StrCat("cat ", dir_, "/", shard, ".log"), &rc2);
    EXPECT_NE(log.find("job"), std::string::npos) << shard << ":\n" << log;
  }
}

TEST_F(NetlabE2eTest, PartitionDetectedAndHealed) {
  int rc;
  std::string out = Submit(
      "--name=cut --model=mlp --epochs=8 --batch_size=64 --lr=0.1 --init=kaiming"
      " --train_limit=8192 --test_limit=1000 --threads=1 --num_trainers=2 --sync=ALLREDUCE"
      " --checkpoint_interval_epochs=1",
      &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string id = SubmittedId(out);
  ASSERT_NE(id, "");
  auto get = [&] {
    int r;
    std::string j = Trainctl(absl::StrCat("--scheduler=", scheduler_, " -o json get ", id), &r);
    return r == 0 ? j : "";
  };
  // The job's own state (the first "state" of its JSON; its events have
  // states too).
  auto state = [](const std::string& j) {
    const std::string key = "\"state\":\"";
    size_t at = j.find(key);
    if (at == std::string::npos) return std::string();
    at += key.size();
    return j.substr(at, j.find('"', at) - at);
  };
  // Running, one epoch done (and checkpointed), before the cut.
  std::string json;
  PollUntil(
      absl::Seconds(60),
      [&] {
        json = get();
        return state(json) == "RUNNING" && JsonNumber(json, "epoch", 0) >= 1;
      },
      absl::Milliseconds(100));
  ASSERT_EQ(state(json), "RUNNING") << json << Logs();
  ASSERT_LT(JsonNumber(json, "epoch", 0), 7) << "the job ran too fast to cut it: " << json;
  const double attempts_before = JsonNumber(json, "attempts", 0);

  ASSERT_TRUE(lab_->Partition(kTrainer1).ok());
  // Detected: the scheduler loses trainer-1 (heartbeat timeout 3 s) and the
  // attempt ends (requeued, or waiting for a trainer).
  const bool detected = PollUntil(
      absl::Seconds(30),
      [&] {
        json = get();
        return JsonNumber(json, "attempts", 0) > attempts_before || state(json) != "RUNNING" ||
               JsonNumber(json, "generation", 0) > 0;
      },
      absl::Milliseconds(300));
  EXPECT_TRUE(detected) << json << Logs();
  // The scheduler names the cut-off trainer LOST (no heartbeats for 3 s).
  int trc;
  std::string trainers;
  PollUntil(
      absl::Seconds(10),
      [&] {
        trainers = Trainctl("--scheduler=" + scheduler_ + " -o json trainers", &trc);
        return trainers.find("\"LOST\"") != std::string::npos;
      },
      absl::Milliseconds(200));
  const size_t t1 = trainers.find("\"name\":\"trainer-1\"");
  ASSERT_NE(t1, std::string::npos) << trainers;
  const std::string entry = trainers.substr(t1, trainers.find('}', t1) - t1);
  EXPECT_NE(entry.find("\"state\":\"LOST\""), std::string::npos) << trainers;
  ASSERT_TRUE(lab_->Heal(kTrainer1).ok());

  // Healed: trainer-1 comes back and the job finishes.
  json = "";
  PollUntil(
      absl::Seconds(150),
      [&] {
        json = get();
        return state(json) == "SUCCEEDED" || state(json) == "FAILED";
      },
      absl::Milliseconds(500));
  EXPECT_EQ(state(json), "SUCCEEDED") << json << Logs();
  EXPECT_GT(JsonNumber(json, "attempts", 0), attempts_before) << json;
  EXPECT_GT(JsonNumber(json, "test_accuracy", -1), 0.6) << json;
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
