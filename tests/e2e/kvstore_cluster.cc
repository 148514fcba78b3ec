#include "tests/e2e/kvstore_cluster.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/base/grpc_status.h"
#include "libs/base/status.h"
#include "libs/kvstore/client.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"

namespace dtrain {
namespace e2e {

namespace v1 = scheduler::v1;

namespace {

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return ctx;
}

}  // namespace

KvstoreCluster::KvstoreCluster(const std::string& name, const std::string& env, bool restart,
                               int replicas)
    : KvstoreCluster(name, [&] {
        KvstoreClusterOptions o;
        o.env = env;
        o.restart = restart;
        o.replicas = replicas;
        return o;
      }()) {}

KvstoreCluster::KvstoreCluster(const std::string& name, const KvstoreClusterOptions& options)
    : dir_(TmpDir(name)), replicas_(options.replicas) {
  int rc;
  const std::string out =
      Run(absl::StrCat(options.env, " ", Runfile("services/trainctl/trainctl"),
                       " cluster up --trainers=", options.trainers,
                       " --kvstore_shards=2 --kvstore_replicas=", options.replicas,
                       " --heartbeat_timeout_s=3 --restart=", options.restart ? "always" : "never",
                       " ", options.flags, " --dir=", dir_),
          &rc);
  if (rc != 0) {
    status_ = absl::InternalError(absl::StrCat("trainctl cluster up failed: ", out));
    return;
  }
  UseClusterCredentials(dir_);
  for (const ClusterProcess& p : ReadCluster(dir_)) {
    if (p.role == "scheduler") scheduler_ = p;
    if (p.role == "kvstore") shards_.push_back(p);
  }
  const std::string first = replicas_ == 1 ? "kvstore-0" : "kvstore-0-0";
  if (scheduler_.address.empty() || shards_.size() != static_cast<size_t>(2 * replicas_) ||
      shards_[0].name != first) {
    status_ = absl::InternalError(absl::StrCat("unexpected cluster.json: ", out));
    return;
  }
  stub_ = v1::JobService::NewStub(dtrain::rpc::NewChannel(scheduler_.address));
}

KvstoreCluster::~KvstoreCluster() {
  int rc;
  const std::vector<ClusterProcess> procs = ReadCluster(dir_);
  Trainctl("cluster down --grace_s=5 --dir=" + dir_, &rc);
  for (const ClusterProcess& p : procs) {
    if (ProcessAlive(p.pid)) kill(p.pid, SIGKILL);
  }
}

v1::SubmitRequest KvstoreCluster::KvstoreJob(const std::string& name, int epochs,
                                             int64_t train_limit) {
  v1::SubmitRequest r;
  v1::JobSpec* s = r.mutable_spec();
  s->set_name(name);
  s->set_model("mlp");
  s->set_epochs(epochs);
  s->set_global_batch_size(64);
  s->set_lr(0.1);
  s->set_seed(1);
  s->set_train_limit(train_limit);
  s->set_test_limit(64);
  s->set_threads(1);
  s->set_num_trainers(2);
  s->mutable_sync()->set_mode(v1::KVSTORE);
  s->mutable_sync()->set_consistency(v1::SYNCHRONOUS);
  return r;
}

absl::StatusOr<v1::JobStatus> KvstoreCluster::Submit(const v1::SubmitRequest& r) {
  v1::JobStatus st;
  DT_RETURN_IF_ERROR(FromGrpcStatus(stub_->Submit(Ctx().get(), r, &st), "Submit"));
  return st;
}

absl::StatusOr<v1::JobStatus> KvstoreCluster::Get(const std::string& id) {
  v1::GetRequest get;
  get.set_id(id);
  v1::JobStatus st;
  DT_RETURN_IF_ERROR(FromGrpcStatus(stub_->Get(Ctx().get(), get, &st), "Get"));
  return st;
}

absl::Status KvstoreCluster::Cancel(const std::string& id) {
  v1::CancelRequest c;
  c.set_id(id);
  v1::JobStatus st;
  return FromGrpcStatus(stub_->Cancel(Ctx().get(), c, &st), "Cancel");
}

std::string KvstoreCluster::Log(const std::string& process) const {
  std::ifstream in(absl::StrCat(dir_, "/", process, ".log"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int KvstoreCluster::CountInLog(const std::string& process, const std::string& needle) const {
  const std::string text = Log(process);
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

absl::StatusOr<kvstore::v1::ShardMap> KvstoreCluster::KvstoreMap() {
  kvstore::v1::ShardMap map;
  DT_RETURN_IF_ERROR(FromGrpcStatus(
      stub_->GetKvstoreMap(Ctx().get(), kvstore::v1::GetShardMapRequest(), &map), "GetKvstoreMap"));
  return map;
}

absl::Status KvstoreCluster::KvstoreJobOnShard(int i, const std::string& kv_job) const {
  kvstore::ClientOptions o;
  if (replicas_ > 1) {
    for (const ClusterProcess& p : shards_) o.servers.push_back(p.address);
    o.replicas = replicas_;
    o.job = kv_job;
    o.unavailable_timeout = absl::Seconds(1);
    DT_ASSIGN_OR_RETURN(std::unique_ptr<kvstore::KVClient> client, kvstore::KVClient::Connect(o));
    return client->GetJob(i, false).status();
  }
  o.servers = {shards_[static_cast<size_t>(i)].address};
  o.job = kv_job;
  o.unavailable_timeout = absl::Seconds(1);
  DT_ASSIGN_OR_RETURN(std::unique_ptr<kvstore::KVClient> client, kvstore::KVClient::Connect(o));
  return client->GetJob(0, false).status();
}

absl::StatusOr<std::vector<std::string>> KvstoreCluster::ShardJobs(int i) const {
  return JobsOn(shards_[static_cast<size_t>(i)]);
}

absl::StatusOr<std::vector<std::string>> KvstoreCluster::JobsOn(const ClusterProcess& p) const {
  DT_ASSIGN_OR_RETURN(std::string text, metrics::Scrape(PortOfUrl(p.metrics_url)));
  std::vector<std::string> jobs;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "dtrain_kvstore_slices{job=\"")) continue;
    jobs.emplace_back(line.substr(0, line.find('"')));
  }
  return jobs;
}

int64_t ResidentBytes(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    int64_t kb = 0;
    if (!absl::ConsumeSuffix(&rest, " kB") || !absl::SimpleAtoi(rest, &kb)) return -1;
    return kb * 1024;
  }
  return -1;
}

}  // namespace e2e
}  // namespace dtrain
