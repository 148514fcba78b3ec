#include "tests/e2e/test_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "libs/base/grpc_status.h"
#include "libs/base/status.h"
#include "libs/kvstore/client.h"
#include "libs/metrics/scrape.h"
#include "tests/e2e/test_cluster_rpc.h"

namespace dtrain {
namespace e2e {

namespace v1 = scheduler::v1;

std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  SetDeadline(ctx.get(), timeout);
  return ctx;
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::StatusOr<v1::JobStatus> WatchToEnd(v1::JobService::Stub* stub, const std::string& id,
                                         absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  v1::WatchRequest w;
  w.set_id(id);
  auto reader = stub->Watch(&ctx, w);
  v1::JobStatus st, last;
  while (reader->Read(&st)) last = st;
  absl::Status s = FromGrpcStatus(reader->Finish(), "JobService.Watch");
  if (!s.ok()) return s;
  return last;
}

std::unique_ptr<v1::JobService::Stub> JobsAs(const TestCluster& cluster, const std::string& user) {
  return v1::JobService::NewStub(
      rpc::NewChannel(cluster.scheduler().address, cluster.Credentials(user).get()));
}

bool PollUntil(absl::Duration timeout, const std::function<bool()>& done, absl::Duration interval) {
  for (const absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;) {
    if (done()) return true;
    absl::SleepFor(interval);
  }
  return done();
}

bool IsFinal(v1::JobState s) { return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED; }

v1::SubmitRequest MomentumLenetJob(const std::string& name, int epochs, int64_t train_limit) {
  v1::SubmitRequest r;
  v1::JobSpec* s = r.mutable_spec();
  s->set_name(name);
  s->set_model("lenet");
  s->set_epochs(epochs);
  s->set_global_batch_size(128);
  s->set_lr(0.05);
  s->set_momentum(0.9);
  s->set_init("kaiming");
  s->set_seed(3);
  s->set_train_limit(train_limit);
  s->set_test_limit(2000);
  s->set_threads(1);
  s->set_num_trainers(2);
  s->set_checkpoint_interval_epochs(1);
  s->mutable_sync()->set_mode(v1::ALLREDUCE);
  return r;
}

v1::SubmitRequest SmallMlpJob(const std::string& name, int64_t train_limit) {
  v1::SubmitRequest r;
  v1::JobSpec* s = r.mutable_spec();
  s->set_name(name);
  s->set_model("mlp");
  s->set_epochs(1);
  s->set_global_batch_size(64);
  s->set_lr(0.1);
  s->set_train_limit(train_limit);
  s->set_test_limit(64);
  s->set_threads(1);
  return r;
}

v1::SubmitRequest KvstoreMlpJob(const std::string& name, int epochs, int64_t train_limit) {
  v1::SubmitRequest r = SmallMlpJob(name, train_limit);
  v1::JobSpec* s = r.mutable_spec();
  s->set_epochs(epochs);
  s->set_seed(1);
  s->set_num_trainers(2);
  s->mutable_sync()->set_mode(v1::KVSTORE);
  s->mutable_sync()->set_consistency(v1::SYNCHRONOUS);
  return r;
}

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(const ClusterOptions& o) {
  std::unique_ptr<TestCluster> c(new TestCluster());
  c->dir_ = TmpDir(o.name.empty() ? "cluster" : o.name);
  c->down_grace_s_ = o.down_grace_s;
  c->replicas_ = o.kvstore_replicas > 0 ? o.kvstore_replicas : o.kvstore_shards > 0 ? 2 : 1;
  std::string args = absl::StrCat("cluster up --dir=", c->dir_, " --trainers=", o.trainers,
                                  " --kvstore_shards=", o.kvstore_shards,
                                  " --restart=", o.restart ? "always" : "never");
  if (o.kvstore_replicas > 0) absl::StrAppend(&args, " --kvstore_replicas=", o.kvstore_replicas);
  if (o.heartbeat_timeout_s > 0)
    absl::StrAppend(&args, " --heartbeat_timeout_s=", o.heartbeat_timeout_s);
  if (!o.tls) absl::StrAppend(&args, " --insecure");
  if (!o.flags.empty()) absl::StrAppend(&args, " ", o.flags);
  int rc;
  // Trainctl() makes this process use the cluster's admin credential.
  c->up_output_ =
      o.env.empty()
          ? Trainctl(args, &rc)
          : Run(absl::StrCat(o.env, " ", Runfile("services/trainctl/trainctl"), " ", args), &rc);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("trainctl ", args, " failed:\n", c->up_output_));
  }
  if (o.tls && !o.env.empty()) UseClusterCredentials(c->dir_);
  c->started_ = ReadCluster(c->dir_);
  c->ReadProcesses();
  const size_t want = static_cast<size_t>(o.kvstore_shards * c->replicas_);
  if (c->scheduler_.address.empty() || c->kvstore_.size() != want) {
    return absl::InternalError(absl::StrCat("unexpected cluster.json (", c->kvstore_.size(),
                                            " kvstore processes, want ", want, "):\n",
                                            c->up_output_));
  }
  for (const std::string& user : o.users) {
    DT_RETURN_IF_ERROR(c->IssueCertificate(user, "user"));
  }
  c->stubs_->jobs = v1::JobService::NewStub(rpc::NewChannel(c->scheduler_.address));
  return c;
}

std::unique_ptr<TestCluster> TestCluster::Adopt(const std::string& dir, int down_grace_s) {
  std::unique_ptr<TestCluster> c(new TestCluster());
  c->dir_ = dir;
  c->down_grace_s_ = down_grace_s;
  return c;
}

void TestCluster::ReadProcesses() {
  kvstore_.clear();
  for (const ClusterProcess& p : ReadCluster(dir_)) {
    if (p.role == "scheduler") scheduler_ = p;
    if (p.role == "kvstore") kvstore_.push_back(p);
  }
}

TestCluster::TestCluster() : stubs_(std::make_unique<Stubs>()) {}

TestCluster::~TestCluster() {
  if (dir_.empty()) return;
  std::vector<ClusterProcess> procs = ReadCluster(dir_);
  procs.insert(procs.end(), started_.begin(), started_.end());
  // A stopped process (SIGSTOP in a test) would not see cluster down's SIGTERM.
  for (const ClusterProcess& p : procs) {
    if (ProcessAlive(p.pid)) kill(p.pid, SIGCONT);
  }
  int rc;
  Trainctl(absl::StrCat("cluster down --grace_s=", down_grace_s_, " --dir=", dir_), &rc);
  for (const ClusterProcess& p : ReadCluster(dir_)) procs.push_back(p);
  for (const ClusterProcess& p : procs) {
    if (ProcessAlive(p.pid)) kill(p.pid, SIGKILL);
  }
  // The supervisor (`cluster supervise --dir=<dir>`) and whatever runs with
  // a flag under <dir>.
  for (const std::string& arg : {"=" + dir_ + std::string(1, '\0'), "=" + dir_ + "/"}) {
    for (int pid : PidsMentioning(arg)) kill(pid, SIGKILL);
  }
  // A failed test keeps the cluster's logs: Bazel deletes TEST_TMPDIR, but
  // zips TEST_UNDECLARED_OUTPUTS_DIR into the test's outputs.zip.
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (outputs != nullptr && ::testing::Test::HasFailure()) {
    const std::string keep = absl::StrCat(outputs, "/", dir_.substr(dir_.rfind('/') + 1));
    Run(absl::StrCat("mkdir -p '", keep, "' && cp '", dir_, "'/*.log '", dir_, "'/cluster.json '",
                     keep, "'/ 2>/dev/null"),
        &rc);
  }
}

absl::StatusOr<v1::JobStatus> TestCluster::Submit(const v1::SubmitRequest& r,
                                                  const std::string& user) {
  v1::JobStatus st;
  if (user.empty()) {
    DT_RETURN_IF_ERROR(FromGrpcStatus(stubs_->jobs->Submit(Ctx().get(), r, &st), "Submit"));
  } else {
    DT_RETURN_IF_ERROR(
        FromGrpcStatus(JobsAs(*this, user)->Submit(Ctx().get(), r, &st), "Submit as " + user));
  }
  return st;
}

absl::StatusOr<v1::JobStatus> TestCluster::Get(const std::string& id) {
  v1::GetRequest get;
  get.set_id(id);
  v1::JobStatus st;
  DT_RETURN_IF_ERROR(FromGrpcStatus(stubs_->jobs->Get(Ctx().get(), get, &st), "Get"));
  return st;
}

absl::Status TestCluster::Cancel(const std::string& id) {
  v1::CancelRequest c;
  c.set_id(id);
  v1::JobStatus st;
  return FromGrpcStatus(stubs_->jobs->Cancel(Ctx().get(), c, &st), "Cancel");
}

absl::StatusOr<v1::JobStatus> TestCluster::WatchToEnd(const std::string& id,
                                                      absl::Duration timeout) {
  return e2e::WatchToEnd(stubs_->jobs.get(), id, timeout);
}

absl::StatusOr<v1::JobStatus> TestCluster::PollJob(
    const std::string& id, const std::function<bool(const JobStatus&)>& until,
    absl::Duration timeout) {
  DT_ASSIGN_OR_RETURN(v1::JobStatus job, Get(id));
  for (const absl::Time deadline = absl::Now() + timeout;
       !until(job) && !IsFinal(job.state()) && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(100));
    DT_ASSIGN_OR_RETURN(job, Get(id));
  }
  return job;
}

absl::StatusOr<v1::JobStatus> TestCluster::WaitEpoch(const std::string& id, int epoch,
                                                     absl::Duration timeout) {
  auto there = [&](const v1::JobStatus& j) {
    return j.state() == v1::RUNNING && j.epoch() >= epoch - 1;
  };
  DT_ASSIGN_OR_RETURN(v1::JobStatus job, PollJob(id, there, timeout));
  if (!there(job)) {
    return absl::FailedPreconditionError(
        absl::StrCat("not running in epoch ", epoch, ": ", job.DebugString()));
  }
  return job;
}

absl::StatusOr<v1::JobStatus> TestCluster::WaitMidEpoch(const std::string& id, const MidEpoch& w) {
  auto in_window = [&](const v1::JobStatus& j) {
    return j.state() == v1::RUNNING && j.epoch() >= w.first_epoch - 1 &&
           j.epoch() <= w.last_epoch - 1 && j.step() >= w.min_step &&
           j.step() + w.min_steps_left <= j.steps_per_epoch();
  };
  DT_ASSIGN_OR_RETURN(
      v1::JobStatus job,
      PollJob(
          id, [&](const v1::JobStatus& j) { return in_window(j) || j.epoch() >= w.last_epoch; },
          w.timeout));
  if (!in_window(job)) {
    return absl::FailedPreconditionError(absl::StrCat("not in the middle of epochs ", w.first_epoch,
                                                      "..", w.last_epoch, ": ", job.DebugString()));
  }
  return job;
}

std::shared_ptr<const rpc::Credentials> TestCluster::Credentials(const std::string& user) const {
  const std::string d = dir_ + "/certs";
  absl::StatusOr<std::shared_ptr<const rpc::Credentials>> c =
      rpc::Credentials::Load({d + "/ca.pem", d + "/" + user + ".pem", d + "/" + user + ".key"});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : rpc::Credentials::Insecure();
}

absl::Status TestCluster::IssueCertificate(const std::string& name, const std::string& role) const {
  int rc;
  const std::string out = Trainctl(
      absl::StrCat("certs issue --dir=", dir_, "/certs --name=", name, " --role=", role), &rc);
  if (rc != 0) return absl::InternalError(absl::StrCat("certs issue ", name, ": ", out));
  return absl::OkStatus();
}

std::string TestCluster::TrainctlAs(const std::string& user, const std::string& args,
                                    int* rc) const {
  const std::string certs = dir_ + "/certs";
  return Trainctl(
      absl::StrCat("--scheduler=", scheduler_.address, " --ca=", certs, "/ca.pem --cert=", certs,
                   "/", user, ".pem --key=", certs, "/", user, ".key ", args),
      rc);
}

std::vector<ClusterProcess> TestCluster::Processes(const std::string& role) const {
  std::vector<ClusterProcess> out;
  for (const ClusterProcess& p : ReadCluster(dir_)) {
    if (role.empty() || p.role == role) out.push_back(p);
  }
  return out;
}

absl::StatusOr<ClusterProcess> TestCluster::Process(const std::string& name) const {
  for (const ClusterProcess& p : ReadCluster(dir_)) {
    if (p.name == name) return p;
  }
  return absl::NotFoundError(absl::StrCat("no process ", name, " in ", dir_, "/cluster.json"));
}

absl::Status TestCluster::Kill(const std::string& name, int sig) const {
  DT_ASSIGN_OR_RETURN(ClusterProcess p, Process(name));
  if (kill(p.pid, sig) != 0) {
    return absl::InternalError(
        absl::StrCat("kill ", name, " (pid ", p.pid, "): ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status TestCluster::KillTrainer(const std::string& trainer_id, int sig) const {
  const std::map<std::string, int> pids = TrainerPids();
  auto it = pids.find(trainer_id);
  if (it == pids.end()) {
    return absl::NotFoundError(absl::StrCat("no trainer registered as ", trainer_id));
  }
  if (kill(it->second, sig) != 0) {
    return absl::InternalError(
        absl::StrCat("kill ", trainer_id, " (pid ", it->second, "): ", strerror(errno)));
  }
  return absl::OkStatus();
}

std::string TestCluster::Log(const std::string& process) const {
  return ReadFile(absl::StrCat(dir_, "/", process, ".log"));
}

int TestCluster::CountInLog(const std::string& process, const std::string& needle) const {
  const std::string text = Log(process);
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

double TestCluster::Metric(const std::string& name, const std::string& series) const {
  absl::StatusOr<ClusterProcess> p = Process(name);
  return p.ok() ? ScrapeSample(PortOfUrl(p->metrics_url), series) : -1;
}

double TestCluster::SchedulerMetric(const std::string& series) const {
  return ScrapeSample(PortOfUrl(scheduler_.metrics_url), series);
}

absl::StatusOr<kvstore::v1::ShardMap> TestCluster::KvstoreMap() {
  kvstore::v1::ShardMap map;
  DT_RETURN_IF_ERROR(FromGrpcStatus(
      stubs_->jobs->GetKvstoreMap(Ctx().get(), kvstore::v1::GetShardMapRequest(), &map),
      "GetKvstoreMap"));
  return map;
}

absl::Status TestCluster::KvstoreJobOnShard(int i, const std::string& kv_job) const {
  kvstore::ClientOptions o;
  o.job = kv_job;
  o.unavailable_timeout = absl::Seconds(1);
  int index = 0;
  if (replicas_ > 1) {
    for (const ClusterProcess& p : kvstore_) o.servers.push_back(p.address);
    o.replicas = replicas_;
    index = i;
  } else {
    o.servers = {shard(i).address};
  }
  DT_ASSIGN_OR_RETURN(std::unique_ptr<kvstore::KVClient> client, kvstore::KVClient::Connect(o));
  return client->GetJob(index, false).status();
}

absl::StatusOr<std::vector<std::string>> TestCluster::JobsOn(const ClusterProcess& p) const {
  DT_ASSIGN_OR_RETURN(std::string text, metrics::Scrape(PortOfUrl(p.metrics_url)));
  std::vector<std::string> jobs;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "dtrain_kvstore_slices{job=\"")) continue;
    jobs.emplace_back(line.substr(0, line.find('"')));
  }
  return jobs;
}

void ClusterTest::Up(ClusterOptions options) {
  if (options.name.empty()) {
    options.name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  absl::StatusOr<std::unique_ptr<TestCluster>> c = TestCluster::Start(options);
  ASSERT_TRUE(c.ok()) << c.status();
  cluster_ = *std::move(c);
}

ClusterTest::JobStatus ClusterTest::WaitMidEpoch(const std::string& id, const MidEpoch& w) {
  absl::StatusOr<JobStatus> job = cluster_->WaitMidEpoch(id, w);
  if (job.ok()) return *job;
  ADD_FAILURE() << job.status();
  return Get(id);
}

}  // namespace e2e
}  // namespace dtrain
