// End to end, with real processes and real signals: a local cluster heals as
// a Kubernetes deployment would (`trainctl cluster up` restarts a SIGKILLed
// kvstore shard and trainer on their ports; --restart=never leaves them
// down; a lost supervisor shows in `cluster status`; `cluster down` leaves
// no process behind), and `trainctl watch`
// notices a scheduler that keeps its connection open but stops answering
// (SIGSTOP) instead of waiting forever.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "libs/base/subprocess.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// `trainctl -o json cluster status`: the whole object, and its processes by
// name. *rc is trainctl's exit status.
struct Status {
  Struct root;
  std::map<std::string, Struct> procs;
  bool parsed = false;

  std::string Str(const std::string& name, const std::string& key) const {
    auto p = procs.find(name);
    if (p == procs.end()) return "";
    auto f = p->second.fields().find(key);
    return f == p->second.fields().end() ? "" : f->second.string_value();
  }
  double Num(const std::string& name, const std::string& key) const {
    auto p = procs.find(name);
    if (p == procs.end()) return -1;
    auto f = p->second.fields().find(key);
    return f == p->second.fields().end() ? -1 : f->second.number_value();
  }
  bool Bool(const std::string& name, const std::string& key) const {
    auto p = procs.find(name);
    if (p == procs.end()) return false;
    auto f = p->second.fields().find(key);
    return f != p->second.fields().end() && f->second.bool_value();
  }
  const Value* Top(const std::string& key) const {
    auto f = root.fields().find(key);
    return f == root.fields().end() ? nullptr : &f->second;
  }
};

Status ClusterStatus(const std::string& dir, int* rc, std::string* raw = nullptr) {
  std::string out = Trainctl("-o json cluster status --dir=" + dir, rc);
  if (raw != nullptr) *raw = out;
  Status s;
  if (!google::protobuf::util::JsonStringToMessage(out, &s.root).ok()) return s;
  s.parsed = true;
  auto it = s.root.fields().find("processes");
  if (it == s.root.fields().end()) return s;
  for (const Value& v : it->second.list_value().values()) {
    auto name = v.struct_value().fields().find("name");
    if (name != v.struct_value().fields().end()) {
      s.procs[name->second.string_value()] = v.struct_value();
    }
  }
  return s;
}

void WaitGone(int pid) {
  PollUntil(absl::Seconds(10), [&] { return !ProcessAlive(pid); });
}

// The cluster `options` asks for; a failure fails the test (non-fatally)
// and returns null.
std::unique_ptr<TestCluster> Start(const ClusterOptions& options) {
  absl::StatusOr<std::unique_ptr<TestCluster>> c = TestCluster::Start(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Every pid the cluster has now: its processes and its supervisor.
std::vector<int> Pids(const Status& s) {
  std::vector<int> pids;
  for (const auto& [name, p] : s.procs) pids.push_back(static_cast<int>(s.Num(name, "pid")));
  if (const Value* sup = s.Top("supervisor_pid"))
    pids.push_back(static_cast<int>(sup->number_value()));
  return pids;
}

TEST(HealE2eTest, KilledShardAndTrainerComeBackOnTheirPorts) {
  std::unique_ptr<TestCluster> cluster = Start({.name = "heal-always",
                                                .trainers = 1,
                                                .kvstore_shards = 1,
                                                .kvstore_replicas = 1,
                                                .restart = true});
  ASSERT_NE(cluster, nullptr);
  const std::string& dir = cluster->dir();
  int rc;
  std::string out = cluster->up_output();
  EXPECT_NE(out.find("restart=always"), std::string::npos) << out;
  std::string raw;
  Status before = ClusterStatus(dir, &rc, &raw);
  ASSERT_TRUE(before.parsed) << raw;
  ASSERT_EQ(rc, 0) << raw;
  ASSERT_TRUE(before.Top("healthy") && before.Top("healthy")->bool_value()) << raw;
  ASSERT_TRUE(before.Top("supervisor_alive") && before.Top("supervisor_alive")->bool_value())
      << raw;
  const int supervisor = static_cast<int>(before.Top("supervisor_pid")->number_value());
  const int kv_pid = static_cast<int>(before.Num("kvstore-0", "pid"));
  const int trainer_pid = static_cast<int>(before.Num("trainer-0", "pid"));
  const std::string kv_address = before.Str("kvstore-0", "address");
  ASSERT_NE(kv_address, "") << raw;
  EXPECT_EQ(before.Num("kvstore-0", "restarts"), 0) << raw;
  EXPECT_EQ(before.Num("trainer-0", "restarts"), 0) << raw;
  EXPECT_EQ(before.Str("kvstore-0", "last_exit"), "") << raw;
  // The supervisor is not one of the processes, and they are not its group.
  EXPECT_NE(supervisor, kv_pid);
  EXPECT_NE(getpgid(kv_pid), getpgid(supervisor));

  ASSERT_EQ(kill(kv_pid, SIGKILL), 0);
  ASSERT_EQ(kill(trainer_pid, SIGKILL), 0);
  WaitGone(kv_pid);
  WaitGone(trainer_pid);
  EXPECT_FALSE(ProcessAlive(kv_pid));
  EXPECT_FALSE(ProcessAlive(trainer_pid));

  // Back within the first backoff (1 s) plus their start.
  Status after;
  bool healed = false;
  PollUntil(
      absl::Seconds(60),
      [&] {
        after = ClusterStatus(dir, &rc, &raw);
        healed = rc == 0 && after.Bool("kvstore-0", "alive") && after.Bool("trainer-0", "alive") &&
                 after.Num("kvstore-0", "restarts") == 1 &&
                 after.Num("trainer-0", "restarts") == 1 &&
                 absl::StartsWith(after.Str("kvstore-0", "serving"), "serving");
        return healed;
      },
      absl::Milliseconds(250));
  ASSERT_TRUE(healed) << raw << "\nsupervisor.log:\n" << ReadAll(dir + "/supervisor.log");
  EXPECT_NE(after.Num("kvstore-0", "pid"), kv_pid);
  EXPECT_NE(after.Num("trainer-0", "pid"), trainer_pid);
  EXPECT_EQ(after.Num("scheduler", "restarts"), 0) << raw;
  // The same ports: the address in cluster.json (and in the trainer's
  // --kvstore flag) and the metrics endpoints.
  EXPECT_EQ(after.Str("kvstore-0", "address"), kv_address);
  EXPECT_EQ(after.Str("kvstore-0", "metrics_url"), before.Str("kvstore-0", "metrics_url"));
  EXPECT_EQ(after.Str("trainer-0", "metrics_url"), before.Str("trainer-0", "metrics_url"));
  for (const char* name : {"kvstore-0", "trainer-0"}) {
    EXPECT_TRUE(absl::StartsWith(after.Str(name, "last_exit"), "killed by SIGKILL ")) << raw;
    EXPECT_TRUE(absl::EndsWith(after.Str(name, "last_exit"), "s ago")) << raw;
    EXPECT_EQ(after.Str(name, "state"), "running") << raw;
  }
  EXPECT_EQ(static_cast<int>(after.Top("supervisor_pid")->number_value()), supervisor);
  // The same log, appended: the shard listened twice, on the same port.
  const std::string port = kv_address.substr(kv_address.rfind(':') + 1);
  const std::string kv_log = ReadAll(dir + "/kvstore-0.log");
  EXPECT_EQ(Count(kv_log, "listening on port " + port), 2) << kv_log.substr(0, 3000);
  const std::string sup_log = ReadAll(dir + "/supervisor.log");
  EXPECT_NE(sup_log.find("kvstore-0 (pid " + std::to_string(kv_pid) + ") killed by SIGKILL"),
            std::string::npos)
      << sup_log;
  EXPECT_NE(sup_log.find("restarted trainer-0"), std::string::npos) << sup_log;

  // The text status: a RESTARTS column and the last exit.
  out = Trainctl("cluster status --dir=" + dir, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("RESTARTS"), std::string::npos) << out;
  EXPECT_EQ(Count(out, "last exit: killed by SIGKILL"), 2) << out;
  EXPECT_NE(out.find("supervisor pid " + std::to_string(supervisor) + " running"),
            std::string::npos)
      << out;

  // The restarted trainer and shard train together: a KVSTORE job through
  // the shard's unchanged address.
  const std::string scheduler = after.Str("scheduler", "address");
  out = Trainctl(absl::StrCat("--scheduler=", scheduler,
                              " submit --name=healed-kv --model=mlp --epochs=1 --batch_size=128"
                              " --lr=0.1 --init=kaiming --train_limit=512 --test_limit=200"
                              " --threads=1 --sync=KVSTORE --wait"),
                 &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;

  // down: nothing is left, the restarted processes and the supervisor
  // included.
  out = Trainctl("cluster down --dir=" + dir, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("supervisor (pid " + std::to_string(supervisor) + "): stopped"),
            std::string::npos)
      << out;
  for (int pid : Pids(before)) EXPECT_FALSE(ProcessAlive(pid)) << "pid " << pid << " runs";
  for (int pid : Pids(after)) EXPECT_FALSE(ProcessAlive(pid)) << "pid " << pid << " runs";
  EXPECT_NE(access((dir + "/cluster.json").c_str(), F_OK), 0);
}

TEST(HealE2eTest, BadFlagsAreRefusedNamingThem) {
  int rc;
  const std::string dir = TmpDir("heal-bad");
  std::string out = Trainctl("cluster up --restart=sometimes --dir=" + dir, &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--restart must be always or never, not 'sometimes'"), std::string::npos)
      << out;
  EXPECT_NE(access((dir + "/cluster.json").c_str(), F_OK), 0);
  out = Trainctl("--watch_timeout_s=0 watch job-000001", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--watch_timeout_s must be >= 1"), std::string::npos) << out;
}

TEST(HealE2eTest, RestartNeverLeavesThemDown) {
  std::unique_ptr<TestCluster> cluster =
      Start({.name = "heal-never", .trainers = 1, .kvstore_shards = 1, .kvstore_replicas = 1});
  ASSERT_NE(cluster, nullptr);
  const std::string& dir = cluster->dir();
  int rc;
  std::string out;
  std::string raw;
  Status before = ClusterStatus(dir, &rc, &raw);
  ASSERT_TRUE(before.parsed) << raw;
  ASSERT_EQ(rc, 0) << raw;
  const int kv_pid = static_cast<int>(before.Num("kvstore-0", "pid"));
  const int trainer_pid = static_cast<int>(before.Num("trainer-0", "pid"));
  ASSERT_EQ(kill(kv_pid, SIGKILL), 0);
  ASSERT_EQ(kill(trainer_pid, SIGKILL), 0);
  WaitGone(kv_pid);
  WaitGone(trainer_pid);
  // Longer than two backoffs of --restart=always (1 s, then 2 s).
  absl::SleepFor(absl::Seconds(4));

  Status after = ClusterStatus(dir, &rc, &raw);
  ASSERT_TRUE(after.parsed) << raw;
  EXPECT_EQ(rc, 1) << raw;
  EXPECT_FALSE(after.Top("healthy")->bool_value()) << raw;
  EXPECT_EQ(after.Top("restart")->string_value(), "never") << raw;
  for (const char* name : {"kvstore-0", "trainer-0"}) {
    EXPECT_FALSE(after.Bool(name, "alive")) << raw;
    EXPECT_EQ(after.Num(name, "restarts"), 0) << raw;
    EXPECT_EQ(after.Str(name, "state"), "exited") << raw;
    EXPECT_TRUE(absl::StartsWith(after.Str(name, "last_exit"), "killed by SIGKILL ")) << raw;
  }
  EXPECT_EQ(after.Num("kvstore-0", "pid"), kv_pid);
  EXPECT_EQ(after.Num("trainer-0", "pid"), trainer_pid);
  EXPECT_FALSE(ProcessAlive(kv_pid));
  EXPECT_FALSE(ProcessAlive(trainer_pid));
  EXPECT_TRUE(after.Bool("scheduler", "alive")) << raw;
  out = Trainctl("cluster status --dir=" + dir, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(Count(out, "DEAD"), 2) << out;
  EXPECT_EQ(Count(out, "last exit: killed by SIGKILL"), 2) << out;
  EXPECT_NE(out.find("UNHEALTHY"), std::string::npos) << out;

  out = Trainctl("cluster down --dir=" + dir, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(Count(out, "was not running"), 2) << out;
  for (int pid : Pids(before)) EXPECT_FALSE(ProcessAlive(pid)) << "pid " << pid << " runs";
}

TEST(HealE2eTest, ALostSupervisorShowsAndDownStillStopsEverything) {
  std::unique_ptr<TestCluster> cluster = Start({.name = "heal-supervisor",
                                                .trainers = 0,
                                                .kvstore_shards = 1,
                                                .kvstore_replicas = 1,
                                                .restart = true});
  ASSERT_NE(cluster, nullptr);
  const std::string& dir = cluster->dir();
  int rc;
  std::string out;
  std::string raw;
  Status before = ClusterStatus(dir, &rc, &raw);
  ASSERT_TRUE(before.parsed) << raw;
  const int supervisor = static_cast<int>(before.Top("supervisor_pid")->number_value());
  ASSERT_EQ(kill(supervisor, SIGKILL), 0);
  WaitGone(supervisor);
  // The processes run on, but nothing would restart them: unhealthy.
  Status after = ClusterStatus(dir, &rc, &raw);
  EXPECT_EQ(rc, 1) << raw;
  EXPECT_FALSE(after.Top("supervisor_alive")->bool_value()) << raw;
  EXPECT_FALSE(after.Top("healthy")->bool_value()) << raw;
  EXPECT_TRUE(after.Bool("kvstore-0", "alive")) << raw;
  EXPECT_TRUE(after.Bool("scheduler", "alive")) << raw;
  out = Trainctl("cluster status --dir=" + dir, &rc);
  EXPECT_NE(out.find("supervisor pid " + std::to_string(supervisor) + " NOT RUNNING"),
            std::string::npos)
      << out;
  out = Trainctl("cluster down --dir=" + dir, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("supervisor (pid " + std::to_string(supervisor) + "): was not running"),
            std::string::npos)
      << out;
  for (int pid : Pids(before)) EXPECT_FALSE(ProcessAlive(pid)) << "pid " << pid << " runs";
}

TEST(HealE2eTest, WatchNoticesASilentScheduler) {
  // No trainers: the job stays QUEUED and its Watch stream stays silent.
  std::unique_ptr<TestCluster> cluster = Start({.name = "heal-watch", .trainers = 0});
  ASSERT_NE(cluster, nullptr);
  const std::string& dir = cluster->dir();
  int rc;
  std::vector<ClusterProcess> procs = cluster->Processes();
  ASSERT_EQ(procs.size(), 1u) << cluster->up_output();
  const ClusterProcess scheduler = procs[0];
  std::string out =
      Trainctl("--scheduler=" + scheduler.address +
                   " submit --name=idle --model=mlp --epochs=1 --batch_size=128 --lr=0.1",
               &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string id = SubmittedId(out);
  ASSERT_NE(id, "") << out;

  const std::string log = dir + "/watch.log";
  SubprocessOptions so;
  so.argv = {Runfile("services/trainctl/trainctl"), "--scheduler=" + scheduler.address, "watch", id,
             "--watch_timeout_s=6"};
  so.output_file = log;
  auto watch = Subprocess::Start(so);
  ASSERT_TRUE(watch.ok()) << watch.status();

  // Silent but answering: two silence checks pass, nothing is reported.
  absl::SleepFor(absl::Seconds(13));
  ASSERT_TRUE((*watch)->Running()) << ReadAll(log);
  std::string text = ReadAll(log);
  EXPECT_NE(text.find("QUEUED"), std::string::npos) << text;
  EXPECT_EQ(text.find("interrupted"), std::string::npos) << text;

  // Stopped: the connection stays open, nothing answers.
  ASSERT_EQ(kill(scheduler.pid, SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  const std::string expected = "did not answer a Get within 2s";
  PollUntil(
      absl::Seconds(30), [&] { return ReadAll(log).find(expected) != std::string::npos; },
      absl::Milliseconds(100));
  const absl::Duration noticed = absl::Now() - stopped;
  text = ReadAll(log);
  ASSERT_NE(text.find(expected), std::string::npos) << text;
  EXPECT_NE(text.find("watch of " + id + " interrupted (the scheduler at " + scheduler.address +
                      " sent nothing for "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("stopped, hung or unreachable"), std::string::npos) << text;
  // Within the limit (6 s) plus slack for a loaded machine; not at once.
  EXPECT_LE(noticed, absl::Seconds(12)) << text;
  EXPECT_GE(noticed, absl::Seconds(1)) << text;
  EXPECT_TRUE((*watch)->Running()) << text;  // it reconnects

  // Running again: the watch reconnects and follows the job to its end.
  ASSERT_EQ(kill(scheduler.pid, SIGCONT), 0);
  out = Trainctl("--scheduler=" + scheduler.address + " cancel " + id, &rc);
  EXPECT_EQ(rc, 0) << out;
  absl::StatusOr<ExitStatus> status = (*watch)->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << ReadAll(log);
  EXPECT_TRUE(status->exited()) << status->ToString();
  EXPECT_EQ(status->exit_code(), 1) << ReadAll(log);  // the job did not succeed
  text = ReadAll(log);
  EXPECT_NE(text.find(id), std::string::npos) << text;
  EXPECT_NE(text.find("CANCELLED"), std::string::npos) << text;

  out = Trainctl("cluster down --dir=" + dir, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_FALSE(ProcessAlive(scheduler.pid));
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
