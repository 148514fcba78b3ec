#include "libs/rpc/server.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/support/server_interceptor.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/base/files.h"
#include "libs/base/grpc_status.h"
#include "libs/base/logging.h"
#include "libs/base/signals.h"
#include "libs/base/status.h"
#include "libs/metrics/metrics.h"
#include "protos/admin.grpc.pb.h"

namespace dtrain {
namespace rpc {

// The RPC metrics of one server, fed by an interceptor on every call.
class RpcMetrics {
 public:
  RpcMetrics()
      : registry_(std::make_shared<prometheus::Registry>()),
        requests_(metrics::AddCounter(*registry_, "dtrain_rpc_server_requests_total",
                                      "RPCs finished, by gRPC service, method and status code.")),
        latency_(metrics::AddHistogram(
            *registry_, "dtrain_rpc_server_request_duration_seconds",
            "RPC latency from arrival to status (streams: their whole life).")),
        in_flight_(metrics::AddGauge(*registry_, "dtrain_rpc_server_requests_in_flight",
                                     "RPCs arrived and not finished.")
                       .Add({})) {}

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  int64_t in_flight() const { return in_flight_count_.load(); }

  // The series of one method, created on its first call.
  struct Method {
    std::string service, method;
    prometheus::Histogram* latency = nullptr;
    std::array<std::atomic<prometheus::Counter*>, 17> by_code{};
  };

  Method* Find(const char* full_name) {
    absl::string_view name = full_name != nullptr ? full_name : "";
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = methods_.find(name);
      if (it != methods_.end()) return it->second.get();
    }
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Method>& m = methods_[name];
    if (m == nullptr) {
      m = std::make_unique<Method>();
      // "/dtrain.kvstore.v1.KVStoreData/Push" -> service, method.
      absl::string_view rest = absl::StripPrefix(name, "/");
      const size_t slash = rest.rfind('/');
      m->service =
          slash == absl::string_view::npos ? "unknown" : std::string(rest.substr(0, slash));
      m->method = slash == absl::string_view::npos ? std::string(rest.empty() ? "unknown" : rest)
                                                   : std::string(rest.substr(slash + 1));
      m->latency = &latency_.Add({{"grpc_service", m->service}, {"grpc_method", m->method}},
                                 metrics::LatencyBuckets());
    }
    return m.get();
  }

  void Begin() {
    in_flight_count_.fetch_add(1);
    in_flight_.Increment();
  }

  void End(Method* m, grpc::StatusCode code, absl::Duration latency) {
    in_flight_count_.fetch_sub(1);
    in_flight_.Decrement();
    const int c = static_cast<int>(code);
    const size_t i = c >= 0 && c < 17 ? static_cast<size_t>(c) : 2;  // UNKNOWN
    prometheus::Counter* counter = m->by_code[i].load(std::memory_order_acquire);
    if (counter == nullptr) {
      // Family::Add returns the same counter for the same labels, so a race
      // here stores the same pointer twice.
      counter = &requests_.Add(
          {{"grpc_service", m->service},
           {"grpc_method", m->method},
           {"grpc_code", absl::StatusCodeToString(static_cast<absl::StatusCode>(i))}});
      m->by_code[i].store(counter, std::memory_order_release);
    }
    counter->Increment();
    m->latency->Observe(absl::ToDoubleSeconds(latency));
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Gauge& in_flight_;
  std::atomic<int64_t> in_flight_count_{0};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Method>> methods_ ABSL_GUARDED_BY(mu_);
};

namespace {

using grpc::experimental::InterceptionHookPoints;

// One per call: created when the call arrives, destroyed when it is done.
class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(RpcMetrics* metrics, const char* method)
      : metrics_(metrics), method_(metrics->Find(method)), start_(absl::Now()) {
    metrics_->Begin();
  }

  // A call that ended without a status of ours (the client went away).
  ~MetricsInterceptor() override {
    if (!done_) metrics_->End(method_, grpc::StatusCode::CANCELLED, absl::Now() - start_);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (!done_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      done_ = true;
      metrics_->End(method_, methods->GetSendStatus().error_code(), absl::Now() - start_);
    }
    methods->Proceed();
  }

 private:
  RpcMetrics* metrics_;
  RpcMetrics::Method* method_;
  absl::Time start_;
  bool done_ = false;
};

class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(std::shared_ptr<RpcMetrics> metrics)
      : metrics_(std::move(metrics)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(metrics_.get(), info->method());
  }

 private:
  std::shared_ptr<RpcMetrics> metrics_;
};

}  // namespace

// dtrain.admin.Admin
class Server::AdminService final : public admin::Admin::Service {
 public:
  explicit AdminService(std::string service) : service_(std::move(service)) {}

  grpc::Status Ping(grpc::ServerContext* ctx, const admin::PingRequest* request,
                    admin::PingReply* reply) override {
    // Any authenticated caller may ping (health and `cluster status`).
    absl::StatusOr<security::Identity> who = PeerIdentity(*ctx);
    if (!who.ok()) return ToGrpcStatus(who.status());
    reply->set_caller(who->ToString());
    if (request->fail_with_code() != 0) {
      return grpc::Status(static_cast<grpc::StatusCode>(request->fail_with_code()),
                          request->payload());
    }
    reply->set_payload(request->payload());
    reply->set_service(service_);
    reply->set_version("dev");
    reply->set_uptime_ms(absl::ToInt64Milliseconds(absl::Now() - start_));
    return grpc::Status::OK;
  }

 private:
  const std::string service_;
  const absl::Time start_ = absl::Now();
};

Server::Server(ServerOptions options)
    : options_(std::move(options)), rpc_metrics_(std::make_shared<RpcMetrics>()) {}

Server::~Server() { Shutdown(absl::ZeroDuration()); }

void Server::AddService(grpc::Service* service) {
  DT_CHECK(!started_) << "rpc::Server::AddService after Start";
  services_.push_back(service);
}

void Server::Expose(std::shared_ptr<prometheus::Collectable> collectable) {
  if (metrics_server_ != nullptr) {
    metrics_server_->Expose(collectable);
  } else {
    exposed_.push_back(std::move(collectable));
  }
}

absl::Status Server::Start() {
  DT_CHECK(!started_) << "rpc::Server::Start called twice";
  started_ = true;
  if (options_.service.empty()) return absl::InvalidArgumentError("rpc::Server: service not set");
  if (options_.listen.empty() && !services_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.service, ": services added but no gRPC address to listen on"));
  }
  if (options_.listen.empty() && !options_.port_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.service, ": a port file but no gRPC address to listen on"));
  }
  if (options_.metrics_listen.empty() && !options_.metrics_port_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.service, ": a metrics port file but no metrics address"));
  }
  if (options_.max_message_bytes < 0 || options_.max_message_bytes > (int64_t{1} << 30) ||
      options_.min_pollers < 0 || options_.max_pollers < 0 || options_.max_threads < 0 ||
      options_.max_concurrent_streams < 0 ||
      (options_.max_threads > 0 && options_.max_threads < 2 * std::max(1, options_.max_pollers))) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.service,
                     ": max_message_bytes must be 0 to 1 GiB, pollers, max_threads and "
                     "max_concurrent_streams >= 0, max_threads at least twice max_pollers"));
  }
  if (!options_.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> m =
        metrics::MetricsServer::Start(options_.metrics_listen);
    if (!m.ok()) return Annotate(m.status(), absl::StrCat(options_.service, " metrics"));
    metrics_server_ = *std::move(m);
    metrics_server_->Expose(rpc_metrics_->registry());
    for (auto& c : exposed_) metrics_server_->Expose(std::move(c));
    exposed_.clear();
  }
  if (!options_.listen.empty()) {
    admin_ = std::make_unique<AdminService>(options_.service);
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    std::shared_ptr<const Credentials> credentials =
        options_.credentials != nullptr ? options_.credentials : DefaultCredentials();
    builder.AddListeningPort(options_.listen, credentials->ServerCredentials(), &port_);
    // Clients may send HTTP/2 keepalive pings every 10 s during a call (trainctl
    // watch does, to notice a dead connection); gRPC's default (5 min) would
    // answer such pings with GOAWAY too_many_pings and break a quiet stream.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
    if (options_.max_message_bytes > 0) {
      builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
      builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
    }
    if (options_.min_pollers > 0) {
      builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS,
                                  options_.min_pollers);
    }
    if (options_.max_pollers > 0) {
      builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                                  options_.max_pollers);
    }
    if (options_.max_threads > 0) {
      grpc::ResourceQuota quota(absl::StrCat(options_.service, "-threads"));
      quota.SetMaxThreads(options_.max_threads);
      builder.SetResourceQuota(quota);
    }
    if (options_.max_concurrent_streams > 0) {
      builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.max_concurrent_streams);
    }
    for (grpc::Service* s : services_) builder.RegisterService(s);
    builder.RegisterService(admin_.get());
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(std::make_unique<MetricsInterceptorFactory>(rpc_metrics_));
    builder.experimental().SetInterceptorCreators(std::move(creators));
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      server_.reset();
      port_ = 0;
      return absl::UnavailableError(
          absl::StrCat(options_.service, ": cannot listen on '", options_.listen, "'"));
    }
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(true);
    if (credentials->insecure()) {
      DT_LOG(WARNING) << options_.service
                      << ": serving PLAIN TEXT (--insecure): no encryption, no identities";
    } else {
      DT_LOG(INFO) << options_.service << ": mutual TLS as " << credentials->identity().ToString()
                   << ", client certificates required";
    }
  }
  DT_LOG(INFO) << options_.service
               << (port_ > 0 ? absl::StrCat(" listening on port ", port_) : std::string(" up"))
               << (metrics_port() > 0 ? absl::StrCat(", metrics on port ", metrics_port())
                                      : std::string());
  if (!options_.metrics_port_file.empty()) {
    DT_RETURN_IF_ERROR(
        WriteFileAtomically(options_.metrics_port_file, absl::StrCat(metrics_port())));
  }
  if (!options_.port_file.empty()) {
    DT_RETURN_IF_ERROR(WriteFileAtomically(options_.port_file, absl::StrCat(port_)));
  }
  return absl::OkStatus();
}

void Server::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
    // gRPC's Shutdown refuses new calls, lets calls in flight finish, and
    // then waits for clients to close their connections, which idle gRPC
    // clients do not do: it would wait out the whole grace period. So once
    // no call is in flight, calls and connections are closed from here.
    const absl::Time deadline = absl::Now() + grace;
    std::atomic<bool> done{false};
    std::thread closer([&] {
      absl::SleepFor(absl::Milliseconds(20));  // Shutdown has begun refusing calls
      while (!done.load() && rpc_metrics_->in_flight() > 0 && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      if (!done.load()) grpc_server_cancel_all_calls(server_->c_server());
    });
    server_->Shutdown(absl::ToChronoTime(deadline));
    done = true;
    closer.join();
    server_->Wait();
  }
  metrics_server_.reset();
}

std::string Server::local_address() const { return absl::StrCat("127.0.0.1:", port_); }

int Server::metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }

int64_t Server::calls_in_flight() const { return rpc_metrics_->in_flight(); }

int RunUntilShutdownSignal(absl::string_view program, absl::FunctionRef<absl::Status()> shutdown) {
  const int sig = ShutdownSignal::Install().Wait();
  DT_LOG(INFO) << "signal " << sig << ": shutting down";
  absl::Status status = shutdown();
  if (!status.ok()) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace rpc
}  // namespace dtrain
