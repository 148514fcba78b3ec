#include "libs/kvstore/client.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/sync_stream.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/base/grpc_status.h"
#include "libs/base/logging.h"
#include "libs/base/retry.h"
#include "libs/base/status.h"
#include "libs/kvstore/codec.h"
#include "libs/kvstore/data_port.h"
#include "libs/kvstore/proto_convert.h"
#include "libs/kvstore/shard_map.h"
#include "libs/kvstore/thread_pool.h"
#include "libs/kvstore/wire.h"
#include "libs/rpc/credentials.h"
#include "libs/security/job_token.h"
#include "protos/kvstore.grpc.pb.h"
#include "protos/replication.grpc.pb.h"

namespace dtrain {
namespace kvstore {

// ---------------------------------------------------------------------------
// Work

namespace {

// Keeps the caller's buffers pinned while gRPC holds slices that point into
// them: every such slice owns a reference to one token, and the token's
// destructor (when gRPC dropped the last slice) unpins.
class PinToken {
 public:
  explicit PinToken(std::shared_ptr<Work::State> state) : state_(std::move(state)) {
    absl::MutexLock lock(&state_->mu);
    ++state_->pins;
  }
  ~PinToken() {
    absl::MutexLock lock(&state_->mu);
    --state_->pins;
  }
  PinToken(const PinToken&) = delete;
  PinToken& operator=(const PinToken&) = delete;

 private:
  std::shared_ptr<Work::State> state_;
};

}  // namespace

namespace {

Work Failed(absl::Status status) { return Work::Done(std::move(status)); }

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address, int64_t max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  // A connection of our own per server (not shared with other clients in
  // the process), and quick reconnection after a shard restarts. gRPC
  // also gives each connection attempt MIN_RECONNECT_BACKOFF to finish
  // (TCP, the TLS handshake, HTTP/2 settings): 100 ms was too short for a
  // TLS handshake on a loaded machine; a refused attempt still retries
  // after INITIAL_RECONNECT_BACKOFF.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return rpc::NewChannel(address, args);
}

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

}  // namespace

// ---------------------------------------------------------------------------
// RemoteParameterServer

namespace {

const std::string& PushMethod() {
  static const std::string* name =
      new std::string(absl::StrCat("/", v1::KVStoreData::service_full_name(), "/Push"));
  return *name;
}
const std::string& PullMethod() {
  static const std::string* name =
      new std::string(absl::StrCat("/", v1::KVStoreData::service_full_name(), "/Pull"));
  return *name;
}
const std::string& PushPullMethod() {
  static const std::string* name =
      new std::string(absl::StrCat("/", v1::KVStoreData::service_full_name(), "/PushPull"));
  return *name;
}
const std::string& UnaryMethod(const char* which) {
  static const auto* names = new std::map<std::string, std::string>{
      {"Push", absl::StrCat("/", v1::KVStoreData::service_full_name(), "/PushUnary")},
      {"Pull", absl::StrCat("/", v1::KVStoreData::service_full_name(), "/PullUnary")},
      {"PushPull", absl::StrCat("/", v1::KVStoreData::service_full_name(), "/PushPullUnary")}};
  return names->at(which);
}

// Yields `buffer` once, as a one-message stream.
std::function<bool(grpc::ByteBuffer*)> Once(const grpc::ByteBuffer& buffer) {
  auto done = std::make_shared<bool>(false);
  return [&buffer, done](grpc::ByteBuffer* b) {
    if (*done) return false;
    *done = true;
    *b = buffer;
    return true;
  };
}

}  // namespace

RemoteParameterServer::RemoteParameterServer(ClientOptions options)
    : options_(std::move(options)), pool_(std::make_unique<ElasticThreadPool>()) {
  absl::Status compression = encoder_.SetCompression(options_.compression);
  DT_CHECK(compression.ok()) << compression;  // Connect validated it
}

RemoteParameterServer::~RemoteParameterServer() {
  pool_.reset();  // finishes operations in flight while keys_ and channels_ exist
}

absl::StatusOr<std::unique_ptr<RemoteParameterServer>> RemoteParameterServer::Connect(
    ClientOptions options) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError("kvstore client needs at least one server");
  }
  if (options.job.empty() || options.job.size() > kMaxJobNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvstore client: job name must have 1 to ", kMaxJobNameLength, " bytes"));
  }
  if (options.worker < 0 || options.worker >= kMaxWorkers) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvstore client: worker ", options.worker, " is out of range"));
  }
  if (options.chunk_bytes < 1024 || options.chunk_bytes > options.max_message_bytes - (64 << 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kvstore client: chunk_bytes=", options.chunk_bytes,
        " must be at least 1024 and leave 64 KiB of max_message_bytes=", options.max_message_bytes,
        " for headers"));
  }
  if (options.max_attempts < 1) options.max_attempts = 1;
  DT_RETURN_IF_ERROR(Annotate(ValidateCompression(options.compression), "kvstore client"));
  if (options.replicas < 1 || options.servers.size() % static_cast<size_t>(options.replicas) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kvstore client: ", options.servers.size(), " servers are not ", options.replicas,
        " replicas of each shard (list every replica, shard-major)"));
  }
  std::unique_ptr<RemoteParameterServer> client(new RemoteParameterServer(options));
  client->num_shards_ = static_cast<int>(options.servers.size()) / options.replicas;
  if (options.replicas > 1) return client;  // channels follow the shard map
  for (const std::string& server : options.servers) {
    client->channels_.push_back(NewChannel(server, options.max_message_bytes));
  }
  return client;
}

void RemoteParameterServer::AddToken(grpc::ClientContext* ctx) const {
  if (!options_.token.empty()) ctx->AddMetadata(security::kJobTokenMetadata, options_.token);
}

// A call Cancel can end: registered while it runs.
class RemoteParameterServer::TrackedCall {
 public:
  TrackedCall(RemoteParameterServer* client, grpc::ClientContext* ctx)
      : client_(client), ctx_(ctx) {
    absl::MutexLock lock(&client_->calls_mu_);
    client_->calls_.insert(ctx_);
    if (!client_->cancelled_.ok()) ctx_->TryCancel();
  }
  ~TrackedCall() {
    absl::MutexLock lock(&client_->calls_mu_);
    client_->calls_.erase(ctx_);
  }
  TrackedCall(const TrackedCall&) = delete;
  TrackedCall& operator=(const TrackedCall&) = delete;

 private:
  RemoteParameterServer* const client_;
  grpc::ClientContext* const ctx_;
};

absl::Status RemoteParameterServer::SetPushCompression(const CompressionSpec& compression) {
  return encoder_.SetCompression(compression);
}

void RemoteParameterServer::Cancel(const std::string& reason) {
  absl::MutexLock lock(&calls_mu_);
  if (!cancelled_.ok()) return;
  cancelled_ = absl::CancelledError(
      absl::StrCat("kvstore job ", options_.job, " worker ", options_.worker, ": ", reason));
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
  for (DataPortConnection* conn : data_calls_) conn->Shutdown();
}

absl::Status RemoteParameterServer::CancelStatus() const {
  absl::MutexLock lock(&calls_mu_);
  return cancelled_;
}

absl::Status RemoteParameterServer::WithRetries(const std::function<absl::Status()>& attempt,
                                                bool cancellable) {
  RetryPolicy policy;
  policy.max_attempts = 0;  // counted below: UNAVAILABLE is bounded by time instead
  policy.initial_backoff = options_.retry_backoff;
  policy.max_backoff = std::max(options_.retry_backoff, absl::Seconds(1));
  int failed = 0;  // attempts that failed with a transient error other than UNAVAILABLE
  absl::Time unavailable_since = absl::InfiniteFuture();
  bool give_up = false;
  RetryHooks hooks;
  hooks.on_retry = [](const absl::Status& error, int attempts, absl::Duration wait) {
    DT_LOG(DEBUG) << "attempt " << attempts << ": " << error << "; retrying in " << wait;
  };
  hooks.wait = [&](absl::Duration wait) {
    if (give_up) return true;
    if (!cancellable) {
      absl::SleepFor(wait);
      return false;
    }
    absl::MutexLock lock(&calls_mu_);
    auto cancelled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) { return !cancelled_.ok(); };
    calls_mu_.AwaitWithTimeout(absl::Condition(&cancelled), wait);
    return !cancelled_.ok();
  };
  absl::Status status = Retry(
      policy,
      [&]() -> absl::Status {
        if (cancellable) DT_RETURN_IF_ERROR(CancelStatus());
        absl::Status s = attempt();
        if (s.ok()) return s;
        if (cancellable) DT_RETURN_IF_ERROR(CancelStatus());
        if (absl::IsUnavailable(s)) {
          if (options_.replicas > 1) {
            absl::MutexLock lock(&map_mu_);
            map_stale_ = true;
          }
          const absl::Time now = absl::Now();
          unavailable_since = std::min(unavailable_since, now);
          give_up = now - unavailable_since >= options_.unavailable_timeout;
        } else if (IsTransient(s)) {
          give_up = ++failed >= options_.max_attempts;
        }
        return s;
      },
      hooks);
  if (cancellable && !status.ok()) DT_RETURN_IF_ERROR(CancelStatus());
  return status;
}

absl::Status RemoteParameterServer::ForEachServer(const std::function<absl::Status(int)>& fn) {
  const int n = num_shards_;
  std::vector<absl::Status> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) {
    threads.emplace_back([&, i] { results[static_cast<size_t>(i)] = fn(i); });
  }
  results[0] = fn(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) DT_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> RemoteParameterServer::ChannelTo(const std::string& address) {
  std::shared_ptr<grpc::Channel>& channel = by_address_[address];
  if (channel == nullptr) channel = NewChannel(address, options_.max_message_bytes);
  return channel;
}

void RemoteParameterServer::RefreshMap() {
  absl::MutexLock refresh(&refresh_mu_);
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&map_mu_);
    if (!map_stale_ && map_ != nullptr) return;  // another thread just refreshed
    addresses = options_.servers;
    if (map_ != nullptr) {
      for (const v1::Chain& c : map_->chains()) {
        for (const v1::ChainMember& m : c.members()) addresses.push_back(m.address());
      }
    }
  }
  std::sort(addresses.begin(), addresses.end());
  addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
  std::unique_ptr<v1::ShardMap> best;
  for (const std::string& address : addresses) {
    std::shared_ptr<grpc::Channel> channel;
    {
      absl::MutexLock lock(&map_mu_);
      channel = ChannelTo(address);
    }
    auto stub = v1::Replica::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(absl::Milliseconds(500)));
    auto map = std::make_unique<v1::ShardMap>();
    grpc::Status s = stub->GetShardMap(&ctx, v1::GetShardMapRequest(), map.get());
    if (!s.ok() || map->num_shards() != num_shards_) continue;
    if (best == nullptr || map->version() > best->version()) best = std::move(map);
  }
  absl::MutexLock lock(&map_mu_);
  if (best != nullptr && (map_ == nullptr || best->version() >= map_->version())) {
    if (map_ == nullptr || best->version() != map_->version()) {
      DT_LOG(DEBUG) << "kvstore job " << options_.job << " worker " << options_.worker
                    << ": shard map version " << best->version();
    }
    map_ = std::move(best);
  }
  map_stale_ = false;
}

absl::StatusOr<RemoteParameterServer::Endpoint> RemoteParameterServer::Route(int shard,
                                                                             bool write) {
  if (options_.replicas == 1) {
    return Endpoint{channels_[static_cast<size_t>(shard)],
                    options_.servers[static_cast<size_t>(shard)]};
  }
  bool stale;
  {
    absl::MutexLock lock(&map_mu_);
    stale = map_stale_ || map_ == nullptr;
  }
  if (stale) RefreshMap();
  absl::MutexLock lock(&map_mu_);
  if (map_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("kvstore shard ", shard,
                                               ": no replica answers with a shard map (tried ",
                                               absl::StrJoin(options_.servers, ", "), ")"));
  }
  const v1::ChainMember* m = write ? ChainHead(*map_, shard) : ChainTail(*map_, shard);
  if (m == nullptr) {
    return absl::UnavailableError(absl::StrCat("kvstore ", DescribeChain(*map_, shard), " has no ",
                                               write ? "head" : "tail", " to take the call"));
  }
  return Endpoint{ChannelTo(m->address()), m->address()};
}

absl::optional<RemoteParameterServer::Endpoint> RemoteParameterServer::AnswerTail(
    int shard, const Endpoint& head) {
  if (options_.replicas == 1 || !options_.answer_at_tail || options_.data_path == DataPath::kGrpc) {
    return absl::nullopt;
  }
  absl::StatusOr<Endpoint> tail = Route(shard, /*write=*/false);
  if (!tail.ok() || tail->address == head.address) return absl::nullopt;
  return *std::move(tail);
}

absl::Status RemoteParameterServer::CreateJob(const JobConfig& config) {
  if (config.job != options_.job) {
    return absl::InvalidArgumentError(absl::StrCat("CreateJob of job '", config.job,
                                                   "' from a client of job '", options_.job, "'"));
  }
  DT_ASSIGN_OR_RETURN(JobConfig stated, StatePlacement(config, options_.placement));
  DT_RETURN_IF_ERROR(ValidateJobConfig(stated));
  v1::CreateJobRequest request;
  *request.mutable_config() = ToProto(stated);
  return ForEachServer([&](int i) {
    return WithRetries([&]() -> absl::Status {
      DT_ASSIGN_OR_RETURN(Endpoint to, Route(i, /*write=*/true));
      auto stub = v1::KVStore::NewStub(to.channel);
      grpc::ClientContext ctx;
      AddToken(&ctx);
      TrackedCall tracked(this, &ctx);
      ctx.set_deadline(Deadline(options_.rpc_timeout));
      v1::CreateJobResponse response;
      return FromGrpcStatus(stub->CreateJob(&ctx, request, &response),
                            absl::StrCat("KVStore.CreateJob to ", to.address));
    });
  });
}

absl::Duration RemoteParameterServer::CleanupTimeout() const {
  // Cleanup must not hold a trainer long: a shard that is gone or hung is
  // left to its job TTL.
  return std::min(options_.rpc_timeout, options_.unavailable_timeout);
}

absl::Status RemoteParameterServer::DeleteJob() {
  v1::DeleteJobRequest request;
  request.set_job(options_.job);
  return SendDeleteJob(request, "KVStore.DeleteJob");
}

absl::Status RemoteParameterServer::LeaveJob() {
  v1::DeleteJobRequest request;
  request.set_job(options_.job);
  request.set_leave(true);
  request.set_worker(options_.worker);
  return SendDeleteJob(request, "KVStore.DeleteJob (leave)");
}

absl::Status RemoteParameterServer::SendDeleteJob(const v1::DeleteJobRequest& request,
                                                  absl::string_view what) {
  return ForEachServer([&](int i) {
    return WithRetries(
        [&]() -> absl::Status {
          DT_ASSIGN_OR_RETURN(Endpoint to, Route(i, /*write=*/true));
          auto stub = v1::KVStore::NewStub(to.channel);
          grpc::ClientContext ctx;
          AddToken(&ctx);
          ctx.set_deadline(Deadline(CleanupTimeout()));
          v1::DeleteJobResponse response;
          return FromGrpcStatus(stub->DeleteJob(&ctx, request, &response),
                                absl::StrCat(what, " to ", to.address));
        },
        /*cancellable=*/false);
  });
}

absl::Status RemoteParameterServer::Init(const std::vector<KeySpec>& keys) {
  // Place every key and check it against what this client knows.
  DT_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Key>> placed,
                      keys_.Place(options_.job, keys, num_shards_, options_.placement));
  // Send each server its slices, with initial values in chunks.
  const std::vector<std::vector<WorkerKeys::InitSlice>> per_server =
      WorkerKeys::SlicesByServer(keys, placed, num_shards_);
  DT_RETURN_IF_ERROR(ForEachServer([&](int i) -> absl::Status {
    const auto& slices = per_server[static_cast<size_t>(i)];
    if (slices.empty()) return absl::OkStatus();
    return WithRetries([&]() -> absl::Status {
      DT_ASSIGN_OR_RETURN(Endpoint to, Route(i, /*write=*/true));
      auto stub = v1::KVStore::NewStub(to.channel);
      grpc::ClientContext ctx;
      AddToken(&ctx);
      TrackedCall tracked(this, &ctx);
      ctx.set_deadline(Deadline(options_.rpc_timeout));
      v1::InitResponse response;
      std::unique_ptr<grpc::ClientWriter<v1::InitRequest>> writer(stub->Init(&ctx, &response));
      v1::InitRequest message;
      message.set_job(options_.job);
      for (const auto& [slice, data] : slices) *message.add_slices() = ToProto(slice->spec);
      int64_t budget = options_.chunk_bytes;
      bool ok = true;
      for (size_t item = 0; item < slices.size() && ok; ++item) {
        const auto& [slice, data] = slices[item];
        if (data == nullptr) continue;
        const int64_t bytes =
            slice->spec.count * static_cast<int64_t>(DTypeSize(slice->spec.dtype));
        for (int64_t off = 0; off < bytes && ok;) {
          int64_t take = std::min(bytes - off, budget);
          v1::Chunk* chunk = message.add_chunks();
          chunk->set_item(static_cast<int32_t>(item));
          chunk->set_offset(off);
          chunk->set_data(data + off, static_cast<size_t>(take));
          off += take;
          budget -= take;
          if (budget == 0) {
            ok = writer->Write(message);
            message.Clear();
            budget = options_.chunk_bytes;
          }
        }
      }
      if (ok) writer->WriteLast(message, grpc::WriteOptions());
      return FromGrpcStatus(writer->Finish(), absl::StrCat("KVStore.Init to ", to.address));
    });
  }));
  keys_.Add(std::move(placed));
  return absl::OkStatus();
}

Work RemoteParameterServer::Issue(Op op, std::vector<CallItem> items, bool run_one_inline) {
  if (absl::Status bad = CheckCallItems(op, items); !bad.ok()) return Failed(bad);
  auto state = std::make_shared<Work::State>();
  absl::StatusOr<WorkerKeys::Plan> plan = keys_.PlanCall(op, items, state);
  if (!plan.ok()) return Failed(plan.status());
  return Start(op, std::move(plan->ops), std::move(plan->after), std::move(state), run_one_inline);
}

Work RemoteParameterServer::Start(Op op, std::vector<SliceOp> work,
                                  std::vector<std::shared_ptr<Work::State>> deps,
                                  std::shared_ptr<Work::State> state, bool run_one_inline) {
  std::map<int, std::vector<SliceOp>> by_server;
  for (const SliceOp& w : work) by_server[w.slice->server].push_back(w);
  {
    absl::MutexLock lock(&state->mu);
    state->remaining = static_cast<int>(by_server.size());
  }
  auto shared_deps = std::make_shared<std::vector<std::shared_ptr<Work::State>>>(std::move(deps));
  if (run_one_inline && by_server.size() > 1 && options_.data_path != DataPath::kGrpc) {
    // Blocking form over several shards: every shard's request goes out from
    // this thread, then every reply is read on it (the shards work in
    // parallel, no hand-off). A shard's part that fails this first attempt
    // runs again with the usual retries; one without a data port goes to
    // the pool (gRPC).
    for (const auto& dep : *shared_deps) {
      dep->WaitTasks();
    }
    std::vector<std::pair<int, std::unique_ptr<PendingData>>> pending;
    std::vector<int> again;
    for (auto& [server, server_work] : by_server) {
      // Writes (and PushPulls) at a chain's head, pulls at its tail.
      absl::StatusOr<Endpoint> to = Route(server, /*write=*/op != Op::kPull);
      absl::optional<Endpoint> tail;
      if (to.ok() && op == Op::kPushPull) tail = AnswerTail(server, *to);
      absl::StatusOr<std::unique_ptr<PendingData>> p =
          to.ok() ? StartDataCall(to->address, to->channel, op, server_work,
                                  tail.has_value() ? &*tail : nullptr)
                  : absl::StatusOr<std::unique_ptr<PendingData>>(to.status());
      if (!p.ok()) {
        again.push_back(server);
      } else if (*p == nullptr) {
        pool_->Schedule([this, op, server = server, w = server_work, state] {
          state->Finish(RunOnServer(op, server, w, state));
        });
      } else {
        pending.emplace_back(server, *std::move(p));
      }
    }
    for (auto& [server, p] : pending) {
      if (FinishDataCall(std::move(p), by_server[server]).ok()) {
        state->Finish(absl::OkStatus());
      } else {
        again.push_back(server);
      }
    }
    for (int server : again) state->Finish(RunOnServer(op, server, by_server[server], state));
    return Work(std::move(state));
  }
  std::function<void()> inline_task;
  for (auto& [server, server_work] : by_server) {
    std::function<void()> task = [this, op, server = server, w = std::move(server_work), state,
                                  shared_deps]() {
      // Operations on the same keys run in the order they were issued.
      for (const auto& dep : *shared_deps) {
        dep->WaitTasks();
      }
      state->Finish(RunOnServer(op, server, w, state));
    };
    if (run_one_inline && !inline_task) {
      inline_task = std::move(task);
    } else {
      pool_->Schedule(std::move(task));
    }
  }
  if (inline_task) inline_task();
  return Work(std::move(state));
}

absl::Status RemoteParameterServer::RunOnServer(Op op, int server, const std::vector<SliceOp>& work,
                                                const std::shared_ptr<Work::State>& state) {
  absl::Status s = WithRetries([&] {
    return op == Op::kPull ? PullOnce(server, work)
                           : PushOnce(server, work, op == Op::kPushPull, state);
  });
  if (absl::IsNotFound(s)) {
    // Every key of `work` was Init'ed through this client (unknown keys are
    // refused before anything is sent), so a shard that answers NOT_FOUND has
    // lost the job or key since: it restarted without its state (no snapshot,
    // or one older than the job). This job's rounds cannot go on there;
    // ABORTED (transient) ends the attempt so that the job starts again from
    // its checkpoint instead of failing for good.
    return LostJobStateError(s);
  }
  return s;
}

namespace {

// Value bytes of a slice in its key's dtype.
int64_t SliceBytes(const SliceSpec& spec) {
  return spec.count * static_cast<int64_t>(DTypeSize(spec.dtype));
}

// The slice's pushed values as they go on the wire: the caller's memory
// itself (pinned by `token`), or their encoding (push_encoder.h).
absl::StatusOr<grpc::Slice> WireSlice(PushEncoder& encoder, const CompressionSpec& compression,
                                      const SliceSpec& spec, int64_t round, const char* src,
                                      const std::shared_ptr<PinToken>& token) {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> encoded,
                      encoder.Encode(compression, spec, round, src));
  if (encoded == nullptr) {
    return wire::SharedSlice(token, src, static_cast<size_t>(SliceBytes(spec)));
  }
  const char* data = encoded->data();
  size_t size = encoded->size();
  return wire::SharedSlice(std::move(encoded), data, size);
}

// Where a pulled item goes.
struct Target {
  const SliceSpec* spec;
  char* dst;
};

// Reads a pull reply (a stream of PullResponse messages, through `read`)
// into the targets; checks that the reply covers every item exactly.
absl::Status ReadPullReply(const std::function<bool(grpc::ByteBuffer*)>& read,
                           const std::vector<Target>& targets, const std::string& server) {
  auto bad = [&](auto&&... parts) {
    return absl::DataLossError(absl::StrCat("pull reply from ", server, ": ", parts...));
  };
  std::vector<int64_t> expected(targets.size(), -1);
  std::vector<int64_t> received(targets.size(), 0);
  bool first = true;
  grpc::ByteBuffer buffer;
  while (read(&buffer)) {
    v1::PullResponse header;
    wire::Decoded decoded;
    absl::Status parsed = wire::Decode(buffer, wire::kPullChunksField, &header, &decoded);
    if (!parsed.ok()) return bad(parsed.message());
    if (first) {
      if (header.items_size() != static_cast<int>(targets.size())) {
        return bad(header.items_size(), " items for ", targets.size(), " requested");
      }
      for (const v1::PulledItem& item : header.items()) {
        if (item.item() < 0 || item.item() >= static_cast<int>(targets.size())) {
          return bad("item index ", item.item());
        }
        const SliceSpec& spec = *targets[static_cast<size_t>(item.item())].spec;
        if (item.dtype() != static_cast<int>(spec.dtype) || item.bytes() != SliceBytes(spec)) {
          return bad("key '", spec.key, "' slice ", spec.slice, " came as ", item.bytes(),
                     " bytes of dtype ", item.dtype(), ", expected ", SliceBytes(spec));
        }
        expected[static_cast<size_t>(item.item())] = item.bytes();
      }
      first = false;
    } else if (header.items_size() != 0) {
      return bad("items repeated in a later message");
    }
    for (const wire::InChunk& chunk : decoded.chunks) {
      if (chunk.item < 0 || chunk.item >= static_cast<int>(targets.size())) {
        return bad("chunk for item ", chunk.item);
      }
      const size_t i = static_cast<size_t>(chunk.item);
      if (chunk.offset != received[i] ||
          received[i] + static_cast<int64_t>(chunk.size) > expected[i]) {
        return bad("chunk [", chunk.offset, ", +", chunk.size, ") of item ", i,
                   " is out of order or too long");
      }
      char* out = targets[i].dst + chunk.offset;
      for (absl::string_view piece : chunk.data) {
        std::memcpy(out, piece.data(), piece.size());
        out += piece.size();
      }
      received[i] += static_cast<int64_t>(chunk.size);
    }
  }
  if (first) return absl::OkStatus();  // no reply: the call's status says why
  for (size_t i = 0; i < targets.size(); ++i) {
    if (received[i] != expected[i]) {
      return bad("key '", targets[i].spec->key, "' slice ", targets[i].spec->slice, ": got ",
                 received[i], " of ", expected[i], " bytes");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RemoteParameterServer::PushOnce(int server, const std::vector<SliceOp>& work,
                                             bool pull_back,
                                             const std::shared_ptr<Work::State>& state) {
  // At a chain's head, which answers a PushPull once every replica holds
  // the values it returns.
  DT_ASSIGN_OR_RETURN(Endpoint to, Route(server, /*write=*/true));
  if (options_.data_path != DataPath::kGrpc) {
    bool used = false;
    absl::optional<Endpoint> tail;
    if (pull_back) tail = AnswerTail(server, to);
    absl::Status s = DataPortCall(to.address, to.channel, pull_back ? Op::kPushPull : Op::kPush,
                                  work, &used, tail.has_value() ? &*tail : nullptr);
    if (used) return s;
  }
  const std::string& address = to.address;
  grpc::Channel* const channel = to.channel.get();
  const CompressionSpec compression = encoder_.compression();
  v1::PushRequest header;
  header.set_job(options_.job);
  header.set_worker(options_.worker);
  header.set_compression(ToProto(compression.method));
  header.set_topk_ratio(compression.topk_ratio);
  auto token = std::make_shared<PinToken>(state);
  std::vector<grpc::Slice> values;
  for (const SliceOp& w : work) {
    v1::PushItem* item = header.add_items();
    item->set_key(w.slice->spec.key);
    item->set_slice(w.slice->spec.slice);
    item->set_round(w.round);
    item->set_dtype(static_cast<int>(w.slice->spec.dtype));
    for (int64_t d : w.slice->spec.shape) item->add_shape(d);
    DT_ASSIGN_OR_RETURN(grpc::Slice value,
                        WireSlice(encoder_, compression, w.slice->spec, w.round, w.src, token));
    values.push_back(std::move(value));
  }
  // Chunk the values into messages of chunk_bytes; the first carries the header.
  std::vector<grpc::ByteBuffer> messages;
  std::vector<wire::OutChunk> chunks;
  int64_t budget = options_.chunk_bytes;
  auto flush = [&] {
    messages.push_back(wire::Encode(messages.empty() ? header : v1::PushRequest(),
                                    wire::kPushChunksField, chunks));
    chunks.clear();
    budget = options_.chunk_bytes;
  };
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t size = static_cast<int64_t>(values[i].size());
    for (int64_t off = 0; off < size;) {
      int64_t take = std::min(size - off, budget);
      chunks.push_back({static_cast<int32_t>(i), off,
                        values[i].sub(static_cast<size_t>(off), static_cast<size_t>(off + take))});
      off += take;
      budget -= take;
      if (budget == 0) flush();
    }
  }
  if (!chunks.empty() || messages.empty()) flush();
  values.clear();
  token.reset();  // the slices in `messages` hold the pin now

  grpc::ClientContext ctx;
  AddToken(&ctx);
  TrackedCall tracked(this, &ctx);
  ctx.set_deadline(Deadline(pull_back ? options_.pull_timeout : options_.rpc_timeout));
  int64_t reply_bytes = 0;
  for (const SliceOp& w : work) reply_bytes += SliceBytes(w.slice->spec);
  if (messages.size() == 1 && (!pull_back || reply_bytes <= options_.chunk_bytes)) {
    // Everything fits in one message each way: a unary call is cheaper.
    const char* which = pull_back ? "PushPull" : "Push";
    grpc::internal::RpcMethod method(UnaryMethod(which).c_str(),
                                     grpc::internal::RpcMethod::NORMAL_RPC);
    grpc::ByteBuffer response;
    grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel, method, &ctx, messages[0], &response);
    messages.clear();
    DT_RETURN_IF_ERROR(
        FromGrpcStatus(status, absl::StrCat("KVStoreData.", which, "Unary to ", address)));
    if (!pull_back) {
      v1::PushResponse reply;
      return wire::ParseSmall(response, &reply, "PushResponse");
    }
    std::vector<Target> targets;
    for (const SliceOp& w : work) targets.push_back({&w.slice->spec, w.dst});
    DT_RETURN_IF_ERROR(ReadPullReply(Once(response), targets, address));
    return absl::OkStatus();
  }
  if (!pull_back) {
    grpc::internal::RpcMethod method(PushMethod().c_str(),
                                     grpc::internal::RpcMethod::CLIENT_STREAMING);
    grpc::ByteBuffer response;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel, method, &ctx,
                                                                      &response));
    for (size_t m = 0; m < messages.size(); ++m) {
      bool ok = m + 1 < messages.size()
                    ? writer->Write(messages[m])
                    : writer->Write(messages[m], grpc::WriteOptions().set_last_message());
      if (!ok) break;  // the server ended the call; Finish says why
    }
    messages.clear();
    DT_RETURN_IF_ERROR(
        FromGrpcStatus(writer->Finish(), absl::StrCat("KVStoreData.Push to ", address)));
    v1::PushResponse reply;
    return wire::ParseSmall(response, &reply, "PushResponse");
  }
  grpc::internal::RpcMethod method(PushPullMethod().c_str(),
                                   grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel, method, &ctx));
  for (size_t m = 0; m < messages.size(); ++m) {
    bool ok = m + 1 < messages.size()
                  ? stream->Write(messages[m])
                  : stream->Write(messages[m], grpc::WriteOptions().set_last_message());
    if (!ok) break;
  }
  messages.clear();
  std::vector<Target> targets;
  for (const SliceOp& w : work) targets.push_back({&w.slice->spec, w.dst});
  absl::Status read =
      ReadPullReply([&](grpc::ByteBuffer* b) { return stream->Read(b); }, targets, address);
  if (!read.ok()) ctx.TryCancel();
  absl::Status finished =
      FromGrpcStatus(stream->Finish(), absl::StrCat("KVStoreData.PushPull to ", address));
  DT_RETURN_IF_ERROR(finished);
  return read;
}

absl::Status RemoteParameterServer::PullOnce(int server, const std::vector<SliceOp>& work) {
  DT_ASSIGN_OR_RETURN(Endpoint to, Route(server, /*write=*/false));
  if (options_.data_path != DataPath::kGrpc) {
    bool used = false;
    absl::Status s = DataPortCall(to.address, to.channel, Op::kPull, work, &used);
    if (used) return s;
  }
  const std::string& address = to.address;
  grpc::Channel* const channel = to.channel.get();
  v1::PullRequest request;
  request.set_job(options_.job);
  request.set_worker(options_.worker);
  std::vector<Target> targets;
  for (const SliceOp& w : work) {
    v1::PullItem* item = request.add_items();
    item->set_key(w.slice->spec.key);
    item->set_slice(w.slice->spec.slice);
    item->set_round(w.round);
    targets.push_back({&w.slice->spec, w.dst});
  }
  grpc::ClientContext ctx;
  AddToken(&ctx);
  TrackedCall tracked(this, &ctx);
  ctx.set_deadline(Deadline(options_.pull_timeout));
  int64_t reply_bytes = 0;
  for (const SliceOp& w : work) reply_bytes += SliceBytes(w.slice->spec);
  if (reply_bytes <= options_.chunk_bytes) {
    grpc::internal::RpcMethod method(UnaryMethod("Pull").c_str(),
                                     grpc::internal::RpcMethod::NORMAL_RPC);
    grpc::ByteBuffer response;
    grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel, method, &ctx, wire::SerializeSmall(request), &response);
    DT_RETURN_IF_ERROR(FromGrpcStatus(status, absl::StrCat("KVStoreData.PullUnary to ", address)));
    return ReadPullReply(Once(response), targets, address);
  }
  grpc::internal::RpcMethod method(PullMethod().c_str(),
                                   grpc::internal::RpcMethod::SERVER_STREAMING);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel, method, &ctx,
                                                                    wire::SerializeSmall(request)));
  absl::Status read =
      ReadPullReply([&](grpc::ByteBuffer* b) { return reader->Read(b); }, targets, address);
  if (!read.ok()) ctx.TryCancel();
  DT_RETURN_IF_ERROR(
      FromGrpcStatus(reader->Finish(), absl::StrCat("KVStoreData.Pull to ", address)));
  return read;
}

// ---------------------------------------------------------------------------
// The data port

const char* DataPathName(DataPath path) {
  switch (path) {
    case DataPath::kAuto:
      return "auto";
    case DataPath::kTcp:
      return "tcp";
    case DataPath::kGrpc:
      return "grpc";
  }
  return "auto";
}

absl::StatusOr<DataPath> ParseDataPath(absl::string_view name) {
  for (DataPath p : {DataPath::kAuto, DataPath::kTcp, DataPath::kGrpc}) {
    if (name == DataPathName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown kvstore data path '", name, "' (auto, tcp or grpc)"));
}

// What this client knows of one server address's data port, and its idle
// connections.
struct RemoteParameterServer::DataPool {
  absl::Mutex mu;
  bool discovered ABSL_GUARDED_BY(mu) = false;
  bool available ABSL_GUARDED_BY(mu) = false;
  bool unix_failed ABSL_GUARDED_BY(mu) = false;  // the socket could not be used: TCP
  // The data port could not be reached (a firewall, a NetworkPolicy, or the
  // shard is down): gRPC until then.
  absl::Time skip_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  DataPortAddress address ABSL_GUARDED_BY(mu);
  IdleDataConns idle ABSL_GUARDED_BY(mu){16};
  IdleDataConns answer_idle ABSL_GUARDED_BY(mu){16};  // answers connections

  // The shard went away or restarted (maybe on another port): its data
  // port is asked for again.
  void Forget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    idle.Clear();
    answer_idle.Clear();
    discovered = false;
    unix_failed = false;
  }
};

namespace {

DataPortTls ProcessTls() {
  std::shared_ptr<const rpc::Credentials> c = rpc::DefaultCredentials();
  DataPortTls tls;
  if (!c->insecure()) {
    tls.enabled = true;
    tls.ca_file = c->files().ca;
    tls.cert_file = c->files().cert;
    tls.key_file = c->files().key;
  }
  return tls;
}

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  return host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPortConnection>> RemoteParameterServer::TakeDataConn(
    const std::string& address, const std::shared_ptr<grpc::Channel>& channel, bool answers) {
  DataPool* pool;
  {
    absl::MutexLock lock(&data_mu_);
    std::unique_ptr<DataPool>& p = data_pools_[address];
    if (p == nullptr) p = std::make_unique<DataPool>();
    pool = p.get();
  }
  absl::MutexLock lock(&pool->mu);
  bool closed = false;
  std::unique_ptr<DataPortConnection> idle =
      answers ? pool->answer_idle.Take(&closed) : pool->idle.Take(&closed);
  if (idle != nullptr) return idle;
  if (closed) pool->Forget();  // the shard closed them: restarted or shut down
  if (absl::Now() < pool->skip_until) return nullptr;
  if (!pool->discovered) {
    auto stub = v1::KVStore::NewStub(channel);
    grpc::ClientContext ctx;
    AddToken(&ctx);
    ctx.set_deadline(Deadline(std::min(options_.rpc_timeout, absl::Seconds(10))));
    v1::DataPortResponse response;
    grpc::Status s = stub->DataPort(&ctx, v1::DataPortRequest(), &response);
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      pool->discovered = true;  // a shard from before the data port: gRPC
      return nullptr;
    }
    DT_RETURN_IF_ERROR(FromGrpcStatus(s, absl::StrCat("KVStore.DataPort to ", address)));
    pool->discovered = true;
    pool->address.host = HostOf(address);
    pool->address.tcp_port = response.tcp_port();
    pool->address.tls = response.tls();
    pool->address.instance = response.instance();
    if (options_.data_path == DataPath::kAuto && !response.unix_socket().empty() &&
        !response.host_id().empty() && response.host_id() == HostId()) {
      pool->address.unix_socket = response.unix_socket();
    }
    pool->available = pool->address.tcp_port != 0 || !pool->address.unix_socket.empty();
  }
  if (!pool->available) return nullptr;
  v1::DataHello hello;
  hello.set_job(options_.job);
  hello.set_worker(options_.worker);
  hello.set_token(options_.token);
  hello.set_answers(answers);
  const absl::Duration timeout = std::min(options_.rpc_timeout, absl::Seconds(10));
  if (!pool->address.unix_socket.empty() && !pool->unix_failed) {
    absl::StatusOr<std::unique_ptr<DataPortConnection>> conn =
        DataPortConnection::Dial(pool->address, hello, ProcessTls(), timeout);
    if (conn.ok()) return conn;
    if (absl::IsPermissionDenied(conn.status()) && pool->address.tcp_port == 0) {
      return conn.status();
    }
    // Not usable from here (another uid, a socket in another mount
    // namespace, ...): TCP from now on.
    DT_LOG(DEBUG) << "kvstore data port socket " << pool->address.unix_socket << ": "
                  << conn.status() << "; using TCP";
    pool->unix_failed = true;
  }
  if (pool->address.tcp_port == 0) return nullptr;
  DataPortAddress tcp = pool->address;
  tcp.unix_socket.clear();
  absl::StatusOr<std::unique_ptr<DataPortConnection>> conn =
      DataPortConnection::Dial(tcp, hello, ProcessTls(), timeout);
  if (absl::IsResourceExhausted(conn.status())) return nullptr;  // at its limit: gRPC
  if (absl::IsUnavailable(conn.status())) {
    // Not reachable though gRPC answered (a firewall?), or gone: gRPC for a
    // while (which fails over or retries as usual when the shard is gone).
    DT_LOG(DEBUG) << "kvstore data port " << tcp.host << ":" << tcp.tcp_port << " of " << address
                  << ": " << conn.status() << "; using gRPC for 30 s";
    pool->skip_until = absl::Now() + absl::Seconds(30);
    pool->discovered = false;
    return nullptr;
  }
  if (!conn.ok()) {
    return absl::Status(conn.status().code(),
                        absl::StrCat("data port ", tcp.host, ":", tcp.tcp_port, " of ", address,
                                     ": ", conn.status().message()));
  }
  return conn;
}

void RemoteParameterServer::ReturnDataConn(const std::string& address,
                                           std::unique_ptr<DataPortConnection> conn, bool answers) {
  DataPool* pool;
  {
    absl::MutexLock lock(&data_mu_);
    pool = data_pools_[address].get();
  }
  absl::MutexLock lock(&pool->mu);
  (answers ? pool->answer_idle : pool->idle).Put(std::move(conn));
}

// A data port request sent and not yet answered.
struct RemoteParameterServer::PendingData {
  RemoteParameterServer* client = nullptr;
  std::string address;
  Op op = Op::kPush;
  std::unique_ptr<DataPortConnection> conn;
  // A PushPull the chain's tail answers (v1::AnswerAt): the answers
  // connection there, and the request id its answer carries.
  std::unique_ptr<DataPortConnection> answer;
  std::string answer_address;
  uint64_t answer_id = 0;
  ~PendingData() {
    absl::MutexLock lock(&client->calls_mu_);
    if (conn != nullptr) client->data_calls_.erase(conn.get());
    if (answer != nullptr) client->data_calls_.erase(answer.get());
  }
  // `s` with the call named; a transport failure also forgets the shard's
  // idle connections (it went away, or restarted, maybe on another port:
  // its data port is asked again).
  absl::Status Annotate(const absl::Status& s) { return AnnotateAt(s, "to ", address, *conn); }
  // The same for a failure of the tail's answer (on `answer`): the tail's
  // connections are the ones forgotten.
  absl::Status AnnotateAnswer(const absl::Status& s) {
    return AnnotateAt(s, "answered by the tail ", answer_address, *answer);
  }

 private:
  absl::Status AnnotateAt(const absl::Status& s, absl::string_view how, const std::string& at,
                          const DataPortConnection& on) {
    if (absl::IsUnavailable(s)) {
      absl::MutexLock lock(&client->data_mu_);
      DataPool* pool = client->data_pools_[at].get();
      absl::MutexLock pool_lock(&pool->mu);
      pool->Forget();
    }
    const char* method = op == Op::kPush ? "Push" : op == Op::kPull ? "Pull" : "PushPull";
    return absl::Status(s.code(), absl::StrCat("DataPort.", method, " ", how, at, " (",
                                               DataConn::KindName(on.kind()), "): ", s.message()));
  }
};

absl::StatusOr<std::unique_ptr<RemoteParameterServer::PendingData>>
RemoteParameterServer::StartDataCall(const std::string& address,
                                     const std::shared_ptr<grpc::Channel>& channel, Op op,
                                     const std::vector<SliceOp>& work, const Endpoint* tail) {
  DT_RETURN_IF_ERROR(CancelStatus());
  DT_ASSIGN_OR_RETURN(std::unique_ptr<DataPortConnection> conn, TakeDataConn(address, channel));
  if (conn == nullptr) return nullptr;  // gRPC
  auto pending = std::make_unique<PendingData>();
  pending->client = this;
  pending->address = address;
  pending->op = op;
  {
    // Registered for Cancel while it runs.
    absl::MutexLock lock(&calls_mu_);
    if (!cancelled_.ok()) return cancelled_;
    data_calls_.insert(conn.get());
  }
  pending->conn = std::move(conn);
  pending->conn->set_spin(options_.reply_spin);
  std::string header;
  std::vector<absl::string_view> payload;
  std::vector<std::shared_ptr<const std::string>> encoded;  // compressed values
  uint64_t reply_bytes = 0;
  if (op == Op::kPull) {
    v1::PullRequest r;
    r.set_job(options_.job);
    r.set_worker(options_.worker);
    for (const SliceOp& w : work) {
      v1::PullItem* item = r.add_items();
      item->set_key(w.slice->spec.key);
      item->set_slice(w.slice->spec.slice);
      item->set_round(w.round);
      reply_bytes += static_cast<uint64_t>(SliceBytes(w.slice->spec));
    }
    header = r.SerializeAsString();
  } else {
    const CompressionSpec compression = encoder_.compression();
    v1::PushRequest r;
    r.set_job(options_.job);
    r.set_worker(options_.worker);
    r.set_compression(ToProto(compression.method));
    r.set_topk_ratio(compression.topk_ratio);
    for (const SliceOp& w : work) {
      const SliceSpec& spec = w.slice->spec;
      v1::PushItem* item = r.add_items();
      item->set_key(spec.key);
      item->set_slice(spec.slice);
      item->set_round(w.round);
      item->set_dtype(static_cast<int>(spec.dtype));
      for (int64_t d : spec.shape) item->add_shape(d);
      // The caller's memory itself, or its encoding (push_encoder.h).
      absl::StatusOr<std::shared_ptr<const std::string>> value =
          encoder_.Encode(compression, spec, w.round, w.src);
      if (!value.ok()) return value.status();
      if (*value == nullptr) {
        payload.emplace_back(w.src, static_cast<size_t>(SliceBytes(spec)));
      } else {
        encoded.push_back(std::move(*value));
        payload.push_back(*encoded.back());
      }
      if (op == Op::kPushPull) reply_bytes += static_cast<uint64_t>(SliceBytes(spec));
    }
    uint64_t pushed = 0;
    for (absl::string_view v : payload) pushed += v.size();
    if (tail != nullptr && pushed <= kMaxAnswerAtBytes) {
      // The tail answers: an answers connection there, or (none: the tail
      // has no data port, or refused one) the head as usual.
      absl::StatusOr<std::unique_ptr<DataPortConnection>> answer =
          TakeDataConn(tail->address, tail->channel, /*answers=*/true);
      if (answer.ok() && *answer != nullptr) {
        pending->answer = *std::move(answer);
        pending->answer_address = tail->address;
        pending->answer_id = pending->answer->ReserveAnswerId();
        r.mutable_answer_at()->set_token(pending->answer->answer_token());
        r.mutable_answer_at()->set_request_id(pending->answer_id);
        absl::MutexLock lock(&calls_mu_);
        data_calls_.insert(pending->answer.get());
      }
    }
    header = r.SerializeAsString();
  }
  const DataOp data_op = op == Op::kPush   ? DataOp::kPush
                         : op == Op::kPull ? DataOp::kPull
                                           : DataOp::kPushPull;
  const absl::Duration timeout = op == Op::kPush ? options_.rpc_timeout : options_.pull_timeout;
  absl::Status sent = pending->conn->Send(data_op, header, payload, reply_bytes, timeout);
  if (!sent.ok()) return pending->Annotate(sent);
  return pending;
}

absl::Status RemoteParameterServer::FinishDataCall(std::unique_ptr<PendingData> pending,
                                                   const std::vector<SliceOp>& work) {
  DataPortConnection& conn = *pending->conn;
  // A connection whose request was answered goes back to its pool.
  auto give_back = [&](std::unique_ptr<DataPortConnection> c, const std::string& at, bool answers) {
    {
      absl::MutexLock lock(&calls_mu_);
      data_calls_.erase(c.get());
    }
    ReturnDataConn(at, std::move(c), answers);
  };
  if (pending->answer != nullptr) {
    // The tail answers; the head writes only a refusal. A failed attempt
    // drops both connections (an answer may still come on one).
    absl::StatusOr<int> ready = DataPortConnection::WaitEither(
        conn, *pending->answer, options_.pull_timeout + absl::Seconds(1));
    if (!ready.ok()) return pending->Annotate(ready.status());
    if (*ready == 0) {
      absl::StatusOr<std::string> refused = conn.ReceiveHeader();
      return pending->Annotate(
          refused.ok() ? absl::DataLossError("the head replied to a push-pull the tail answers")
                       : refused.status());
    }
    absl::StatusOr<std::string> reply =
        pending->answer->ReceiveAnswer(pending->answer_id, options_.pull_timeout);
    if (!reply.ok()) return pending->AnnotateAnswer(reply.status());
    DT_RETURN_IF_ERROR(ReadPulled(*pending, *pending->answer, *reply, work));
    give_back(std::move(pending->conn), pending->address, /*answers=*/false);
    give_back(std::move(pending->answer), pending->answer_address, /*answers=*/true);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> reply = conn.ReceiveHeader();
  if (!reply.ok()) return pending->Annotate(reply.status());
  if (pending->op == Op::kPush) {
    v1::PushResponse r;
    if (!r.ParseFromString(*reply)) {
      return pending->Annotate(absl::DataLossError("unparsable PushResponse"));
    }
  } else {
    DT_RETURN_IF_ERROR(ReadPulled(*pending, conn, *reply, work));
  }
  give_back(std::move(pending->conn), pending->address, /*answers=*/false);
  return absl::OkStatus();
}

absl::Status RemoteParameterServer::ReadPulled(PendingData& pending, DataPortConnection& conn,
                                               const std::string& reply,
                                               const std::vector<SliceOp>& work) {
  auto annotate = [&](const absl::Status& s) {
    return &conn == pending.answer.get() ? pending.AnnotateAnswer(s) : pending.Annotate(s);
  };
  v1::PullResponse r;
  if (!r.ParseFromString(reply)) {
    return annotate(absl::DataLossError("unparsable PullResponse"));
  }
  if (r.items_size() != static_cast<int>(work.size())) {
    return annotate(absl::DataLossError(
        absl::StrCat(r.items_size(), " items for ", work.size(), " requested")));
  }
  uint64_t total = 0;
  for (int i = 0; i < r.items_size(); ++i) {
    const v1::PulledItem& item = r.items(i);
    const SliceSpec& spec = work[static_cast<size_t>(i)].slice->spec;
    if (item.item() != i || item.dtype() != static_cast<int>(spec.dtype) ||
        item.bytes() != SliceBytes(spec)) {
      return annotate(absl::DataLossError(absl::StrCat(
          "key '", spec.key, "' slice ", spec.slice, " came as item ", item.item(), " of ",
          item.bytes(), " bytes of dtype ", item.dtype(), ", expected ", SliceBytes(spec))));
    }
    total += static_cast<uint64_t>(item.bytes());
  }
  if (total != conn.reply_payload_bytes()) {
    return annotate(absl::DataLossError(absl::StrCat(
        "reply payload of ", conn.reply_payload_bytes(), " bytes, its items need ", total)));
  }
  for (const SliceOp& w : work) {
    absl::Status read = conn.ReadPayload(w.dst, static_cast<size_t>(SliceBytes(w.slice->spec)));
    if (!read.ok()) return annotate(read);
  }
  return absl::OkStatus();
}

absl::Status RemoteParameterServer::DataPortCall(const std::string& address,
                                                 const std::shared_ptr<grpc::Channel>& channel,
                                                 Op op, const std::vector<SliceOp>& work,
                                                 bool* used, const Endpoint* tail) {
  absl::StatusOr<std::unique_ptr<PendingData>> pending =
      StartDataCall(address, channel, op, work, tail);
  if (pending.ok() && *pending == nullptr) return absl::OkStatus();  // gRPC
  *used = true;
  DT_RETURN_IF_ERROR(pending.status());
  return FinishDataCall(*std::move(pending), work);
}

absl::StatusOr<JobStatus> RemoteParameterServer::GetJob(int server, bool include_slices) {
  if (server < 0 || server >= num_shards_) {
    return absl::InvalidArgumentError(absl::StrCat("no server ", server));
  }
  v1::GetJobRequest request;
  request.set_job(options_.job);
  request.set_worker(options_.worker);
  request.set_include_slices(include_slices);
  v1::GetJobResponse response;
  DT_RETURN_IF_ERROR(WithRetries([&]() -> absl::Status {
    DT_ASSIGN_OR_RETURN(Endpoint to, Route(server, /*write=*/false));
    auto stub = v1::KVStore::NewStub(to.channel);
    grpc::ClientContext ctx;
    AddToken(&ctx);
    TrackedCall tracked(this, &ctx);
    ctx.set_deadline(Deadline(options_.rpc_timeout));
    return FromGrpcStatus(stub->GetJob(&ctx, request, &response),
                          absl::StrCat("KVStore.GetJob to ", to.address));
  }));
  return FromProto(response);
}

absl::Status RemoteParameterServer::Resync() { return ResyncRounds().status(); }

absl::StatusOr<int64_t> RemoteParameterServer::ResyncRounds() {
  std::vector<JobStatus> states(static_cast<size_t>(num_shards_));
  DT_RETURN_IF_ERROR(ForEachServer([&](int i) -> absl::Status {
    DT_ASSIGN_OR_RETURN(states[static_cast<size_t>(i)], GetJob(i, /*include_slices=*/true));
    return absl::OkStatus();
  }));
  return keys_.SetPushedRounds(states);
}

absl::StatusOr<int64_t> RemoteParameterServer::ResumeRounds() { return ResyncRounds(); }

absl::StatusOr<std::vector<std::string>> RemoteParameterServer::Snapshot() {
  std::vector<std::string> paths(static_cast<size_t>(num_shards_));
  DT_RETURN_IF_ERROR(ForEachServer([&](int i) -> absl::Status {
    v1::SnapshotRequest request;
    v1::SnapshotResponse response;
    DT_RETURN_IF_ERROR(WithRetries([&]() -> absl::Status {
      DT_ASSIGN_OR_RETURN(Endpoint to, Route(i, /*write=*/true));
      auto stub = v1::KVStore::NewStub(to.channel);
      grpc::ClientContext ctx;
      AddToken(&ctx);
      TrackedCall tracked(this, &ctx);
      ctx.set_deadline(Deadline(options_.rpc_timeout));
      return FromGrpcStatus(stub->Snapshot(&ctx, request, &response),
                            absl::StrCat("KVStore.Snapshot to ", to.address));
    }));
    paths[static_cast<size_t>(i)] = response.path();
    return absl::OkStatus();
  }));
  return paths;
}

absl::StatusOr<int64_t> RemoteParameterServer::PushedRound(const std::string& key) const {
  return keys_.PushedRound(key);
}

absl::StatusOr<std::vector<PlacedSlice>> RemoteParameterServer::Placement(
    const std::string& key) const {
  return keys_.Placement(key);
}

}  // namespace kvstore
}  // namespace dtrain
