// The scheduler's gRPC service for the e2e tests that call it themselves
// (test_cluster.h is the cluster; this adds deadlines, the admin's and the
// users' JobService stubs and Watch):
//
//   v1::ListQueuesReply reply;
//   grpc::Status s = cluster->stubs().jobs->ListQueues(Ctx().get(), {}, &reply);
//   absl::StatusOr<JobStatus> done = WatchToEnd(JobsAs(*cluster, "alice").get(), id, timeout);
#ifndef DTRAIN_TESTS_E2E_TEST_CLUSTER_RPC_H_
#define DTRAIN_TESTS_E2E_TEST_CLUSTER_RPC_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "protos/scheduler.grpc.pb.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {

// A client context whose deadline is `timeout` from now.
std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout = absl::Seconds(10));

// Sets `ctx`'s deadline `timeout` from now.
void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout);

struct TestCluster::Stubs {
  std::unique_ptr<scheduler::v1::JobService::Stub> jobs;  // as the admin
};

// A JobService stub of `cluster`'s scheduler with `user`'s certificate
// (ClusterOptions::users, or "admin").
std::unique_ptr<scheduler::v1::JobService::Stub> JobsAs(const TestCluster& cluster,
                                                        const std::string& user);

// Watches job `id` until its stream ends (the job finished) and returns the
// last status; the stream's error, if it fails, or DEADLINE_EXCEEDED after
// `timeout`.
absl::StatusOr<scheduler::v1::JobStatus> WatchToEnd(scheduler::v1::JobService::Stub* stub,
                                                    const std::string& id, absl::Duration timeout);

}  // namespace e2e
}  // namespace dtrain

#endif  // DTRAIN_TESTS_E2E_TEST_CLUSTER_RPC_H_
