#include "tests/e2e/cluster_fixture.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/base/grpc_status.h"
#include "libs/rpc/credentials.h"
#include "tests/e2e/e2e_util.h"

namespace dtrain {
namespace e2e {

namespace v1 = scheduler::v1;

void ClusterFixture::Up(const std::string& name, const std::string& flags) {
  dir_ = TmpDir(name);
  int rc;
  // Trainctl() makes this process use the cluster's admin credential.
  const std::string out = Trainctl(absl::StrCat("cluster up --dir=", dir_, " ", flags), &rc);
  ASSERT_EQ(rc, 0) << out;
  for (const ClusterProcess& p : ReadCluster(dir_)) {
    if (p.role == "scheduler") {
      scheduler_ = p.address;
      scheduler_metrics_port_ = PortOfUrl(p.metrics_url);
    }
  }
  ASSERT_NE(scheduler_, "") << out;
  stub_ = v1::JobService::NewStub(rpc::NewChannel(scheduler_));
}

void ClusterFixture::TearDown() {
  if (dir_.empty()) return;
  int rc;
  Trainctl(absl::StrCat("cluster down --grace_s=", down_grace_s_, " --dir=", dir_), &rc);
  for (const ClusterProcess& p : ReadCluster(dir_)) {
    if (ProcessAlive(p.pid)) kill(p.pid, SIGKILL);
  }
}

std::unique_ptr<grpc::ClientContext> ClusterFixture::Ctx(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

v1::SubmitRequest ClusterFixture::MomentumLenetJob(const std::string& name, int epochs,
                                                   int64_t train_limit) {
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

v1::JobStatus ClusterFixture::Submit(const v1::SubmitRequest& request) {
  v1::JobStatus job;
  absl::Status s = FromGrpcStatus(stub_->Submit(Ctx().get(), request, &job), "Submit");
  EXPECT_TRUE(s.ok()) << s;
  return job;
}

v1::JobStatus ClusterFixture::Get(const std::string& id) {
  v1::GetRequest get;
  get.set_id(id);
  v1::JobStatus st;
  absl::Status s = FromGrpcStatus(stub_->Get(Ctx().get(), get, &st), "Get");
  EXPECT_TRUE(s.ok()) << s;
  return st;
}

void ClusterFixture::Cancel(const std::string& id) {
  v1::CancelRequest c;
  c.set_id(id);
  v1::JobStatus st;
  absl::Status s = FromGrpcStatus(stub_->Cancel(Ctx().get(), c, &st), "Cancel");
  EXPECT_TRUE(s.ok()) << s;
}

v1::JobStatus ClusterFixture::WatchToEnd(const std::string& id, absl::Duration timeout) {
  absl::StatusOr<v1::JobStatus> last = e2e::WatchToEnd(stub_.get(), id, timeout);
  EXPECT_TRUE(last.ok()) << last.status();
  return last.ok() ? *last : v1::JobStatus();
}

bool ClusterFixture::IsFinal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

v1::JobStatus ClusterFixture::PollJob(const std::string& id,
                                      const std::function<bool(const JobStatus&)>& until,
                                      absl::Duration timeout) {
  v1::JobStatus job = Get(id);
  for (const absl::Time deadline = absl::Now() + timeout;
       !until(job) && !IsFinal(job.state()) && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
    job = Get(id);
  }
  return job;
}

v1::JobStatus ClusterFixture::WaitMidEpoch(const std::string& id, const MidEpoch& w) {
  auto in_window = [&](const v1::JobStatus& j) {
    return j.state() == v1::RUNNING && j.epoch() >= w.first_epoch - 1 &&
           j.epoch() <= w.last_epoch - 1 && j.step() >= w.min_step &&
           j.step() + w.min_steps_left <= j.steps_per_epoch();
  };
  v1::JobStatus job = PollJob(
      id, [&](const v1::JobStatus& j) { return in_window(j) || j.epoch() >= w.last_epoch; },
      w.timeout);
  EXPECT_TRUE(in_window(job)) << "not in the middle of epochs " << w.first_epoch << ".."
                              << w.last_epoch << ": " << job.DebugString();
  return job;
}

double ClusterFixture::SchedulerMetric(const std::string& series) const {
  return ScrapeSample(scheduler_metrics_port_, series);
}

std::map<std::string, int> ClusterFixture::TrainerPids() const { return e2e::TrainerPids(dir_); }

}  // namespace e2e
}  // namespace dtrain
