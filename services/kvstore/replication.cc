#include "services/kvstore/replication.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/base/grpc_status.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/kvstore/data_port.h"
#include "libs/rpc/authorize.h"
#include "libs/rpc/credentials.h"
#include "libs/security/authz.h"
#include "protos/kvstore.grpc.pb.h"
#include "protos/scheduler.grpc.pb.h"

namespace dtrain {
namespace kvstore {

std::shared_ptr<grpc::Channel> GrpcReplicaLink::Channel(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(static_cast<int>(chunk_bytes_ + (64 << 10)));
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // This process's credentials (a kvstore certificate with mutual TLS).
    channel = rpc::NewChannel(address, args);
  }
  return channel;
}

absl::StatusOr<v1::ReplicateReply> GrpcReplicaLink::Replicate(
    const std::string& address, const std::string& batch,
    const std::vector<absl::string_view>& values) {
  std::string inlined;
  if (!values.empty()) {
    DT_ASSIGN_OR_RETURN(v1::ReplicateBatch whole, InlineValues(batch, values));
    inlined = whole.SerializeAsString();
  }
  const std::string& bytes = values.empty() ? batch : inlined;
  auto stub = v1::Replica::NewStub(Channel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  v1::ReplicateReply reply;
  std::unique_ptr<grpc::ClientWriter<v1::ReplicateChunk>> writer = stub->Replicate(&ctx, &reply);
  v1::ReplicateChunk chunk;
  size_t at = 0;
  do {
    const size_t take = std::min(bytes.size() - at, static_cast<size_t>(chunk_bytes_));
    chunk.set_data(bytes.data() + at, take);
    at += take;
    if (!writer->Write(chunk)) break;  // Finish says why
  } while (at < bytes.size());
  writer->WritesDone();
  DT_RETURN_IF_ERROR(
      FromGrpcStatus(writer->Finish(), absl::StrCat("Replica.Replicate to ", address)));
  return reply;
}

struct DataPortReplicaLink::Peer {
  absl::Mutex mu;
  bool discovered ABSL_GUARDED_BY(mu) = false;
  // tcp_port 0 and no unix_socket: gRPC. unix_socket: the successor is on
  // this host (and, with TLS, `ticket` lets this link in).
  DataPortAddress address ABSL_GUARDED_BY(mu);
  std::string ticket ABSL_GUARDED_BY(mu);
  bool unix_failed ABSL_GUARDED_BY(mu) = false;   // TCP until the next discovery
  bool values_apart ABSL_GUARDED_BY(mu) = false;  // DataPortResponse.replicate_values_apart
  IdleDataConns idle ABSL_GUARDED_BY(mu){4};
};

DataPortReplicaLink::DataPortReplicaLink(absl::Duration timeout, absl::Duration spin)
    : timeout_(timeout), spin_(spin), fallback_(timeout) {}

DataPortReplicaLink::~DataPortReplicaLink() = default;

DataPortReplicaLink::Peer* DataPortReplicaLink::PeerOf(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Peer>& p = peers_[address];
  if (p == nullptr) p = std::make_unique<Peer>();
  return p.get();
}

void DataPortReplicaLink::Count(const char* kind) {
  absl::MutexLock lock(&frames_mu_);
  ++frames_[kind];
}

std::map<std::string, int64_t> DataPortReplicaLink::FramesSent() const {
  absl::MutexLock lock(&frames_mu_);
  return frames_;
}

absl::StatusOr<v1::ReplicateReply> DataPortReplicaLink::Replicate(
    const std::string& address, const std::string& batch,
    const std::vector<absl::string_view>& values) {
  Peer* peer = PeerOf(address);
  std::unique_ptr<DataPortConnection> conn;
  DataPortAddress where;
  std::string ticket;
  bool try_unix = false;
  bool values_apart = false;
  {
    absl::MutexLock lock(&peer->mu);
    bool closed = false;
    conn = peer->idle.Take(&closed);
    // The successor closed them: it restarted (maybe on another port) or
    // shut down. Ask for its data port again.
    if (closed) peer->discovered = false;
    if (!peer->discovered) {
      auto stub = v1::KVStore::NewStub(rpc::NewChannel(address));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + std::min(timeout_, absl::Seconds(5))));
      v1::DataPortResponse response;
      grpc::Status s = stub->DataPort(&ctx, v1::DataPortRequest(), &response);
      if (s.ok() || s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        peer->discovered = true;
        peer->unix_failed = false;
        const size_t colon = address.rfind(':');
        peer->address = DataPortAddress();
        peer->address.host = colon == std::string::npos ? address : address.substr(0, colon);
        peer->address.tcp_port = response.tcp_port();
        peer->address.tls = response.tls();
        peer->address.instance = response.instance();
        peer->ticket = response.replica_ticket();
        peer->values_apart = response.replicate_values_apart();
        // The successor's socket when it is on this host; with TLS only
        // with its ticket (without one its Unix HELLO would be refused).
        if (!response.unix_socket().empty() && !response.host_id().empty() &&
            response.host_id() == HostId() && (!response.tls() || !peer->ticket.empty())) {
          peer->address.unix_socket = response.unix_socket();
        }
      }
    }
    where = peer->address;
    ticket = peer->ticket;
    values_apart = peer->values_apart;
    try_unix = !where.unix_socket.empty() && !peer->unix_failed;
  }
  if (where.tcp_port == 0 && !try_unix) {
    Count("grpc");
    return fallback_.Replicate(address, batch, values);
  }
  auto forget = [&](const absl::Status& s) {
    absl::MutexLock lock(&peer->mu);
    peer->idle.Clear();
    peer->discovered = false;  // it may come back on another port
    return absl::Status(s.code(),
                        absl::StrCat("data port REPLICATE to ", address, ": ", s.message()));
  };
  if (conn == nullptr) {
    std::shared_ptr<const rpc::Credentials> c = rpc::DefaultCredentials();
    DataPortTls tls;
    if (!c->insecure()) tls = {true, c->files().ca, c->files().cert, c->files().key};
    v1::DataHello hello;  // no job: a replica link
    const absl::Duration dial_timeout = std::min(timeout_, absl::Seconds(10));
    if (try_unix) {
      hello.set_replica_ticket(ticket);
      absl::StatusOr<std::unique_ptr<DataPortConnection>> dialed =
          DataPortConnection::Dial(where, hello, tls, dial_timeout);
      if (dialed.ok()) {
        conn = *std::move(dialed);
      } else if (where.tcp_port == 0) {
        return forget(dialed.status());
      } else {
        // Not usable from here (a socket in another mount namespace, a
        // restarted successor, ...): TCP until the next discovery.
        DT_LOG(INFO) << "replica link to " << address << ": its data port socket "
                     << where.unix_socket << ": " << dialed.status() << "; using TCP";
        absl::MutexLock lock(&peer->mu);
        peer->unix_failed = true;
      }
      hello.clear_replica_ticket();
    }
    if (conn == nullptr) {
      where.unix_socket.clear();
      absl::StatusOr<std::unique_ptr<DataPortConnection>> dialed =
          DataPortConnection::Dial(where, hello, tls, dial_timeout);
      if (!dialed.ok()) return forget(dialed.status());
      conn = *std::move(dialed);
    }
  }
  conn->set_spin(spin_);
  // The values as the frame's payload (on a Unix socket: written straight
  // into the shared segment, applied from there by the successor); a
  // successor that does not take them apart gets one whole batch.
  absl::Status sent;
  if (values.empty()) {
    sent = conn->Send(DataOp::kReplicate, "", {batch}, 0, timeout_);
  } else if (values_apart) {
    sent = conn->Send(DataOp::kReplicate, batch, values, 0, timeout_);
  } else {
    absl::StatusOr<v1::ReplicateBatch> whole = InlineValues(batch, values);
    if (!whole.ok()) return whole.status();
    sent = conn->Send(DataOp::kReplicate, "", {whole->SerializeAsString()}, 0, timeout_);
  }
  if (!sent.ok()) return forget(sent);
  Count(DataConn::KindName(conn->kind()));
  absl::StatusOr<std::string> header = conn->ReceiveHeader();
  if (!header.ok()) return forget(header.status());
  v1::ReplicateReply reply;
  if (!reply.ParseFromString(*header)) {
    return forget(absl::DataLossError("unparsable ReplicateReply"));
  }
  absl::MutexLock lock(&peer->mu);
  peer->idle.Put(std::move(conn));
  return reply;
}

grpc::Status ReplicaService::Replicate(grpc::ServerContext* ctx,
                                       grpc::ServerReader<v1::ReplicateChunk>* reader,
                                       v1::ReplicateReply* reply) {
  // Replicate only from kvstore shards (libs/security/authz.h).
  if (auto who = rpc::AuthorizedPeer(*ctx, security::Action::kReplicate); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  std::string bytes;
  v1::ReplicateChunk chunk;
  while (reader->Read(&chunk)) {
    if (static_cast<int64_t>(bytes.size() + chunk.data().size()) > batch_limit_) {
      return ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("Replicate: a batch over ", batch_limit_, " bytes")));
    }
    bytes += chunk.data();
  }
  v1::ReplicateBatch batch;
  if (!batch.ParseFromString(bytes)) {
    return ToGrpcStatus(absl::InvalidArgumentError("Replicate: the batch does not parse"));
  }
  bytes.clear();
  absl::Time deadline = absl::FromChrono(ctx->deadline());
  absl::StatusOr<v1::ReplicateReply> r = receive_
                                             ? receive_(std::move(batch), deadline)
                                             : replicator_->Receive(std::move(batch), deadline);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *reply = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status ReplicaService::GetShardMap(grpc::ServerContext* ctx, const v1::GetShardMapRequest*,
                                         v1::ShardMap* map) {
  if (auto who = rpc::AuthorizedPeer(*ctx, security::Action::kReadKvstoreMap); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  *map = replicator_->map();
  return grpc::Status::OK;
}

MapHeartbeat::MapHeartbeat(Replicator* replicator, MapHeartbeatOptions options)
    : replicator_(replicator), options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

MapHeartbeat::~MapHeartbeat() {
  stop_.Notify();
  thread_.join();
}

int64_t MapHeartbeat::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

void MapHeartbeat::Loop() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto stub = scheduler::v1::ClusterService::NewStub(rpc::NewChannel(options_.scheduler, args));
  absl::Duration interval = options_.interval;
  int64_t failed_in_a_row = 0;
  do {
    v1::KvstoreHeartbeatRequest request;
    request.set_shard(options_.shard);
    request.set_replica(options_.replica);
    request.set_num_shards(options_.num_shards);
    request.set_address(options_.address);
    request.set_incarnation(options_.incarnation);
    *request.mutable_map() = replicator_->map();
    request.set_has_state(replicator_->has_state());
    const auto [succ, succ_incarnation] = replicator_->caught_up();
    if (succ >= 0) {
      request.set_caught_up_replica(succ);
      request.set_caught_up_incarnation(succ_incarnation);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
    v1::KvstoreHeartbeatReply reply;
    absl::Status s =
        FromGrpcStatus(stub->KvstoreHeartbeat(&ctx, request, &reply),
                       absl::StrCat("ClusterService.KvstoreHeartbeat to ", options_.scheduler));
    if (s.ok()) {
      if (failed_in_a_row > 0) {
        DT_LOG(INFO) << "kvstore shard " << options_.shard << " replica " << options_.replica
                     << ": the scheduler answers again";
      }
      failed_in_a_row = 0;
      replicator_->SetMap(reply.map());
      if (reply.heartbeat_interval_ms() > 0) {
        interval = absl::Milliseconds(reply.heartbeat_interval_ms());
      }
    } else {
      {
        absl::MutexLock lock(&mu_);
        ++failures_;
      }
      // The map stays as it was: the chain keeps serving while the
      // scheduler restarts.
      if (failed_in_a_row++ % 25 == 0) {
        DT_LOG(WARNING) << "kvstore shard " << options_.shard << " replica " << options_.replica
                        << ": " << s << " (keeping map version " << replicator_->map().version()
                        << ")";
      }
    }
  } while (!stop_.WaitForNotificationWithTimeout(interval));
}

}  // namespace kvstore
}  // namespace dtrain
