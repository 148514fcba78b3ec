// Issue 16, exhaustion: slow clients holding the scheduler's /metrics
// connections. Throughout, the gRPC health probe and a scrape of /metrics
// each answer within 1 s, and the scheduler keeps serving jobs.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/health_check.h"
#include "protos/scheduler.grpc.pb.h"
#include "services/scheduler/server.h"

namespace dtrain {
namespace scheduler {
namespace {

TEST(SlowMetricsClientsTest, HealthAndMetricsAnswerWithinOneSecond) {
  ServerOptions o;
  o.metrics_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                     grpc::InsecureChannelCredentials());
  ASSERT_TRUE(rpc::HealthServing(channel.get(), absl::Seconds(10)));  // connected
  auto jobs = v1::JobService::NewStub(channel);

  // Four times the default connection cap, trickling or silent.
  metrics::SlowClients slow((*server)->metrics_port(), 128, absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(300));
  for (int i = 0; i < 10; ++i) {
    absl::Time start = absl::Now();
    EXPECT_TRUE(rpc::HealthServing(channel.get(), absl::Seconds(1))) << "probe " << i;
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "probe " << i;

    start = absl::Now();
    absl::StatusOr<std::string> text = metrics::Scrape((*server)->metrics_port());
    ASSERT_TRUE(text.ok()) << "scrape " << i << ": " << text.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "scrape " << i;
    // Current figures: the jobs submitted so far wait (no trainers).
    absl::StatusOr<double> queued = metrics::SampleValue(*text, "dtrain_scheduler_queue_length");
    ASSERT_TRUE(queued.ok()) << *text;
    EXPECT_EQ(*queued, i);

    // The scheduler itself keeps working: a submit is accepted.
    v1::SubmitRequest r;
    r.mutable_spec()->set_name(absl::StrCat("j", i));
    r.mutable_spec()->set_model("mlp");
    r.mutable_spec()->set_epochs(1);
    r.mutable_spec()->set_global_batch_size(64);
    r.mutable_spec()->set_lr(0.1);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    v1::JobStatus reply;
    grpc::Status s = jobs->Submit(&ctx, r, &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_GT(slow.closed_by_server(), 0);
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain
