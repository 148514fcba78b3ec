// trainctl cluster: starts, checks and stops a local cluster.
//
//   trainctl cluster up --dir=DIR [--trainers=N] [--kvstore_shards=M] [--devices_per_trainer=K]
//   trainctl cluster status --dir=DIR
//   trainctl cluster down --dir=DIR [--grace_s=15]
//
// `up` starts kvstore shards (kvstore-0..M-1), the scheduler and trainer
// daemons (trainer-0..N-1), each in its own session (setsid) with its own
// data directory DIR/<name> and its output in DIR/<name>.log. Servers listen
// on 127.0.0.1 port 0 and write their ports to DIR/<name>.port; their
// Prometheus endpoints (127.0.0.1:0) are read from their logs. The binaries
// are found next to trainctl (bazel-bin layout: ../scheduler/scheduler_server,
// ../trainer/trainer, ../kvstore/kvstore_server relative to trainctl's
// directory, via argv[0] and then /proc/self/exe) unless --scheduler_bin,
// --trainer_bin or --kvstore_bin say otherwise. When everything started,
// DIR/cluster.json lists the processes (pid, address, metrics URL, data
// directory, log) and `up` prints them; if one fails to start, the ones
// already started are stopped and `up` fails naming the log to read.
//
// `status` checks that each pid is alive (and still one of this cluster's
// processes) and that the scheduler and the kvstore shards answer Admin.Ping.
// `down` sends SIGTERM to every process group (trainers first), waits up to
// --grace_s, sends SIGKILL to what is left, reports what happened to each,
// and removes cluster.json (logs and data directories stay).
//
// The trainer daemons do not use the kvstore shards yet (KVSTORE-mode jobs
// fail with a reason); the shards are there for clients and for when they do.
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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
#include "libs/base/subprocess.h"
#include "protos/admin.grpc.pb.h"

namespace dtrain {
namespace trainctl {
namespace {

struct Proc {
  std::string name;  // scheduler, kvstore-0, trainer-0, ...
  std::string role;  // scheduler, kvstore or trainer
  int pid = -1;
  std::string address;      // servers: 127.0.0.1:port
  std::string metrics_url;  // servers: http://127.0.0.1:port/metrics
  std::string data_dir;
  std::string log;
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

// Starts `argv` in a new session with stdout and stderr appended to `log`;
// the process outlives trainctl.
absl::StatusOr<int> Spawn(const std::vector<std::string>& argv, const std::string& log) {
  SubprocessOptions options;
  options.argv = argv;
  options.output_file = log;
  options.new_session = true;
  // The processes of a local cluster share the machine's cores: OpenMP
  // threads that spin while waiting (libgomp's default) slow each other
  // down several-fold; sleeping waits cost little (unless the user chose).
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) options.env = {{"OMP_WAIT_POLICY", "PASSIVE"}};
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(options);
  if (!child.ok()) return child.status();
  (*child)->Release();  // `cluster down` stops it, by the pid in cluster.json
  return static_cast<int>((*child)->pid());
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
absl::Status WaitServing(Proc* p, const std::string& port_file, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int port = 0;
  while (absl::Now() < deadline) {
    std::string text(absl::StripAsciiWhitespace(ReadFile(port_file)));
    if (!text.empty() && absl::SimpleAtoi(text, &port) && port > 0) break;
    if (!Alive(p->pid)) {
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
  auto stub =
      admin::Admin::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
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

google::protobuf::Struct ToStruct(const std::string& dir, const std::vector<Proc>& procs) {
  google::protobuf::Struct root;
  (*root.mutable_fields())["dir"].set_string_value(dir);
  auto* list = (*root.mutable_fields())["processes"].mutable_list_value();
  for (const Proc& p : procs) {
    auto* f = list->add_values()->mutable_struct_value()->mutable_fields();
    (*f)["name"].set_string_value(p.name);
    (*f)["role"].set_string_value(p.role);
    (*f)["pid"].set_number_value(p.pid);
    if (!p.address.empty()) (*f)["address"].set_string_value(p.address);
    if (!p.metrics_url.empty()) (*f)["metrics_url"].set_string_value(p.metrics_url);
    (*f)["data_dir"].set_string_value(p.data_dir);
    (*f)["log"].set_string_value(p.log);
  }
  return root;
}

absl::StatusOr<std::vector<Proc>> LoadCluster(const std::string& dir) {
  const std::string path = dir + "/cluster.json";
  if (!Exists(path)) {
    return absl::NotFoundError(absl::StrCat("no cluster in ", dir, " (no ", path, ")"));
  }
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(ReadFile(path), &root).ok()) {
    return absl::DataLossError(absl::StrCat(path, " is not valid JSON"));
  }
  std::vector<Proc> procs;
  auto it = root.fields().find("processes");
  if (it == root.fields().end()) return absl::DataLossError(path + " has no processes");
  for (const auto& v : it->second.list_value().values()) {
    const auto& f = v.struct_value().fields();
    auto str = [&](const char* k) {
      auto i = f.find(k);
      return i == f.end() ? std::string() : i->second.string_value();
    };
    Proc p;
    p.name = str("name");
    p.role = str("role");
    auto pid = f.find("pid");
    p.pid = pid == f.end() ? -1 : static_cast<int>(pid->second.number_value());
    p.address = str("address");
    p.metrics_url = str("metrics_url");
    p.data_dir = str("data_dir");
    p.log = str("log");
    procs.push_back(p);
  }
  return procs;
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

int Up(const ClusterOptions& o) {
  if (o.trainers < 0 || o.trainers > 64) {
    std::fprintf(stderr, "trainctl: --trainers must be in 0..64\n");
    return 2;
  }
  if (o.kvstore_shards < 0 || o.kvstore_shards > 64) {
    std::fprintf(stderr, "trainctl: --kvstore_shards must be in 0..64\n");
    return 2;
  }
  if (o.devices_per_trainer < 1 || o.devices_per_trainer > 64) {
    std::fprintf(stderr, "trainctl: --devices_per_trainer must be in 1..64\n");
    return 2;
  }
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "trainctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
                 std::string(s.message()).c_str());
    return 1;
  };
  if (mkdir(o.dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return fail(absl::InternalError(absl::StrCat("cannot create ", o.dir, ": ", strerror(errno))));
  }
  char real[PATH_MAX];
  if (realpath(o.dir.c_str(), real) == nullptr) {
    return fail(absl::InternalError(absl::StrCat("cannot resolve ", o.dir, ": ", strerror(errno))));
  }
  const std::string dir = real;
  if (auto old = LoadCluster(dir); old.ok()) {
    for (const Proc& p : *old) {
      if (AliveAndOurs(p)) {
        return fail(absl::AlreadyExistsError(
            absl::StrCat("a cluster is already up in ", dir, " (", p.name, " pid ", p.pid,
                         " is running); run `trainctl cluster down --dir=", dir, "` first")));
      }
    }
  }
  auto scheduler_bin = FindBinary(o.scheduler_binary, "scheduler/scheduler_server", o.argv0);
  if (!scheduler_bin.ok()) return fail(scheduler_bin.status());
  auto trainer_bin = FindBinary(o.trainer_binary, "trainer/trainer", o.argv0);
  if (o.trainers > 0 && !trainer_bin.ok()) return fail(trainer_bin.status());
  auto kvstore_bin = FindBinary(o.kvstore_binary, "kvstore/kvstore_server", o.argv0);
  if (o.kvstore_shards > 0 && !kvstore_bin.ok()) return fail(kvstore_bin.status());

  std::vector<Proc> procs;
  const absl::Duration timeout = absl::Seconds(o.start_timeout_s);
  // Starts one process; on failure stops the ones already started.
  auto start = [&](Proc p, std::vector<std::string> argv, bool server) -> absl::Status {
    p.data_dir = absl::StrCat(dir, "/", p.name);
    p.log = absl::StrCat(dir, "/", p.name, ".log");
    const std::string port_file = absl::StrCat(dir, "/", p.name, ".port");
    std::remove(port_file.c_str());
    mkdir(p.data_dir.c_str(), 0755);
    if (server) {
      argv.push_back("--listen=127.0.0.1:0");
      argv.push_back("--port_file=" + port_file);
      argv.push_back("--metrics_listen=127.0.0.1:0");
    }
    auto pid = Spawn(argv, p.log);
    if (!pid.ok()) return pid.status();
    p.pid = *pid;
    absl::Status s = server ? WaitServing(&p, port_file, timeout) : absl::OkStatus();
    procs.push_back(p);
    return s;
  };
  // Checkpoints go to a directory every trainer shares, so a job whose
  // trainer is lost resumes on the others.
  mkdir(absl::StrCat(dir, "/checkpoints").c_str(), 0755);
  absl::Status s;
  for (int i = 0; s.ok() && i < o.kvstore_shards; ++i) {
    Proc p;
    p.name = absl::StrCat("kvstore-", i);
    p.role = "kvstore";
    s = start(p,
              {*kvstore_bin, absl::StrCat("--data_dir=", dir, "/", p.name),
               absl::StrCat("--shard_index=", i)},
              true);
  }
  std::string scheduler_address;
  if (s.ok()) {
    Proc p;
    p.name = "scheduler";
    p.role = "scheduler";
    std::vector<std::string> argv = {*scheduler_bin,
                                     absl::StrCat("--data_dir=", dir, "/scheduler")};
    if (o.heartbeat_timeout_s > 0) {
      argv.push_back(absl::StrCat("--heartbeat_timeout_s=", o.heartbeat_timeout_s));
    }
    s = start(p, argv, true);
    if (s.ok()) scheduler_address = procs.back().address;
  }
  std::vector<std::string> devices(o.devices_per_trainer);
  for (int d = 0; d < o.devices_per_trainer; ++d) {
    devices[d] = o.devices_per_trainer == 1 ? "cpu" : absl::StrCat("cpu:", d);
  }
  std::vector<std::string> kvstore_addresses;
  for (const Proc& p : procs) {
    if (p.role == "kvstore") kvstore_addresses.push_back(p.address);
  }
  for (int i = 0; s.ok() && i < o.trainers; ++i) {
    Proc p;
    p.name = absl::StrCat("trainer-", i);
    p.role = "trainer";
    s = start(
        p,
        {*trainer_bin, "--scheduler=" + scheduler_address, "--name=" + p.name,
         "--devices=" + absl::StrJoin(devices, ","), absl::StrCat("--work_dir=", dir, "/", p.name),
         absl::StrCat("--checkpoint_dir=", dir, "/checkpoints"), "--collective_host=127.0.0.1",
         "--metrics_listen=127.0.0.1:0", "--kvstore=" + absl::StrJoin(kvstore_addresses, ","),
         absl::StrCat("--metrics_port_file=", dir, "/", p.name, ".metrics_port")},
        false);
  }
  if (s.ok() && o.trainers > 0) {
    // Trainers serve no gRPC port: wait for their metrics port (which also
    // shows they got past flag parsing), or for them to exit.
    absl::Time deadline = absl::Now() + timeout;
    for (Proc& p : procs) {
      if (p.role != "trainer" || !s.ok()) continue;
      const std::string file = absl::StrCat(dir, "/", p.name, ".metrics_port");
      for (;;) {
        std::ifstream in(file);
        int port = 0;
        if (in >> port && port > 0) {
          p.metrics_url = absl::StrCat("http://127.0.0.1:", port, "/metrics");
          break;
        }
        if (!Alive(p.pid)) {
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
  google::protobuf::Struct root = ToStruct(dir, procs);
  if (s.ok()) s = WriteFileAtomically(dir + "/cluster.json", JsonOf(root, true) + "\n");
  if (!s.ok()) {
    StopAll(procs, absl::Seconds(5));
    return fail(s);
  }
  if (o.json) {
    std::printf("%s\n", JsonOf(root, false).c_str());
  } else {
    std::printf("cluster up in %s (%s/cluster.json)\n", dir.c_str(), dir.c_str());
    PrintProcs(procs);
    std::printf("export DTRAIN_SCHEDULER=%s\n", scheduler_address.c_str());
  }
  std::fflush(stdout);
  return 0;
}

int Status(const ClusterOptions& o) {
  auto procs = LoadCluster(o.dir);
  if (!procs.ok()) {
    std::fprintf(stderr, "trainctl: %s: %s\n",
                 absl::StatusCodeToString(procs.status().code()).c_str(),
                 std::string(procs.status().message()).c_str());
    return 1;
  }
  bool healthy = true;
  google::protobuf::Struct root = ToStruct(o.dir, *procs);
  auto* list = (*root.mutable_fields())["processes"].mutable_list_value();
  for (size_t i = 0; i < procs->size(); ++i) {
    const Proc& p = (*procs)[i];
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
    auto* f = list->mutable_values(i)->mutable_struct_value()->mutable_fields();
    (*f)["alive"].set_bool_value(alive);
    if (!p.address.empty()) (*f)["serving"].set_string_value(serving);
    if (!o.json) {
      std::printf("%-12s pid %-7d %-8s %-21s %s%s%s\n", p.name.c_str(), p.pid,
                  alive ? "running" : "DEAD", p.address.empty() ? "-" : p.address.c_str(),
                  serving.c_str(), p.metrics_url.empty() ? "" : "  ", p.metrics_url.c_str());
    }
  }
  (*root.mutable_fields())["healthy"].set_bool_value(healthy);
  if (o.json) {
    std::printf("%s\n", JsonOf(root, false).c_str());
  } else {
    std::printf("cluster %s\n", healthy ? "healthy" : "UNHEALTHY");
  }
  std::fflush(stdout);
  return healthy ? 0 : 1;
}

int Down(const ClusterOptions& o) {
  auto procs = LoadCluster(o.dir);
  if (!procs.ok()) {
    std::fprintf(stderr, "trainctl: %s: %s\n",
                 absl::StatusCodeToString(procs.status().code()).c_str(),
                 std::string(procs.status().message()).c_str());
    return 1;
  }
  std::vector<std::string> report = StopAll(*procs, absl::Seconds(o.grace_s));
  bool all_gone = true;
  for (const Proc& p : *procs) all_gone = all_gone && !Alive(p.pid);
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
  if (args[0] == "status") return Status(options);
  if (args[0] == "down") return Down(options);
  std::fprintf(stderr, "trainctl: unknown cluster command '%s' (up, down or status)\n",
               args[0].c_str());
  return 2;
}

}  // namespace trainctl
}  // namespace dtrain
