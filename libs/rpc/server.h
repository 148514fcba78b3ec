// rpc::Server: what every dtrain gRPC server has besides its own API, set up
// in one place.
//
//   rpc::ServerOptions options;
//   options.service = "kvstore";               // Admin.Ping's `service`
//   options.listen = "0.0.0.0:7070";           // port 0: any free port
//   options.port_file = "/run/kvstore.port";   // written once serving
//   options.metrics_listen = ":9100";          // Prometheus /metrics
//   rpc::Server server(options);
//   server.AddService(&my_service);            // not owned; outlives `server`
//   server.Expose(my_registry);                // more families on /metrics
//   DT_RETURN_IF_ERROR(server.Start());
//   ...
//   server.Shutdown(absl::Seconds(10));
//
// On the gRPC port, next to the added services:
//   grpc.health.v1.Health   SERVING from Start until Shutdown begins
//   grpc.reflection         for grpcurl and friends
//   dtrain.admin.Admin      Ping (protos/admin.proto)
// and, when metrics_listen is set, on /metrics, for every call of every
// service (the added ones, health, reflection, admin), counted by an
// interceptor:
//   dtrain_rpc_server_requests_total{grpc_service,grpc_method,grpc_code}
//       calls finished, by status code name ("OK", "UNAVAILABLE", ...)
//   dtrain_rpc_server_request_duration_seconds{grpc_service,grpc_method}
//       histogram (metrics::LatencyBuckets) from the call's arrival to its
//       status (a stream's whole life)
//   dtrain_rpc_server_requests_in_flight
//       calls arrived and not finished
// grpc_service is the full service name ("dtrain.kvstore.v1.KVStoreData"),
// grpc_method the method's ("Push").
//
// The gRPC port serves mutual TLS with options.credentials (else the
// process's DefaultCredentials(), credentials.h); handlers learn their
// caller with PeerIdentity.
//
// A server without a gRPC API (the trainer daemon) sets `listen` for health,
// reflection and admin only, or leaves it empty for metrics only.
//
// Shutdown(grace) reports NOT_SERVING, refuses new calls, lets calls in
// flight finish for up to `grace`, and then cancels what is left. Once no
// call is in flight it also closes idle client connections, which gRPC
// would otherwise wait for until the grace ends. Streams that would run
// forever must be ended by their service first (the scheduler ends its
// Watch streams). For mains, RunUntilShutdownSignal waits for SIGTERM or
// SIGINT (libs/base/signals.h) and then calls the owner's shutdown.
//
// Thread-safety: AddService, Expose, Start and Shutdown belong to the
// owner (one thread); the accessors are thread-safe once Start returned.
#ifndef DTRAIN_LIBS_RPC_SERVER_H_
#define DTRAIN_LIBS_RPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/rpc/credentials.h"
#include "prometheus/collectable.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace dtrain {
namespace metrics {
class MetricsServer;
}  // namespace metrics

namespace rpc {

struct ServerOptions {
  // Required: this server's kind, "kvstore", "scheduler", "trainer"
  // (Admin.Ping's `service`, the log lines).
  std::string service;
  // gRPC address, e.g. "0.0.0.0:7070" or "127.0.0.1:0"; empty: no gRPC
  // server (AddService is then an error at Start).
  std::string listen;
  // Where Start writes the bound gRPC port (decimal, no newline), atomically,
  // once serving; empty: nowhere.
  std::string port_file;
  // Prometheus endpoint: "host:port", ":port" or "port"; empty: none.
  std::string metrics_listen;
  // Where Start writes the bound metrics port; empty: nowhere.
  std::string metrics_port_file;
  // gRPC send and receive limit per message; 0: gRPC's defaults.
  int64_t max_message_bytes = 0;
  // Mutual TLS or plain text (credentials.h); nullptr: DefaultCredentials(),
  // which a main sets from its flags.
  std::shared_ptr<const Credentials> credentials;
  // Idle threads of gRPC's synchronous server; 0: gRPC's defaults.
  int min_pollers = 0;
  int max_pollers = 0;
  // Caps against exhaustion (issue 16). At most max_threads threads serve
  // calls (grpc::ResourceQuota::SetMaxThreads); a call that would need one
  // more is refused at once with RESOURCE_EXHAUSTED, and the server, its
  // health checks (gRPC serves them outside this pool) and its calls in
  // flight carry on. At most max_concurrent_streams calls at once per client
  // connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; more wait in the
  // client). 0: gRPC's defaults (no limits).
  int max_threads = 256;
  int max_concurrent_streams = 256;
};

class RpcMetrics;

class Server {
 public:
  explicit Server(ServerOptions options);
  // Shutdown(0) if it was not called.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Before Start: serve `service` too. Not owned; it must outlive this
  // Server.
  void AddService(grpc::Service* service);

  // Adds `collectable` to /metrics (any time; ignored without metrics_listen).
  void Expose(std::shared_ptr<prometheus::Collectable> collectable);

  // Starts the metrics endpoint and the gRPC server, reports SERVING, logs
  // the ports ("<service> listening on port P, metrics on port M") and
  // writes the port files. Errors: kInvalidArgument for bad options,
  // kUnavailable naming the address when one cannot be bound,
  // WriteFileAtomically's errors. Called once.
  absl::Status Start();

  // See the file comment. Idempotent; later calls return at once.
  void Shutdown(absl::Duration grace);

  // The bound gRPC port (0 without one), "127.0.0.1:<port>" for local
  // clients, the bound metrics port (0 without an endpoint).
  int port() const { return port_; }
  std::string local_address() const;
  int metrics_port() const;

  // Calls arrived and not finished (all services).
  int64_t calls_in_flight() const;

  // The underlying server (nullptr before Start or without `listen`).
  grpc::Server* grpc_server() const { return server_.get(); }

 private:
  class AdminService;

  ServerOptions options_;
  std::vector<grpc::Service*> services_;
  std::shared_ptr<RpcMetrics> rpc_metrics_;
  std::vector<std::shared_ptr<prometheus::Collectable>> exposed_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool started_ = false;
  bool shut_down_ = false;
};

// The tail of a server's main: waits for SIGTERM or SIGINT (installing the
// handlers if the main did not; install them before starting the server so
// an early signal is not lost), logs it, and calls `shutdown` (the owner's,
// which calls Server::Shutdown with its grace period). Returns the exit
// status: 0, or 1 after logging `shutdown`'s error to stderr as
// "<program>: <error>".
int RunUntilShutdownSignal(absl::string_view program, absl::FunctionRef<absl::Status()> shutdown);

}  // namespace rpc
}  // namespace dtrain

#endif  // DTRAIN_LIBS_RPC_SERVER_H_
