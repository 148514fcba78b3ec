// trainctl cluster: starts, checks and stops a local cluster.
//
//   trainctl cluster up --dir=DIR [--trainers=N] [--kvstore_shards=M] [--kvstore_replicas=R]
//                       [--devices_per_trainer=K] [--restart=always|never]
//   trainctl cluster status --dir=DIR
//   trainctl cluster down --dir=DIR [--grace_s=15]
//
// `up` starts a supervisor (this binary, `trainctl cluster supervise`, in a
// session of its own, its output in DIR/supervisor.log) and waits until it
// has started everything or failed. The supervisor starts kvstore shards
// (kvstore-0..M-1), the scheduler and trainer daemons (trainer-0..N-1), each
// in its own session (setsid) with its own data directory DIR/<name> and its
// output appended to DIR/<name>.log.
//
// Replicated shards (--kvstore_replicas=R > 1, the default 2 whenever
// --kvstore_shards > 0): the scheduler starts first, then M * R kvstore
// servers kvstore-<i>-<j> (shard i, replica j; data in DIR/kvstore-<i>-<j>)
// with --shard_index=i --replica_index=j --num_shards=M --scheduler=<its
// address>; they heartbeat to the scheduler, which owns the shard map
// (chains of replicas). Trainers get --kvstore=<all M * R addresses,
// shard-major: shard i replica j at index i * R + j> --kvstore_replicas=R.
// The cluster is reported up only once the scheduler's map
// (JobService.GetKvstoreMap) shows M chains with R ACTIVE replicas each,
// within --start_timeout_s (else `up` fails saying which shard lacks which
// replica). cluster.json gives these processes role "kvstore" and the
// fields "shard" and "replica". With R = 1 the shards are kvstore-<i>,
// started before the scheduler, as unreplicated servers (--shard_index=i
// only) that never heartbeat.
//
// Servers listen on 127.0.0.1, on free ports picked below the ephemeral
// range (so that a restarted server finds its port free again), and write
// their ports to DIR/<name>.port; their Prometheus endpoints are read from
// their logs. The binaries are found next to
// trainctl (bazel-bin layout: ../scheduler/scheduler_server,
// ../trainer/trainer, ../kvstore/kvstore_server relative to trainctl's
// directory, via argv[0] and then /proc/self/exe) unless --scheduler_bin,
// --trainer_bin or --kvstore_bin say otherwise. When everything started,
// DIR/cluster.json lists the processes (pid, address, metrics URL, data
// directory, log, restarts, last exit) and the supervisor's pid, and `up`
// prints them; if one fails to start, the supervisor stops the ones already
// started and exits, and `up` fails with its error (naming the log to read).
//
// The supervisor is the parent of the processes, as a Deployment's
// controller would be (libs/base/supervisor.h): with --restart=always (the
// default) a process that
// exits is started again with the same flags, on the same ports (the
// scheduler's and the kvstore shards' addresses are in cluster.json and in
// the trainers' flags), data directory and log, after a backoff of 1 s that
// doubles up to 30 s and starts over once a process ran for a minute. Each
// exit and restart is recorded in cluster.json (rewritten atomically) and
// logged. With --restart=never the exit is recorded and the process stays
// down; the supervisor exits when none is left.
//
// Mutual TLS (unless `up --insecure`): `up` makes DIR/certs with a CA
// (`trainctl certs init`: ca.pem, the scheduler's, the kvstore shards' and
// an admin certificate, cluster.secret) the first time, and a certificate
// trainer-<i> (role trainer) for each trainer; every process gets --ca,
// --cert and --key, and `up` prints the export lines of DTRAIN_SCHEDULER,
// DTRAIN_CA, DTRAIN_CERT and DTRAIN_KEY (the admin credential) a shell needs
// to use the cluster. The scheduler and the shards share certs/cluster.secret:
// KVSTORE assignments carry a per-attempt kvstore token, and a shard serves
// a trainer only the job its token names. `up --insecure` starts everything with --insecure,
// leaves DIR/insecure as a mark for `status`, and prints DTRAIN_INSECURE=1.
// `status` and the supervisor call the servers with the admin credential.
//
// `status` shows each process (alive and still one of this cluster's
// processes; servers answering Admin.Ping), its restarts and last exit
// ("killed by SIGKILL 12s ago"), whether the supervisor runs, and, for
// replicated kvstore servers, their state and role in the scheduler's shard
// map ("ACTIVE head", "JOINING joining", "not in the map"). `down`
// stops the supervisor first (so nothing is restarted), then sends SIGTERM
// to every process group (trainers first), waits up to --grace_s, sends
// SIGKILL to what is left, reports what happened to each, and removes
// cluster.json (logs and data directories stay).
#include "services/trainctl/cluster.h"

#include <errno.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "libs/base/files.h"
#include "libs/base/grpc_status.h"
#include "libs/base/ports.h"
#include "libs/base/subprocess.h"
#include "libs/base/supervisor.h"
#include "libs/rpc/credentials.h"
#include "libs/security/certs.h"
#include "protos/admin.grpc.pb.h"
#include "protos/scheduler.grpc.pb.h"
#include "services/trainctl/shard_map_view.h"

namespace dtrain {
namespace trainctl {
namespace {

struct Proc {
  std::string name;  // scheduler, kvstore-0, trainer-0, ...
  std::string role;  // scheduler, kvstore or trainer
  // Replicated kvstore servers: their shard and replica (-1: none).
  int shard = -1;
  int replica = -1;
  int pid = -1;
  std::string address;      // servers: 127.0.0.1:port
  std::string metrics_url;  // servers: http://127.0.0.1:port/metrics
  std::string data_dir;
  std::string log;
  // Kept by the supervisor (cluster.json): restarts so far, how the last
  // run ended and when, and running / restarting / exited.
  int restarts = 0;
  std::string last_exit;
  int64_t last_exit_unix_ms = 0;
  std::string state = "running";
};

// What cluster.json holds.
struct Cluster {
  std::vector<Proc> procs;
  int supervisor_pid = -1;  // -1: none (a cluster.json of an older trainctl)
  std::string restart = "always";
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return path.substr(0, slash);
}

// The binary `rel` (e.g. "scheduler/scheduler_server") next to trainctl.
absl::StatusOr<std::string> FindBinary(const std::string& flag, const std::string& rel,
                                       const std::string& argv0) {
  if (!flag.empty()) {
    if (access(flag.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(flag, " is not an executable"));
    }
    return flag;
  }
  std::vector<std::string> tried;
  if (argv0.find('/') != std::string::npos) {
    tried.push_back(absl::StrCat(Dirname(argv0), "/../", rel));
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    tried.push_back(absl::StrCat(Dirname(exe), "/../", rel));
  }
  for (const std::string& p : tried) {
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return absl::NotFoundError(absl::StrCat("cannot find ", rel, " next to trainctl (tried ",
                                          absl::StrJoin(tried, ", "),
                                          "); build it or pass its path with a flag"));
}

// How a cluster process runs: a session of its own, stdout and stderr
// appended to `log`.
SubprocessOptions ProcessOptions(const std::vector<std::string>& argv, const std::string& log) {
  SubprocessOptions options;
  options.argv = argv;
  options.output_file = log;
  options.new_session = true;
  // The processes of a local cluster share the machine's cores: OpenMP
  // threads that spin while waiting (libgomp's default) slow each other
  // down several-fold; sleeping waits cost little (unless the user chose).
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) options.env = {{"OMP_WAIT_POLICY", "PASSIVE"}};
  return options;
}

// Alive and not a zombie (an orphan may wait a while to be reaped).
bool Alive(int pid) {
  if (pid <= 0) return false;
  int status;
  if (waitpid(pid, &status, WNOHANG) == pid) return false;  // our child, now reaped
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  size_t paren = stat.rfind(')');
  if (paren != std::string::npos && paren + 2 < stat.size()) {
    char state = stat[paren + 2];
    if (state == 'Z' || state == 'X') return false;
  }
  return true;
}

// Alive and still ours: its command line mentions the cluster directory.
bool AliveAndOurs(const Proc& p) {
  if (!Alive(p.pid)) return false;
  std::string cmdline = ReadFile(absl::StrCat("/proc/", p.pid, "/cmdline"));
  if (cmdline.empty()) return true;  // no /proc access: trust the pid
  return cmdline.find(p.data_dir) != std::string::npos;
}

void Signal(int pid, int sig) {
  if (kill(-pid, sig) != 0) kill(pid, sig);  // its process group, else itself
}

// Waits until `p` wrote its port file (and its metrics port to its log).
// `alive` tells whether it still runs.
absl::Status WaitServing(Proc* p, const std::string& port_file, absl::Duration timeout,
                         const std::function<bool()>& alive) {
  const absl::Time deadline = absl::Now() + timeout;
  int port = 0;
  while (absl::Now() < deadline) {
    std::string text(absl::StripAsciiWhitespace(ReadFile(port_file)));
    if (!text.empty() && absl::SimpleAtoi(text, &port) && port > 0) break;
    if (!alive()) {
      return absl::UnavailableError(absl::StrCat(p->name, " exited while starting; see ", p->log));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (port <= 0) {
    return absl::DeadlineExceededError(absl::StrCat(
        p->name, " did not start within ", absl::FormatDuration(timeout), "; see ", p->log));
  }
  p->address = absl::StrCat("127.0.0.1:", port);
  // The server logs "metrics on port N" before it writes its port file.
  const std::string log = ReadFile(p->log);
  const std::string key = "metrics on port ";
  size_t at = log.rfind(key);
  int metrics = 0;
  if (at != std::string::npos) {
    size_t start = at + key.size(), end = start;
    while (end < log.size() && log[end] >= '0' && log[end] <= '9') ++end;
    if (absl::SimpleAtoi(log.substr(start, end - start), &metrics) && metrics > 0) {
      p->metrics_url = absl::StrCat("http://127.0.0.1:", metrics, "/metrics");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<admin::PingReply> Ping(const std::string& address) {
  auto stub = admin::Admin::NewStub(dtrain::rpc::NewChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  admin::PingRequest req;
  req.set_payload("trainctl cluster status");
  admin::PingReply reply;
  absl::Status s = FromGrpcStatus(stub->Ping(&ctx, req, &reply), "Admin.Ping");
  if (!s.ok()) return s;
  return reply;
}

std::string JsonOf(const google::protobuf::Message& m, bool multiline) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = multiline;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

google::protobuf::Struct ToStruct(const std::string& dir, const Cluster& c) {
  google::protobuf::Struct root;
  (*root.mutable_fields())["dir"].set_string_value(dir);
  (*root.mutable_fields())["supervisor_pid"].set_number_value(c.supervisor_pid);
  (*root.mutable_fields())["restart"].set_string_value(c.restart);
  auto* list = (*root.mutable_fields())["processes"].mutable_list_value();
  for (const Proc& p : c.procs) {
    auto* f = list->add_values()->mutable_struct_value()->mutable_fields();
    (*f)["name"].set_string_value(p.name);
    (*f)["role"].set_string_value(p.role);
    if (p.shard >= 0) {
      (*f)["shard"].set_number_value(p.shard);
      (*f)["replica"].set_number_value(p.replica);
    }
    (*f)["pid"].set_number_value(p.pid);
    if (!p.address.empty()) (*f)["address"].set_string_value(p.address);
    if (!p.metrics_url.empty()) (*f)["metrics_url"].set_string_value(p.metrics_url);
    (*f)["data_dir"].set_string_value(p.data_dir);
    (*f)["log"].set_string_value(p.log);
    (*f)["restarts"].set_number_value(p.restarts);
    (*f)["state"].set_string_value(p.state);
    if (!p.last_exit.empty()) {
      (*f)["last_exit"].set_string_value(p.last_exit);
      (*f)["last_exit_unix_ms"].set_number_value(static_cast<double>(p.last_exit_unix_ms));
    }
  }
  return root;
}

absl::StatusOr<Cluster> LoadCluster(const std::string& dir) {
  const std::string path = dir + "/cluster.json";
  if (!Exists(path)) {
    return absl::NotFoundError(absl::StrCat("no cluster in ", dir, " (no ", path, ")"));
  }
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(ReadFile(path), &root).ok()) {
    return absl::DataLossError(absl::StrCat(path, " is not valid JSON"));
  }
  Cluster c;
  auto it = root.fields().find("processes");
  if (it == root.fields().end()) return absl::DataLossError(path + " has no processes");
  if (auto sup = root.fields().find("supervisor_pid"); sup != root.fields().end()) {
    c.supervisor_pid = static_cast<int>(sup->second.number_value());
  }
  if (auto r = root.fields().find("restart"); r != root.fields().end()) {
    c.restart = r->second.string_value();
  }
  for (const auto& v : it->second.list_value().values()) {
    const auto& f = v.struct_value().fields();
    auto str = [&](const char* k) {
      auto i = f.find(k);
      return i == f.end() ? std::string() : i->second.string_value();
    };
    auto num = [&](const char* k, double fallback) {
      auto i = f.find(k);
      return i == f.end() ? fallback : i->second.number_value();
    };
    Proc p;
    p.name = str("name");
    p.role = str("role");
    p.shard = static_cast<int>(num("shard", -1));
    p.replica = static_cast<int>(num("replica", -1));
    p.pid = static_cast<int>(num("pid", -1));
    p.address = str("address");
    p.metrics_url = str("metrics_url");
    p.data_dir = str("data_dir");
    p.log = str("log");
    p.restarts = static_cast<int>(num("restarts", 0));
    p.state = str("state");
    p.last_exit = str("last_exit");
    p.last_exit_unix_ms = static_cast<int64_t>(num("last_exit_unix_ms", 0));
    c.procs.push_back(p);
  }
  return c;
}

// The supervisor of `c` runs (and is one: its command line names the
// supervise command and the cluster directory).
bool SupervisorAlive(const Cluster& c, const std::string& dir) {
  if (!Alive(c.supervisor_pid)) return false;
  std::string cmdline = ReadFile(absl::StrCat("/proc/", c.supervisor_pid, "/cmdline"));
  if (cmdline.empty()) return true;  // no /proc access: trust the pid
  return cmdline.find("supervise") != std::string::npos && cmdline.find(dir) != std::string::npos;
}

// "12s ago", "3m ago", "2h ago".
std::string Ago(int64_t unix_ms, absl::Time now) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(now - absl::FromUnixMillis(unix_ms)));
  if (s < 120) return absl::StrCat(s, "s ago");
  if (s < 2 * 3600) return absl::StrCat(s / 60, "m ago");
  return absl::StrCat(s / 3600, "h ago");
}

// Stops `procs` (trainers first): SIGTERM, up to `grace`, then SIGKILL.
// Returns one line per process.
std::vector<std::string> StopAll(std::vector<Proc> procs, absl::Duration grace) {
  std::stable_sort(procs.begin(), procs.end(), [](const Proc& a, const Proc& b) {
    auto rank = [](const Proc& p) {
      return p.role == "trainer" ? 0 : p.role == "scheduler" ? 1 : 2;
    };
    return rank(a) < rank(b);
  });
  std::vector<std::string> report(procs.size());
  std::vector<bool> pending(procs.size(), false);
  for (size_t i = 0; i < procs.size(); ++i) {
    if (AliveAndOurs(procs[i])) {
      Signal(procs[i].pid, SIGTERM);
      pending[i] = true;
    } else {
      report[i] = absl::StrCat(procs[i].name, " (pid ", procs[i].pid, "): was not running");
    }
  }
  const absl::Time start = absl::Now(), deadline = start + grace;
  for (;;) {
    bool any = false;
    for (size_t i = 0; i < procs.size(); ++i) {
      if (!pending[i]) continue;
      if (!Alive(procs[i].pid)) {
        pending[i] = false;
        report[i] = absl::StrCat(
            procs[i].name, " (pid ", procs[i].pid, "): stopped after SIGTERM (",
            absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(10))), ")");
      } else {
        any = true;
      }
    }
    if (!any || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  for (size_t i = 0; i < procs.size(); ++i) {
    if (!pending[i]) continue;
    Signal(procs[i].pid, SIGKILL);
    const absl::Time kill_deadline = absl::Now() + absl::Seconds(5);
    while (Alive(procs[i].pid) && absl::Now() < kill_deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    report[i] = absl::StrCat(procs[i].name, " (pid ", procs[i].pid, "): ",
                             Alive(procs[i].pid) ? "still running after SIGKILL"
                                                 : "killed (SIGKILL) after the grace period");
  }
  return report;
}

void PrintProcs(const std::vector<Proc>& procs) {
  for (const Proc& p : procs) {
    std::printf("%-12s pid %-7d %-21s %s\n", p.name.c_str(), p.pid,
                p.address.empty() ? "-" : p.address.c_str(),
                p.metrics_url.empty() ? "" : p.metrics_url.c_str());
  }
}

void PrintError(const absl::Status& s) {
  std::fprintf(stderr, "trainctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
               std::string(s.message()).c_str());
}

// "127.0.0.1:<a free port below the ephemeral range>" (port 0 if none).
// (ports.h: a restarted server finds its port free again.)
std::string LoopbackListen() { return absl::StrCat("127.0.0.1:", PickRestartablePort()); }

// A line of the supervisor's log (its stdout: <dir>/supervisor.log).
void SupervisorLog(const std::string& line) {
  std::printf("%s supervisor: %s\n",
              absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(), absl::LocalTimeZone()).c_str(),
              line.c_str());
  std::fflush(stdout);
}

// `argv` with the flag --<name>=... replaced by --<name>=<value>.
void SetFlag(std::vector<std::string>* argv, const std::string& name, const std::string& value) {
  const std::string prefix = absl::StrCat("--", name, "=");
  for (std::string& a : *argv) {
    if (absl::StartsWith(a, prefix)) a = prefix + value;
  }
}

// A process started by StartAll, and how to start it again (with the ports
// it got the first time).
struct Child {
  std::unique_ptr<Subprocess> process;
  std::vector<std::string> argv;
  absl::Time started;
};

volatile sig_atomic_t g_stop_supervisor = 0;
void OnStopSignal(int) { g_stop_supervisor = 1; }

// Waits until the scheduler's kvstore shard map shows `shards` chains with
// `replicas` ACTIVE members each. Fails when a kvstore process exits, or
// after `timeout`, naming what is missing and the logs to read.
absl::Status WaitForShardMap(const std::string& scheduler, int shards, int replicas,
                             absl::Duration timeout, const std::vector<Proc>& procs,
                             const std::vector<Child>& children) {
  auto stub = scheduler::v1::JobService::NewStub(rpc::NewChannel(scheduler));
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::UnavailableError("the scheduler did not answer GetKvstoreMap");
  kvstore::v1::ShardMap map;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
    kvstore::v1::ShardMap got;
    absl::Status call = FromGrpcStatus(
        stub->GetKvstoreMap(&ctx, kvstore::v1::GetShardMapRequest(), &got), "GetKvstoreMap");
    if (call.ok()) {
      map = got;
      last = ChainsReady(map, shards, replicas);
      if (last.ok()) return last;
    } else {
      last = call;
    }
    for (size_t i = 0; i < procs.size(); ++i) {
      if (procs[i].role == "kvstore" && !children[i].process->Running()) {
        return absl::UnavailableError(
            absl::StrCat(procs[i].name, " exited while joining its chain; see ", procs[i].log));
      }
    }
    if (absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  // The replicas not ACTIVE in the last map, and their logs.
  std::vector<std::string> logs;
  for (const Proc& p : procs) {
    if (p.role != "kvstore" || p.shard < 0) continue;
    bool active = false;
    for (const auto& chain : map.chains()) {
      for (const auto& m : chain.members()) {
        active |= chain.shard() == p.shard && m.replica() == p.replica &&
                  m.state() == kvstore::v1::REPLICA_ACTIVE;
      }
    }
    if (!active) logs.push_back(p.log);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the kvstore shards did not form ", shards, " chains of ", replicas,
                   " ACTIVE replicas within ", absl::FormatDuration(timeout), " (", last.message(),
                   "); see ", logs.empty() ? "the kvstore logs" : absl::StrJoin(logs, ", "),
                   " and the scheduler's log (`trainctl kvstore` shows the map)"));
}

// Starts the kvstore shards, the scheduler and the trainers (in that order:
// each needs the addresses of the ones before), appending to `procs` and
// `children` as it goes (so that the caller can stop them on failure).
absl::Status StartAll(const ClusterOptions& o, const std::string& dir, std::vector<Proc>* procs,
                      std::vector<Child>* children) {
  const absl::Duration timeout = absl::Seconds(o.start_timeout_s);
  // Starts one process; servers: waits until they serve.
  auto start = [&](Proc p, std::vector<std::string> argv, bool server) -> absl::Status {
    p.data_dir = absl::StrCat(dir, "/", p.name);
    p.log = absl::StrCat(dir, "/", p.name, ".log");
    const std::string port_file = absl::StrCat(dir, "/", p.name, ".port");
    std::remove(port_file.c_str());
    mkdir(p.data_dir.c_str(), 0755);
    if (o.insecure) {
      argv.push_back("--insecure");
    } else {
      // kvstore-3 holds the shards' certificate "kvstore"; trainer-i its own.
      const std::string cert = p.role == "trainer" ? p.name : p.role;
      argv.push_back(absl::StrCat("--ca=", dir, "/certs/ca.pem"));
      argv.push_back(absl::StrCat("--cert=", dir, "/certs/", cert, ".pem"));
      argv.push_back(absl::StrCat("--key=", dir, "/certs/", cert, ".key"));
      // Per-job kvstore tokens: the scheduler mints, the shards check.
      if (p.role != "trainer") {
        argv.push_back(absl::StrCat("--cluster_secret_file=", dir, "/certs/cluster.secret"));
      }
    }
    if (server) {
      argv.push_back("--listen=" + LoopbackListen());
      argv.push_back("--port_file=" + port_file);
      argv.push_back("--metrics_listen=" + LoopbackListen());
    }
    Child c;
    absl::Status s;
    for (int attempt = 1;; ++attempt) {
      const size_t log_start = ReadFile(p.log).size();
      auto child = Subprocess::Start(ProcessOptions(argv, p.log));
      if (!child.ok()) return child.status();
      c.process = *std::move(child);
      c.started = absl::Now();
      p.pid = c.process->pid();
      Subprocess* sp = c.process.get();
      s = server ? WaitServing(&p, port_file, timeout, [sp] { return sp->Running(); })
                 : absl::OkStatus();
      // A port checked free can be taken before the server binds it: by
      // another cluster's server restarting on the port it had (ports.h),
      // or another `cluster up` that picked the same one. Nobody has this
      // server's address yet, so a first start takes other ports and tries
      // again.
      if (s.ok() || !server || !absl::IsUnavailable(s) || attempt == 3 ||
          ReadFile(p.log).find("Address already in use", log_start) == std::string::npos) {
        break;
      }
      SupervisorLog(absl::StrCat(
          p.name, ": a port it was given was taken before it listened; trying other ports"));
      c.process->Wait(absl::Seconds(5)).status().IgnoreError();
      SetFlag(&argv, "listen", LoopbackListen());
      SetFlag(&argv, "metrics_listen", LoopbackListen());
    }
    if (s.ok() && server) {
      // Started again, it listens where it listened the first time.
      SetFlag(&argv, "listen", p.address);
      const std::string metrics_prefix = "http://";
      if (absl::StartsWith(p.metrics_url, metrics_prefix)) {
        std::string hostport = p.metrics_url.substr(metrics_prefix.size());
        hostport = hostport.substr(0, hostport.find('/'));
        SetFlag(&argv, "metrics_listen", hostport);
      }
    }
    c.argv = argv;
    procs->push_back(p);
    children->push_back(std::move(c));
    return s;
  };
  // Checkpoints go to a directory every trainer shares, so a job whose
  // trainer is lost resumes on the others.
  mkdir(absl::StrCat(dir, "/checkpoints").c_str(), 0755);
  absl::Status s;
  const int replicas = o.kvstore_replicas > 0 ? o.kvstore_replicas : 2;
  // Unreplicated shards start first (the scheduler does not know them);
  // replicated ones after the scheduler, whose address they need.
  for (int i = 0; s.ok() && replicas == 1 && i < o.kvstore_shards; ++i) {
    Proc p;
    p.name = absl::StrCat("kvstore-", i);
    p.role = "kvstore";
    s = start(p,
              {o.kvstore_binary, absl::StrCat("--data_dir=", dir, "/", p.name),
               absl::StrCat("--shard_index=", i)},
              true);
  }
  std::string scheduler_address;
  if (s.ok()) {
    Proc p;
    p.name = "scheduler";
    p.role = "scheduler";
    std::vector<std::string> argv = {o.scheduler_binary,
                                     absl::StrCat("--data_dir=", dir, "/scheduler")};
    if (o.heartbeat_timeout_s > 0) {
      argv.push_back(absl::StrCat("--heartbeat_timeout_s=", o.heartbeat_timeout_s));
    }
    if (o.max_attempts > 0) argv.push_back(absl::StrCat("--max_attempts=", o.max_attempts));
    if (o.max_model_bytes > 0) {
      argv.push_back(absl::StrCat("--max_model_bytes=", o.max_model_bytes));
    }
    if (!o.recover_in_place) argv.push_back("--recover_in_place=false");
    if (!o.queues_file.empty()) argv.push_back("--queues=" + o.queues_file);
    s = start(p, argv, true);
    if (s.ok()) scheduler_address = procs->back().address;
  }
  for (int i = 0; s.ok() && replicas > 1 && i < o.kvstore_shards; ++i) {
    for (int j = 0; s.ok() && j < replicas; ++j) {
      Proc p;
      p.name = absl::StrCat("kvstore-", i, "-", j);
      p.role = "kvstore";
      p.shard = i;
      p.replica = j;
      s = start(
          p,
          {o.kvstore_binary, absl::StrCat("--data_dir=", dir, "/", p.name),
           absl::StrCat("--shard_index=", i), absl::StrCat("--replica_index=", j),
           absl::StrCat("--num_shards=", o.kvstore_shards), "--scheduler=" + scheduler_address},
          true);
    }
  }
  std::vector<std::string> devices(o.devices_per_trainer);
  for (int d = 0; d < o.devices_per_trainer; ++d) {
    devices[d] = o.devices_per_trainer == 1 ? "cpu" : absl::StrCat("cpu:", d);
  }
  std::vector<std::string> kvstore_addresses;
  for (const Proc& p : *procs) {
    if (p.role == "kvstore") kvstore_addresses.push_back(p.address);
  }
  for (int i = 0; s.ok() && i < o.trainers; ++i) {
    Proc p;
    p.name = absl::StrCat("trainer-", i);
    p.role = "trainer";
    std::vector<std::string> argv = {
        o.trainer_binary,
        "--scheduler=" + scheduler_address,
        "--name=" + p.name,
        "--devices=" + absl::StrJoin(devices, ","),
        absl::StrCat("--work_dir=", dir, "/", p.name),
        absl::StrCat("--checkpoint_dir=", dir, "/checkpoints"),
        "--collective_host=127.0.0.1",
        "--metrics_listen=" + LoopbackListen(),
        "--kvstore=" + absl::StrJoin(kvstore_addresses, ","),
        absl::StrCat("--metrics_port_file=", dir, "/", p.name, ".metrics_port")};
    if (replicas > 1 && o.kvstore_shards > 0) {
      argv.push_back(absl::StrCat("--kvstore_replicas=", replicas));
    }
    if (!o.kvstore_data_path.empty()) {
      argv.push_back("--kvstore_data_path=" + o.kvstore_data_path);
    }
    if (!o.data_roots.empty()) argv.push_back("--data_roots=" + o.data_roots);
    s = start(p, argv, false);
  }
  if (s.ok() && o.trainers > 0) {
    // Trainers serve no gRPC port: wait for their metrics port (which also
    // shows they got past flag parsing), or for them to exit.
    absl::Time deadline = absl::Now() + timeout;
    for (size_t i = 0; i < procs->size() && s.ok(); ++i) {
      Proc& p = (*procs)[i];
      Child& c = (*children)[i];
      if (p.role != "trainer") continue;
      const std::string file = absl::StrCat(dir, "/", p.name, ".metrics_port");
      for (;;) {
        std::ifstream in(file);
        int port = 0;
        if (in >> port && port > 0) {
          p.metrics_url = absl::StrCat("http://127.0.0.1:", port, "/metrics");
          SetFlag(&c.argv, "metrics_listen", absl::StrCat("127.0.0.1:", port));
          break;
        }
        if (!c.process->Running()) {
          s = absl::UnavailableError(absl::StrCat(p.name, " exited while starting; see ", p.log));
          break;
        }
        if (absl::Now() > deadline) {
          s = absl::DeadlineExceededError(
              absl::StrCat(p.name, " did not open its metrics port; see ", p.log));
          break;
        }
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
  }
  if (s.ok() && replicas > 1 && o.kvstore_shards > 0) {
    s = WaitForShardMap(scheduler_address, o.kvstore_shards, replicas, timeout, *procs, *children);
  }
  return s;
}

// `trainctl cluster supervise` (started by `up`): starts the cluster, writes
// cluster.json, then restarts what exits until SIGTERM (from `down`). Its
// output goes to DIR/supervisor.log; a start failure is its last line
// ("trainctl: CODE: message"), which `up` shows.
int Supervise(const ClusterOptions& o) {
  const std::string dir = o.dir;
  const bool always = o.restart == "always";
  Cluster cluster;
  cluster.supervisor_pid = getpid();
  cluster.restart = o.restart;
  std::vector<Child> children;
  // SIGTERM (cluster down) or SIGINT: stop supervising, leave the processes
  // to `down`. No terminal: SIGHUP is of no concern.
  signal(SIGTERM, OnStopSignal);
  signal(SIGINT, OnStopSignal);
  signal(SIGHUP, SIG_IGN);
  SupervisorLog(absl::StrCat("starting the cluster in ", dir, " (restart=", o.restart, ")"));
  absl::Status s = StartAll(o, dir, &cluster.procs, &children);
  const std::string json_path = dir + "/cluster.json";
  if (s.ok()) s = WriteFileAtomically(json_path, JsonOf(ToStruct(dir, cluster), true) + "\n");
  if (!s.ok()) {
    for (auto it = children.rbegin(); it != children.rend(); ++it) {
      if (it->process != nullptr) (void)it->process->Stop(absl::Seconds(5));
    }
    std::fflush(stdout);
    PrintError(s);
    return 1;
  }
  SupervisorLog("all processes started");
  SupervisorOptions so;  // 1 s doubling to 30 s, reset after a minute up
  so.restart = always ? RestartPolicy::kAlways : RestartPolicy::kNever;
  Supervisor supervisor(so);
  for (size_t i = 0; i < children.size(); ++i) {
    Child& c = children[i];
    supervisor.Adopt(cluster.procs[i].name, std::move(c.process),
                     ProcessOptions(c.argv, cluster.procs[i].log), c.started);
  }
  while (!g_stop_supervisor) {
    std::vector<std::string> events = supervisor.Poll(absl::Now());
    if (!events.empty()) {
      for (const std::string& e : events) SupervisorLog(e);
      for (size_t i = 0; i < cluster.procs.size(); ++i) {
        const SupervisedProcess& sp = supervisor.processes()[i];
        Proc& p = cluster.procs[i];
        p.pid = sp.pid;
        p.restarts = sp.restarts;
        p.last_exit = sp.last_exit;
        p.last_exit_unix_ms = p.last_exit.empty() ? 0 : absl::ToUnixMillis(sp.last_exit_time);
        p.state = sp.state == SupervisedProcess::State::kRunning      ? "running"
                  : sp.state == SupervisedProcess::State::kRestarting ? "restarting"
                                                                      : "exited";
      }
      absl::Status w = WriteFileAtomically(json_path, JsonOf(ToStruct(dir, cluster), true) + "\n");
      if (!w.ok()) SupervisorLog(absl::StrCat("cannot update cluster.json: ", w.message()));
    }
    if (!supervisor.AnyLeft()) {
      SupervisorLog("every process exited; nothing left to supervise");
      return 0;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  // `cluster down` stops the processes (by the pids in cluster.json).
  supervisor.ReleaseAll();
  SupervisorLog("stopped supervising (signal); the processes are left to `cluster down`");
  return 0;
}

int Up(const ClusterOptions& o) {
  if (o.trainers < 0 || o.trainers > 64) {
    std::fprintf(stderr, "trainctl: --trainers must be in 0..64\n");
    return 2;
  }
  if (o.kvstore_shards < 0 || o.kvstore_shards > 64) {
    std::fprintf(stderr, "trainctl: --kvstore_shards must be in 0..64\n");
    return 2;
  }
  if (o.kvstore_replicas < 0 || o.kvstore_replicas > 8) {
    std::fprintf(stderr, "trainctl: --kvstore_replicas must be in 1..8 (0: 2 with shards)\n");
    return 2;
  }
  if (o.devices_per_trainer < 1 || o.devices_per_trainer > 64) {
    std::fprintf(stderr, "trainctl: --devices_per_trainer must be in 1..64\n");
    return 2;
  }
  if (o.restart != "always" && o.restart != "never") {
    std::fprintf(stderr, "trainctl: --restart must be always or never, not '%s'\n",
                 o.restart.c_str());
    return 2;
  }
  auto fail = [](const absl::Status& s) {
    PrintError(s);
    return 1;
  };
  const int replicas = o.kvstore_replicas > 0 ? o.kvstore_replicas : 2;
  if (mkdir(o.dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return fail(absl::InternalError(absl::StrCat("cannot create ", o.dir, ": ", strerror(errno))));
  }
  char real[PATH_MAX];
  if (realpath(o.dir.c_str(), real) == nullptr) {
    return fail(absl::InternalError(absl::StrCat("cannot resolve ", o.dir, ": ", strerror(errno))));
  }
  const std::string dir = real;
  const std::string json_path = dir + "/cluster.json";
  if (auto old = LoadCluster(dir); old.ok()) {
    if (SupervisorAlive(*old, dir)) {
      return fail(absl::AlreadyExistsError(absl::StrCat(
          "a cluster is already up in ", dir, " (its supervisor, pid ", old->supervisor_pid,
          ", is running); run `trainctl cluster down --dir=", dir, "` first")));
    }
    for (const Proc& p : old->procs) {
      if (AliveAndOurs(p)) {
        return fail(absl::AlreadyExistsError(
            absl::StrCat("a cluster is already up in ", dir, " (", p.name, " pid ", p.pid,
                         " is running); run `trainctl cluster down --dir=", dir, "` first")));
      }
    }
  }
  std::remove(json_path.c_str());  // a stale one (nothing of it runs)
  const std::string certs = dir + "/certs";
  const std::string insecure_mark = dir + "/insecure";
  if (o.insecure) {
    if (absl::Status s = WriteFileAtomically(insecure_mark, "plain text (cluster up --insecure)\n");
        !s.ok()) {
      return fail(s);
    }
  } else {
    std::remove(insecure_mark.c_str());
    if (!Exists(certs + "/ca.pem")) {
      if (absl::Status s = security::InitCertDir(certs, {}); !s.ok()) return fail(s);
    }
    for (int i = 0; i < o.trainers; ++i) {
      security::CertRequest r;
      r.name = absl::StrCat("trainer-", i);
      r.role = security::Role::kTrainer;
      if (Exists(absl::StrCat(certs, "/", r.name, ".pem"))) continue;
      if (absl::Status s = security::IssueCert(certs, r); !s.ok()) return fail(s);
    }
  }
  auto absolute = [](absl::StatusOr<std::string> path) -> absl::StatusOr<std::string> {
    if (!path.ok()) return path;
    char buf[PATH_MAX];
    if (realpath(path->c_str(), buf) == nullptr) return path;
    return std::string(buf);
  };
  auto scheduler_bin =
      absolute(FindBinary(o.scheduler_binary, "scheduler/scheduler_server", o.argv0));
  if (!scheduler_bin.ok()) return fail(scheduler_bin.status());
  auto trainer_bin = absolute(FindBinary(o.trainer_binary, "trainer/trainer", o.argv0));
  if (o.trainers > 0 && !trainer_bin.ok()) return fail(trainer_bin.status());
  auto kvstore_bin = absolute(FindBinary(o.kvstore_binary, "kvstore/kvstore_server", o.argv0));
  if (o.kvstore_shards > 0 && !kvstore_bin.ok()) return fail(kvstore_bin.status());
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return fail(absl::InternalError("cannot find trainctl itself (/proc/self/exe)"));
  self[n] = '\0';

  // The supervisor: this binary in the hidden mode `cluster supervise`.
  std::vector<std::string> argv = {
      self,
      "cluster",
      "supervise",
      "--dir=" + dir,
      absl::StrCat("--trainers=", o.trainers),
      absl::StrCat("--kvstore_shards=", o.kvstore_shards),
      absl::StrCat("--kvstore_replicas=", replicas),
      absl::StrCat("--devices_per_trainer=", o.devices_per_trainer),
      "--scheduler_bin=" + *scheduler_bin,
      absl::StrCat("--start_timeout_s=", o.start_timeout_s),
      absl::StrCat("--heartbeat_timeout_s=", o.heartbeat_timeout_s),
      "--restart=" + o.restart,
  };
  if (o.insecure) argv.push_back("--insecure");
  if (o.max_attempts > 0) argv.push_back(absl::StrCat("--max_attempts=", o.max_attempts));
  if (o.max_model_bytes > 0) argv.push_back(absl::StrCat("--max_model_bytes=", o.max_model_bytes));
  if (!o.recover_in_place) argv.push_back("--recover_in_place=false");
  if (!o.queues_file.empty()) {
    auto queues = absolute(o.queues_file);
    if (!queues.ok()) return fail(queues.status());
    argv.push_back("--queues=" + *queues);
  }
  if (!o.kvstore_data_path.empty()) {
    argv.push_back("--kvstore_data_path=" + o.kvstore_data_path);
  }
  if (!o.data_roots.empty()) argv.push_back("--data_roots=" + o.data_roots);
  if (o.trainers > 0) argv.push_back("--trainer_bin=" + *trainer_bin);
  if (o.kvstore_shards > 0) argv.push_back("--kvstore_bin=" + *kvstore_bin);
  const std::string log = dir + "/supervisor.log";
  const size_t log_start = ReadFile(log).size();
  SubprocessOptions so;
  so.argv = argv;
  so.output_file = log;
  so.new_session = true;
  auto supervisor = Subprocess::Start(so);
  if (!supervisor.ok()) return fail(supervisor.status());
  // Every process gets start_timeout_s; the supervisor gives up before this.
  const absl::Time deadline =
      absl::Now() +
      absl::Seconds(o.start_timeout_s * (o.trainers + o.kvstore_shards * replicas + 3) + 10);
  for (;;) {
    if (auto c = LoadCluster(dir); c.ok() && c->supervisor_pid == (*supervisor)->pid()) {
      (*supervisor)->Release();  // it outlives `up`; `down` stops it
      google::protobuf::Struct root = ToStruct(dir, *c);
      if (o.insecure) {
        (*root.mutable_fields())["insecure"].set_bool_value(true);
      } else {
        (*root.mutable_fields())["ca"].set_string_value(certs + "/ca.pem");
        (*root.mutable_fields())["cert"].set_string_value(certs + "/admin.pem");
        (*root.mutable_fields())["key"].set_string_value(certs + "/admin.key");
      }
      if (o.json) {
        std::printf("%s\n", JsonOf(root, false).c_str());
      } else {
        std::printf("cluster up in %s (%s/cluster.json, restart=%s)\n", dir.c_str(), dir.c_str(),
                    o.restart.c_str());
        PrintProcs(c->procs);
        for (const Proc& p : c->procs) {
          if (p.role == "scheduler") {
            std::printf("export DTRAIN_SCHEDULER=%s\n", p.address.c_str());
          }
        }
        if (o.insecure) {
          std::printf("export DTRAIN_INSECURE=1\n");
        } else {
          std::printf(
              "export DTRAIN_CA=%s/ca.pem DTRAIN_CERT=%s/admin.pem DTRAIN_KEY=%s/admin.key\n",
              certs.c_str(), certs.c_str(), certs.c_str());
        }
      }
      std::fflush(stdout);
      return 0;
    }
    if (!(*supervisor)->Running()) {
      // Its error is the last "trainctl: " line of its output.
      const std::string out = ReadFile(log).substr(log_start);
      size_t at = out.rfind("trainctl: ");
      if (at != std::string::npos) {
        std::fprintf(stderr, "%s", out.substr(at).c_str());
      } else {
        std::fprintf(stderr, "trainctl: the cluster's supervisor exited; see %s\n", log.c_str());
      }
      return 1;
    }
    if (absl::Now() > deadline) {
      (void)(*supervisor)->Signal(SIGKILL);
      return fail(absl::DeadlineExceededError(
          absl::StrCat("the cluster did not start in time; see ", log)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

int Status(const ClusterOptions& o) {
  auto cluster = LoadCluster(o.dir);
  if (!cluster.ok()) {
    PrintError(cluster.status());
    return 1;
  }
  const absl::Time now = absl::Now();
  bool healthy = true;
  google::protobuf::Struct root = ToStruct(o.dir, *cluster);
  // Replicated kvstore servers: their state and role in the scheduler's map.
  std::optional<kvstore::v1::ShardMap> map;
  for (const Proc& p : cluster->procs) {
    if (p.role != "scheduler" || p.address.empty()) continue;
    if (std::none_of(cluster->procs.begin(), cluster->procs.end(),
                     [](const Proc& q) { return q.shard >= 0; })) {
      break;
    }
    auto stub = scheduler::v1::JobService::NewStub(rpc::NewChannel(p.address));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
    kvstore::v1::ShardMap got;
    if (stub->GetKvstoreMap(&ctx, kvstore::v1::GetShardMapRequest(), &got).ok()) map = got;
  }
  // "ACTIVE head", "JOINING joining", "not in the shard map" or "" (unknown).
  auto chain_state = [&map](const Proc& p) -> std::string {
    if (p.shard < 0 || !map.has_value()) return "";
    for (const auto& chain : map->chains()) {
      if (chain.shard() != p.shard) continue;
      for (int i = 0; i < chain.members_size(); ++i) {
        const auto& m = chain.members(i);
        if (m.replica() != p.replica) continue;
        return absl::StrCat(m.state() == kvstore::v1::REPLICA_ACTIVE ? "ACTIVE" : "JOINING", " ",
                            ChainRole(chain, i));
      }
    }
    return "not in the shard map";
  };
  auto* list = (*root.mutable_fields())["processes"].mutable_list_value();
  if (!o.json) {
    std::printf("%-12s %-7s %-10s %-8s %-21s %s\n", "NAME", "PID", "STATE", "RESTARTS", "ADDRESS",
                "SERVING / LAST EXIT / METRICS");
  }
  for (size_t i = 0; i < cluster->procs.size(); ++i) {
    const Proc& p = cluster->procs[i];
    const bool alive = AliveAndOurs(p);
    std::string serving = "-";
    if (alive && !p.address.empty()) {
      auto ping = Ping(p.address);
      serving = ping.ok() ? absl::StrCat("serving (", ping->service(), ", up ",
                                         ping->uptime_ms() / 1000, "s)")
                          : absl::StrCat("not serving: ", ping.status().message());
      if (!ping.ok()) healthy = false;
    }
    if (!alive) healthy = false;
    const std::string last_exit =
        p.last_exit.empty() ? "" : absl::StrCat(p.last_exit, " ", Ago(p.last_exit_unix_ms, now));
    auto* f = list->mutable_values(i)->mutable_struct_value()->mutable_fields();
    (*f)["alive"].set_bool_value(alive);
    const std::string in_chain = chain_state(p);
    if (!in_chain.empty()) (*f)["chain"].set_string_value(in_chain);
    if (!p.address.empty()) (*f)["serving"].set_string_value(serving);
    if (!last_exit.empty()) (*f)["last_exit"].set_string_value(last_exit);
    if (!o.json) {
      const std::string state = alive ? "running" : p.state == "restarting" ? "RESTARTING" : "DEAD";
      std::string detail = serving;
      if (!in_chain.empty()) {
        absl::StrAppend(&detail, "  shard ", p.shard, " replica ", p.replica, ": ", in_chain);
      }
      if (!last_exit.empty()) absl::StrAppend(&detail, "  last exit: ", last_exit);
      if (!p.metrics_url.empty()) absl::StrAppend(&detail, "  ", p.metrics_url);
      std::printf("%-12s %-7d %-10s %-8d %-21s %s\n", p.name.c_str(), p.pid, state.c_str(),
                  p.restarts, p.address.empty() ? "-" : p.address.c_str(), detail.c_str());
    }
  }
  const bool supervised = SupervisorAlive(*cluster, o.dir);
  // Without its supervisor a cluster with --restart=always heals no more.
  if (!supervised && cluster->restart == "always") healthy = false;
  (*root.mutable_fields())["supervisor_alive"].set_bool_value(supervised);
  (*root.mutable_fields())["healthy"].set_bool_value(healthy);
  if (o.json) {
    std::printf("%s\n", JsonOf(root, false).c_str());
  } else {
    if (cluster->supervisor_pid > 0) {
      std::printf("supervisor pid %d %s (restart=%s)\n", cluster->supervisor_pid,
                  supervised ? "running" : "NOT RUNNING: nothing restarts processes that exit",
                  cluster->restart.c_str());
    }
    std::printf("cluster %s\n", healthy ? "healthy" : "UNHEALTHY");
  }
  std::fflush(stdout);
  return healthy ? 0 : 1;
}

int Down(const ClusterOptions& o) {
  auto cluster = LoadCluster(o.dir);
  if (!cluster.ok()) {
    PrintError(cluster.status());
    return 1;
  }
  std::vector<std::string> report;
  const int supervisor = cluster->supervisor_pid;
  if (supervisor > 0) {
    // First the supervisor, so that nothing is restarted; then the processes
    // at the pids it last wrote.
    if (SupervisorAlive(*cluster, o.dir)) {
      kill(supervisor, SIGTERM);
      const absl::Time deadline = absl::Now() + absl::Seconds(5);
      while (Alive(supervisor) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
      if (Alive(supervisor)) {
        kill(supervisor, SIGKILL);
        const absl::Time kill_deadline = absl::Now() + absl::Seconds(5);
        while (Alive(supervisor) && absl::Now() < kill_deadline) {
          absl::SleepFor(absl::Milliseconds(20));
        }
      }
      report.push_back(absl::StrCat("supervisor (pid ", supervisor,
                                    "): ", Alive(supervisor) ? "still running" : "stopped"));
      if (auto again = LoadCluster(o.dir); again.ok()) cluster = *std::move(again);
    } else {
      report.push_back(absl::StrCat("supervisor (pid ", supervisor, "): was not running"));
    }
  }
  for (const std::string& line : StopAll(cluster->procs, absl::Seconds(o.grace_s))) {
    report.push_back(line);
  }
  bool all_gone = supervisor <= 0 || !Alive(supervisor);
  for (const Proc& p : cluster->procs) all_gone = all_gone && !Alive(p.pid);
  if (all_gone) std::remove((o.dir + "/cluster.json").c_str());
  if (o.json) {
    google::protobuf::Struct root;
    auto* list = (*root.mutable_fields())["stopped"].mutable_list_value();
    for (const auto& line : report) list->add_values()->set_string_value(line);
    (*root.mutable_fields())["all_stopped"].set_bool_value(all_gone);
    std::printf("%s\n", JsonOf(root, false).c_str());
  } else {
    for (const auto& line : report) std::printf("%s\n", line.c_str());
    std::printf("cluster in %s %s\n", o.dir.c_str(), all_gone ? "down" : "NOT fully down");
  }
  std::fflush(stdout);
  return all_gone ? 0 : 1;
}

}  // namespace

int ClusterMain(const std::vector<std::string>& args, const ClusterOptions& options) {
  if (args.size() != 1) {
    std::fprintf(stderr, "trainctl: cluster needs one of up, down, status\n");
    return 2;
  }
  if (options.dir.empty()) {
    std::fprintf(stderr, "trainctl: cluster %s needs --dir\n", args[0].c_str());
    return 2;
  }
  if (args[0] == "up") return Up(options);
  // The supervisor's command line names the directory as `up` resolved it.
  ClusterOptions resolved = options;
  char real[PATH_MAX];
  if (realpath(options.dir.c_str(), real) != nullptr) resolved.dir = real;
  // The supervisor and `status` call the servers as the cluster's admin.
  if (!resolved.insecure && !Exists(resolved.dir + "/insecure") &&
      Exists(resolved.dir + "/certs/admin.pem")) {
    const std::string certs = resolved.dir + "/certs";
    absl::StatusOr<std::shared_ptr<const rpc::Credentials>> admin =
        rpc::Credentials::Load({certs + "/ca.pem", certs + "/admin.pem", certs + "/admin.key"});
    if (!admin.ok()) {
      PrintError(admin.status());
      return 1;
    }
    rpc::SetDefaultCredentials(*admin);
  }
  if (args[0] == "status") return Status(resolved);
  if (args[0] == "down") return Down(resolved);
  if (args[0] == "supervise") return Supervise(resolved);  // started by `up`
  std::fprintf(stderr, "trainctl: unknown cluster command '%s' (up, down or status)\n",
               args[0].c_str());
  return 2;
}

}  // namespace trainctl
}  // namespace dtrain
