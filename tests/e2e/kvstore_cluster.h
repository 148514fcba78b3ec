// A local cluster for the kvstore end-to-end tests: `trainctl cluster up`
// with one scheduler, two kvstore shards and two trainer daemons, and what
// the tests read from it (processes, logs, metrics, kvstore jobs, RSS).
#ifndef DTRAIN_TESTS_E2E_KVSTORE_CLUSTER_H_
#define DTRAIN_TESTS_E2E_KVSTORE_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "protos/scheduler.grpc.pb.h"
#include "tests/e2e/e2e_util.h"

namespace dtrain {
namespace e2e {

struct KvstoreClusterOptions {
  // Environment assignments for the cluster's processes ("VAR=value ...").
  std::string env;
  // The supervisor restarts processes that die (as Kubernetes would).
  bool restart = false;
  int replicas = 1;  // per shard
  int trainers = 2;
  // More `trainctl cluster up` flags.
  std::string flags;
};

class KvstoreCluster {
 public:
  KvstoreCluster(const std::string& name, const KvstoreClusterOptions& options);
  // Starts the cluster in $TEST_TMPDIR/<name>, its processes with the
  // environment assignments `env` ("VAR=value ..."); status() says whether
  // it started. Processes that die stay dead unless `restart` (then the
  // cluster's supervisor restarts them, as Kubernetes would).
  // With replicas > 1 each shard is a chain of that many replicas
  // (kvstore-<i>-<j> in cluster.json).
  explicit KvstoreCluster(const std::string& name, const std::string& env = "",
                          bool restart = false, int replicas = 1);
  // `trainctl cluster down`, then SIGKILL to anything left.
  ~KvstoreCluster();

  absl::Status status() const { return status_; }
  const std::string& dir() const { return dir_; }
  scheduler::v1::JobService::Stub* jobs() { return stub_.get(); }
  // kvstore-<i>, as cluster.json lists it (replicas == 1).
  const ClusterProcess& shard(int i) const { return shards_[static_cast<size_t>(i)]; }
  // kvstore-<i>-<j> (replicas > 1).
  const ClusterProcess& replica(int shard, int j) const {
    return shards_[static_cast<size_t>(shard * replicas_ + j)];
  }
  int replicas() const { return replicas_; }
  // The scheduler's shard map (JobService.GetKvstoreMap).
  absl::StatusOr<kvstore::v1::ShardMap> KvstoreMap();
  const ClusterProcess& scheduler() const { return scheduler_; }

  // A 2-trainer MLP job synchronizing through the kvstore (SYNCHRONOUS).
  static scheduler::v1::SubmitRequest KvstoreJob(const std::string& name, int epochs,
                                                 int64_t train_limit);
  absl::StatusOr<scheduler::v1::JobStatus> Submit(const scheduler::v1::SubmitRequest& r);
  absl::StatusOr<scheduler::v1::JobStatus> Get(const std::string& id);
  absl::Status Cancel(const std::string& id);

  // The text of <dir>/<process>.log.
  std::string Log(const std::string& process) const;
  // Occurrences of `needle` in <dir>/<process>.log.
  int CountInLog(const std::string& process, const std::string& needle) const;

  // GetJob of kvstore job `kv_job` on shard `i`: OK, NOT_FOUND, or the error.
  absl::Status KvstoreJobOnShard(int i, const std::string& kv_job) const;
  // The jobs shard `i` reports in its per-job metric series
  // (dtrain_kvstore_slices{job=...}), or an error if it cannot be scraped.
  absl::StatusOr<std::vector<std::string>> ShardJobs(int i) const;
  // The same for any kvstore process (a replica).
  absl::StatusOr<std::vector<std::string>> JobsOn(const ClusterProcess& p) const;
  // Every kvstore process (replicas, shard-major).
  const std::vector<ClusterProcess>& kvstore_processes() const { return shards_; }

 private:
  std::string dir_;
  absl::Status status_;
  ClusterProcess scheduler_;
  int replicas_ = 1;
  std::vector<ClusterProcess> shards_;
  std::unique_ptr<scheduler::v1::JobService::Stub> stub_;
};

// VmRSS of `pid` in bytes (from /proc/<pid>/status), or -1.
int64_t ResidentBytes(int pid);

}  // namespace e2e
}  // namespace dtrain

#endif  // DTRAIN_TESTS_E2E_KVSTORE_CLUSTER_H_
