#include "libs/kvstore/shard.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/kvstore/chunks.h"
#include "libs/kvstore/malloc_tuning.h"
#include "libs/kvstore/proto_convert.h"
#include "libs/security/authz.h"

namespace dtrain {
namespace kvstore {
namespace {

using Clock = ShardHandler::Clock;

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

}  // namespace

// A data port PushPull whose pull waits for its round without a thread
// (ShardHandler::ParkPull), or one this replica answers as its chain's
// tail (v1::AnswerAt: ShardHandler::TailAnswers).
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

namespace {

// While a data port request runs (ShardHandler::Handle): the parked pulls
// whose rounds its push completed, for it to answer once its own write is
// on the chain.
thread_local std::vector<std::shared_ptr<ParkedPull>>* completed_pulls = nullptr;

}  // namespace

ShardHandler::ShardHandler(const ShardHandlerOptions& options, Store* store,
                           Snapshotter* snapshotter, Replicator* replicator)
    : options_(options),
      calls_per_job_(options_.max_calls_per_job, "calls in flight",
                     "kvstore_server --max_calls_per_job"),
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

ShardHandler::~ShardHandler() = default;

absl::StatusOr<ShardHandler::Grant> ShardHandler::Authorize(const security::Identity& who,
                                                            const char* method,
                                                            const std::string* token) const {
  return AuthorizeKvstore(who, method, token, options_.job_token_secret);
}

absl::StatusOr<JobLimiter::Hold> ShardHandler::CallPlace(const Grant& grant) {
  if (!grant.has_value()) return JobLimiter::Hold();
  return calls_per_job_.Acquire(grant->job, grant->workers);
}

void ShardHandler::Account(const char* method, Clock::time_point start,
                           const absl::Status& status) {
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

// ---- Replication: writes go through the chain, reads need an ACTIVE member ----

absl::Status ShardHandler::CheckWrites() const {
  return replicator_ == nullptr ? absl::OkStatus() : replicator_->CheckIsHead();
}
absl::Status ShardHandler::CheckReads() const {
  return replicator_ == nullptr ? absl::OkStatus() : replicator_->CheckServesReads();
}
absl::StatusOr<MutationResult> ShardHandler::Replicate(v1::Mutation m) {
  return replicator_->Submit(std::move(m), absl::Now() + options_.replication_timeout);
}

// ---- KVStore (control) ----

absl::Status ShardHandler::CreateJob(const v1::CreateJobRequest& request,
                                     v1::CreateJobResponse* response) {
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

absl::Status ShardHandler::DeleteJob(const v1::DeleteJobRequest& request,
                                     v1::DeleteJobResponse* response) {
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

absl::Status ShardHandler::GetJob(const v1::GetJobRequest& request, v1::GetJobResponse* response) {
  DT_RETURN_IF_ERROR(security::JobScope::Check(request.job()));
  DT_RETURN_IF_ERROR(CheckReads());
  DT_ASSIGN_OR_RETURN(JobStatus status,
                      store_->GetJob(request.job(), request.worker(), request.include_slices()));
  *response = ToProto(status);
  return absl::OkStatus();
}

absl::Status ShardHandler::Init(const std::function<bool(v1::InitRequest*)>& read,
                                v1::InitResponse* response) {
  std::deque<v1::InitRequest> messages;
  messages.emplace_back();
  if (!read(&messages.back())) {
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
    more = read(&messages.back());
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

absl::Status ShardHandler::Snapshot(v1::SnapshotResponse* response) {
  DT_ASSIGN_OR_RETURN(SnapshotInfo info, snapshotter_->SnapshotNow());
  if (info.path.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("kvstore shard ", options_.shard_index, " has no --data_dir to snapshot to"));
  }
  response->set_path(info.path);
  response->set_bytes(info.bytes);
  return absl::OkStatus();
}

// ---- KVStoreData ----

absl::Status ShardHandler::PreparePush(IncomingPush* p,
                                       std::vector<std::pair<std::string, int64_t>>* sizes) {
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

void ShardHandler::CountPushBytes(int64_t bytes) {
  push_bytes_.Increment(static_cast<double>(bytes));
}

void ShardHandler::CountPullBytes(int64_t bytes) {
  pull_bytes_.Increment(static_cast<double>(bytes));
}

absl::StatusOr<PushResult> ShardHandler::ApplyPush(const IncomingPush& p, Replicator::Ack* ack,
                                                   bool by_reference, bool hold_incomplete) {
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
absl::Status ShardHandler::ReadCommitted() const {
  if (replicator_ == nullptr) return absl::OkStatus();
  return replicator_->AppliedSoFar().Wait(absl::Now() + options_.replication_timeout);
}

absl::StatusOr<std::vector<PulledValue>> ShardHandler::PullPushed(const IncomingPush& p,
                                                                  const PullOptions& options) {
  std::vector<PullRequestItem> items;
  for (const PushItem& item : p.items) items.push_back({item.key, item.slice, item.round});
  DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values,
                      store_->Pull(p.header.job(), p.header.worker(), items, options));
  DT_RETURN_IF_ERROR(ReadCommitted());
  return values;
}

absl::StatusOr<std::vector<PullRequestItem>> ShardHandler::PreparePull(
    const v1::PullRequest& request) const {
  DT_RETURN_IF_ERROR(CheckReads());
  DT_RETURN_IF_ERROR(security::JobScope::Check(request.job()));
  std::vector<PullRequestItem> items;
  for (const v1::PullItem& p : request.items()) items.push_back({p.key(), p.slice(), p.round()});
  return items;
}

absl::StatusOr<std::vector<PulledValue>> ShardHandler::Pull(const v1::PullRequest& request,
                                                            const PullOptions& options) {
  DT_ASSIGN_OR_RETURN(std::vector<PullRequestItem> items, PreparePull(request));
  DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values,
                      store_->Pull(request.job(), request.worker(), items, options));
  DT_RETURN_IF_ERROR(ReadCommitted());
  return values;
}

absl::Time ShardHandler::PullDeadline(absl::Time caller_deadline) const {
  return std::min(caller_deadline, absl::Now() + options_.max_pull_wait);
}

// ---- The data port (libs/kvstore/data_port.h) ----

absl::Status ShardHandler::DataPort(const absl::StatusOr<security::Identity>& who,
                                    v1::DataPortResponse* response) const {
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
    if (who.ok() && who->authenticated &&
        security::Authorize(*who, security::Action::kReplicate).ok()) {
      response->set_replica_ticket(port->replica_ticket());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardHandler::Grant> ShardHandler::Hello(const security::Identity& who,
                                                        const v1::DataHello& hello,
                                                        DataConn::Kind kind) {
  // A HELLO without a job opens a replica link (REPLICATE frames from
  // the predecessor: kvstore identities only).
  DT_ASSIGN_OR_RETURN(absl::optional<security::JobGrant> grant,
                      AuthorizeKvstore(who, hello.job().empty() ? "Replicate" : "Push",
                                       hello.token().empty() ? nullptr : &hello.token(),
                                       options_.job_token_secret));
  if (grant.has_value() && grant->job != hello.job()) {
    return absl::PermissionDeniedError(absl::StrCat(who.ToString(),
                                                    ": the kvstore token grants job '", grant->job,
                                                    "', not '", hello.job(), "'"));
  }
  DT_LOG(DEBUG) << "data port (" << DataConn::KindName(kind) << "): " << who.ToString()
                << " for job '" << hello.job() << "' worker " << hello.worker();
  return grant;
}

absl::Status ShardHandler::Handle(const DataRequest& request, DataReply* reply) {
  const char* method = DataOpMethod(request.op);
  const Clock::time_point start = Clock::now();
  security::JobScope scope(request.scope != nullptr && request.scope->has_value() ? &**request.scope
                                                                                  : nullptr);
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
void ShardHandler::ParkPull(const DataRequest& request, const IncomingPush& p,
                            const Replicator::Ack& ack, absl::Time deadline) {
  auto parked = std::make_shared<ParkedPull>();
  parked->job = p.header.job();
  parked->worker = p.header.worker();
  for (const PushItem& item : p.items) parked->items.push_back({item.key, item.slice, item.round});
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

void ShardHandler::Arm(const std::shared_ptr<ParkedPull>& p) {
  p->responder->SetTimer(p->held.load() ? std::min(p->hold_until, p->deadline) : p->deadline,
                         [this, p] { Progress(p); });
}

// On the parked request's connection thread: at a deadline, or poked.
void ShardHandler::Progress(const std::shared_ptr<ParkedPull>& p) {
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
void ShardHandler::TryAnswer(const std::shared_ptr<ParkedPull>& p, bool expired) {
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
    absl::StatusOr<std::vector<PulledValue>> late = store_->Pull(p->job, p->worker, p->items, now);
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
std::vector<std::shared_ptr<ParkedPull>> ShardHandler::TailAnswers(
    const v1::ReplicateBatch& batch) {
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

absl::StatusOr<v1::ReplicateReply> ShardHandler::ReceiveBatch(
    v1::ReplicateBatch batch, absl::Time deadline, const std::vector<absl::string_view>& values) {
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

absl::Status ShardHandler::HandleData(const DataRequest& request, DataReply* reply, bool* parked) {
  PullOptions pull;
  pull.deadline = PullDeadline(request.deadline);
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
    case DataOp::kPushPull:
      return HandlePush(request, pull, reply, parked);
    case DataOp::kReplicate:
      return HandleReplicate(request, reply);
    case DataOp::kHello:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("data port: unexpected ", DataOpName(static_cast<uint16_t>(request.op))));
}

// A data port PUSH or PUSHPULL: its values are read where they arrived
// (the connection's buffer or shared-memory segment), not copied.
absl::Status ShardHandler::HandlePush(const DataRequest& request, const PullOptions& pull,
                                      DataReply* reply, bool* parked) {
  IncomingPush p;
  if (!p.header.ParseFromArray(request.header.data(), static_cast<int>(request.header.size())) ||
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
    return absl::InvalidArgumentError(
        absl::StrCat("data port PUSH of job '", p.header.job(), "': payload of ",
                     request.payload_bytes, " bytes, its ", p.items.size(), " items need ", need));
  }
  DT_ASSIGN_OR_RETURN(absl::string_view payload, request.read_payload());
  DT_ASSIGN_OR_RETURN(std::vector<absl::string_view> pieces, SplitPayload(payload, bytes));
  for (size_t i = 0; i < p.items.size(); ++i) p.items[i].data = {pieces[i]};
  p.bytes = static_cast<int64_t>(need);
  CountPushBytes(p.bytes);
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
      DT_RETURN_IF_ERROR(replicator_->WaitHeld(ack, absl::Now() + options_.replication_timeout));
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
    DT_RETURN_IF_ERROR(replicator_->WaitHeld(ack, absl::Now() + options_.replication_timeout));
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

// A push whose pull the tail answers (v1::AnswerAt) and whose round
// waits for other workers, deferred on `r` (EndOnFrame: the client's next
// frame ends the wait): when a hold on it runs out, sends it alone; at
// the pull's deadline, if the round is still incomplete, answers here
// what a blocking pull would (the workers it waits for), since the tail
// keeps no deadline. The tail answers the values.
void ShardHandler::WaitForAnswerAt(DataResponder* r, const IncomingPush& p,
                                   const Replicator::Ack& ack, absl::Time deadline) {
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
absl::Status ShardHandler::CheckAnswerAt(const DataRequest& request, uint64_t payload_bytes) const {
  if (request.op != DataOp::kPushPull) {
    return absl::InvalidArgumentError("data port PUSH: answer_at is for push-pulls only");
  }
  if (replicator_ == nullptr || !replicator_->has_successor()) {
    return absl::UnavailableError(
        "data port PUSHPULL with answer_at: this shard has no replica after this one to answer "
        "it (the chain changed); refresh the shard map");
  }
  if (payload_bytes > kMaxAnswerAtBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data port PUSHPULL with answer_at: a payload of ", payload_bytes,
                     " bytes (answers at the tail are for pushes up to ", kMaxAnswerAtBytes, ")"));
  }
  return absl::OkStatus();
}

v1::PullResponse PullReplyHeader(const std::vector<PulledValue>& values) {
  v1::PullResponse header;
  for (size_t i = 0; i < values.size(); ++i) {
    v1::PulledItem* item = header.add_items();
    item->set_item(static_cast<int32_t>(i));
    item->set_round(values[i].round);
    item->set_dtype(static_cast<int32_t>(values[i].dtype));
    item->set_bytes(static_cast<int64_t>(values[i].bytes.size));
  }
  return header;
}

// A pull's reply: the items' sizes in the header, the values as the
// payload (referenced, not copied, until written).
absl::Status ShardHandler::PulledReply(const std::vector<PulledValue>& values, DataReply* reply) {
  int64_t total = 0;
  for (const PulledValue& v : values) {
    reply->values.push_back(v.bytes.view());
    reply->owners.push_back(v.bytes.owner);
    total += static_cast<int64_t>(v.bytes.size);
  }
  reply->header = PullReplyHeader(values).SerializeAsString();
  pull_bytes_.Increment(static_cast<double>(total));
  return absl::OkStatus();
}

std::vector<prometheus::MetricFamily> ShardHandler::Collect() const {
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
  if (frames_sent_) {
    std::vector<metrics::Sample> frames;
    for (const auto& [kind, n] : frames_sent_()) {
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

absl::Status ShardHandler::HandleReplicate(const DataRequest& request, DataReply* reply) {
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

}  // namespace kvstore
}  // namespace dtrain
