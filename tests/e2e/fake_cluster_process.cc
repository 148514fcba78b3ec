// A stand-in for kvstore_server (replicated: --replica_index, --num_shards,
// --scheduler) and for the trainer daemon in `trainctl cluster up` tests of
// what the cluster tooling does on its own: which processes it starts with
// which flags, cluster.json, waiting for the scheduler's shard map, status.
// (The real replicated kvstore_server is tested end to end with its own
// tests; this binary lets the tooling's test run without it.)
//
// It writes its command line, one argument a line, to <--data_dir or
// --work_dir>/argv and serves until SIGTERM:
//   kvstore mode (--shard_index given): the gRPC scaffold (Admin.Ping, port
//     file, metrics) and a heartbeat to --scheduler every interval the
//     scheduler returns, as a replica would: a random incarnation, the map
//     of the last reply, has_state when ACTIVE in it, and, when ACTIVE with
//     a JOINING successor, the report that the successor caught up (a state
//     transfer of nothing), unless $FAKE_REPLICA_NEVER_CATCH_UP is set.
//   trainer mode: metrics only, the port written to --metrics_port_file.
// With $FAKE_PORT_TAKEN_ONCE=<file>, the first kvstore process to create
// <file> holds its own --listen port with a socket before its server starts:
// the server's bind is refused ("Address already in use"), as when another
// process takes a port between `cluster up`'s check and the server's bind.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/base/logging.h"
#include "libs/base/signals.h"
#include "libs/rpc/credentials.h"
#include "libs/rpc/server.h"
#include "protos/scheduler.grpc.pb.h"

namespace {

using dtrain::kvstore::v1::KvstoreHeartbeatReply;
using dtrain::kvstore::v1::KvstoreHeartbeatRequest;
using dtrain::kvstore::v1::ShardMap;

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    const size_t eq = a.find('=');
    flags[a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
        eq == std::string::npos ? "" : a.substr(eq + 1);
  }
  return flags;
}

int Int(const std::map<std::string, std::string>& flags, const std::string& name) {
  int v = -1;
  auto it = flags.find(name);
  if (it == flags.end() || !absl::SimpleAtoi(it->second, &v)) return -1;
  return v;
}

// The heartbeat loop of a replica, until `stop`.
void Heartbeats(const std::string& scheduler, int shard, int replica, int num_shards,
                const std::string& address, const std::atomic<bool>* stop) {
  std::random_device rd;
  const uint64_t incarnation = (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
  const bool never_catch_up = std::getenv("FAKE_REPLICA_NEVER_CATCH_UP") != nullptr;
  auto stub = dtrain::scheduler::v1::ClusterService::NewStub(dtrain::rpc::NewChannel(scheduler));
  ShardMap map;
  absl::Duration interval = absl::Milliseconds(200);
  while (!stop->load()) {
    KvstoreHeartbeatRequest req;
    req.set_shard(shard);
    req.set_replica(replica);
    req.set_address(address);
    req.set_incarnation(incarnation);
    req.set_num_shards(num_shards);
    *req.mutable_map() = map;
    for (const auto& chain : map.chains()) {
      if (chain.shard() != shard) continue;
      for (int i = 0; i < chain.members_size(); ++i) {
        const auto& m = chain.members(i);
        if (m.replica() != replica || m.incarnation() != incarnation) continue;
        const bool active = m.state() == dtrain::kvstore::v1::REPLICA_ACTIVE;
        req.set_has_state(active);
        if (active && !never_catch_up && i + 1 < chain.members_size() &&
            chain.members(i + 1).state() == dtrain::kvstore::v1::REPLICA_JOINING) {
          req.set_caught_up_replica(chain.members(i + 1).replica());
          req.set_caught_up_incarnation(chain.members(i + 1).incarnation());
        }
      }
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    KvstoreHeartbeatReply reply;
    grpc::Status s = stub->KvstoreHeartbeat(&ctx, req, &reply);
    if (s.ok()) {
      if (reply.map().version() >= map.version()) map = reply.map();
      if (reply.heartbeat_interval_ms() > 0) {
        interval = absl::Milliseconds(reply.heartbeat_interval_ms());
      }
    } else {
      DT_LOG(WARNING) << "KvstoreHeartbeat: " << s.error_message();
    }
    absl::SleepFor(interval);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::string> flags = ParseFlags(argc, argv);
  const bool kvstore = flags.count("shard_index") > 0;
  const std::string dir = kvstore ? flags.count("data_dir") ? flags.at("data_dir") : ""
                          : flags.count("work_dir") ? flags.at("work_dir")
                                                    : "";
  if (dir.empty()) {
    std::fprintf(stderr, "fake_cluster_process: needs --data_dir or --work_dir\n");
    return 2;
  }
  {
    std::ofstream out(dir + "/argv");
    for (int i = 1; i < argc; ++i) out << argv[i] << "\n";
  }
  // Mutual TLS as `cluster up` configures its processes (--ca/--cert/--key),
  // or plain text (--insecure).
  if (flags.count("ca") && flags.count("cert") && flags.count("key")) {
    absl::StatusOr<std::shared_ptr<const dtrain::rpc::Credentials>> credentials =
        dtrain::rpc::Credentials::Load({flags.at("ca"), flags.at("cert"), flags.at("key")});
    if (!credentials.ok()) {
      std::fprintf(stderr, "fake_cluster_process: %s\n", credentials.status().ToString().c_str());
      return 2;
    }
    dtrain::rpc::SetDefaultCredentials(*std::move(credentials));
  }
  dtrain::ShutdownSignal& shutdown = dtrain::ShutdownSignal::Install();
  dtrain::rpc::ServerOptions o;
  o.service = kvstore ? "kvstore" : "trainer";
  if (kvstore) {
    o.listen = flags.count("listen") ? flags.at("listen") : "127.0.0.1:0";
    if (flags.count("port_file")) o.port_file = flags.at("port_file");
  }
  if (flags.count("metrics_listen")) o.metrics_listen = flags.at("metrics_listen");
  if (flags.count("metrics_port_file")) o.metrics_port_file = flags.at("metrics_port_file");
  if (const char* marker = std::getenv("FAKE_PORT_TAKEN_ONCE"); kvstore && marker != nullptr) {
    const int fd = open(marker, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) close(fd);
    int port = 0;
    if (fd >= 0 && absl::SimpleAtoi(o.listen.substr(o.listen.rfind(':') + 1), &port) && port > 0) {
      const int holder = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr = {};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      if (holder < 0 || bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
          listen(holder, 1) != 0) {
        std::fprintf(stderr, "fake_cluster_process: cannot hold port %d\n", port);
        return 2;
      }
    }
  }
  dtrain::rpc::Server server(o);
  absl::Status started = server.Start();
  if (!started.ok()) {
    std::fprintf(stderr, "fake_cluster_process: %s\n", started.ToString().c_str());
    return 1;
  }
  std::atomic<bool> stop{false};
  std::thread beats;
  if (kvstore && Int(flags, "replica_index") >= 0) {
    beats = std::thread(Heartbeats, flags.count("scheduler") ? flags.at("scheduler") : "",
                        Int(flags, "shard_index"), Int(flags, "replica_index"),
                        Int(flags, "num_shards"), absl::StrCat("127.0.0.1:", server.port()), &stop);
  }
  shutdown.Wait();
  stop = true;
  if (beats.joinable()) beats.join();
  server.Shutdown(absl::Seconds(1));
  return 0;
}
