#include "services/scheduler/server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "libs/base/grpc_status.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/metrics/metrics.h"
#include "libs/rpc/authorize.h"
#include "libs/rpc/credentials.h"
#include "libs/rpc/server.h"
#include "libs/scheduler/model_check.h"
#include "libs/scheduler/timeline_store.h"
#include "libs/security/authz.h"
#include "protos/scheduler.grpc.pb.h"
#include "services/scheduler/model_rpc.h"

namespace dtrain {
namespace scheduler {
namespace {

constexpr absl::Duration kWatchPoll = absl::Milliseconds(200);
constexpr absl::Duration kModelGcPeriod = absl::Minutes(1);

// Per-RPC counters and latencies.
class RpcMetrics {
 public:
  RpcMetrics()
      : registry_(std::make_shared<prometheus::Registry>()),
        requests_(metrics::AddCounter(*registry_, "dtrain_scheduler_requests_total",
                                      "RPCs handled, by method and status code.")),
        latency_(metrics::AddHistogram(*registry_, "dtrain_scheduler_request_duration_seconds",
                                       "RPC latency (Watch: the whole stream).")) {}

  // Runs `handler` and records its outcome under `method`.
  template <typename F>
  grpc::Status Observe(const char* method, F handler) {
    const absl::Time start = absl::Now();
    grpc::Status status = handler();
    requests_
        .Add({{"method", method},
              {"code",
               absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))}})
        .Increment();
    latency_.Add({{"method", method}}, metrics::LatencyBuckets())
        .Observe(absl::ToDoubleSeconds(absl::Now() - start));
    return status;
  }

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(Scheduler* s, KvstoreMembership* kv, TimelineStore* timelines, ModelStore* models,
                 const absl::Notification* stopping, RpcMetrics* m)
      : s_(s), kv_(kv), timelines_(timelines), models_(models), stopping_(stopping), m_(m) {}

  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req,
                      v1::JobStatus* reply) override {
    return m_->Observe("Submit", [&] { return ToGrpcStatus(DoSubmit(*ctx, req, reply)); });
  }
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetRequest* req,
                   v1::JobStatus* reply) override {
    return m_->Observe("Get", [&] {
      absl::StatusOr<JobStatus> r = JobFor(*ctx, req->id(), security::Action::kReadJob);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *reply = std::move(*r);
      return grpc::Status::OK;
    });
  }
  grpc::Status GetTimeline(grpc::ServerContext* ctx, const v1::GetTimelineRequest* req,
                           v1::Timeline* reply) override {
    return m_->Observe("GetTimeline", [&] {
      absl::StatusOr<JobStatus> job = JobFor(*ctx, req->id(), security::Action::kReadJob);
      if (!job.ok()) return ToGrpcStatus(job.status());
      absl::StatusOr<v1::Timeline> t = timelines_->Get(req->id());
      if (!t.ok()) return ToGrpcStatus(t.status());
      *reply = std::move(*t);
      return grpc::Status::OK;
    });
  }
  grpc::Status List(grpc::ServerContext* ctx, const v1::ListRequest* req,
                    v1::ListReply* reply) override {
    return m_->Observe("List", [&] { return ToGrpcStatus(DoList(*ctx, req, reply)); });
  }
  grpc::Status Cancel(grpc::ServerContext* ctx, const v1::CancelRequest* req,
                      v1::JobStatus* reply) override {
    return m_->Observe("Cancel", [&] {
      absl::StatusOr<JobStatus> job = JobFor(*ctx, req->id(), security::Action::kCancelJob);
      if (!job.ok()) return ToGrpcStatus(job.status());
      return DoCancel(req, reply);
    });
  }
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::JobStatus>* writer) override {
    return m_->Observe("Watch", [&] {
      absl::StatusOr<JobStatus> job = JobFor(*ctx, req->id(), security::Action::kReadJob);
      if (!job.ok()) return ToGrpcStatus(job.status());
      return DoWatch(ctx, req, writer);
    });
  }
  grpc::Status DrainTrainer(grpc::ServerContext* ctx, const v1::DrainTrainerRequest* req,
                            v1::TrainerStatus* reply) override {
    return m_->Observe("DrainTrainer", [&] {
      absl::StatusOr<security::Identity> who =
          rpc::AuthorizedPeer(*ctx, security::Action::kDrainTrainer);
      if (!who.ok()) return ToGrpcStatus(who.status());
      absl::StatusOr<v1::TrainerStatus> r = s_->DrainTrainer(req->trainer());
      if (!r.ok()) return ToGrpcStatus(r.status());
      *reply = std::move(*r);
      return grpc::Status::OK;
    });
  }
  grpc::Status ListTrainers(grpc::ServerContext* ctx, const v1::ListTrainersRequest*,
                            v1::ListTrainersReply* reply) override {
    return m_->Observe("ListTrainers", [&] {
      absl::StatusOr<security::Identity> who =
          rpc::AuthorizedPeer(*ctx, security::Action::kListTrainers);
      if (!who.ok()) return ToGrpcStatus(who.status());
      for (v1::TrainerStatus& t : s_->ListTrainers()) *reply->add_trainers() = std::move(t);
      return grpc::Status::OK;
    });
  }
  grpc::Status ListQueues(grpc::ServerContext* ctx, const v1::ListQueuesRequest*,
                          v1::ListQueuesReply* reply) override {
    return m_->Observe("ListQueues", [&] {
      absl::StatusOr<security::Identity> who =
          rpc::AuthorizedPeer(*ctx, security::Action::kListQueues);
      if (!who.ok()) return ToGrpcStatus(who.status());
      // The file (users' names) only for admins.
      *reply = s_->ListQueues(security::SeesAllJobs(*who));
      return grpc::Status::OK;
    });
  }
  grpc::Status ApplyQueues(grpc::ServerContext* ctx, const v1::ApplyQueuesRequest* req,
                           v1::ListQueuesReply* reply) override {
    return m_->Observe("ApplyQueues", [&] {
      absl::StatusOr<security::Identity> who =
          rpc::AuthorizedPeer(*ctx, security::Action::kApplyQueues);
      if (!who.ok()) return ToGrpcStatus(who.status());
      absl::StatusOr<v1::ListQueuesReply> r = s_->ApplyQueues(req->yaml(), who->ToString());
      if (!r.ok()) {
        DT_LOG(WARNING) << "queues file from " << who->ToString() << " refused: " << r.status();
        return ToGrpcStatus(r.status());
      }
      *reply = std::move(*r);
      return grpc::Status::OK;
    });
  }
  grpc::Status PutModel(grpc::ServerContext* ctx, grpc::ServerReader<v1::ModelChunk>* in,
                        v1::PutModelReply* reply) override {
    return m_->Observe("PutModel", [&] {
      absl::StatusOr<security::Identity> who =
          rpc::AuthorizedPeer(*ctx, security::Action::kSubmitJob);
      if (!who.ok()) return ToGrpcStatus(who.status());
      absl::StatusOr<v1::PutModelReply> r = ReceiveModel(models_, in);
      if (!r.ok()) return ToGrpcStatus(r.status());
      if (!r->existed()) {
        DT_LOG(INFO) << "model " << r->digest() << " (" << r->total_bytes()
                     << " bytes) uploaded by " << who->ToString();
      }
      *reply = std::move(*r);
      return grpc::Status::OK;
    });
  }
  grpc::Status GetJobModel(grpc::ServerContext* ctx, const v1::GetJobModelRequest* req,
                           grpc::ServerWriter<v1::ModelChunk>* out) override {
    return m_->Observe("GetJobModel", [&] {
      absl::StatusOr<JobStatus> job = JobFor(*ctx, req->id(), security::Action::kReadJob);
      if (!job.ok()) return ToGrpcStatus(job.status());
      const std::string& digest = job->spec().model_digest();
      if (digest.empty()) {
        return ToGrpcStatus(absl::NotFoundError(absl::StrCat(
            req->id(), " trains the built-in model ", job->spec().model(), ": no model file")));
      }
      if (models_ == nullptr) {
        return ToGrpcStatus(absl::NotFoundError("this scheduler has no model store"));
      }
      absl::StatusOr<std::string> path = models_->Find(digest);
      if (!path.ok()) return ToGrpcStatus(path.status());
      return ToGrpcStatus(SendModel(*path, digest, out));
    });
  }
  grpc::Status GetKvstoreMap(grpc::ServerContext* ctx, const kvstore::v1::GetShardMapRequest*,
                             kvstore::v1::ShardMap* reply) override {
    return m_->Observe("GetKvstoreMap", [&] {
      absl::StatusOr<security::Identity> who =
          rpc::AuthorizedPeer(*ctx, security::Action::kReadKvstoreMap);
      if (!who.ok()) return ToGrpcStatus(who.status());
      *reply = kv_->Map();
      return grpc::Status::OK;
    });
  }

 private:
  absl::Status DoSubmit(const grpc::ServerContext& ctx, const v1::SubmitRequest* req,
                        v1::JobStatus* reply) {
    DT_ASSIGN_OR_RETURN(security::Identity who,
                        rpc::AuthorizedPeer(ctx, security::Action::kSubmitJob));
    DT_RETURN_IF_ERROR(CheckJobModel(req->spec(), models_));
    DT_ASSIGN_OR_RETURN(JobStatus r,
                        s_->Submit(req->spec(), req->request_id(), security::OwnerOf(who)));
    // A request id another user's submission used answers with that job:
    // not for this caller.
    DT_RETURN_IF_ERROR(security::Authorize(who, security::Action::kReadJob, r.owner()));
    DT_LOG(INFO) << "job " << r.id() << " (" << r.spec().name() << ") submitted by "
                 << who.ToString();
    *reply = std::move(r);
    return absl::OkStatus();
  }

  // Job `id` if the caller may do `action` to it.
  absl::StatusOr<JobStatus> JobFor(const grpc::ServerContext& ctx, const std::string& id,
                                   security::Action action) {
    DT_ASSIGN_OR_RETURN(security::Identity who, rpc::PeerIdentity(ctx));
    // NotFound for an unknown id whoever asks (ids are sequential: their
    // existence is no secret); PermissionDenied for another user's job.
    DT_ASSIGN_OR_RETURN(JobStatus job, s_->Get(id));
    DT_RETURN_IF_ERROR(security::Authorize(who, action, job.owner()));
    return job;
  }

  absl::Status DoList(const grpc::ServerContext& ctx, const v1::ListRequest* req,
                      v1::ListReply* reply) {
    DT_ASSIGN_OR_RETURN(security::Identity who,
                        rpc::AuthorizedPeer(ctx, security::Action::kListJobs));
    if (!v1::JobState_IsValid(req->state())) {
      return absl::InvalidArgumentError(absl::StrCat("state: unknown value ", req->state()));
    }
    const std::string owner = security::OwnerOf(who);
    DT_ASSIGN_OR_RETURN(JobPage page,
                        s_->ListPage(req->state(), req->page_size(), req->page_token(),
                                     security::SeesAllJobs(who) ? nullptr : &owner));
    for (JobStatus& j : page.jobs) *reply->add_jobs() = std::move(j);
    reply->set_next_page_token(std::move(page.next_page_token));
    return absl::OkStatus();
  }

  grpc::Status DoCancel(const v1::CancelRequest* req, v1::JobStatus* reply) {
    absl::StatusOr<JobStatus> r = s_->Cancel(req->id(), req->reason());
    if (!r.ok()) return ToGrpcStatus(r.status());
    DT_LOG(INFO) << "job " << r->id() << " cancelled";
    *reply = std::move(*r);
    return grpc::Status::OK;
  }

  grpc::Status DoWatch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                       grpc::ServerWriter<v1::JobStatus>* writer) {
    int64_t version = -1;
    while (!ctx->IsCancelled()) {
      if (stopping_->HasBeenNotified()) {
        return ToGrpcStatus(absl::UnavailableError("scheduler shutting down; watch again"));
      }
      absl::StatusOr<JobStatus> r = s_->WaitForChange(req->id(), version, absl::Now() + kWatchPoll);
      if (!r.ok()) return ToGrpcStatus(r.status());
      if (r->version() == version) continue;
      version = r->version();
      if (!writer->Write(*r)) break;  // the client went away
      if (IsFinal(r->state())) return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled");
  }

  Scheduler* s_;
  KvstoreMembership* kv_;
  TimelineStore* timelines_;
  ModelStore* models_;
  const absl::Notification* stopping_;
  RpcMetrics* m_;
};

class ClusterServiceImpl final : public v1::ClusterService::Service {
 public:
  ClusterServiceImpl(Scheduler* s, KvstoreMembership* kv, TimelineStore* timelines,
                     ModelStore* models, RpcMetrics* m)
      : s_(s), kv_(kv), timelines_(timelines), models_(models), m_(m) {}

  grpc::Status RegisterTrainer(grpc::ServerContext* ctx, const v1::RegisterTrainerRequest* req,
                               v1::RegisterTrainerReply* reply) override {
    return m_->Observe("RegisterTrainer", [&] {
      absl::StatusOr<security::Identity> who =
          rpc::AuthorizedPeer(*ctx, security::Action::kTrainerCall);
      if (!who.ok()) return ToGrpcStatus(who.status());
      grpc::Status s = DoRegister(req, reply);
      if (s.ok()) trainers_.Bind(reply->trainer_id(), *who);
      return s;
    });
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatReply* reply) override {
    return m_->Observe("Heartbeat", [&] {
      if (absl::Status a = AsTrainer(*ctx, req->trainer_id()); !a.ok()) return ToGrpcStatus(a);
      return DoHeartbeat(req, reply);
    });
  }
  grpc::Status ReportProgress(grpc::ServerContext* ctx, const v1::ProgressReport* req,
                              v1::ReportProgressReply* reply) override {
    return m_->Observe("ReportProgress", [&] {
      if (absl::Status a = AsTrainer(*ctx, req->trainer_id()); !a.ok()) return ToGrpcStatus(a);
      return DoReport(req, reply);
    });
  }
  grpc::Status KvstoreHeartbeat(grpc::ServerContext* ctx,
                                const kvstore::v1::KvstoreHeartbeatRequest* req,
                                kvstore::v1::KvstoreHeartbeatReply* reply) override {
    return m_->Observe("KvstoreHeartbeat", [&] {
      absl::StatusOr<security::Identity> who =
          rpc::AuthorizedPeer(*ctx, security::Action::kKvstoreHeartbeat);
      if (!who.ok()) return ToGrpcStatus(who.status());
      absl::StatusOr<kvstore::v1::KvstoreHeartbeatReply> r = kv_->Heartbeat(*req, absl::Now());
      if (!r.ok()) return ToGrpcStatus(r.status());
      *reply = std::move(*r);
      return grpc::Status::OK;
    });
  }
  grpc::Status StoreSet(grpc::ServerContext* ctx, const v1::StoreSetRequest* req,
                        v1::StoreSetReply*) override {
    return m_->Observe("StoreSet", [&] {
      if (absl::Status a = AsTrainer(*ctx, req->trainer_id()); !a.ok()) return ToGrpcStatus(a);
      return ToGrpcStatus(s_->StoreSet(*req));
    });
  }
  grpc::Status StoreGet(grpc::ServerContext* ctx, const v1::StoreGetRequest* req,
                        v1::StoreGetReply* reply) override {
    return m_->Observe("StoreGet", [&] {
      if (absl::Status a = AsTrainer(*ctx, req->trainer_id()); !a.ok()) return ToGrpcStatus(a);
      v1::StoreGetRequest r = *req;
      // Never wait past the caller's deadline.
      const absl::Duration left = absl::FromChrono(ctx->deadline()) - absl::Now();
      if (left < absl::Milliseconds(r.wait_ms())) {
        r.set_wait_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(left) - 100));
      }
      absl::StatusOr<v1::StoreGetReply> got = s_->StoreGet(r);
      if (!got.ok()) return ToGrpcStatus(got.status());
      *reply = std::move(*got);
      return grpc::Status::OK;
    });
  }
  grpc::Status StoreAdd(grpc::ServerContext* ctx, const v1::StoreAddRequest* req,
                        v1::StoreAddReply* reply) override {
    return m_->Observe("StoreAdd", [&] {
      if (absl::Status a = AsTrainer(*ctx, req->trainer_id()); !a.ok()) return ToGrpcStatus(a);
      absl::StatusOr<int64_t> v = s_->StoreAdd(*req);
      if (!v.ok()) return ToGrpcStatus(v.status());
      reply->set_value(*v);
      return grpc::Status::OK;
    });
  }

  grpc::Status GetModel(grpc::ServerContext* ctx, const v1::GetModelRequest* req,
                        grpc::ServerWriter<v1::ModelChunk>* out) override {
    return m_->Observe("GetModel", [&] {
      if (absl::Status a = AsTrainer(*ctx, req->trainer_id()); !a.ok()) return ToGrpcStatus(a);
      return ToGrpcStatus(DoGetModel(*req, out));
    });
  }

 private:
  // Only the model of a job the trainer holds a rank of.
  absl::Status DoGetModel(const v1::GetModelRequest& req, grpc::ServerWriter<v1::ModelChunk>* out) {
    DT_ASSIGN_OR_RETURN(JobStatus job, s_->Get(req.job_id()));
    if (job.spec().model_digest().empty() || job.spec().model_digest() != req.digest()) {
      return absl::FailedPreconditionError(
          absl::StrCat(req.job_id(), " does not train the model ", req.digest()));
    }
    if (std::find(job.trainers().begin(), job.trainers().end(), req.trainer_id()) ==
        job.trainers().end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(req.job_id(), " is not trainer ", req.trainer_id(), "'s job"));
    }
    if (models_ == nullptr) return absl::NotFoundError("this scheduler has no model store");
    DT_ASSIGN_OR_RETURN(std::string path, models_->Find(req.digest()));
    return SendModel(path, req.digest(), out);
  }

  // A trainer's call about `trainer_id`: the caller must be a trainer, and
  // the one that registered that id (a trainer cannot report or meet for
  // another's assignment; the scheduler checks the id holds the job).
  absl::Status AsTrainer(const grpc::ServerContext& ctx, const std::string& trainer_id) {
    DT_ASSIGN_OR_RETURN(security::Identity who,
                        rpc::AuthorizedPeer(ctx, security::Action::kTrainerCall));
    return trainers_.Check(trainer_id, who);
  }

  grpc::Status DoRegister(const v1::RegisterTrainerRequest* req, v1::RegisterTrainerReply* reply) {
    absl::StatusOr<RegisterTrainerReply> r = s_->RegisterTrainer(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *reply = std::move(*r);
    return grpc::Status::OK;
  }

  grpc::Status DoHeartbeat(const v1::HeartbeatRequest* req, v1::HeartbeatReply* reply) {
    absl::StatusOr<HeartbeatReply> r = s_->Heartbeat(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *reply = std::move(*r);
    reply->set_server_time_unix_us(absl::ToUnixMicros(absl::Now()));
    return grpc::Status::OK;
  }

  grpc::Status DoReport(const v1::ProgressReport* req, v1::ReportProgressReply* reply) {
    if (req->final_state() != v1::JOB_STATE_UNSPECIFIED && !IsFinal(req->final_state())) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          "final_state: must be SUCCEEDED, FAILED or CANCELLED when set"));
    }
    absl::StatusOr<bool> r = s_->ReportProgress(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    reply->set_stop(*r);
    if (req->has_timeline()) {
      // The report was the trainer's own (its job and rank): so is the
      // timeline, whatever it says.
      v1::RankTimeline t = req->timeline();
      t.set_rank(req->rank());
      t.set_attempt(req->attempt());
      t.set_trainer_id(req->trainer_id());
      timelines_->Put(req->job_id(), std::move(t));
    }
    return grpc::Status::OK;
  }

  Scheduler* s_;
  KvstoreMembership* kv_;
  TimelineStore* timelines_;
  ModelStore* models_;
  RpcMetrics* m_;
  security::TrainerBinding trainers_;
};

// A histogram metric from per-bucket counts (the last one above the last
// bound), cumulative as Prometheus wants them.
template <size_t N>
prometheus::ClientMetric Histogram(const std::map<std::string, std::string>& labels,
                                   const double (&bounds)[N], const std::vector<int64_t>& counts,
                                   double sum) {
  prometheus::ClientMetric m;
  for (const auto& [name, value] : labels) m.label.push_back({name, value});
  uint64_t cumulative = 0;
  for (size_t b = 0; b < N; ++b) {
    cumulative += b < counts.size() ? static_cast<uint64_t>(counts[b]) : 0;
    prometheus::ClientMetric::Bucket bucket;
    bucket.upper_bound = bounds[b];
    bucket.cumulative_count = cumulative;
    m.histogram.bucket.push_back(bucket);
  }
  cumulative += counts.size() > N ? static_cast<uint64_t>(counts[N]) : 0;
  prometheus::ClientMetric::Bucket inf;
  inf.upper_bound = std::numeric_limits<double>::infinity();
  inf.cumulative_count = cumulative;
  m.histogram.bucket.push_back(inf);
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = sum;
  return m;
}

std::vector<prometheus::MetricFamily> Collect(Scheduler* s, KvstoreMembership* kv) {
  SchedulerStats st = s->Stats();
  KvstoreMembershipStats kst = kv->Stats();
  std::vector<metrics::Sample> replicas;
  for (const auto& [shard, counts] : kst.replicas) {
    const std::string label = absl::StrCat(shard);
    replicas.push_back(
        {{{"shard", label}, {"state", "ACTIVE"}}, static_cast<double>(counts.first)});
    replicas.push_back(
        {{{"shard", label}, {"state", "JOINING"}}, static_cast<double>(counts.second)});
  }
  // Recovery in place: a histogram the scheduler keeps.
  prometheus::MetricFamily recovery;
  recovery.name = "dtrain_scheduler_recovery_seconds";
  recovery.help =
      "Time from a lost rank's failed step to the next completed step, per recovery in place.";
  recovery.type = prometheus::MetricType::Histogram;
  recovery.metric.push_back(
      Histogram({}, kRecoverySecondsBounds, st.recovery_seconds_counts, st.recovery_seconds_sum));
  // Queues (docs/queues.md).
  prometheus::MetricFamily wait;
  wait.name = "dtrain_scheduler_queue_admission_wait_seconds";
  wait.help = "Time from a job's (re)queueing to its placement, per queue.";
  wait.type = prometheus::MetricType::Histogram;
  std::vector<metrics::Sample> pending, admitted, pending_within, oldest_within, preemptions, quota,
      usage, borrowed, lent;
  for (const QueueMetrics& q : st.queues) {
    const QueueSummary& s = q.summary;
    const std::map<std::string, std::string> queue = {{"queue", s.name}};
    wait.metric.push_back(Histogram(queue, kAdmissionWaitBounds, q.wait_counts, q.wait_sum));
    pending.push_back({queue, static_cast<double>(s.pending)});
    admitted.push_back({queue, static_cast<double>(s.admitted)});
    pending_within.push_back({queue, static_cast<double>(q.pending_within_quota)});
    oldest_within.push_back({queue, q.oldest_pending_within_quota_seconds});
    for (const auto& [reason, n] : q.preemptions) {
      preemptions.push_back({{{"queue", s.name}, {"reason", reason}}, static_cast<double>(n)});
    }
    for (int r = 0; r < kNumResources; ++r) {
      if (!s.managed[r]) continue;
      const std::map<std::string, std::string> labels = {{"queue", s.name},
                                                         {"resource", ResourceName(r)}};
      quota.push_back({labels, static_cast<double>(s.quota[r])});
      usage.push_back({labels, static_cast<double>(s.usage[r])});
      borrowed.push_back({labels, static_cast<double>(s.borrowed[r])});
      lent.push_back({labels, static_cast<double>(s.lent[r])});
    }
  }
  std::vector<metrics::Sample> by_state;
  for (const auto& [state, n] : st.jobs_by_state) {
    by_state.push_back({{{"state", v1::JobState_Name(state)}}, static_cast<double>(n)});
  }
  return {
      metrics::MakeFamily("dtrain_scheduler_jobs", "Jobs in each state.",
                          prometheus::MetricType::Gauge, by_state),
      metrics::MakeFamily("dtrain_scheduler_queue_length", "Jobs waiting for trainers.",
                          prometheus::MetricType::Gauge,
                          {{{}, static_cast<double>(st.queue_length)}}),
      metrics::MakeFamily("dtrain_scheduler_trainers_alive", "Registered, heartbeating trainers.",
                          prometheus::MetricType::Gauge,
                          {{{}, static_cast<double>(st.trainers_alive)}}),
      metrics::MakeFamily("dtrain_scheduler_trainers_busy", "Trainers working on a job.",
                          prometheus::MetricType::Gauge,
                          {{{}, static_cast<double>(st.trainers_busy)}}),
      metrics::MakeFamily("dtrain_scheduler_kvstore_map_version",
                          "Version of the kvstore shard map (0: no replica heartbeated yet).",
                          prometheus::MetricType::Gauge, {{{}, static_cast<double>(kst.version)}}),
      metrics::MakeFamily("dtrain_scheduler_kvstore_replicas",
                          "Members of each kvstore shard's chain, by state (ACTIVE, JOINING).",
                          prometheus::MetricType::Gauge, replicas),
      metrics::MakeFamily("dtrain_scheduler_recoveries_total",
                          "Recoveries in place completed since the scheduler started (a lost "
                          "rank replaced by a spare within the attempt).",
                          prometheus::MetricType::Counter,
                          {{{}, static_cast<double>(st.recoveries)}}),
      recovery,
      metrics::MakeFamily("dtrain_scheduler_stragglers",
                          "Ranks of running jobs that are stragglers now (persistently slower "
                          "than the job's other ranks; JobStatus.stragglers).",
                          prometheus::MetricType::Gauge,
                          {{{}, static_cast<double>(st.stragglers)}}),
      metrics::MakeFamily("dtrain_scheduler_stragglers_detected_total",
                          "Ranks named stragglers since the scheduler started.",
                          prometheus::MetricType::Counter,
                          {{{}, static_cast<double>(st.stragglers_detected)}}),
      metrics::MakeFamily("dtrain_scheduler_queue_pending_jobs", "QUEUED jobs per queue.",
                          prometheus::MetricType::Gauge, pending),
      metrics::MakeFamily("dtrain_scheduler_queue_admitted_jobs", "RUNNING jobs per queue.",
                          prometheus::MetricType::Gauge, admitted),
      metrics::MakeFamily("dtrain_scheduler_queue_quota",
                          "Nominal quota per queue and resource (those the queue limits).",
                          prometheus::MetricType::Gauge, quota),
      metrics::MakeFamily("dtrain_scheduler_queue_usage",
                          "What a queue's running jobs use, per resource.",
                          prometheus::MetricType::Gauge, usage),
      metrics::MakeFamily("dtrain_scheduler_queue_borrowed",
                          "What a queue uses above its quota (borrowed from its cohort).",
                          prometheus::MetricType::Gauge, borrowed),
      metrics::MakeFamily("dtrain_scheduler_queue_lent",
                          "Of a queue's quota, what other queues of its cohort use.",
                          prometheus::MetricType::Gauge, lent),
      metrics::MakeFamily("dtrain_scheduler_queue_preemptions_total",
                          "Jobs of a queue preempted since the scheduler started, by reason: "
                          "drained whole by a rule (within_queue, reclaim_within_cohort), or "
                          "shrink (an elastic job gave up trainers).",
                          prometheus::MetricType::Counter, preemptions),
      wait,
      metrics::MakeFamily("dtrain_scheduler_queue_pending_within_quota_jobs",
                          "QUEUED jobs whose gang fits their queue's free quota now.",
                          prometheus::MetricType::Gauge, pending_within),
      metrics::MakeFamily("dtrain_scheduler_queue_pending_within_quota_oldest_seconds",
                          "How long the oldest QUEUED job that fits its queue's free quota has "
                          "waited (long: trainers are missing or the scheduler has a bug).",
                          prometheus::MetricType::Gauge, oldest_within),
      metrics::MakeFamily("dtrain_scheduler_kvstore_map_changes_total",
                          "Changes of the kvstore shard map since the scheduler started.",
                          prometheus::MetricType::Counter,
                          {{{}, static_cast<double>(kst.changes)}}),
  };
}

}  // namespace

class SchedulerServer::Services {
 public:
  Services(Scheduler* s, KvstoreMembership* kv, ModelStore* models,
           const absl::Notification* stopping)
      : jobs(s, kv, &timelines, models, stopping, &rpc_metrics),
        cluster(s, kv, &timelines, models, &rpc_metrics) {}
  RpcMetrics rpc_metrics;  // before the services, which use it
  TimelineStore timelines;
  JobServiceImpl jobs;
  ClusterServiceImpl cluster;
};

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(
    const ServerOptions& options) {
  if (options.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_timeout must be > 0");
  }
  if (options.max_attempts < 1) return absl::InvalidArgumentError("max_attempts must be >= 1");
  if (options.kvstore_heartbeat_interval <= absl::ZeroDuration() ||
      options.kvstore_heartbeat_timeout <= options.kvstore_heartbeat_interval) {
    return absl::InvalidArgumentError(
        "kvstore_heartbeat_interval must be > 0 and kvstore_heartbeat_timeout above it");
  }
  std::unique_ptr<SchedulerServer> server(new SchedulerServer());
  SchedulerOptions so;
  if (!options.data_dir.empty()) so.wal_path = options.data_dir + "/jobs.wal";
  so.heartbeat_timeout = options.heartbeat_timeout;
  so.max_attempts = options.max_attempts;
  so.max_queued_jobs_per_user = options.max_queued_jobs_per_user;
  so.recover_in_place = options.recover_in_place;
  so.finished_job_retention = options.finished_job_retention;
  so.queues = options.queues;
  so.queues_yaml = options.queues_yaml;
  so.job_token_secret = options.job_token_secret;
  so.heartbeat_interval =
      std::max(absl::Milliseconds(100), std::min(absl::Seconds(5), options.heartbeat_timeout / 4));
  DT_ASSIGN_OR_RETURN(server->scheduler_, Scheduler::Open(so));
  Scheduler* sched = server->scheduler_.get();
  KvstoreMembershipOptions ko;
  ko.heartbeat_interval = options.kvstore_heartbeat_interval;
  ko.heartbeat_timeout = options.kvstore_heartbeat_timeout;
  ko.startup_grace = options.kvstore_startup_grace;
  server->kvstore_map_ = std::make_unique<KvstoreMembership>(ko);
  KvstoreMembership* kv = server->kvstore_map_.get();

  if (!options.data_dir.empty()) {
    ModelStoreOptions mo;
    mo.dir = options.data_dir + "/models";
    mo.max_model_bytes = options.max_model_bytes;
    DT_ASSIGN_OR_RETURN(server->models_, ModelStore::Open(mo));
  }
  ModelStore* models = server->models_.get();
  server->services_ = std::make_unique<Services>(sched, kv, models, &server->stopping_);
  rpc::ServerOptions rpc_options;
  rpc_options.service = "scheduler";
  rpc_options.listen = options.listen;
  rpc_options.port_file = options.port_file;
  rpc_options.metrics_listen = options.metrics_listen;
  server->rpc_ = std::make_unique<rpc::Server>(rpc_options);
  server->rpc_->AddService(&server->services_->jobs);
  server->rpc_->AddService(&server->services_->cluster);
  server->rpc_->Expose(
      std::make_shared<metrics::CallbackCollectable>([sched, kv] { return Collect(sched, kv); }));
  server->rpc_->Expose(server->services_->rpc_metrics.registry());
  DT_RETURN_IF_ERROR(server->rpc_->Start());

  // Trainers every heartbeat_timeout / 4, kvstore replicas every
  // kvstore_heartbeat_timeout / 4 (a dead replica stalls its chain's pushes
  // until it leaves the map).
  const absl::Duration period = options.heartbeat_timeout / 4;
  const absl::Duration kv_period = options.kvstore_heartbeat_timeout / 4;
  SchedulerServer* raw = server.get();
  server->liveness_ = std::thread([raw, sched, kv, models, period, kv_period] {
    absl::Time next_trainers = absl::Now() + period;
    absl::Time next_models = absl::Now();
    while (!raw->stopping_.WaitForNotificationWithTimeout(std::min(period, kv_period))) {
      const absl::Time now = absl::Now();
      kv->Expire(now);
      if (now >= next_trainers) {
        sched->CheckLiveness();
        next_trainers = now + period;
      }
      // Models no retained job refers to (after the retention sweep above).
      if (models != nullptr && now >= next_models) {
        std::set<std::string> referenced;
        for (const JobStatus& j : sched->List()) {
          if (!j.spec().model_digest().empty()) referenced.insert(j.spec().model_digest());
        }
        models->CollectGarbage(referenced);
        next_models = now + kModelGcPeriod;
      }
    }
  });
  return server;
}

int SchedulerServer::port() const { return rpc_ ? rpc_->port() : 0; }

int SchedulerServer::metrics_port() const { return rpc_ ? rpc_->metrics_port() : 0; }

void SchedulerServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (!stopping_.HasBeenNotified()) stopping_.Notify();
  if (liveness_.joinable()) liveness_.join();
  // Watch streams end once stopping_ is notified; other calls get `grace`.
  if (rpc_) rpc_->Shutdown(grace);
}

SchedulerServer::~SchedulerServer() { Shutdown(absl::ZeroDuration()); }

}  // namespace scheduler
}  // namespace dtrain
