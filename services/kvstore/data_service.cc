#include "services/kvstore/data_service.h"

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
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/base/grpc_status.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/kvstore/chunks.h"
#include "libs/kvstore/shard.h"
#include "libs/kvstore/wire.h"
#include "libs/rpc/credentials.h"
#include "libs/security/job_token.h"
#include "protos/kvstore.grpc.pb.h"

namespace dtrain {
namespace kvstore {
namespace {

using Clock = ShardHandler::Clock;
using grpc::ByteBuffer;

// A gRPC call's caller (its certificate) and token (metadata), through the
// shard's one authorization step.
absl::StatusOr<ShardHandler::Grant> Authorized(const ShardHandler& shard,
                                               const grpc::ServerContextBase& ctx,
                                               const char* method) {
  DT_ASSIGN_OR_RETURN(security::Identity who, rpc::PeerIdentity(ctx));
  auto token = ctx.client_metadata().find(security::kJobTokenMetadata);
  if (token == ctx.client_metadata().end()) return shard.Authorize(who, method, nullptr);
  const std::string value(token->second.data(), token->second.size());
  return shard.Authorize(who, method, &value);
}

// Unary forms: the request is one message, and so is the reply.
std::function<bool(ByteBuffer*)> ReadOnce(const ByteBuffer* request) {
  auto done = std::make_shared<bool>(false);
  return [request, done](ByteBuffer* b) {
    if (*done) return false;
    *done = true;
    *b = *request;
    return true;
  };
}

std::function<bool(const ByteBuffer&, bool)> WriteOnce(ByteBuffer* response) {
  return [response](const ByteBuffer& b, bool) {
    *response = b;
    return true;
  };
}

template <typename Stream>
std::function<bool(const ByteBuffer&, bool)> WriteTo(Stream* stream) {
  return [stream](const ByteBuffer& b, bool last) {
    return stream->Write(b, last ? grpc::WriteOptions().set_last_message() : grpc::WriteOptions());
  };
}

ByteBuffer PushReply(const PushResult& result) {
  v1::PushResponse reply;
  reply.set_applied(result.applied);
  reply.set_duplicates(result.duplicates);
  return wire::SerializeSmall(reply);
}

}  // namespace

grpc::Status RunShardCall(ShardHandler& shard, const char* method, const grpc::ServerContext* ctx,
                          const std::function<absl::Status()>& handler) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<ShardHandler::Grant> grant = Authorized(shard, *ctx, method);
  security::JobScope scope(grant.ok() && grant->has_value() ? &(*grant)->job : nullptr);
  absl::Status status = grant.status();
  if (grant.ok()) {
    absl::StatusOr<JobLimiter::Hold> hold = shard.CallPlace(*grant);
    status = hold.ok() ? handler() : hold.status();
  }
  shard.Account(method, start, status);
  return ToGrpcStatus(status);
}

// The data calls over the shard.
class DataService::Calls {
 public:
  Calls(ShardHandler* shard, const DataServiceOptions& options)
      : options_(options),
        shard_(*shard),
        chunk_bytes_(std::max<int64_t>(
            1024, std::min(options.chunk_bytes, options.max_message_bytes / 2))) {}

  grpc::Status Run(const char* method, const grpc::ServerContext* ctx,
                   const std::function<absl::Status()>& handler) {
    return RunShardCall(shard_, method, ctx, handler);
  }

  // Counts a finished call and converts its status for gRPC.
  grpc::Status Record(const char* method, Clock::time_point start, const absl::Status& status) {
    shard_.Account(method, start, status);
    return ToGrpcStatus(status);
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
    Calls* impl = nullptr;
    const char* method = nullptr;
    Clock::time_point start;
    grpc::ServerUnaryReactor* reactor = nullptr;
    ByteBuffer* response = nullptr;
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
    if (status.ok() && values != nullptr) status = shard_.ReadCommitted();
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
    absl::StatusOr<bool> ready = shard_.store().TryPull(
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
        shard_.store().Pull(call.job, call.worker, call.items, now);
    if (!values.ok()) return Complete(call, values.status(), nullptr);
    Complete(call, absl::OkStatus(), &*values);
  }

  grpc::ServerUnaryReactor* StartUnary(const char* method, grpc::CallbackServerContext* ctx,
                                       const ByteBuffer* request, ByteBuffer* response) {
    auto call = std::make_shared<UnaryCall>();
    call->impl = this;
    call->method = method;
    call->start = Clock::now();
    call->response = response;
    auto* reactor = new UnaryReactor(call);
    call->reactor = reactor;
    absl::StatusOr<ShardHandler::Grant> grant = Authorized(shard_, *ctx, method);
    absl::Status status = grant.status();
    if (grant.ok()) {
      // A pull that waits without a thread holds its place too.
      absl::StatusOr<JobLimiter::Hold> hold = shard_.CallPlace(*grant);
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
  absl::Status BeginUnary(const char* method, const ByteBuffer* request, UnaryCall* call) {
    const absl::string_view m = method;
    if (m == "PullUnary") {
      DT_RETURN_IF_ERROR(shard_.CheckReads());
      v1::PullRequest r;
      DT_RETURN_IF_ERROR(wire::ParseSmall(*request, &r, "PullRequest"));
      DT_ASSIGN_OR_RETURN(call->items, shard_.PreparePull(r));
      call->job = r.job();
      call->worker = r.worker();
      call->pulling = true;
      return absl::OkStatus();
    }
    ReceivedPush p;
    DT_RETURN_IF_ERROR(ReceivePush(ReadOnce(request), &p));
    DT_ASSIGN_OR_RETURN(PushResult result, shard_.ApplyPush(p.push));
    if (m == "PushUnary") {
      *call->response = PushReply(result);
      return absl::OkStatus();
    }
    for (const PushItem& item : p.push.items) {
      call->items.push_back({item.key, item.slice, item.round});
    }
    call->job = p.push.header.job();
    call->worker = p.push.header.worker();
    call->pulling = true;
    return absl::OkStatus();
  }

  // ---- KVStoreData (sync) ----

  // A push as received: the messages whose slices hold its values, and
  // the push.
  struct ReceivedPush {
    ShardHandler::IncomingPush push;
    std::deque<wire::Decoded> messages;
  };

  absl::Status ReceivePush(const std::function<bool(ByteBuffer*)>& read, ReceivedPush* r) {
    DT_RETURN_IF_ERROR(shard_.CheckWrites());
    ShardHandler::IncomingPush* p = &r->push;
    ByteBuffer buffer;
    if (!read(&buffer)) return absl::InvalidArgumentError("push: empty request stream");
    r->messages.emplace_back();
    DT_RETURN_IF_ERROR(Annotate(
        wire::Decode(buffer, wire::kPushChunksField, &p->header, &r->messages.back()), "push"));
    if (p->header.has_answer_at()) {
      return absl::InvalidArgumentError(
          "push: answer_at is for data port push-pulls only (the tail answers on the data port)");
    }
    // Check the items against the store before reading their values.
    std::vector<std::pair<std::string, int64_t>> sizes;
    DT_RETURN_IF_ERROR(shard_.PreparePush(p, &sizes));
    ChunkAssembler assembler(std::move(sizes));
    for (bool more = true; more;) {
      for (const wire::InChunk& c : r->messages.back().chunks) {
        DT_RETURN_IF_ERROR(assembler.Add(c.item, c.offset, c.data));
      }
      more = read(&buffer);
      if (more) {
        v1::PushRequest later;
        r->messages.emplace_back();
        DT_RETURN_IF_ERROR(Annotate(
            wire::Decode(buffer, wire::kPushChunksField, &later, &r->messages.back()), "push"));
        if (!later.job().empty() || later.items_size() > 0) {
          return absl::InvalidArgumentError("push: only the first message may name job and items");
        }
      }
    }
    DT_RETURN_IF_ERROR(assembler.Finish(/*allow_empty=*/false));
    for (size_t i = 0; i < p->items.size(); ++i) p->items[i].data = assembler.pieces(i);
    p->bytes = assembler.bytes();
    shard_.CountPushBytes(p->bytes);
    return absl::OkStatus();
  }

  // How long a pull of the call `ctx` may wait: its deadline, at most
  // max_pull_wait.
  absl::Time PullDeadline(const grpc::ServerContextBase& ctx) const {
    auto deadline = ctx.deadline();
    return shard_.PullDeadline(deadline >= std::chrono::system_clock::time_point::max() -
                                               std::chrono::hours(1)
                                   ? absl::InfiniteFuture()
                                   : absl::FromChrono(deadline));
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
                          const std::function<bool(const ByteBuffer&, bool)>& write) {
    const v1::PullResponse header = PullReplyHeader(values);
    std::vector<grpc::Slice> wholes;
    int64_t total = 0;
    for (const PulledValue& v : values) {
      wholes.push_back(wire::SharedSlice(v.bytes.owner, v.bytes.data, v.bytes.size));
      total += static_cast<int64_t>(wholes.back().size());
    }
    if (one_message && total > options_.max_message_bytes - (64 << 10)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a reply of ", total, " value bytes does not fit in one message (max_message_bytes=",
          options_.max_message_bytes, "); use the streaming call"));
    }
    const int64_t chunk_bytes = one_message ? std::max<int64_t>(total, 1) : chunk_bytes_;
    std::vector<ByteBuffer> messages;
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
    shard_.CountPullBytes(sent);
    return absl::OkStatus();
  }

  // Push and PushUnary.
  absl::Status Push(const std::function<bool(ByteBuffer*)>& read, ByteBuffer* response) {
    ReceivedPush p;
    DT_RETURN_IF_ERROR(ReceivePush(read, &p));
    DT_ASSIGN_OR_RETURN(PushResult result, shard_.ApplyPush(p.push));
    *response = PushReply(result);
    return absl::OkStatus();
  }

  // Pull and PullUnary (`one_message`).
  absl::Status Pull(grpc::ServerContext* ctx, const ByteBuffer* request, bool one_message,
                    const std::function<bool(const ByteBuffer&, bool)>& write) {
    DT_RETURN_IF_ERROR(shard_.CheckReads());
    v1::PullRequest r;
    DT_RETURN_IF_ERROR(wire::ParseSmall(*request, &r, "PullRequest"));
    DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values, shard_.Pull(r, MakePullOptions(ctx)));
    return SendPulled(values, one_message, write);
  }

  // PushPull and PushPullUnary (`one_message`).
  absl::Status PushPull(grpc::ServerContext* ctx, const std::function<bool(ByteBuffer*)>& read,
                        bool one_message,
                        const std::function<bool(const ByteBuffer&, bool)>& write) {
    ReceivedPush p;
    DT_RETURN_IF_ERROR(ReceivePush(read, &p));
    Replicator::Ack ack;
    DT_RETURN_IF_ERROR(shard_.ApplyPush(p.push, &ack).status());
    p.messages.clear();  // release the pushed bytes before waiting (items keep their keys)
    DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values,
                        shard_.PullPushed(p.push, MakePullOptions(ctx)));
    return SendPulled(values, one_message, write);
  }

 private:
  const DataServiceOptions options_;
  ShardHandler& shard_;
  const int64_t chunk_bytes_;
};

template <typename Handler, typename Fn>
void DataService::Add(const char* method, grpc::internal::RpcMethod::RpcType type, Fn fn) {
  names_.push_back(std::make_unique<std::string>(
      absl::StrCat("/", v1::KVStoreData::service_full_name(), "/", method)));
  AddMethod(
      new grpc::internal::RpcServiceMethod(names_.back()->c_str(), type, new Handler(fn, this)));
}

DataService::DataService(ShardHandler* shard, const DataServiceOptions& options)
    : calls_(std::make_unique<Calls>(shard, options)) {
  using grpc::ServerContext;
  using grpc::internal::RpcMethod;
  Add<grpc::internal::ClientStreamingHandler<DataService, ByteBuffer, ByteBuffer>>(
      "Push", RpcMethod::CLIENT_STREAMING,
      [](DataService* s, ServerContext* ctx, grpc::ServerReader<ByteBuffer>* reader,
         ByteBuffer* response) {
        return s->calls_->Run("Push", ctx, [&] {
          return s->calls_->Push([reader](ByteBuffer* b) { return reader->Read(b); }, response);
        });
      });
  Add<grpc::internal::ServerStreamingHandler<DataService, ByteBuffer, ByteBuffer>>(
      "Pull", RpcMethod::SERVER_STREAMING,
      [](DataService* s, ServerContext* ctx, const ByteBuffer* request,
         grpc::ServerWriter<ByteBuffer>* writer) {
        return s->calls_->Run(
            "Pull", ctx, [&] { return s->calls_->Pull(ctx, request, false, WriteTo(writer)); });
      });
  Add<grpc::internal::BidiStreamingHandler<DataService, ByteBuffer, ByteBuffer>>(
      "PushPull", RpcMethod::BIDI_STREAMING,
      [](DataService* s, ServerContext* ctx,
         grpc::ServerReaderWriter<ByteBuffer, ByteBuffer>* stream) {
        return s->calls_->Run("PushPull", ctx, [&] {
          return s->calls_->PushPull(
              ctx, [stream](ByteBuffer* b) { return stream->Read(b); }, false, WriteTo(stream));
        });
      });
  using Unary = grpc::internal::RpcMethodHandler<DataService, ByteBuffer, ByteBuffer>;
  Add<Unary>(
      "PushUnary", RpcMethod::NORMAL_RPC,
      [](DataService* s, ServerContext* ctx, const ByteBuffer* request, ByteBuffer* response) {
        return s->calls_->Run("PushUnary", ctx,
                              [&] { return s->calls_->Push(ReadOnce(request), response); });
      });
  Add<Unary>(
      "PullUnary", RpcMethod::NORMAL_RPC,
      [](DataService* s, ServerContext* ctx, const ByteBuffer* request, ByteBuffer* response) {
        return s->calls_->Run("PullUnary", ctx, [&] {
          return s->calls_->Pull(ctx, request, true, WriteOnce(response));
        });
      });
  Add<Unary>(
      "PushPullUnary", RpcMethod::NORMAL_RPC,
      [](DataService* s, ServerContext* ctx, const ByteBuffer* request, ByteBuffer* response) {
        return s->calls_->Run("PushPullUnary", ctx, [&] {
          return s->calls_->PushPull(ctx, ReadOnce(request), true, WriteOnce(response));
        });
      });
  if (options.callback) {
    // The unary forms on gRPC's callback threads instead (the sync
    // handlers above are replaced).
    for (const char* method : {"PushUnary", "PullUnary", "PushPullUnary"}) {
      int index = 0;
      for (; index < static_cast<int>(names_.size()); ++index) {
        if (absl::EndsWith(*names_[static_cast<size_t>(index)], absl::StrCat("/", method))) break;
      }
      Calls* calls = calls_.get();
      MarkMethodRawCallback(
          index, new grpc::internal::CallbackUnaryHandler<ByteBuffer, ByteBuffer>(
                     [calls, method](grpc::CallbackServerContext* ctx, const ByteBuffer* request,
                                     ByteBuffer* response) {
                       return calls->StartUnary(method, ctx, request, response);
                     }));
    }
  }
}

DataService::~DataService() = default;

}  // namespace kvstore
}  // namespace dtrain
