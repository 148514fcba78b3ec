// SchedulerStore against a real scheduler server on loopback: the store
// contract, the scheduler's checks, and a TCP communicator that meets
// through it.
#include "services/trainer/scheduler_store.h"

#include <grpcpp/grpcpp.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/collective/communicator.h"
#include "libs/rpc/credentials.h"
#include "services/scheduler/server.h"

namespace dtrain {
namespace trainer {
namespace {

namespace v1 = scheduler::v1;

class SchedulerStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = scheduler::SchedulerServer::Start({});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::ClusterService::NewStub(
        dtrain::rpc::NewChannel(absl::StrCat("127.0.0.1:", server_->port())));
    for (int i = 0; i < 3; ++i) {
      v1::RegisterTrainerRequest r;
      r.set_name(absl::StrCat("t", i));
      r.add_devices("cpu");
      auto t = server_->scheduler()->RegisterTrainer(r);
      ASSERT_TRUE(t.ok()) << t.status();
      trainers_.push_back(t->trainer_id());
    }
    v1::JobSpec spec;
    spec.set_name("rendezvous");
    spec.set_model("mlp");
    spec.set_epochs(1);
    spec.set_global_batch_size(8);
    spec.set_lr(0.1);
    spec.set_num_trainers(2);
    auto job = server_->scheduler()->Submit(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->state(), v1::RUNNING);
    ASSERT_EQ(job->attempts(), 1);
    job_ = job->id();
    for (int i = 0; i < 2; ++i) {
      v1::HeartbeatRequest hb;
      hb.set_trainer_id(trainers_[i]);
      auto reply = server_->scheduler()->Heartbeat(hb);
      ASSERT_TRUE(reply.ok()) << reply.status();
      ASSERT_EQ(reply->assignments_size(), 1);
      EXPECT_EQ(reply->assignments(0).attempt(), 1);
      EXPECT_EQ(reply->assignments(0).rank(), i);
    }
  }

  SchedulerStore Store(int trainer, int attempt = 1) {
    SchedulerStoreOptions o;
    o.retry_for = absl::Seconds(2);
    return SchedulerStore(stub_.get(), trainers_[trainer], job_, attempt, o);
  }

  std::unique_ptr<scheduler::SchedulerServer> server_;
  std::unique_ptr<v1::ClusterService::Stub> stub_;
  std::vector<std::string> trainers_;
  std::string job_;
};

TEST_F(SchedulerStoreTest, SetGetAdd) {
  SchedulerStore a = Store(0), b = Store(1);
  ASSERT_TRUE(a.Set("k", "v1").ok());
  auto got = b.Get("k", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v1");
  ASSERT_TRUE(b.Set("k", std::string("\0bin", 4)).ok());
  EXPECT_EQ(*a.Get("k", absl::ZeroDuration()), std::string("\0bin", 4));

  EXPECT_EQ(*a.Add("n", 2), 2);
  EXPECT_EQ(*b.Add("n", 3), 5);
  EXPECT_EQ(*a.Get("n", absl::ZeroDuration()), "5");
  EXPECT_EQ(a.Add("k", 1).status().code(), absl::StatusCode::kInvalidArgument);

  // Get waits for a key set later, across the scheduler's wait slices.
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_TRUE(b.Set("late", "here").ok());
  });
  got = a.Get("late", absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");

  const absl::Time start = absl::Now();
  got = a.Get("never", absl::Milliseconds(300));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_NE(got.status().message().find("never"), std::string::npos) << got.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  // StoreBarrier works over it.
  std::thread other(
      [&] { EXPECT_TRUE(collective::StoreBarrier(b, "bar", 2, absl::Seconds(5)).ok()); });
  EXPECT_TRUE(collective::StoreBarrier(a, "bar", 2, absl::Seconds(5)).ok());
  other.join();
}

TEST_F(SchedulerStoreTest, AddWithTheSameRequestIdCountsOnce) {
  v1::StoreAddRequest r;
  r.set_trainer_id(trainers_[0]);
  r.set_job_id(job_);
  r.set_attempt(1);
  r.set_key("c");
  r.set_delta(1);
  r.set_request_id(42);
  EXPECT_EQ(*server_->scheduler()->StoreAdd(r), 1);
  EXPECT_EQ(*server_->scheduler()->StoreAdd(r), 1);  // a retry
  r.set_request_id(43);
  EXPECT_EQ(*server_->scheduler()->StoreAdd(r), 2);
}

TEST_F(SchedulerStoreTest, RejectsStrangersStaleAttemptsBadKeysAndEndedJobs) {
  EXPECT_EQ(Store(2).Set("k", "v").code(),
            absl::StatusCode::kFailedPrecondition);  // not on the job
  absl::Status s = Store(0, /*attempt=*/2).Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("attempt"), std::string::npos) << s;
  SchedulerStore a = Store(0);
  EXPECT_EQ(a.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Set(std::string(scheduler::kMaxStoreKeyBytes + 1, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  s = a.Set("big", std::string(scheduler::kMaxStoreValueBytes + 1, 'v'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(s.message().find("ClusterService.StoreSet") != std::string::npos) << s;
  SchedulerStore unknown(stub_.get(), "trainer-nope", job_, 1);
  EXPECT_EQ(unknown.Set("k", "v").code(), absl::StatusCode::kNotFound);

  // A Get waiting when the job ends returns at once; the table is gone.
  ASSERT_TRUE(a.Set("k", "v").ok());
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_TRUE(server_->scheduler()->Cancel(job_, "test").ok());
  });
  const absl::Time start = absl::Now();
  auto got = a.Get("never", absl::Seconds(30));
  canceller.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(a.Get("k", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// With the scheduler away (restarting), a poll (Get with no timeout) fails
// within 250 ms of retries instead of retrying for an RPC timeout: the
// agent's drain poll does not hold up training; a wait is still retried.
TEST_F(SchedulerStoreTest, APollIsNotRetriedWhileTheSchedulerIsAway) {
  SchedulerStore store(stub_.get(), trainers_[0], job_, 1, SchedulerStoreOptions());
  ASSERT_TRUE(store.Set("k", "v").ok());
  EXPECT_EQ(*store.Get("k", absl::ZeroDuration()), "v");
  server_.reset();
  absl::Time start = absl::Now();
  absl::StatusOr<std::string> polled = store.Get("k", absl::ZeroDuration());
  EXPECT_EQ(polled.status().code(), absl::StatusCode::kUnavailable) << polled.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));  // it was 5 s (rpc_timeout) of retries
  start = absl::Now();
  absl::StatusOr<std::string> waited = store.Get("k", absl::Seconds(1));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kUnavailable) << waited.status();
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
}

TEST_F(SchedulerStoreTest, TcpCommunicatorMeetsThroughTheScheduler) {
  std::vector<float> data[2] = {{1, 2, 3}, {10, 20, 30}};
  absl::Status results[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      SchedulerStore store = Store(r);
      collective::CommunicatorOptions o;
      o.transport = collective::TransportKind::kTcp;
      o.timeout = absl::Seconds(20);
      o.tcp.host = "127.0.0.1";
      auto comm = collective::Communicator::Create(r, 2, &store, o);
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      results[r] = (*comm)->Allreduce(data[r].data(), 3, DType::kF32);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    EXPECT_EQ(data[r], (std::vector<float>{11, 22, 33}));
  }
}

}  // namespace
}  // namespace trainer
}  // namespace dtrain
