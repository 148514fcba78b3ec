// End to end: `trainctl cluster up|status|down` starts, checks and stops a
// real local cluster (scheduler, kvstore shards, trainer daemons), and the
// scheduler survives hostile input from trainctl and from many concurrent
// gRPC clients.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/grpc_status.h"
#include "libs/rpc/credentials.h"
#include "protos/admin.grpc.pb.h"
#include "protos/scheduler.grpc.pb.h"
#include "services/kvstore/testing/server_process.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"
#include "tests/e2e/test_cluster_rpc.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

// Calls get 30 s (a burst of 1000 submits from 16 threads below).
constexpr absl::Duration kCallTimeout = absl::Seconds(30);

absl::Status PingScheduler(const std::string& address) {
  auto stub = admin::Admin::NewStub(dtrain::rpc::NewChannel(address));
  admin::PingRequest req;
  req.set_payload("e2e");
  admin::PingReply reply;
  absl::Status s = FromGrpcStatus(stub->Ping(Ctx(absl::Seconds(5)).get(), req, &reply), "Ping");
  if (s.ok() && reply.payload() != "e2e") return absl::InternalError("bad ping payload");
  return s;
}

// Every job (List pages through next_page_token), or the first error.
absl::StatusOr<std::vector<v1::JobStatus>> ListAll(v1::JobService::Stub* stub) {
  std::vector<v1::JobStatus> jobs;
  v1::ListRequest req;
  do {
    v1::ListReply page;
    absl::Status s = FromGrpcStatus(stub->List(Ctx(kCallTimeout).get(), req, &page), "List");
    if (!s.ok()) return s;
    for (auto& j : *page.mutable_jobs()) jobs.push_back(std::move(j));
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  return jobs;
}

TEST(ClusterE2eTest, UpStatusDownRoundTrip) {
  // The binaries are found next to trainctl (its runfiles here).
  // Restart never: the trainer killed below must stay dead (heal_e2e_test
  // covers restarts).
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(
      {.name = "cluster", .trainers = 2, .kvstore_shards = 2, .kvstore_replicas = 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string& dir = (*cluster)->dir();
  std::string out = (*cluster)->up_output();
  int rc;
  std::fprintf(stderr, "%s", out.c_str());
  std::vector<ClusterProcess> procs = ReadCluster(dir);
  ASSERT_EQ(procs.size(), 5u) << out;
  std::map<std::string, ClusterProcess> by_name;
  for (const auto& p : procs) {
    by_name[p.name] = p;
    EXPECT_TRUE(ProcessAlive(p.pid)) << p.name << " pid " << p.pid;
    EXPECT_NE(out.find(p.name), std::string::npos) << out;
    if (p.role != "trainer") {
      EXPECT_NE(p.address, "") << p.name;
    }
    // Every process, trainers included, has a metrics endpoint.
    EXPECT_EQ(p.metrics_url.rfind("http://127.0.0.1:", 0), 0u) << p.name << out;
    EXPECT_NE(out.find(p.metrics_url), std::string::npos) << out;
  }
  ASSERT_TRUE(by_name.count("scheduler") && by_name.count("kvstore-0") &&
              by_name.count("kvstore-1") && by_name.count("trainer-0") &&
              by_name.count("trainer-1"))
      << out;
  const std::string scheduler = by_name["scheduler"].address;
  EXPECT_TRUE(PingScheduler(scheduler).ok());
  // Each process has its own data directory and log.
  for (const auto& p : procs) {
    EXPECT_EQ(access((dir + "/" + p.name).c_str(), F_OK), 0) << p.name;
    EXPECT_EQ(access((dir + "/" + p.name + ".log").c_str(), F_OK), 0) << p.name;
  }

  // A second `up` on the same directory refuses.
  out = Trainctl("cluster up --dir=" + dir, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("ALREADY_EXISTS"), std::string::npos) << out;

  out = Trainctl("cluster status --dir=" + dir, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("cluster healthy"), std::string::npos) << out;
  out = Trainctl("-o json cluster status --dir=" + dir, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"healthy\":true"), std::string::npos) << out;

  // The cluster trains: a small job on one of its trainers.
  out = Trainctl(absl::StrCat("--scheduler=", scheduler,
                              " submit --name=tiny --model=mlp --epochs=1 --batch_size=128"
                              " --lr=0.1 --init=kaiming --train_limit=1024 --test_limit=500"
                              " --threads=1 --wait"),
                 &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;

  // The same job hybridized: the trainer compiles the training step, and it
  // learns as the imperative one does (the same initial weights and data;
  // fused kernels sum in another order, and the last partial batch is
  // dropped, so not bit for bit).
  auto accuracy_of = [&](const std::string& submit_out) {
    return JsonNumber(JobJson(scheduler, submit_out), "test_accuracy", -1);
  };
  const double imperative = accuracy_of(out);
  out = Trainctl(absl::StrCat("--scheduler=", scheduler,
                              " submit --name=tiny-hybrid --model=mlp --epochs=1 --batch_size=128"
                              " --lr=0.1 --init=kaiming --train_limit=1024 --test_limit=500"
                              " --threads=1 --hybridize --wait"),
                 &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  const double hybridized = accuracy_of(out);
  std::fprintf(stderr, "tiny job test accuracy: imperative %.4f, hybridized %.4f\n", imperative,
               hybridized);
  EXPECT_GT(imperative, 0.5);
  EXPECT_NEAR(hybridized, imperative, 0.05);
  std::string trainer_logs;
  for (const char* t : {"/trainer-0.log", "/trainer-1.log"}) {
    std::ifstream in(dir + t);
    trainer_logs.append(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_NE(trainer_logs.find("hybridized training step"), std::string::npos);
  // Hybridized multi-trainer jobs are refused at submission, naming the field.
  out = Trainctl(absl::StrCat("--scheduler=", scheduler,
                              " submit --name=bad-hybrid --model=mlp --epochs=1 --batch_size=128"
                              " --lr=0.1 --num_trainers=2 --hybridize"),
                 &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out;
  EXPECT_NE(out.find("hybridize: compiled training steps run on one trainer"), std::string::npos)
      << out;

  // Synchronized batch norm across two trainer processes (ResNet-18 has
  // batch norm; the statistics of every step travel between the trainers).
  out = Trainctl(absl::StrCat("--scheduler=", scheduler,
                              " submit --name=tiny-syncbn --model=resnet18 --epochs=1"
                              " --batch_size=32 --lr=0.05 --init=kaiming --train_limit=64"
                              " --test_limit=64 --threads=1 --num_trainers=2 --sync_batch_norm"
                              " --wait"),
                 &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  trainer_logs.clear();
  for (const char* t : {"/trainer-0.log", "/trainer-1.log"}) {
    std::ifstream in(dir + t);
    trainer_logs.append(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_NE(trainer_logs.find("synchronized batch norm over 1 devices x 2 trainers"),
            std::string::npos);

  // LeNet through the parameter server: both trainers, gradients pushed to
  // and pulled from the 2 kvstore shards in synchronous rounds.
  out = Trainctl(absl::StrCat("--scheduler=", scheduler,
                              " submit --name=tiny-kv --model=lenet --epochs=1 --batch_size=128"
                              " --lr=0.1 --init=kaiming --train_limit=2048 --test_limit=500"
                              " --threads=1 --num_trainers=2 --sync=KVSTORE --wait"),
                 &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  std::string shard_log;
  {
    std::ifstream in(dir + "/kvstore-0.log");
    shard_log.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_NE(shard_log.find("workers=2 consistency=sync"), std::string::npos)
      << "kvstore-0 never saw the 2-worker job:\n"
      << shard_log.substr(0, 2000);
  // The same LeNet job with TCP allreduce: the same training, and both report the
  // mean loss over the two trainers (not rank 0's share).
  auto loss_of = [&](const std::string& submit_out) {
    return JsonNumber(JobJson(scheduler, submit_out), "loss", -1);
  };
  const double kv_loss = loss_of(out);
  out = Trainctl(absl::StrCat("--scheduler=", scheduler,
                              " submit --name=tiny-ar --model=lenet --epochs=1 --batch_size=128"
                              " --lr=0.1 --init=kaiming --train_limit=2048 --test_limit=500"
                              " --threads=1 --num_trainers=2 --sync=ALLREDUCE --wait"),
                 &rc);
  EXPECT_EQ(rc, 0) << out;
  const double ar_loss = loss_of(out);
  std::fprintf(stderr, "2-trainer epoch loss: kvstore %.6f, allreduce %.6f\n", kv_loss, ar_loss);
  EXPECT_GT(kv_loss, 0);
  EXPECT_NEAR(kv_loss, ar_loss, 1e-3 * ar_loss);

  // Asynchronous and bounded-delay consistency: the shards hold the weights
  // and apply SGD to every push; the job still learns.
  for (const std::string consistency : {"ASYNCHRONOUS", "BOUNDED_DELAY --max_staleness=2"}) {
    out = Trainctl(absl::StrCat("--scheduler=", scheduler,
                                " submit --name=tiny-kv-async --model=mlp --epochs=2"
                                " --batch_size=128 --lr=0.1 --init=kaiming --train_limit=4096"
                                " --test_limit=500 --threads=1 --num_trainers=2 --sync=KVSTORE"
                                " --consistency=",
                                consistency, " --wait"),
                   &rc);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
    const std::string json = JobJson(scheduler, out);
    std::fprintf(stderr, "%s: test accuracy %.4f, loss %.4f\n", consistency.c_str(),
                 JsonNumber(json, "test_accuracy", -1), JsonNumber(json, "loss", -1));
    // Asynchronous updates are not reproducible: 64 steps of 2 trainers
    // reached 0.72-0.79 in four runs (untrained: 0.1; 16 steps once gave
    // 0.478, too close to the bound).
    EXPECT_GT(JsonNumber(json, "test_accuracy", -1), 0.5) << json;
  }
  {
    std::ifstream in(dir + "/kvstore-0.log");
    shard_log.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_NE(shard_log.find("consistency=async"), std::string::npos) << shard_log.substr(0, 3000);
  EXPECT_NE(shard_log.find("consistency=bounded_delay"), std::string::npos)
      << shard_log.substr(0, 3000);

  // A dead trainer makes the cluster unhealthy.
  ASSERT_TRUE((*cluster)->Kill("trainer-1", SIGKILL).ok());
  PollUntil(absl::Seconds(10), [&] { return !ProcessAlive(by_name["trainer-1"].pid); });
  out = Trainctl("cluster status --dir=" + dir, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("DEAD"), std::string::npos) << out;
  EXPECT_NE(out.find("UNHEALTHY"), std::string::npos) << out;

  const absl::Time start = absl::Now();
  out = Trainctl("cluster down --dir=" + dir, &rc);
  std::fprintf(stderr, "cluster down in %s:\n%s", absl::FormatDuration(absl::Now() - start).c_str(),
               out.c_str());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("trainer-1 (pid "), std::string::npos) << out;
  EXPECT_NE(out.find("was not running"), std::string::npos) << out;
  for (const auto& p : procs) EXPECT_FALSE(ProcessAlive(p.pid)) << p.name << " still runs";
  EXPECT_FALSE(PingScheduler(scheduler).ok());

  out = Trainctl("cluster status --dir=" + dir, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  out = Trainctl("cluster down --dir=" + dir, &rc);
  EXPECT_EQ(rc, 1) << out;
}

TEST(ClusterE2eTest, UpFailsCleanlyAndBadUsage) {
  int rc;
  std::string out = Trainctl("cluster up", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--dir"), std::string::npos) << out;
  out = Trainctl("cluster sideways --dir=" + TmpDir("x"), &rc);
  EXPECT_EQ(rc, 2) << out;
  out = Trainctl("cluster up --trainers=-1 --dir=" + TmpDir("x"), &rc);
  EXPECT_EQ(rc, 2) << out;
  out = Trainctl("--help", &rc);
  EXPECT_NE(out.find("\n  cluster "), std::string::npos) << out;
  out = Trainctl("cluster --help", &rc);
  EXPECT_NE(out.find("usage: trainctl cluster up"), std::string::npos) << out;

  // A trainer binary that exits at once: up fails naming its log and stops
  // the processes it had started.
  const std::string dir = TmpDir("cluster-bad");
  std::unique_ptr<TestCluster> guard = TestCluster::Adopt(dir);  // whatever a failure left
  out = Trainctl("cluster up --trainer_bin=/bin/false --dir=" + dir, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("trainer-0 exited while starting"), std::string::npos) << out;
  EXPECT_TRUE(ReadCluster(dir).empty());
  out = Trainctl("cluster up --scheduler_bin=/nonexistent --dir=" + dir, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
}

// Hostile input against a real scheduler process (no trainers: accepted
// jobs queue, nothing trains).
class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    e2e::UseTestCredentials();  // the scheduler and trainctl on mutual TLS
    ASSERT_TRUE(
        scheduler_
            .Start(Runfile("services/scheduler/scheduler_server"),
                   // One user submits a burst of 900 valid jobs here; the
                   // per-user queue cap has its own tests.
                   {"--data_dir=" + TmpDir("hostile-scheduler"), "--max_queued_jobs_per_user=0"})
            .ok());
    stub_ = v1::JobService::NewStub(dtrain::rpc::NewChannel(scheduler_.address()));
  }

  std::string Ctl(const std::string& args, int* rc) {
    return Trainctl(absl::StrCat("--scheduler=", scheduler_.address(), " ", args), rc);
  }

  std::string WriteSpec(const std::string& name, const std::string& text) {
    std::string path = TmpDir("hostile-specs") + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  static v1::SubmitRequest Small(const std::string& name) {
    v1::SubmitRequest r = SmallMlpJob(name, 256);
    r.mutable_spec()->set_test_limit(100);
    return r;
  }

  // Submits `r`; returns the status code (and the job id when accepted).
  grpc::StatusCode Submit(const v1::SubmitRequest& r, std::string* id, std::string* msg) {
    v1::JobStatus job;
    grpc::Status s = stub_->Submit(Ctx(kCallTimeout).get(), r, &job);
    if (s.ok() && id != nullptr) *id = job.id();
    if (msg != nullptr) *msg = s.error_message();
    return s.error_code();
  }

  kvstore::ServerProcess scheduler_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

TEST_F(HostileInputTest, BadSpecsUnknownIdsAndASubmitBurst) {
  int rc;
  std::set<std::string> accepted;

  // trainctl: malformed JSON files are rejected before any call (exit 2).
  std::string out =
      Ctl("submit -f " + WriteSpec("bad.json", "{\"name\": \"x\", \"epochs\": "), &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("bad.json: not valid JSON"), std::string::npos) << out;
  out = Ctl("submit -f " + WriteSpec("wrong-type.json", R"({"name": "x", "epochs": "many"})"), &rc);
  EXPECT_EQ(rc, 2) << out;
  out = Ctl("submit -f " + WriteSpec("unknown.json", R"({"name": "x", "colour": "red"})"), &rc);
  EXPECT_EQ(rc, 2) << out;
  out = Ctl("submit -f " + WriteSpec("array.json", "[1, 2, 3]"), &rc);
  EXPECT_EQ(rc, 2) << out;
  out = Ctl("submit -f /nonexistent/job.json", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("cannot read"), std::string::npos) << out;

  // Invalid specs: INVALID_ARGUMENT naming the field, from trainctl (exit 1)...
  const std::string ok_flags = "--model=mlp --epochs=1 --batch_size=64 --lr=0.1 --priority=-5";
  struct Case {
    std::string flags, field;
  };
  for (const Case& c : std::vector<Case>{
           {"--name=neg --model=mlp --epochs=-3 --batch_size=64 --lr=0.1", "epochs"},
           {"--name=unk --model=gpt5 --epochs=1 --batch_size=64 --lr=0.1", "model"},
           {"--model=mlp --epochs=1 --batch_size=64 --lr=0.1", "name"},
           {"--name=bs --model=mlp --epochs=1 --batch_size=-64 --lr=0.1", "global_batch_size"},
           {"--name=lr --model=mlp --epochs=1 --batch_size=64 --lr=-1", "lr"},
           {"--name=ep --model=mlp --epochs=10001 --batch_size=64 --lr=0.1", "epochs"},
       }) {
    out = Ctl("submit " + c.flags, &rc);
    EXPECT_EQ(rc, 1) << c.flags << ": " << out;
    EXPECT_NE(out.find("INVALID_ARGUMENT: JobService.Submit: " + c.field + ":"), std::string::npos)
        << c.flags << ": " << out;
  }
  out = Ctl("submit -f " + WriteSpec("neg.json", R"({"name": "neg", "model": "mlp", "epochs": -1,
                                                    "global_batch_size": 64, "lr": 0.1})"),
            &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out;

  // ... and from the stubs, with huge string fields (~1 MB).
  const std::string huge(1 << 20, 'a');
  {
    v1::SubmitRequest r = Small(huge);
    std::string msg;
    EXPECT_EQ(Submit(r, nullptr, &msg), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_LT(msg.size(), 1000u) << "the error should not echo 1 MB";
    // Every bad value, however large, gets INVALID_ARGUMENT naming the field;
    // the message quotes at most 64 bytes of the value (libs/scheduler Quote).
    for (const char* field : {"model", "init", "device_kind"}) {
      for (size_t size : {size_t{1000}, huge.size()}) {
        r = Small(absl::StrCat("huge-", field));
        const std::string value(size, 'a');
        if (std::string(field) == "model") r.mutable_spec()->set_model(value);
        if (std::string(field) == "init") r.mutable_spec()->set_init(value);
        if (std::string(field) == "device_kind") r.mutable_spec()->set_device_kind(value);
        grpc::StatusCode code = Submit(r, nullptr, &msg);
        EXPECT_EQ(code, grpc::StatusCode::INVALID_ARGUMENT) << field << " of " << size << " bytes";
        EXPECT_EQ(msg.rfind(absl::StrCat(field, ":"), 0), 0u) << msg.substr(0, 200);
        EXPECT_LT(msg.size(), 300u) << field;
      }
    }
    // data_dir is bounded (4096 bytes).
    r = Small("huge-data-dir");
    r.mutable_spec()->set_data_dir(huge);
    r.mutable_spec()->set_priority(-1000);
    std::string id;
    grpc::StatusCode code = Submit(r, &id, &msg);
    EXPECT_EQ(code, grpc::StatusCode::INVALID_ARGUMENT) << msg.substr(0, 200);
    EXPECT_EQ(msg.rfind("data_dir:", 0), 0u) << msg.substr(0, 200);
    // Over gRPC's message limit: RESOURCE_EXHAUSTED, not a crash.
    r.mutable_spec()->set_data_dir(std::string(8 << 20, 'b'));
    code = Submit(r, nullptr, &msg);
    EXPECT_EQ(code, grpc::StatusCode::RESOURCE_EXHAUSTED) << msg;
    // An absurd batch size is refused, naming the field.
    r = Small("absurd-batch");
    r.mutable_spec()->set_global_batch_size(int64_t{1} << 50);
    r.mutable_spec()->set_priority(-1000);
    code = Submit(r, &id, &msg);
    EXPECT_EQ(code, grpc::StatusCode::INVALID_ARGUMENT) << msg;
    EXPECT_EQ(msg.rfind("global_batch_size:", 0), 0u) << msg;
  }

  // Unknown ids: NOT_FOUND from get and cancel, also for odd ids.
  for (const std::string& id :
       std::vector<std::string>{"job-nope", "", "../../etc/passwd", std::string(100000, 'z')}) {
    v1::GetRequest get;
    get.set_id(id);
    v1::JobStatus job;
    // Also the 100 kB id: the message quotes only its first 64 bytes.
    auto expected = [&](grpc::StatusCode code) { return code == grpc::StatusCode::NOT_FOUND; };
    grpc::StatusCode code = stub_->Get(Ctx(kCallTimeout).get(), get, &job).error_code();
    EXPECT_TRUE(expected(code)) << id.substr(0, 100) << ": " << code;
    v1::CancelRequest cancel;
    cancel.set_id(id);
    code = stub_->Cancel(Ctx(kCallTimeout).get(), cancel, &job).error_code();
    EXPECT_TRUE(expected(code)) << id.substr(0, 100) << ": " << code;
  }
  out = Ctl("get job-nope", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  out = Ctl("cancel job-nope", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  out = Ctl("get", &rc);
  EXPECT_EQ(rc, 2) << out;

  // Cancel of a finished (here: cancelled) job: FAILED_PRECONDITION.
  out = Ctl("-o json submit --name=to-cancel " + ok_flags, &rc);
  ASSERT_EQ(rc, 0) << out;
  std::string id;
  {
    absl::StatusOr<std::vector<v1::JobStatus>> list = ListAll(stub_.get());
    ASSERT_TRUE(list.ok()) << list.status();
    for (const auto& j : *list) {
      if (j.spec().name() == "to-cancel") id = j.id();
    }
  }
  ASSERT_NE(id, "");
  accepted.insert(id);
  out = Ctl("cancel " + id + " --reason=e2e", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("CANCELLED"), std::string::npos) << out;
  out = Ctl("cancel " + id, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("FAILED_PRECONDITION"), std::string::npos) << out;

  // A burst: 1000 submits from 16 threads (a tenth of them invalid). Every
  // call gets OK or INVALID_ARGUMENT; every accepted id is listed after.
  constexpr int kThreads = 16, kSubmits = 1000;
  std::atomic<int> next{0}, ok{0}, invalid{0}, other{0};
  absl::Mutex mu;
  std::vector<std::string> burst_ids;
  std::string other_msg;
  const absl::Time start = absl::Now();
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        // Each thread its own channel, like separate clients.
        grpc::ChannelArguments args;
        args.SetInt("grpc.channel_id", t);
        auto stub = v1::JobService::NewStub(dtrain::rpc::NewChannel(scheduler_.address(), args));
        for (int i = next++; i < kSubmits; i = next++) {
          v1::SubmitRequest r = Small(absl::StrCat("burst-", i));
          r.mutable_spec()->set_priority(-1000 + i % 7);
          if (i % 10 == 3) r.mutable_spec()->set_epochs(-i);  // invalid
          v1::JobStatus job;
          // 16 channels connecting at once: a connect can fail transiently
          // (seen in the sandbox), and without wait_for_ready the channel
          // then fails calls fast; like a real client, wait for it instead.
          auto ctx = Ctx(kCallTimeout);
          ctx->set_wait_for_ready(true);
          grpc::Status s = stub->Submit(ctx.get(), r, &job);
          if (s.ok()) {
            ++ok;
            absl::MutexLock lock(&mu);
            burst_ids.push_back(job.id());
          } else if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
            ++invalid;
          } else {
            ++other;
            absl::MutexLock lock(&mu);
            other_msg = absl::StrCat(s.error_code(), ": ", s.error_message());
          }
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  std::fprintf(stderr, "burst: %d ok, %d invalid, %d other in %s\n", ok.load(), invalid.load(),
               other.load(), absl::FormatDuration(absl::Now() - start).c_str());
  EXPECT_EQ(other.load(), 0) << other_msg;
  EXPECT_EQ(invalid.load(), kSubmits / 10);
  EXPECT_EQ(ok.load(), kSubmits - kSubmits / 10);
  std::set<std::string> unique(burst_ids.begin(), burst_ids.end());
  EXPECT_EQ(unique.size(), burst_ids.size()) << "duplicate job ids";
  accepted.insert(burst_ids.begin(), burst_ids.end());

  // The scheduler is still up, and lists every accepted job.
  ASSERT_TRUE(PingScheduler(scheduler_.address()).ok());
  absl::StatusOr<std::vector<v1::JobStatus>> list = ListAll(stub_.get());
  ASSERT_TRUE(list.ok()) << list.status();
  std::set<std::string> listed;
  for (const auto& j : *list) listed.insert(j.id());
  size_t missing = 0;
  for (const auto& a : accepted) missing += listed.count(a) == 0;
  EXPECT_EQ(missing, 0u) << "of " << accepted.size() << " accepted jobs";

  // Cancel them all (concurrently too); each is CANCELLED or already ended.
  std::vector<std::string> to_cancel(accepted.begin(), accepted.end());
  std::atomic<int> cancel_bad{0};
  next = 0;
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int i = next++; i < static_cast<int>(to_cancel.size()); i = next++) {
          v1::CancelRequest c;
          c.set_id(to_cancel[i]);
          c.set_reason("e2e cleanup");
          v1::JobStatus job;
          grpc::Status s = stub_->Cancel(Ctx(kCallTimeout).get(), c, &job);
          if (!s.ok() && s.error_code() != grpc::StatusCode::FAILED_PRECONDITION) ++cancel_bad;
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  EXPECT_EQ(cancel_bad.load(), 0);
  v1::ListRequest queued;
  queued.set_state(v1::QUEUED);
  v1::ListReply left;
  ASSERT_TRUE(stub_->List(Ctx(kCallTimeout).get(), queued, &left).ok());
  EXPECT_EQ(left.jobs_size(), 0);

  // trainctl list still works (text and JSON) and the server shuts down cleanly.
  out = Ctl("--timeout_s=30 -o json list --state=CANCELLED", &rc);
  EXPECT_EQ(rc, 0) << out.substr(0, 1000);
  ASSERT_TRUE(PingScheduler(scheduler_.address()).ok());
  ASSERT_TRUE(scheduler_.Kill(SIGTERM).ok());
  auto status = scheduler_.Wait();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
