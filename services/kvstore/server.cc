#include "services/kvstore/server.h"

#include <grpcpp/alarm.h>
#include <grpcpp/impl/codegen/server_callback_handlers.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/method_handler.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/sync_stream.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"
#include "libs/base/grpc_status.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/kvstore/chunks.h"
#include "libs/kvstore/data_port.h"
#include "libs/kvstore/job_limiter.h"
#include "libs/kvstore/malloc_tuning.h"
#include "libs/kvstore/proto_convert.h"
#include "libs/kvstore/wire.h"
#include "libs/metrics/metrics.h"
#include "libs/rpc/authorize.h"
#include "libs/rpc/credentials.h"
#include "libs/rpc/server.h"
#include "libs/security/authz.h"
#include "libs/security/job_token.h"
#include "protos/kvstore.grpc.pb.h"
#include "services/kvstore/replication.h"

namespace dtrain {
namespace kvstore {
namespace {

using Clock = std::chrono::steady_clock;

const char* CodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return "OK";
    case absl::StatusCode::kCancelled:
      return "CANCELLED";
    case absl::StatusCode::kUnknown:
      return "UNKNOWN";
    case absl::StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case absl::StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case absl::StatusCode::kNotFound:
      return "NOT_FOUND";
    case absl::StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case absl::StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case absl::StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case absl::StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case absl::StatusCode::kAborted:
      return "ABORTED";
    case absl::StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case absl::StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case absl::StatusCode::kInternal:
      return "INTERNAL";
    case absl::StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case absl::StatusCode::kDataLoss:
      return "DATA_LOSS";
    case absl::StatusCode::kUnauthenticated:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace

namespace {

// The kvstore's one authorization step, for gRPC calls and data port
// connections alike: `who` may call `method` (rules: libs/security/authz.h).
// With a cluster secret, a trainer must present a kvstore token (`token`,
// null when none was sent): then what it grants, the job its calls are
// confined to (security::JobScope) and its trainers (the per-job caps);
// nullopt: unconfined.
absl::StatusOr<absl::optional<security::JobGrant>> AuthorizeKvstore(const security::Identity& who,
                                                                    const char* method,
                                                                    const std::string* token,
                                                                    const std::string& secret) {
  DT_RETURN_IF_ERROR(security::Authorize(who, security::KvstoreAction(method)));
  if (secret.empty() || !who.authenticated || who.role != security::Role::kTrainer) {
    return absl::nullopt;
  }
  if (token == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(who.ToString(), " sent no kvstore token (", security::kJobTokenMetadata,
                     " metadata; the scheduler's assignment carries it)"));
  }
  DT_ASSIGN_OR_RETURN(security::JobGrant grant,
                      security::VerifyJobToken(secret, *token, absl::Now()));
  return absl::optional<security::JobGrant>(std::move(grant));
}

// A gRPC call's caller (its certificate) and token (metadata).
absl::StatusOr<absl::optional<security::JobGrant>> Authorized(const grpc::ServerContextBase& ctx,
                                                              const char* method,
                                                              const std::string& secret) {
  DT_ASSIGN_OR_RETURN(security::Identity who, rpc::PeerIdentity(ctx));
  auto token = ctx.client_metadata().find(security::kJobTokenMetadata);
  if (token == ctx.client_metadata().end()) {
    return AuthorizeKvstore(who, method, nullptr, secret);
  }
  const std::string value(token->second.data(), token->second.size());
  return AuthorizeKvstore(who, method, &value, secret);
}

// A data port PushPull whose pull waits for its round without a thread
// (KVStoreServer::Impl::ParkPull), or one this replica answers as its
// chain's tail (v1::AnswerAt: Impl::TailAnswers).
struct ParkedPull {
  // The deferred request (ParkPull); null for a tail answer.
  std::shared_ptr<DataResponder> responder;
  // Writes the answer; false when it was written already (or, for a tail
  // answer, refused: then it never will be).
  std::function<bool(const absl::Status&, const DataReply&)> deliver;
  std::atomic<bool> delivered{false};
  std::string job;
  int worker = 0;
  std::vector<PullRequestItem> items;
  absl::Time deadline;  // the pull's
  Replicator::Ack ack;  // its push's
  // Its push is held (Replicator::Apply's hold_incomplete) until then, or
  // until a push completes the round.
  std::atomic<bool> held{false};
  absl::Time hold_until;
  Clock::time_point start;
};

// While a data port request runs (Impl::Handle): the parked pulls whose
// rounds its push completed, for it to answer once its own write is on the
// chain.
thread_local std::vector<std::shared_ptr<ParkedPull>>* completed_pulls = nullptr;

}  // namespace

// Everything behind the gRPC services: handlers and their metrics.
class KVStoreServer::Impl : public DataPortHandler {
 public:
  Impl(const ServerOptions& options, Store* store, Snapshotter* snapshotter, Replicator* replicator)
      : options_(options),
        store_(store),
        snapshotter_(snapshotter),
        replicator_(replicator),
        registry_(std::make_shared<prometheus::Registry>()),
        requests_(metrics::AddCounter(*registry_, "dtrain_kvstore_requests_total",
                                      "kvstore RPCs handled, by method and status code.")),
        latency_(metrics::AddHistogram(*registry_, "dtrain_kvstore_request_duration_seconds",
                                       "kvstore RPC latency (pulls include waiting for rounds).")),
        push_bytes_(metrics::AddCounter(*registry_, "dtrain_kvstore_push_bytes_total",
                                        "Value bytes received in Push and PushPull calls.")
                        .Add({})),
        pull_bytes_(metrics::AddCounter(*registry_, "dtrain_kvstore_pull_bytes_total",
                                        "Value bytes sent in Pull and PushPull replies.")
                        .Add({})),
        duplicates_(metrics::AddCounter(*registry_, "dtrain_kvstore_duplicate_pushes_total",
                                        "Pushed slices already applied (retries), not applied "
                                        "again.")
                        .Add({})),
        tail_answers_(metrics::AddCounter(
            *registry_, "dtrain_kvstore_tail_answers_total",
            "Push-pulls this replica answered as its chain's tail (result=ok), or could not "
            "answer (result=refused: the answers connection closed or is another job's).")),
        tail_answered_(tail_answers_.Add({{"result", "ok"}})),
        tail_refused_(tail_answers_.Add({{"result", "refused"}})) {
    chunk_bytes_ =
        std::max<int64_t>(1024, std::min(options_.chunk_bytes, options_.max_message_bytes / 2));
    // The metrics of every method, created once: building label sets and
    // bucket lists per call costs more than a small push-pull's arithmetic.
    for (const char* method :
         {"CreateJob", "DeleteJob", "GetJob", "Init", "Snapshot", "DataPort", "Push", "Pull",
          "PushPull", "PushUnary", "PullUnary", "PushPullUnary"}) {
      MethodMetrics& m = methods_[method];
      m.ok = &requests_.Add({{"method", method}, {"code", "OK"}});
      m.latency = &latency_.Add({{"method", method}}, metrics::LatencyBuckets());
    }
    store_metrics_ = std::make_shared<metrics::CallbackCollectable>([this] { return Collect(); });
  }

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  std::shared_ptr<metrics::CallbackCollectable> store_metrics() const { return store_metrics_; }

  // Handles one call: times it, records its status in the kvstore's own
  // metrics, and converts the status for gRPC. (Calls in flight and the
  // dtrain_rpc_server_* metrics are the scaffold's interceptor's.)
  // Every call of both services: authorizes the caller of `ctx` for
  // `method` (libs/security/authz.h: KvstoreAction), runs `handler`, counts.
  grpc::Status Run(const char* method, const grpc::ServerContext* ctx,
                   const std::function<absl::Status()>& handler) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<absl::optional<security::JobGrant>> grant =
        Authorized(*ctx, method, options_.job_token_secret);
    security::JobScope scope(grant.ok() && grant->has_value() ? &(*grant)->job : nullptr);
    absl::Status status = grant.status();
    if (grant.ok()) {
      absl::StatusOr<JobLimiter::Hold> hold = CallPlace(*grant);
      status = hold.ok() ? handler() : hold.status();
    }
    return Record(method, start, status);
  }

  // A call's place among its job's calls in flight (--max_calls_per_job):
  // a trainer's calls count against its job's cap, admins' hold none.
  absl::StatusOr<JobLimiter::Hold> CallPlace(const absl::optional<security::JobGrant>& grant) {
    if (!grant.has_value()) return JobLimiter::Hold();
    return calls_per_job_.Acquire(grant->job, grant->workers);
  }

  // Counts a finished call and converts its status for gRPC.
  grpc::Status Record(const char* method, Clock::time_point start, const absl::Status& status) {
    Account(method, start, status);
    return ToGrpcStatus(status);
  }

  // Counts a finished call of either transport (gRPC or the data port).
  void Account(const char* method, Clock::time_point start, const absl::Status& status) {
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const MethodMetrics& m = methods_.at(method);
    if (status.ok()) {
      m.ok->Increment();
    } else {
      requests_.Add({{"method", method}, {"code", CodeName(status.code())}}).Increment();
    }
    m.latency->Observe(seconds);
    if (!status.ok() && !absl::IsDeadlineExceeded(status) && !absl::IsCancelled(status)) {
      DT_LOG(DEBUG) << method << ": " << status;
    }
  }

  // ---- The callback data path (ServerOptions.callback_data) ----
  //
  // The unary data calls run on gRPC's callback threads. A pull whose round
  // is not complete holds no thread: it waits in the store (Store::TryPull)
  // and the push that completes the round sends its reply; its deadline is
  // an alarm and its cancellation the reactor's OnCancel. The call's job
  // scope (security::JobScope) is set while its handler runs on the thread
  // that started it; the continuation touches no other job.

  struct UnaryCall {
    Impl* impl = nullptr;
    const char* method = nullptr;
    Clock::time_point start;
    grpc::ServerUnaryReactor* reactor = nullptr;
    grpc::ByteBuffer* response = nullptr;
    // The pull the call waits for, if any.
    bool pulling = false;
    std::string job;
    int worker = 0;
    std::vector<PullRequestItem> items;
    grpc::Alarm alarm;
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    // The call's place among its job's calls in flight (--max_calls_per_job,
    // as Run takes for the sync calls); given back when the call completes,
    // not when the store drops a continuation it left.
    JobLimiter::Hold hold ABSL_GUARDED_BY(mu);
  };

  class UnaryReactor final : public grpc::ServerUnaryReactor {
   public:
    explicit UnaryReactor(std::shared_ptr<UnaryCall> call) : call_(std::move(call)) {}
    void OnCancel() override {
      call_->impl->Complete(*call_, absl::CancelledError("the call was cancelled"), nullptr);
    }
    void OnDone() override {
      if (call_->pulling) call_->alarm.Cancel();
      delete this;
    }

   private:
    std::shared_ptr<UnaryCall> call_;
  };

  // Ends `call` once: with `status`, or when ok and `values` is set, with
  // the reply of those values.
  void Complete(UnaryCall& call, absl::Status status, const std::vector<PulledValue>* values) {
    if (status.ok() && values != nullptr) {
      status = ReadCommitted();
    }
    JobLimiter::Hold place;  // given back once the call is answered
    {
      absl::MutexLock lock(&call.mu);
      if (call.done) return;
      call.done = true;
      place = std::move(call.hold);
      if (status.ok() && values != nullptr) {
        status = SendPulled(*values, true, WriteOnce(call.response));
      }
    }
    call.reactor->Finish(Record(call.method, call.start, status));
  }

  // Answers the call's pull if its rounds are complete, else leaves a
  // continuation in the store that calls this again.
  void TryFinishPull(const std::shared_ptr<UnaryCall>& call) {
    {
      absl::MutexLock lock(&call->mu);
      if (call->done) return;
    }
    std::vector<PulledValue> values;
    absl::StatusOr<bool> ready = store_->TryPull(
        call->job, call->worker, call->items, [call] { call->impl->TryFinishPull(call); }, &values);
    if (!ready.ok()) return Complete(*call, ready.status(), nullptr);
    if (*ready) Complete(*call, absl::OkStatus(), &values);
  }

  // The pull's deadline passed: Pull with no time left answers it (with the
  // values if the round just completed, else naming the missing workers).
  void ExpirePull(UnaryCall& call) {
    PullOptions now;
    now.deadline = absl::Now();
    absl::StatusOr<std::vector<PulledValue>> values =
        store_->Pull(call.job, call.worker, call.items, now);
    if (!values.ok()) return Complete(call, values.status(), nullptr);
    Complete(call, absl::OkStatus(), &*values);
  }

  grpc::ServerUnaryReactor* StartUnary(const char* method, grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) {
    auto call = std::make_shared<UnaryCall>();
    call->impl = this;
    call->method = method;
    call->start = Clock::now();
    call->response = response;
    auto* reactor = new UnaryReactor(call);
    call->reactor = reactor;
    absl::StatusOr<absl::optional<security::JobGrant>> grant =
        Authorized(*ctx, method, options_.job_token_secret);
    absl::Status status = grant.status();
    if (grant.ok()) {
      // A pull that waits without a thread holds its place too.
      absl::StatusOr<JobLimiter::Hold> hold = CallPlace(*grant);
      if (hold.ok()) {
        absl::MutexLock lock(&call->mu);
        call->hold = std::move(*hold);
      } else {
        status = hold.status();
      }
    }
    if (status.ok()) {
      security::JobScope scope(grant->has_value() ? &(*grant)->job : nullptr);
      status = BeginUnary(method, request, call.get());
    }
    if (!status.ok() || !call->pulling) {
      Complete(*call, status, nullptr);
      return reactor;
    }
    const absl::Time deadline = PullDeadline(*ctx);
    std::weak_ptr<UnaryCall> weak = call;
    call->alarm.Set(absl::ToChronoTime(deadline), [weak](bool fired) {
      if (!fired) return;
      if (std::shared_ptr<UnaryCall> c = weak.lock()) c->impl->ExpirePull(*c);
    });
    TryFinishPull(call);
    return reactor;
  }

  // The part of a unary data call that needs no waiting: the push, the
  // pull's checks. Sets call->pulling (and what to pull) for a pull.
  absl::Status BeginUnary(const char* method, const grpc::ByteBuffer* request, UnaryCall* call) {
    const absl::string_view m = method;
    if (m == "PullUnary") {
      DT_RETURN_IF_ERROR(CheckReads());
      v1::PullRequest r;
      DT_RETURN_IF_ERROR(wire::ParseSmall(*request, &r, "PullRequest"));
      DT_RETURN_IF_ERROR(security::JobScope::Check(r.job()));
      for (const v1::PullItem& p : r.items())
        call->items.push_back({p.key(), p.slice(), p.round()});
      call->job = r.job();
      call->worker = r.worker();
      call->pulling = true;
      return absl::OkStatus();
    }
    ReceivedPush p;
    DT_RETURN_IF_ERROR(ReceivePush(ReadOnce(request), &p));
    DT_ASSIGN_OR_RETURN(PushResult result, ApplyPush(p));
    if (m == "PushUnary") {
      v1::PushResponse reply;
      reply.set_applied(result.applied);
      reply.set_duplicates(result.duplicates);
      *call->response = wire::SerializeSmall(reply);
      return absl::OkStatus();
    }
    for (const PushItem& item : p.items) call->items.push_back({item.key, item.slice, item.round});
    call->job = p.header.job();
    call->worker = p.header.worker();
    call->pulling = true;
    return absl::OkStatus();
  }

  // ---- Replication: writes go through the chain, reads need an ACTIVE member ----

  absl::Status CheckWrites() const {
    return replicator_ == nullptr ? absl::OkStatus() : replicator_->CheckIsHead();
  }
  absl::Status CheckReads() const {
    return replicator_ == nullptr ? absl::OkStatus() : replicator_->CheckServesReads();
  }
  absl::StatusOr<MutationResult> Replicate(v1::Mutation m) {
    return replicator_->Submit(std::move(m), absl::Now() + options_.replication_timeout);
  }

  // ---- KVStore (control) ----

  absl::Status CreateJob(const v1::CreateJobRequest& request, v1::CreateJobResponse* response) {
    DT_ASSIGN_OR_RETURN(JobConfig config, FromProto(request.config()));
    DT_RETURN_IF_ERROR(security::JobScope::Check(config.job));
    DT_RETURN_IF_ERROR(CheckWrites());
    bool created;
    if (replicator_ != nullptr) {
      v1::Mutation m;
      *m.mutable_create_job() = request;
      DT_ASSIGN_OR_RETURN(MutationResult r, Replicate(std::move(m)));
      created = r.created;
    } else {
      DT_ASSIGN_OR_RETURN(created, store_->CreateJob(config));
    }
    response->set_created(created);
    if (created) DT_LOG(INFO) << "created " << DescribeJobConfig(config);
    return absl::OkStatus();
  }

  absl::Status DeleteJob(const v1::DeleteJobRequest& request, v1::DeleteJobResponse* response) {
    DT_RETURN_IF_ERROR(security::JobScope::Check(request.job()));
    DT_RETURN_IF_ERROR(CheckWrites());
    if (replicator_ != nullptr) {
      v1::Mutation m;
      *m.mutable_delete_job() = request;
      DT_ASSIGN_OR_RETURN(MutationResult r, Replicate(std::move(m)));
      response->set_deleted(r.deleted);
      if (r.deleted) {
        DT_LOG(INFO) << "deleted job '" << request.job() << "'"
                     << (request.leave() ? " (every worker left)" : "");
        ReleaseFreeMemory();
      }
      return absl::OkStatus();
    }
    if (request.leave()) {
      DT_ASSIGN_OR_RETURN(bool deleted, store_->LeaveJob(request.job(), request.worker()));
      response->set_deleted(deleted);
      if (deleted) {
        DT_LOG(INFO) << "deleted job '" << request.job() << "' (every worker left)";
        ReleaseFreeMemory();
      }
      return absl::OkStatus();
    }
    DT_RETURN_IF_ERROR(store_->DeleteJob(request.job()));
    response->set_deleted(true);
    DT_LOG(INFO) << "deleted job '" << request.job() << "'";
    ReleaseFreeMemory();
    return absl::OkStatus();
  }

  absl::Status GetJob(const v1::GetJobRequest& request, v1::GetJobResponse* response) {
    DT_RETURN_IF_ERROR(security::JobScope::Check(request.job()));
    DT_RETURN_IF_ERROR(CheckReads());
    DT_ASSIGN_OR_RETURN(JobStatus status,
                        store_->GetJob(request.job(), request.worker(), request.include_slices()));
    *response = ToProto(status);
    return absl::OkStatus();
  }

  absl::Status Init(grpc::ServerReader<v1::InitRequest>* reader, v1::InitResponse* response) {
    std::deque<v1::InitRequest> messages;
    messages.emplace_back();
    if (!reader->Read(&messages.back())) {
      return absl::InvalidArgumentError("Init: empty request stream");
    }
    const v1::InitRequest& first = messages.front();
    DT_RETURN_IF_ERROR(security::JobScope::Check(first.job()));
    DT_RETURN_IF_ERROR(CheckWrites());
    std::vector<InitItem> items;
    std::vector<std::pair<std::string, int64_t>> sizes;
    for (const v1::SliceSpec& proto : first.slices()) {
      InitItem item;
      DT_ASSIGN_OR_RETURN(item.spec, FromProto(proto));
      DT_RETURN_IF_ERROR(Annotate(ValidateSliceSpec(item.spec), "Init"));
      sizes.emplace_back(absl::StrCat("Init of ", DescribeSlice(item.spec)),
                         item.spec.count * static_cast<int64_t>(DTypeSize(item.spec.dtype)));
      items.push_back(std::move(item));
    }
    // Refuse (unknown job, conflicting spec, over quota) before reading values.
    std::vector<SliceSpec> specs;
    for (const InitItem& item : items) specs.push_back(item.spec);
    DT_RETURN_IF_ERROR(store_->CheckInit(first.job(), specs));
    ChunkAssembler assembler(std::move(sizes));
    for (bool more = true; more;) {
      const v1::InitRequest& m = messages.back();
      if (&m != &first && (!m.job().empty() || m.slices_size() > 0)) {
        return absl::InvalidArgumentError("Init: only the first message may name job and slices");
      }
      for (const v1::Chunk& c : m.chunks()) {
        DT_RETURN_IF_ERROR(Annotate(assembler.Add(c.item(), c.offset(), {c.data()}), "Init"));
      }
      messages.emplace_back();
      more = reader->Read(&messages.back());
    }
    DT_RETURN_IF_ERROR(Annotate(assembler.Finish(/*allow_empty=*/true), "Init"));
    for (size_t i = 0; i < items.size(); ++i) items[i].data = assembler.pieces(i);
    InitResult result;
    if (replicator_ != nullptr) {
      v1::Mutation m;
      v1::InitRequest* init = m.mutable_init();
      init->set_job(first.job());
      *init->mutable_slices() = first.slices();
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].data.empty()) continue;  // zeros
        v1::Chunk* c = init->add_chunks();
        c->set_item(static_cast<int32_t>(i));
        for (absl::string_view piece : items[i].data) {
          c->mutable_data()->append(piece.data(), piece.size());
        }
      }
      DT_ASSIGN_OR_RETURN(MutationResult r, Replicate(std::move(m)));
      result = r.init;
    } else {
      DT_ASSIGN_OR_RETURN(result, store_->Init(first.job(), items));
    }
    response->set_created(result.created);
    response->set_existing(result.existing);
    return absl::OkStatus();
  }

  absl::Status Snapshot(v1::SnapshotResponse* response) {
    DT_ASSIGN_OR_RETURN(SnapshotInfo info, snapshotter_->SnapshotNow());
    if (info.path.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("kvstore shard ", options_.shard_index,
                                                        " has no --data_dir to snapshot to"));
    }
    response->set_path(info.path);
    response->set_bytes(info.bytes);
    return absl::OkStatus();
  }

  // ---- KVStoreData ----

  // A push as received: its header, the messages whose slices hold the
  // values, and the store's view of it.
  struct ReceivedPush {
    v1::PushRequest header;
    CompressionSpec compression;
    std::deque<wire::Decoded> messages;
    std::vector<PushItem> items;
    int64_t bytes = 0;
  };

  // The checks of a push before any value is read, for both transports:
  // writes allowed here, the job within the caller's scope, the items'
  // expected value bytes (`sizes`, from the store: what the values must add
  // up to).
  absl::Status PreparePush(ReceivedPush* p, std::vector<std::pair<std::string, int64_t>>* sizes) {
    DT_RETURN_IF_ERROR(CheckWrites());
    const v1::PushRequest& h = p->header;
    // Before the store is asked about the job (its keys' sizes).
    DT_RETURN_IF_ERROR(security::JobScope::Check(h.job()));
    DT_ASSIGN_OR_RETURN(p->compression, CompressionFromProto(h.compression(), h.topk_ratio()));
    for (const v1::PushItem& proto : h.items()) {
      PushItem item;
      item.key = proto.key();
      item.slice = proto.slice();
      item.round = proto.round();
      DT_ASSIGN_OR_RETURN(item.dtype, DTypeFromWire(proto.dtype()));
      item.shape.assign(proto.shape().begin(), proto.shape().end());
      DT_ASSIGN_OR_RETURN(int64_t expected,
                          store_->ExpectedPushBytes(h.job(), item.key, item.slice, p->compression));
      sizes->emplace_back(
          absl::StrCat("push of job '", h.job(), "' key '", item.key, "' slice ", item.slice),
          expected);
      p->items.push_back(std::move(item));
    }
    return absl::OkStatus();
  }

  absl::Status ReceivePush(const std::function<bool(grpc::ByteBuffer*)>& read, ReceivedPush* p) {
    DT_RETURN_IF_ERROR(CheckWrites());
    grpc::ByteBuffer buffer;
    if (!read(&buffer)) return absl::InvalidArgumentError("push: empty request stream");
    p->messages.emplace_back();
    DT_RETURN_IF_ERROR(Annotate(
        wire::Decode(buffer, wire::kPushChunksField, &p->header, &p->messages.back()), "push"));
    if (p->header.has_answer_at()) {
      return absl::InvalidArgumentError(
          "push: answer_at is for data port push-pulls only (the tail answers on the data port)");
    }
    // Check the items against the store before reading their values.
    std::vector<std::pair<std::string, int64_t>> sizes;
    DT_RETURN_IF_ERROR(PreparePush(p, &sizes));
    ChunkAssembler assembler(std::move(sizes));
    for (bool more = true; more;) {
      for (const wire::InChunk& c : p->messages.back().chunks) {
        DT_RETURN_IF_ERROR(assembler.Add(c.item, c.offset, c.data));
      }
      more = read(&buffer);
      if (more) {
        v1::PushRequest later;
        p->messages.emplace_back();
        DT_RETURN_IF_ERROR(Annotate(
            wire::Decode(buffer, wire::kPushChunksField, &later, &p->messages.back()), "push"));
        if (!later.job().empty() || later.items_size() > 0) {
          return absl::InvalidArgumentError("push: only the first message may name job and items");
        }
      }
    }
    DT_RETURN_IF_ERROR(assembler.Finish(/*allow_empty=*/false));
    for (size_t i = 0; i < p->items.size(); ++i) p->items[i].data = assembler.pieces(i);
    p->bytes = assembler.bytes();
    push_bytes_.Increment(static_cast<double>(p->bytes));
    return absl::OkStatus();
  }

  // Applies a push (through the chain when replicated). With `ack`, does
  // not wait for the chain: the caller waits (ReadCommitted covers it)
  // before answering.
  //
  // With `by_reference` (and `ack`), a push whose items are one piece each
  // (the data port's) reaches the chain without a copy: the caller keeps the
  // pieces valid until it called Replicator::Detach(*ack).
  //
  // With `hold_incomplete` (a PushPull, which waits for its round anyway),
  // a push that completes no round reaches the chain with the push that
  // completes it (Replicator::Apply); wait with Replicator::WaitHeld.
  absl::StatusOr<PushResult> ApplyPush(const ReceivedPush& p, Replicator::Ack* ack = nullptr,
                                       bool by_reference = false, bool hold_incomplete = false) {
    DT_RETURN_IF_ERROR(security::JobScope::Check(p.header.job()));
    PushResult result;
    if (replicator_ != nullptr) {
      v1::Mutation m;
      v1::ReplicatedPush* push = m.mutable_push();
      push->set_job(p.header.job());
      push->set_worker(p.header.worker());
      push->set_compression(p.header.compression());
      push->set_topk_ratio(p.header.topk_ratio());
      *push->mutable_items() = p.header.items();
      if (p.header.has_answer_at()) *push->mutable_answer_at() = p.header.answer_at();
      std::vector<absl::string_view> values;
      by_reference = by_reference && ack != nullptr &&
                     std::all_of(p.items.begin(), p.items.end(),
                                 [](const PushItem& item) { return item.data.size() == 1; });
      for (const PushItem& item : p.items) {
        if (by_reference) {
          push->add_data_bytes(static_cast<int64_t>(item.data[0].size()));
          values.push_back(item.data[0]);
          continue;
        }
        std::string* data = push->add_data();
        for (absl::string_view piece : item.data) data->append(piece.data(), piece.size());
      }
      DT_ASSIGN_OR_RETURN(
          MutationResult r,
          ack != nullptr ? replicator_->Apply(std::move(m), ack, std::move(values), hold_incomplete)
                         : Replicate(std::move(m)));
      result = r.push;
    } else {
      DT_ASSIGN_OR_RETURN(result,
                          store_->Push(p.header.job(), p.header.worker(), p.compression, p.items));
    }
    if (result.duplicates > 0) duplicates_.Increment(result.duplicates);
    return result;
  }

  // Before values read here are answered: at a chain's head (a PushPull),
  // waits until every replica holds every write applied here so far, so a
  // client never gets a value that a replica taking over could lack. At
  // the tail and unreplicated: at once. Gives up after replication_timeout
  // (the client retries).
  absl::Status ReadCommitted() const {
    if (replicator_ == nullptr) return absl::OkStatus();
    return replicator_->AppliedSoFar().Wait(absl::Now() + options_.replication_timeout);
  }

  // A PushPull's pull, after its push: the values of the pushed items'
  // rounds once complete and on every replica.
  absl::StatusOr<std::vector<PulledValue>> PullPushed(const ReceivedPush& p,
                                                      const PullOptions& options) {
    std::vector<PullRequestItem> items;
    for (const PushItem& item : p.items) items.push_back({item.key, item.slice, item.round});
    DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values,
                        store_->Pull(p.header.job(), p.header.worker(), items, options));
    DT_RETURN_IF_ERROR(ReadCommitted());
    return values;
  }

  // How long a pull of the call `ctx` may wait: its deadline, at most
  // max_pull_wait.
  absl::Time PullDeadline(const grpc::ServerContextBase& ctx) const {
    absl::Time cap = absl::Now() + options_.max_pull_wait;
    auto deadline = ctx.deadline();
    return deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(1)
               ? cap
               : std::min(cap, absl::FromChrono(deadline));
  }

  PullOptions MakePullOptions(grpc::ServerContext* ctx) const {
    PullOptions o;
    o.deadline = PullDeadline(*ctx);
    o.cancelled = [ctx] { return ctx->IsCancelled(); };
    return o;
  }

  // Streams pulled values as PullResponse messages through `write`; with
  // `one_message`, all of them in a single message (unary replies).
  absl::Status SendPulled(const std::vector<PulledValue>& values, bool one_message,
                          const std::function<bool(const grpc::ByteBuffer&, bool)>& write) {
    v1::PullResponse header;
    std::vector<grpc::Slice> wholes;
    for (size_t i = 0; i < values.size(); ++i) {
      v1::PulledItem* item = header.add_items();
      item->set_item(static_cast<int32_t>(i));
      item->set_round(values[i].round);
      item->set_dtype(static_cast<int32_t>(values[i].dtype));
      item->set_bytes(static_cast<int64_t>(values[i].bytes.size));
      wholes.push_back(
          wire::SharedSlice(values[i].bytes.owner, values[i].bytes.data, values[i].bytes.size));
    }
    int64_t total = 0;
    for (const grpc::Slice& w : wholes) total += static_cast<int64_t>(w.size());
    if (one_message && total > options_.max_message_bytes - (64 << 10)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a reply of ", total, " value bytes does not fit in one message (max_message_bytes=",
          options_.max_message_bytes, "); use the streaming call"));
    }
    const int64_t chunk_bytes = one_message ? std::max<int64_t>(total, 1) : chunk_bytes_;
    std::vector<grpc::ByteBuffer> messages;
    std::vector<wire::OutChunk> chunks;
    int64_t budget = chunk_bytes;
    int64_t sent = 0;
    auto flush = [&] {
      messages.push_back(wire::Encode(messages.empty() ? header : v1::PullResponse(),
                                      wire::kPullChunksField, chunks));
      chunks.clear();
      budget = chunk_bytes;
    };
    for (size_t i = 0; i < wholes.size(); ++i) {
      const int64_t size = static_cast<int64_t>(wholes[i].size());
      for (int64_t off = 0; off < size;) {
        int64_t take = std::min(size - off, budget);
        chunks.push_back(
            {static_cast<int32_t>(i), off,
             wholes[i].sub(static_cast<size_t>(off), static_cast<size_t>(off + take))});
        off += take;
        budget -= take;
        sent += take;
        if (budget == 0) flush();
      }
    }
    if (!chunks.empty() || messages.empty()) flush();
    for (size_t m = 0; m < messages.size(); ++m) {
      if (!write(messages[m], m + 1 == messages.size())) {
        return absl::CancelledError("pull: the client went away");
      }
    }
    pull_bytes_.Increment(static_cast<double>(sent));
    return absl::OkStatus();
  }

  absl::Status Push(grpc::ServerContext* ctx, grpc::ServerReader<grpc::ByteBuffer>* reader,
                    grpc::ByteBuffer* response) {
    ReceivedPush p;
    DT_RETURN_IF_ERROR(ReceivePush([reader](grpc::ByteBuffer* b) { return reader->Read(b); }, &p));
    DT_ASSIGN_OR_RETURN(PushResult result, ApplyPush(p));
    v1::PushResponse reply;
    reply.set_applied(result.applied);
    reply.set_duplicates(result.duplicates);
    *response = wire::SerializeSmall(reply);
    return absl::OkStatus();
  }

  absl::Status Pull(grpc::ServerContext* ctx, const grpc::ByteBuffer* request,
                    grpc::ServerWriter<grpc::ByteBuffer>* writer) {
    DT_RETURN_IF_ERROR(CheckReads());
    v1::PullRequest r;
    DT_RETURN_IF_ERROR(wire::ParseSmall(*request, &r, "PullRequest"));
    DT_RETURN_IF_ERROR(security::JobScope::Check(r.job()));
    std::vector<PullRequestItem> items;
    for (const v1::PullItem& p : r.items()) items.push_back({p.key(), p.slice(), p.round()});
    DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values,
                        store_->Pull(r.job(), r.worker(), items, MakePullOptions(ctx)));
    DT_RETURN_IF_ERROR(ReadCommitted());
    return SendPulled(values, false, [writer](const grpc::ByteBuffer& b, bool last) {
      return writer->Write(b,
                           last ? grpc::WriteOptions().set_last_message() : grpc::WriteOptions());
    });
  }

  absl::Status PushPull(grpc::ServerContext* ctx,
                        grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
    ReceivedPush p;
    DT_RETURN_IF_ERROR(ReceivePush([stream](grpc::ByteBuffer* b) { return stream->Read(b); }, &p));
    Replicator::Ack ack;
    DT_RETURN_IF_ERROR(ApplyPush(p, &ack).status());
    p.messages.clear();  // release the pushed bytes before waiting (items keep their keys)
    DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values, PullPushed(p, MakePullOptions(ctx)));
    return SendPulled(values, false, [stream](const grpc::ByteBuffer& b, bool last) {
      return stream->Write(b,
                           last ? grpc::WriteOptions().set_last_message() : grpc::WriteOptions());
    });
  }

  // Unary forms: the request is one message, and so is the reply.
  static std::function<bool(grpc::ByteBuffer*)> ReadOnce(const grpc::ByteBuffer* request) {
    auto done = std::make_shared<bool>(false);
    return [request, done](grpc::ByteBuffer* b) {
      if (*done) return false;
      *done = true;
      *b = *request;
      return true;
    };
  }

  static std::function<bool(const grpc::ByteBuffer&, bool)> WriteOnce(grpc::ByteBuffer* response) {
    return [response](const grpc::ByteBuffer& b, bool) {
      *response = b;
      return true;
    };
  }

  absl::Status PushUnary(const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
    ReceivedPush p;
    DT_RETURN_IF_ERROR(ReceivePush(ReadOnce(request), &p));
    DT_ASSIGN_OR_RETURN(PushResult result, ApplyPush(p));
    v1::PushResponse reply;
    reply.set_applied(result.applied);
    reply.set_duplicates(result.duplicates);
    *response = wire::SerializeSmall(reply);
    return absl::OkStatus();
  }

  absl::Status PullUnary(grpc::ServerContext* ctx, const grpc::ByteBuffer* request,
                         grpc::ByteBuffer* response) {
    DT_RETURN_IF_ERROR(CheckReads());
    v1::PullRequest r;
    DT_RETURN_IF_ERROR(wire::ParseSmall(*request, &r, "PullRequest"));
    DT_RETURN_IF_ERROR(security::JobScope::Check(r.job()));
    std::vector<PullRequestItem> items;
    for (const v1::PullItem& p : r.items()) items.push_back({p.key(), p.slice(), p.round()});
    DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values,
                        store_->Pull(r.job(), r.worker(), items, MakePullOptions(ctx)));
    DT_RETURN_IF_ERROR(ReadCommitted());
    return SendPulled(values, true, WriteOnce(response));
  }

  absl::Status PushPullUnary(grpc::ServerContext* ctx, const grpc::ByteBuffer* request,
                             grpc::ByteBuffer* response) {
    ReceivedPush p;
    DT_RETURN_IF_ERROR(ReceivePush(ReadOnce(request), &p));
    Replicator::Ack ack;
    DT_RETURN_IF_ERROR(ApplyPush(p, &ack).status());
    p.messages.clear();
    DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values, PullPushed(p, MakePullOptions(ctx)));
    return SendPulled(values, true, WriteOnce(response));
  }

  // ---- The data port (libs/kvstore/data_port.h): the same checks, store
  // operations and accounting as the gRPC data calls above ----

  void set_data_port(DataPortServer* data_port) { data_port_.store(data_port); }

  void set_replica_link(const DataPortReplicaLink* link) { link_ = link; }

  absl::Status DataPort(const grpc::ServerContextBase& ctx, v1::DataPortResponse* response) {
    DataPortServer* port = data_port_.load();
    if (port == nullptr) return absl::OkStatus();
    response->set_tcp_port(port->tcp_port());
    response->set_tls(port->tls());
    response->set_unix_socket(port->unix_socket());
    response->set_host_id(HostId());
    response->set_instance(port->instance());
    response->set_replicate_values_apart(true);
    // The replica ticket lets a Unix peer in as a kvstore (a chain
    // predecessor on this host): only for callers that may replicate over
    // mutual TLS already (kvstore shards, admins), never for trainers.
    if (port->tls()) {
      absl::StatusOr<security::Identity> who = rpc::PeerIdentity(ctx);
      if (who.ok() && who->authenticated &&
          security::Authorize(*who, security::Action::kReplicate).ok()) {
        response->set_replica_ticket(port->replica_ticket());
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<absl::optional<security::JobGrant>> Hello(const security::Identity& who,
                                                           const v1::DataHello& hello,
                                                           DataConn::Kind kind) override {
    // A HELLO without a job opens a replica link (REPLICATE frames from
    // the predecessor: kvstore identities only).
    DT_ASSIGN_OR_RETURN(absl::optional<security::JobGrant> grant,
                        AuthorizeKvstore(who, hello.job().empty() ? "Replicate" : "Push",
                                         hello.token().empty() ? nullptr : &hello.token(),
                                         options_.job_token_secret));
    if (grant.has_value() && grant->job != hello.job()) {
      return absl::PermissionDeniedError(absl::StrCat(who.ToString(),
                                                      ": the kvstore token grants job '",
                                                      grant->job, "', not '", hello.job(), "'"));
    }
    DT_LOG(DEBUG) << "data port (" << DataConn::KindName(kind) << "): " << who.ToString()
                  << " for job '" << hello.job() << "' worker " << hello.worker();
    return grant;
  }

  absl::Status Handle(const DataRequest& request, DataReply* reply) override {
    const char* method = DataOpMethod(request.op);
    const Clock::time_point start = Clock::now();
    security::JobScope scope(
        request.scope != nullptr && request.scope->has_value() ? &**request.scope : nullptr);
    std::vector<std::shared_ptr<ParkedPull>> completed;
    completed_pulls = &completed;
    bool parked = false;
    absl::Status status = HandleData(request, reply, &parked);
    completed_pulls = nullptr;
    // The pulls this request's push completed: their rounds are on the
    // chain with it (HandleData waited for that), so answer them now,
    // before this request's own reply.
    for (const std::shared_ptr<ParkedPull>& p : completed) TryAnswer(p, /*expired=*/false);
    if (request.op != DataOp::kReplicate && !parked) Account(method, start, status);
    return status;
  }

 private:
  // ---- Parked pulls (DataRequest::defer) ----
  //
  // A data port PushPull whose push leaves its round incomplete holds no
  // thread: its pull waits in the store (Store::TryPull), and the request
  // whose push completes the round answers it on its own thread (Handle),
  // so no thread is woken to write the reply. The parked request's
  // connection thread runs Progress only at the pull's deadline, when the
  // hold on its push runs out, and for a round completed by a thread that
  // answers no parked pulls (a gRPC push: DataResponder::Poke).

  // Payloads up to this size park. A held push's bytes are copied to
  // wait (the client reuses its memory once answered): up to 64 KiB that
  // copy costs less than the thread wakeup parking saves (tens of us);
  // bigger pushes wait on their thread as before.
  static constexpr uint64_t kParkMaxBytes = 64 << 10;

  // Parks the pull of a PushPull whose push `ack` left its round
  // incomplete (or answers it at once if the round completed meanwhile).
  void ParkPull(const DataRequest& request, const ReceivedPush& p, const Replicator::Ack& ack,
                absl::Time deadline) {
    auto parked = std::make_shared<ParkedPull>();
    parked->job = p.header.job();
    parked->worker = p.header.worker();
    for (const PushItem& item : p.items)
      parked->items.push_back({item.key, item.slice, item.round});
    parked->deadline = deadline;
    parked->ack = ack;
    parked->held = ack.held();
    parked->hold_until = absl::Now() + options_.replica_round_hold;
    parked->start = Clock::now();
    parked->responder = request.defer();
    parked->deliver = [r = parked->responder.get()](const absl::Status& status,
                                                    const DataReply& reply) {
      return r->Answer(status, reply);
    };
    Arm(parked);
    TryAnswer(parked, /*expired=*/false);
  }

  void Arm(const std::shared_ptr<ParkedPull>& p) {
    p->responder->SetTimer(p->held.load() ? std::min(p->hold_until, p->deadline) : p->deadline,
                           [this, p] { Progress(p); });
  }

  // On the parked request's connection thread: at a deadline, or poked.
  void Progress(const std::shared_ptr<ParkedPull>& p) {
    const absl::Time now = absl::Now();
    if (now >= p->hold_until && p->held.exchange(false)) {
      // The round did not complete within the hold: send the push alone.
      replicator_->ReleaseHold(p->ack);
    }
    TryAnswer(p, /*expired=*/now >= p->deadline);
    if (!p->responder->answered()) Arm(p);
  }

  // Answers `p` if its rounds are complete, or at its deadline (`expired`:
  // with the values if the round just completed, else naming the missing
  // workers); otherwise leaves a continuation in the store.
  void TryAnswer(const std::shared_ptr<ParkedPull>& p, bool expired) {
    if (p->delivered.load()) return;
    if (p->responder != nullptr && p->responder->answered()) return;
    std::vector<PulledValue> values;
    absl::StatusOr<bool> ready = store_->TryPull(
        p->job, p->worker, p->items,
        [this, p] {
          // On the thread of the push that completed the round, which may
          // hold the chain's lock: only note it.
          if (completed_pulls != nullptr) {
            completed_pulls->push_back(p);
          } else if (p->responder != nullptr) {
            p->responder->Poke();
          }
          // (A tail answer's round is completed by a batch, which every
          // path receives with completed_pulls set: ReceiveBatch.)
        },
        &values);
    absl::Status status = ready.status();
    if (ready.ok() && !*ready) {
      if (!expired) return;
      PullOptions now;
      now.deadline = absl::Now();
      absl::StatusOr<std::vector<PulledValue>> late =
          store_->Pull(p->job, p->worker, p->items, now);
      status = late.status();
      if (late.ok()) values = std::move(*late);
    }
    if (status.ok()) status = p->ack.Wait(absl::Now() + options_.replication_timeout);
    if (status.ok()) status = ReadCommitted();
    DataReply reply;
    if (status.ok()) status = PulledReply(values, &reply);
    if (p->held.exchange(false)) {
      // Answered, perhaps before its round went down the chain (an error):
      // its push is held for no one any more.
      replicator_->ReleaseHold(p->ack);
    }
    if (p->deliver(status, reply)) {
      p->delivered = true;
      if (p->responder != nullptr) Account(DataOpMethod(DataOp::kPushPull), p->start, status);
    }
  }

  // ---- Answers at the tail (v1::AnswerAt) ----
  //
  // A push-pull whose push names an answers connection on this replica:
  // the pull half is answered here, once its round is complete here and
  // acknowledged by any successor (ReceiveBatch answers after Receive),
  // so the values are on every replica. The head wrote no reply.

  // The answers `batch`'s pushes ask of this replica (those whose answers
  // connection is here), to try once it is applied.
  std::vector<std::shared_ptr<ParkedPull>> TailAnswers(const v1::ReplicateBatch& batch) {
    std::vector<std::shared_ptr<ParkedPull>> answers;
    DataPortServer* port = data_port_.load();
    if (port == nullptr) return answers;
    for (const v1::Mutation& m : batch.mutations()) {
      if (!m.has_push() || !m.push().has_answer_at()) continue;
      const v1::ReplicatedPush& push = m.push();
      const uint64_t token = push.answer_at().token();
      if (!port->HasAnswers(token)) continue;  // another replica's (or closed)
      auto a = std::make_shared<ParkedPull>();
      a->job = push.job();
      a->worker = push.worker();
      for (const v1::PushItem& item : push.items()) {
        a->items.push_back({item.key(), item.slice(), item.round()});
      }
      a->deadline = absl::InfiniteFuture();  // the client keeps its own
      a->start = Clock::now();
      a->deliver = [this, port, token, id = push.answer_at().request_id(), job = push.job()](
                       const absl::Status& status, const DataReply& reply) {
        absl::Status written = port->Answer(token, id, job, status, reply);
        if (written.ok()) {
          tail_answered_.Increment();
        } else if (!absl::IsAlreadyExists(written)) {
          tail_refused_.Increment();
          DT_LOG(DEBUG) << "answer at the tail for job '" << job << "': " << written;
        }
        return true;  // done either way: a refused answer is never written
      };
      answers.push_back(std::move(a));
    }
    return answers;
  }

 public:
  // A batch from the predecessor (data port or gRPC): applied, then the
  // answers its pushes (and the rounds they completed) owe clients here.
  absl::StatusOr<v1::ReplicateReply> ReceiveBatch(v1::ReplicateBatch batch, absl::Time deadline,
                                                  const std::vector<absl::string_view>& values) {
    std::vector<std::shared_ptr<ParkedPull>> answers = TailAnswers(batch);
    std::vector<std::shared_ptr<ParkedPull>> completed;
    std::vector<std::shared_ptr<ParkedPull>>* outer = completed_pulls;
    if (outer == nullptr) completed_pulls = &completed;
    absl::StatusOr<v1::ReplicateReply> r = replicator_->Receive(std::move(batch), deadline, values);
    if (outer == nullptr) completed_pulls = nullptr;
    if (r.ok()) {
      for (const std::shared_ptr<ParkedPull>& a : answers) TryAnswer(a, /*expired=*/false);
    }
    for (const std::shared_ptr<ParkedPull>& p : completed) TryAnswer(p, /*expired=*/false);
    return r;
  }

 private:
  // `*parked`: the reply was deferred (ParkPull).
  absl::Status HandleData(const DataRequest& request, DataReply* reply, bool* parked) {
    PullOptions pull;
    pull.deadline = std::min(request.deadline, absl::Now() + options_.max_pull_wait);
    pull.cancelled = request.cancelled;
    switch (request.op) {
      case DataOp::kPull: {
        DT_RETURN_IF_ERROR(CheckReads());
        v1::PullRequest r;
        if (!r.ParseFromArray(request.header.data(), static_cast<int>(request.header.size()))) {
          return absl::InvalidArgumentError("data port PULL: unparsable PullRequest");
        }
        if (request.payload_bytes != 0) {
          return absl::InvalidArgumentError("data port PULL: a pull carries no payload");
        }
        DT_RETURN_IF_ERROR(security::JobScope::Check(r.job()));
        std::vector<PullRequestItem> items;
        for (const v1::PullItem& p : r.items()) items.push_back({p.key(), p.slice(), p.round()});
        DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values,
                            store_->Pull(r.job(), r.worker(), items, pull));
        DT_RETURN_IF_ERROR(ReadCommitted());
        return PulledReply(values, reply);
      }
      case DataOp::kPush:
      case DataOp::kPushPull: {
        ReceivedPush p;
        if (!p.header.ParseFromArray(request.header.data(),
                                     static_cast<int>(request.header.size())) ||
            p.header.chunks_size() > 0) {
          return absl::InvalidArgumentError(
              "data port PUSH: unparsable PushRequest (or one with chunks)");
        }
        std::vector<std::pair<std::string, int64_t>> sizes;
        DT_RETURN_IF_ERROR(PreparePush(&p, &sizes));
        std::vector<int64_t> bytes;
        uint64_t need = 0;
        for (const auto& [what, n] : sizes) {
          bytes.push_back(n);
          need += static_cast<uint64_t>(n);
        }
        if (need != request.payload_bytes || p.items.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "data port PUSH of job '", p.header.job(), "': payload of ", request.payload_bytes,
              " bytes, its ", p.items.size(), " items need ", need));
        }
        DT_ASSIGN_OR_RETURN(absl::string_view payload, request.read_payload());
        DT_ASSIGN_OR_RETURN(std::vector<absl::string_view> pieces, SplitPayload(payload, bytes));
        for (size_t i = 0; i < p.items.size(); ++i) p.items[i].data = {pieces[i]};
        p.bytes = static_cast<int64_t>(need);
        push_bytes_.Increment(static_cast<double>(need));
        // The chain reads the pushed values where they arrived (the
        // connection's buffer or segment, valid until this returns).
        Replicator::Ack ack;
        absl::Cleanup detach = [&] {
          if (replicator_ != nullptr) replicator_->Detach(ack);
        };
        const bool pushpull = request.op == DataOp::kPushPull;
        if (p.header.has_answer_at()) {
          DT_RETURN_IF_ERROR(CheckAnswerAt(request, need));
        }
        DT_ASSIGN_OR_RETURN(PushResult result, ApplyPush(p, &ack, /*by_reference=*/true,
                                                         /*hold_incomplete=*/pushpull));
        if (p.header.has_answer_at()) {
          // The tail answers the pull; this writes no reply. The pushed
          // bytes are copied if the chain still needs them.
          if (result.applied > 0 && result.incomplete == result.applied && request.defer) {
            // Its round waits for other workers: wait (without a thread)
            // for the hold to run out (then let a held push go alone), for
            // the pull's deadline, or for the client's next frame (it has
            // its answer).
            replicator_->Detach(ack, /*keep_hold=*/true);
            std::move(detach).Cancel();
            std::shared_ptr<DataResponder> responder = request.defer();
            responder->EndOnFrame();
            WaitForAnswerAt(responder.get(), p, ack, pull.deadline);
            return absl::OkStatus();  // accounted now: nothing more is answered here
          }
          if (ack.held()) {  // no way to wait without the thread
            DT_RETURN_IF_ERROR(
                replicator_->WaitHeld(ack, absl::Now() + options_.replication_timeout));
          }
          reply->none = true;
          return absl::OkStatus();
        }
        if (pushpull && request.defer && need <= kParkMaxBytes && result.applied > 0 &&
            result.incomplete == result.applied) {
          // Its round waits for other workers: park the pull. The pushed
          // bytes are copied if the chain still needs them (the client
          // reuses its segment once answered), and stay held.
          if (replicator_ != nullptr) replicator_->Detach(ack, /*keep_hold=*/true);
          std::move(detach).Cancel();
          ParkPull(request, p, ack, pull.deadline);
          *parked = true;
          return absl::OkStatus();
        }
        if (pushpull && replicator_ != nullptr) {
          // On the chain first (with the round's other pushes: one batch),
          // then the round's values.
          DT_RETURN_IF_ERROR(
              replicator_->WaitHeld(ack, absl::Now() + options_.replication_timeout));
        }
        if (!pushpull) {
          DT_RETURN_IF_ERROR(ack.Wait(absl::Now() + options_.replication_timeout));
          v1::PushResponse r;
          r.set_applied(result.applied);
          r.set_duplicates(result.duplicates);
          reply->header = r.SerializeAsString();
          return absl::OkStatus();
        }
        DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values, PullPushed(p, pull));
        return PulledReply(values, reply);
      }
      case DataOp::kReplicate:
        return HandleReplicate(request, reply);
      case DataOp::kHello:
        break;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("data port: unexpected ", DataOpName(static_cast<uint16_t>(request.op))));
  }

  absl::Status HandleReplicate(const DataRequest& request, DataReply* reply);

  // A push whose pull the tail answers (v1::AnswerAt) and whose round
  // waits for other workers, deferred on `r` (EndOnFrame: the client's next
  // frame ends the wait): when a hold on it runs out, sends it alone; at
  // the pull's deadline, if the round is still incomplete, answers here
  // what a blocking pull would (the workers it waits for), since the tail
  // keeps no deadline. The tail answers the values.
  void WaitForAnswerAt(DataResponder* r, const ReceivedPush& p, const Replicator::Ack& ack,
                       absl::Time deadline) {
    std::vector<PullRequestItem> items;
    for (const PushItem& item : p.items) items.push_back({item.key, item.slice, item.round});
    auto at_deadline = [this, r, job = p.header.job(), worker = p.header.worker(),
                        items = std::move(items)] {
      PullOptions now;
      now.deadline = absl::Now();
      absl::StatusOr<std::vector<PulledValue>> late = store_->Pull(job, worker, items, now);
      if (late.ok()) {
        r->Finish();  // complete after all: the tail answers
      } else {
        r->Answer(late.status(), DataReply());
      }
    };
    if (!ack.held()) {
      r->SetTimer(deadline, std::move(at_deadline));
      return;
    }
    const absl::Time hold_until = std::min(absl::Now() + options_.replica_round_hold, deadline);
    r->SetTimer(hold_until, [this, r, ack, deadline, at_deadline = std::move(at_deadline)] {
      replicator_->ReleaseHold(ack);
      if (absl::Now() >= deadline) {
        at_deadline();
      } else {
        r->SetTimer(deadline, at_deadline);
      }
    });
  }

  // Whether a data port push-pull of `payload_bytes` may be answered at the
  // tail (v1::AnswerAt): only here at a replicated chain's head with a
  // successor, and only for payloads that wait without a thread.
  absl::Status CheckAnswerAt(const DataRequest& request, uint64_t payload_bytes) const {
    if (request.op != DataOp::kPushPull) {
      return absl::InvalidArgumentError("data port PUSH: answer_at is for push-pulls only");
    }
    if (replicator_ == nullptr || !replicator_->has_successor()) {
      return absl::UnavailableError(
          "data port PUSHPULL with answer_at: this shard has no replica after this one to answer "
          "it (the chain changed); refresh the shard map");
    }
    if (payload_bytes > kMaxAnswerAtBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data port PUSHPULL with answer_at: a payload of ", payload_bytes,
          " bytes (answers at the tail are for pushes up to ", kMaxAnswerAtBytes, ")"));
    }
    return absl::OkStatus();
  }

  // A pull's reply: the items' sizes in the header, the values as the
  // payload (referenced, not copied, until written).
  absl::Status PulledReply(const std::vector<PulledValue>& values, DataReply* reply) {
    v1::PullResponse header;
    int64_t total = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      v1::PulledItem* item = header.add_items();
      item->set_item(static_cast<int32_t>(i));
      item->set_round(values[i].round);
      item->set_dtype(static_cast<int32_t>(values[i].dtype));
      item->set_bytes(static_cast<int64_t>(values[i].bytes.size));
      reply->values.push_back(values[i].bytes.view());
      reply->owners.push_back(values[i].bytes.owner);
      total += static_cast<int64_t>(values[i].bytes.size);
    }
    reply->header = header.SerializeAsString();
    pull_bytes_.Increment(static_cast<double>(total));
    return absl::OkStatus();
  }

  std::vector<prometheus::MetricFamily> Collect() const {
    std::vector<metrics::Sample> rounds, keys, slices, held;
    for (const std::string& job : store_->JobNames()) {
      absl::StatusOr<JobStatus> s = store_->GetJob(job, -1, false);
      if (!s.ok()) continue;  // deleted meanwhile
      std::map<std::string, std::string> labels = {{"job", job}};
      rounds.push_back({labels, static_cast<double>(s->rounds_completed)});
      keys.push_back({labels, static_cast<double>(s->num_keys)});
      slices.push_back({labels, static_cast<double>(s->num_slices)});
      held.push_back({labels, static_cast<double>(s->held_bytes)});
    }
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> families = {
        metrics::MakeFamily("dtrain_kvstore_rounds_completed_total",
                            "Slice-rounds completed on this shard since it started, per job.",
                            MetricType::Counter, rounds),
        metrics::MakeFamily("dtrain_kvstore_keys", "Keys with a slice on this shard, per job.",
                            MetricType::Gauge, keys),
        metrics::MakeFamily("dtrain_kvstore_slices", "Slices held on this shard, per job.",
                            MetricType::Gauge, slices),
        metrics::MakeFamily("dtrain_kvstore_held_bytes",
                            "Bytes of values, optimizer state and accumulators, per job.",
                            MetricType::Gauge, held),
        metrics::MakeFamily("dtrain_kvstore_quota_bytes", "Bytes a job may hold (0: no limit).",
                            MetricType::Gauge,
                            {{{}, static_cast<double>(options_.quota_bytes_per_job)}}),
        metrics::MakeFamily("dtrain_kvstore_snapshots_total", "Snapshots written.",
                            MetricType::Counter,
                            {{{}, static_cast<double>(snapshotter_->snapshots_written())}}),
    };
    if (DataPortServer* port = data_port_.load(); port != nullptr) {
      std::vector<metrics::Sample> open;
      for (const auto& [kind, n] : port->Connections()) {
        open.push_back({{{"kind", kind}}, static_cast<double>(n)});
      }
      families.push_back(metrics::MakeFamily("dtrain_kvstore_data_port_connections",
                                             "Data port connections open now, by kind (tcp, "
                                             "tls, unix).",
                                             MetricType::Gauge, open));
    }
    if (link_ != nullptr) {
      std::vector<metrics::Sample> frames;
      for (const auto& [kind, n] : link_->FramesSent()) {
        frames.push_back({{{"kind", kind}}, static_cast<double>(n)});
      }
      families.push_back(metrics::MakeFamily(
          "dtrain_kvstore_replicate_frames_total",
          "Batches this replica sent to its successor, by transport (unix: socket and shared "
          "memory on this host; tls, tcp: the data port over TCP; grpc: Replica.Replicate).",
          MetricType::Counter, frames));
    }
    if (replicator_ != nullptr) {
      const ReplicatorStats st = replicator_->stats();
      const std::string role = replicator_->Role();
      std::vector<metrics::Sample> roles;
      for (const char* r : {"head", "middle", "tail", "joining", "none"}) {
        roles.push_back({{{"role", r}}, role == r ? 1.0 : 0.0});
      }
      auto counter = [&](const char* name, const char* help, int64_t v) {
        families.push_back(
            metrics::MakeFamily(name, help, MetricType::Counter, {{{}, static_cast<double>(v)}}));
      };
      families.push_back(metrics::MakeFamily(
          "dtrain_kvstore_replica_map_version", "Version of the shard map this replica follows.",
          MetricType::Gauge, {{{}, static_cast<double>(replicator_->map().version())}}));
      families.push_back(metrics::MakeFamily("dtrain_kvstore_replica_role",
                                             "1 for this replica's role in its chain.",
                                             MetricType::Gauge, roles));
      counter("dtrain_kvstore_replica_forwarded_total",
              "Writes the successor acknowledged (batched).", st.forwarded);
      counter("dtrain_kvstore_replica_received_total", "Writes applied from the predecessor.",
              st.received);
      counter("dtrain_kvstore_replica_transfers_total",
              "Whole-state transfers the successor acknowledged.", st.transfers);
      counter("dtrain_kvstore_replica_transfer_bytes_total", "Value bytes of those transfers.",
              st.transfer_bytes);
      counter("dtrain_kvstore_replica_send_failures_total",
              "Batches to the successor that failed and went again.", st.send_failures);
    }
    return families;
  }

  const ServerOptions options_;
  JobLimiter calls_per_job_{options_.max_calls_per_job, "calls in flight",
                            "kvstore_server --max_calls_per_job"};
  Store* const store_;
  Snapshotter* const snapshotter_;
  Replicator* const replicator_;  // null: unreplicated
  int64_t chunk_bytes_ = 1 << 20;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Counter& push_bytes_;
  prometheus::Counter& pull_bytes_;
  prometheus::Counter& duplicates_;
  prometheus::Family<prometheus::Counter>& tail_answers_;
  prometheus::Counter& tail_answered_;
  prometheus::Counter& tail_refused_;
  std::shared_ptr<metrics::CallbackCollectable> store_metrics_;
  struct MethodMetrics {
    prometheus::Counter* ok = nullptr;
    prometheus::Histogram* latency = nullptr;
  };
  std::map<std::string, MethodMetrics> methods_;  // filled by the constructor, then read-only
  std::atomic<DataPortServer*> data_port_{nullptr};
  const DataPortReplicaLink* link_ = nullptr;  // null: unreplicated; set before serving
};

absl::Status KVStoreServer::Impl::HandleReplicate(const DataRequest& request, DataReply* reply) {
  // As Replica.Replicate: kvstore shards only (libs/security/authz.h).
  DT_RETURN_IF_ERROR(security::Authorize(
      request.who != nullptr ? *request.who : security::Identity{}, security::Action::kReplicate));
  if (replicator_ == nullptr) {
    return absl::FailedPreconditionError("data port REPLICATE: this shard is not replicated");
  }
  if (!request.header.empty()) {
    // The batch as the header, its pushes' values as the payload (applied
    // from the connection's buffer or segment, not copied).
    v1::ReplicateBatch batch;
    if (!batch.ParseFromArray(request.header.data(), static_cast<int>(request.header.size()))) {
      return absl::InvalidArgumentError("data port REPLICATE: the batch does not parse");
    }
    absl::StatusOr<std::vector<int64_t>> sizes = ApartValueSizes(batch);
    DT_RETURN_IF_ERROR(Annotate(sizes.status(), "data port REPLICATE"));
    uint64_t need = 0;
    for (int64_t n : *sizes) need += static_cast<uint64_t>(n);
    if (need != request.payload_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("data port REPLICATE: payload of ",
                                                     request.payload_bytes,
                                                     " bytes, the batch's pushes name ", need));
    }
    std::vector<absl::string_view> values;
    if (need > 0) {
      DT_ASSIGN_OR_RETURN(absl::string_view payload, request.read_payload());
      DT_ASSIGN_OR_RETURN(values, SplitPayload(payload, *sizes));
    }
    DT_ASSIGN_OR_RETURN(v1::ReplicateReply r,
                        ReceiveBatch(std::move(batch), request.deadline, values));
    reply->header = r.SerializeAsString();
    return absl::OkStatus();
  }
  constexpr uint64_t kBatchLimit = (uint64_t{1} << 31) - 1;  // what protobuf parses
  if (request.payload_bytes == 0 || request.payload_bytes > kBatchLimit) {
    return absl::InvalidArgumentError(absl::StrCat("data port REPLICATE: a batch of ",
                                                   request.payload_bytes, " bytes (1 to ",
                                                   kBatchLimit, ")"));
  }
  DT_ASSIGN_OR_RETURN(absl::string_view payload, request.read_payload());
  v1::ReplicateBatch batch;
  if (!batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::InvalidArgumentError("data port REPLICATE: the batch does not parse");
  }
  DT_ASSIGN_OR_RETURN(v1::ReplicateReply r, ReceiveBatch(std::move(batch), request.deadline, {}));
  reply->header = r.SerializeAsString();
  return absl::OkStatus();
}

namespace {

// dtrain.kvstore.v1.KVStore
class ControlService final : public v1::KVStore::Service {
 public:
  explicit ControlService(KVStoreServer::Impl* impl) : impl_(impl) {}

  grpc::Status CreateJob(grpc::ServerContext* ctx, const v1::CreateJobRequest* request,
                         v1::CreateJobResponse* response) override {
    return impl_->Run("CreateJob", ctx, [&] { return impl_->CreateJob(*request, response); });
  }
  grpc::Status DeleteJob(grpc::ServerContext* ctx, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override {
    return impl_->Run("DeleteJob", ctx, [&] { return impl_->DeleteJob(*request, response); });
  }
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override {
    return impl_->Run("GetJob", ctx, [&] { return impl_->GetJob(*request, response); });
  }
  grpc::Status Init(grpc::ServerContext* ctx, grpc::ServerReader<v1::InitRequest>* reader,
                    v1::InitResponse* response) override {
    return impl_->Run("Init", ctx, [&] { return impl_->Init(reader, response); });
  }
  grpc::Status Snapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest*,
                        v1::SnapshotResponse* response) override {
    return impl_->Run("Snapshot", ctx, [&] { return impl_->Snapshot(response); });
  }
  grpc::Status DataPort(grpc::ServerContext* ctx, const v1::DataPortRequest*,
                        v1::DataPortResponse* response) override {
    return impl_->Run("DataPort", ctx, [&] { return impl_->DataPort(*ctx, response); });
  }

 private:
  KVStoreServer::Impl* impl_;
};

// dtrain.kvstore.v1.KVStoreData, with raw byte buffers so values are never
// copied by protobuf (see libs/kvstore/wire.h). Methods are registered under
// the names the generated stubs use.
class DataService final : public grpc::Service {
 public:
  DataService(KVStoreServer::Impl* impl, bool callback) : impl_(impl) {
    using grpc::ByteBuffer;
    using grpc::ServerContext;
    using grpc::internal::RpcMethod;
    Add<grpc::internal::ClientStreamingHandler<DataService, ByteBuffer, ByteBuffer>>(
        "Push", RpcMethod::CLIENT_STREAMING,
        [](DataService* s, ServerContext* ctx, grpc::ServerReader<ByteBuffer>* reader,
           ByteBuffer* response) {
          return s->impl_->Run("Push", ctx, [&] { return s->impl_->Push(ctx, reader, response); });
        });
    Add<grpc::internal::ServerStreamingHandler<DataService, ByteBuffer, ByteBuffer>>(
        "Pull", RpcMethod::SERVER_STREAMING,
        [](DataService* s, ServerContext* ctx, const ByteBuffer* request,
           grpc::ServerWriter<ByteBuffer>* writer) {
          return s->impl_->Run("Pull", ctx, [&] { return s->impl_->Pull(ctx, request, writer); });
        });
    Add<grpc::internal::BidiStreamingHandler<DataService, ByteBuffer, ByteBuffer>>(
        "PushPull", RpcMethod::BIDI_STREAMING,
        [](DataService* s, ServerContext* ctx,
           grpc::ServerReaderWriter<ByteBuffer, ByteBuffer>* stream) {
          return s->impl_->Run("PushPull", ctx, [&] { return s->impl_->PushPull(ctx, stream); });
        });
    using Unary = grpc::internal::RpcMethodHandler<DataService, ByteBuffer, ByteBuffer>;
    Add<Unary>(
        "PushUnary", RpcMethod::NORMAL_RPC,
        [](DataService* s, ServerContext* ctx, const ByteBuffer* request, ByteBuffer* response) {
          return s->impl_->Run("PushUnary", ctx,
                               [&] { return s->impl_->PushUnary(request, response); });
        });
    Add<Unary>(
        "PullUnary", RpcMethod::NORMAL_RPC,
        [](DataService* s, ServerContext* ctx, const ByteBuffer* request, ByteBuffer* response) {
          return s->impl_->Run("PullUnary", ctx,
                               [&] { return s->impl_->PullUnary(ctx, request, response); });
        });
    Add<Unary>(
        "PushPullUnary", RpcMethod::NORMAL_RPC,
        [](DataService* s, ServerContext* ctx, const ByteBuffer* request, ByteBuffer* response) {
          return s->impl_->Run("PushPullUnary", ctx,
                               [&] { return s->impl_->PushPullUnary(ctx, request, response); });
        });
    if (callback) {
      // The unary forms on gRPC's callback threads instead (the sync
      // handlers above are replaced).
      for (const char* method : {"PushUnary", "PullUnary", "PushPullUnary"}) {
        int index = 0;
        for (; index < static_cast<int>(names_.size()); ++index) {
          if (absl::EndsWith(*names_[static_cast<size_t>(index)], absl::StrCat("/", method))) break;
        }
        KVStoreServer::Impl* i = impl_;
        MarkMethodRawCallback(
            index, new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                       [i, method](grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
                         return i->StartUnary(method, ctx, request, response);
                       }));
      }
    }
  }

 private:
  template <typename Handler, typename Fn>
  void Add(const char* method, grpc::internal::RpcMethod::RpcType type, Fn fn) {
    names_.push_back(std::make_unique<std::string>(
        absl::StrCat("/", v1::KVStoreData::service_full_name(), "/", method)));
    AddMethod(
        new grpc::internal::RpcServiceMethod(names_.back()->c_str(), type, new Handler(fn, this)));
  }

  KVStoreServer::Impl* impl_;
  std::vector<std::unique_ptr<std::string>> names_;  // RpcServiceMethod keeps the pointers
};

}  // namespace

// The services live as long as the gRPC server.
struct KVStoreServer::Services {
  std::unique_ptr<ControlService> control;
  std::unique_ptr<DataService> data;
  std::unique_ptr<ReplicaService> replica;
};

absl::StatusOr<std::unique_ptr<KVStoreServer>> KVStoreServer::Start(const ServerOptions& options) {
  if (options.shard_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_index must be >= 0, got ", options.shard_index));
  }
  if (options.max_message_bytes < (64 << 10) || options.max_message_bytes > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes must be 64 KiB to 1 GiB, got ", options.max_message_bytes));
  }
  if (options.quota_bytes_per_job < 0 || options.max_jobs < 0) {
    return absl::InvalidArgumentError("quota_bytes_per_job and max_jobs must be >= 0");
  }
  std::unique_ptr<KVStoreServer> server(new KVStoreServer());
  server->options_ = options;
  StoreOptions store_options;
  store_options.shard_index = options.shard_index;
  store_options.quota_bytes_per_job = options.quota_bytes_per_job;
  store_options.max_jobs = options.max_jobs;
  server->store_ = std::make_unique<Store>(store_options);
  if (!options.data_dir.empty()) {
    DT_ASSIGN_OR_RETURN(server->resumed_, LoadSnapshot(options.data_dir, server->store_.get()));
    if (server->resumed_) {
      DT_LOG(INFO) << "kvstore shard " << options.shard_index << " resumed from "
                   << SnapshotPath(options.data_dir, options.shard_index) << " ("
                   << server->store_->JobNames().size() << " jobs)";
    }
  }
  server->snapshotter_ = std::make_unique<Snapshotter>(server->store_.get(), options.data_dir,
                                                       options.snapshot_interval);
  uint64_t r_incarnation = 0;
  const DataPortReplicaLink* link = nullptr;  // its metrics
  if (!options.scheduler.empty()) {
    if (options.num_shards < 1 || options.shard_index >= options.num_shards ||
        options.replica_index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replication needs 0 <= shard_index < num_shards and replica_index >= 0, got shard ",
          options.shard_index, " of ", options.num_shards, ", replica ", options.replica_index));
    }
    // The chain's writes travel over the successor's data port (gRPC when it
    // has none).
    auto data_port_link =
        std::make_unique<DataPortReplicaLink>(options.replication_timeout, options.replica_spin);
    link = data_port_link.get();
    server->link_ = std::move(data_port_link);
    ReplicatorOptions r;
    r.ack_spin = options.replica_spin;
    r.round_hold = options.replica_round_hold;
    r.shard = options.shard_index;
    r.replica = options.replica_index;
    std::random_device random;
    r.incarnation = (static_cast<uint64_t>(random()) << 32) ^ random() ^ 1;
    r_incarnation = r.incarnation;
    server->replicator_ =
        std::make_unique<Replicator>(server->store_.get(), server->link_.get(), r);
  }
  server->impl_ = std::make_unique<Impl>(options, server->store_.get(), server->snapshotter_.get(),
                                         server->replicator_.get());
  server->impl_->set_replica_link(link);
  server->services_ = std::make_unique<Services>();
  server->services_->control = std::make_unique<ControlService>(server->impl_.get());
  // A replicated shard answers a pull once the chain holds what it read; the
  // callback path's continuations run inside the store's push (under the
  // replicator), where that cannot be waited for: the sync path there.
  const bool callback_data = options.callback_data && server->replicator_ == nullptr;
  if (options.callback_data && !callback_data) {
    DT_LOG(WARNING) << "--callback_data is ignored on a replicated shard (--scheduler): its "
                       "pulls wait for the chain on the sync path";
  }
  server->services_->data = std::make_unique<DataService>(server->impl_.get(), callback_data);

  rpc::ServerOptions rpc_options;
  rpc_options.service = "kvstore";
  rpc_options.listen = options.listen;
  rpc_options.port_file = options.port_file;
  rpc_options.metrics_listen = options.metrics_listen;
  rpc_options.max_message_bytes = options.max_message_bytes;
  // A sync server thread blocks while its pull waits for a round. With
  // gRPC's defaults (1 to 2 idle pollers) the pool then creates a thread
  // for the next call and ends one after every round; keeping a few more
  // idle threads avoids that churn (a thread start per push-pull).
  rpc_options.min_pollers = 2;
  rpc_options.max_pollers = 16;
  server->rpc_ = std::make_unique<rpc::Server>(rpc_options);
  server->rpc_->AddService(server->services_->control.get());
  server->rpc_->AddService(server->services_->data.get());
  if (server->replicator_ != nullptr) {
    // A state transfer carries the whole shard.
    server->services_->replica = std::make_unique<ReplicaService>(
        server->replicator_.get(), int64_t{16} << 30,
        [impl = server->impl_.get()](v1::ReplicateBatch batch, absl::Time deadline) {
          return impl->ReceiveBatch(std::move(batch), deadline, {});
        });
    server->rpc_->AddService(server->services_->replica.get());
  }
  server->rpc_->Expose(server->impl_->registry());
  server->rpc_->Expose(server->impl_->store_metrics());
  DT_RETURN_IF_ERROR(server->rpc_->Start());
  {
    DataPortServerOptions d;
    if (options.data_listen == "auto") {
      const size_t colon = options.listen.rfind(':');
      d.tcp_listen = absl::StrCat(
          colon == std::string::npos ? std::string("127.0.0.1") : options.listen.substr(0, colon),
          ":0");
    } else {
      d.tcp_listen = options.data_listen;
    }
    if (options.data_socket == "auto") {
      absl::StatusOr<std::string> path = DefaultDataSocketPath();
      if (path.ok()) {
        d.unix_socket = *path;
      } else {
        DT_LOG(WARNING) << "no data port socket: " << path.status();
      }
    } else {
      d.unix_socket = options.data_socket;
    }
    std::shared_ptr<const rpc::Credentials> credentials = rpc::DefaultCredentials();
    if (!credentials->insecure()) {
      d.tls.enabled = true;
      d.tls.ca_file = credentials->files().ca;
      d.tls.cert_file = credentials->files().cert;
      d.tls.key_file = credentials->files().key;
    }
    d.max_connections = options.data_max_connections;
    d.max_connections_per_job = options.data_max_connections_per_job;
    d.replicate_spin = options.replica_spin;
    if (!d.tcp_listen.empty() || !d.unix_socket.empty()) {
      DT_ASSIGN_OR_RETURN(server->data_port_, DataPortServer::Start(d, server->impl_.get()));
      server->impl_->set_data_port(server->data_port_.get());
      DT_LOG(INFO) << "kvstore shard " << options.shard_index << " data port: tcp port "
                   << server->data_port_->tcp_port() << (d.tls.enabled ? " (TLS)" : " (plain)")
                   << ", socket " << (d.unix_socket.empty() ? "none" : d.unix_socket);
    }
  }
  if (server->replicator_ != nullptr) {
    MapHeartbeatOptions h;
    h.scheduler = options.scheduler;
    h.shard = options.shard_index;
    h.replica = options.replica_index;
    h.num_shards = options.num_shards;
    h.address = options.advertise.empty() ? server->local_address() : options.advertise;
    h.incarnation = r_incarnation;
    server->heartbeat_ = std::make_unique<MapHeartbeat>(server->replicator_.get(), h);
    DT_LOG(INFO) << "kvstore shard " << options.shard_index << " replica " << options.replica_index
                 << " at " << h.address << " follows the shard map of " << options.scheduler;
  }
  if (options.job_ttl > absl::ZeroDuration()) {
    const absl::Duration every = std::min(options.job_ttl / 4, absl::Minutes(1));
    KVStoreServer* s = server.get();
    server->reaper_ = std::thread([s, every] { s->Reap(every); });
  }
  return server;
}

void KVStoreServer::Reap(absl::Duration every) {
  while (!reaper_stop_.WaitForNotificationWithTimeout(every)) {
    const std::vector<std::string> dropped = store_->DropIdleJobs(absl::Now() - options_.job_ttl);
    for (const std::string& job : dropped) {
      DT_LOG(INFO) << "expired job '" << job << "': no call named it for " << options_.job_ttl;
    }
    if (!dropped.empty()) ReleaseFreeMemory();
    if (!dropped.empty() && !options_.data_dir.empty()) {
      // The dropped jobs leave the snapshot now, not at the next interval.
      absl::StatusOr<bool> wrote = snapshotter_->SnapshotIfChanged();
      if (!wrote.ok()) DT_LOG(ERROR) << "snapshot after expiring jobs failed: " << wrote.status();
    }
  }
}

KVStoreServer::~KVStoreServer() {
  absl::Status s = Shutdown(absl::ZeroDuration());
  if (!s.ok()) DT_LOG(ERROR) << "kvstore shutdown: " << s;
}

absl::Status KVStoreServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return absl::OkStatus();
  shut_down_ = true;
  reaper_stop_.Notify();
  if (reaper_.joinable()) reaper_.join();
  heartbeat_.reset();
  // Calls in flight finish (or are cancelled) before the final snapshot.
  // Writes still waiting for the chain when the grace period ends (a
  // successor that died with no map change coming: the heartbeat has
  // stopped) are failed, so that their handlers return.
  std::thread stopper;
  absl::Notification rpc_done;
  if (replicator_ != nullptr) {
    stopper = std::thread([this, grace, &rpc_done] {
      if (!rpc_done.WaitForNotificationWithTimeout(grace + absl::Milliseconds(100))) {
        replicator_->Stop();
      }
    });
  }
  if (rpc_) rpc_->Shutdown(grace);
  rpc_done.Notify();
  if (stopper.joinable()) stopper.join();
  if (replicator_ != nullptr) replicator_->Stop();
  if (data_port_) {
    impl_->set_data_port(nullptr);
    data_port_->Shutdown();
  }
  absl::Status status;
  if (snapshotter_) {
    snapshotter_->Stop();
    if (!options_.data_dir.empty()) {
      absl::StatusOr<SnapshotInfo> info = snapshotter_->SnapshotNow();
      if (info.ok()) {
        DT_LOG(INFO) << "final snapshot " << info->path << " (" << info->slices << " slices, "
                     << info->bytes << " bytes)";
      } else {
        status = info.status();
      }
    }
  }
  return status;
}

int KVStoreServer::port() const { return rpc_ ? rpc_->port() : 0; }

int KVStoreServer::metrics_port() const { return rpc_ ? rpc_->metrics_port() : 0; }

int KVStoreServer::data_port() const { return data_port_ ? data_port_->tcp_port() : 0; }

std::string KVStoreServer::data_socket() const {
  return data_port_ ? data_port_->unix_socket() : "";
}

std::string KVStoreServer::data_port_instance() const {
  return data_port_ ? data_port_->instance() : "";
}

std::string KVStoreServer::local_address() const { return absl::StrCat("127.0.0.1:", port()); }

}  // namespace kvstore
}  // namespace dtrain
