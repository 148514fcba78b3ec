// End to end, the cluster tooling's side of replicated kvstore shards:
// `trainctl cluster up --kvstore_shards=M --kvstore_replicas=R` with a real
// scheduler_server and trainctl, and fake_cluster_process standing in for
// kvstore_server and the trainer (it records its flags and heartbeats to the
// scheduler as a replica would): which processes start with which flags,
// cluster.json, waiting for the scheduler's shard map (and its error),
// `trainctl kvstore`, `cluster status`, and a SIGKILLed replica restarted by
// the supervisor rejoining its chain. The real replicated kvstore is tested
// with its own end-to-end tests.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "protos/replication.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

std::vector<std::string> Argv(const std::string& dir) {
  return absl::StrSplit(ReadFile(dir + "/argv"), '\n', absl::SkipEmpty());
}

bool Has(const std::vector<std::string>& argv, const std::string& arg) {
  return std::find(argv.begin(), argv.end(), arg) != argv.end();
}

struct Proc {
  std::string name, role, address;
  int pid = -1, shard = -1, replica = -1, restarts = 0;
};

// cluster.json's processes, with the replica fields.
std::vector<Proc> Procs(const std::string& dir) {
  google::protobuf::Struct root;
  std::vector<Proc> procs;
  if (!google::protobuf::util::JsonStringToMessage(ReadFile(dir + "/cluster.json"), &root).ok()) {
    return procs;
  }
  for (const auto& v : root.fields().at("processes").list_value().values()) {
    const auto& f = v.struct_value().fields();
    Proc p;
    p.name = f.at("name").string_value();
    p.role = f.at("role").string_value();
    if (f.count("address")) p.address = f.at("address").string_value();
    p.pid = static_cast<int>(f.at("pid").number_value());
    p.restarts = static_cast<int>(f.at("restarts").number_value());
    if (f.count("shard")) p.shard = static_cast<int>(f.at("shard").number_value());
    if (f.count("replica")) p.replica = static_cast<int>(f.at("replica").number_value());
    procs.push_back(p);
  }
  return procs;
}

kvstore::v1::ShardMap MapOf(const std::string& scheduler) {
  int rc;
  const std::string json =
      Trainctl(absl::StrCat("--scheduler=", scheduler, " -o json kvstore"), &rc);
  kvstore::v1::ShardMap map;
  EXPECT_EQ(rc, 0) << json;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &map).ok()) << json;
  return map;
}

class ClusterReplicasTest : public ClusterTest {
 protected:
  // fake_cluster_process as the kvstore servers (and the trainers).
  static std::string Fakes(bool trainers) {
    const std::string fake = Runfile("tests/e2e/fake_cluster_process");
    return absl::StrCat("--kvstore_bin=", fake, trainers ? " --trainer_bin=" + fake : "");
  }
};

TEST_F(ClusterReplicasTest, UpStartsEveryReplicaWaitsForTheMapAndHeals) {
  // Default: 2 replicas per shard.
  ASSERT_NO_FATAL_FAILURE(Up({.name = "replicas",
                              .trainers = 2,
                              .kvstore_shards = 2,
                              .kvstore_replicas = 0,
                              .restart = true,
                              .flags = Fakes(true)}));
  const std::string& cluster_dir = dir();
  const std::string& out = cluster_->up_output();
  int rc;
  std::vector<Proc> procs = Procs(cluster_dir);
  std::vector<std::string> names;
  for (const Proc& p : procs) names.push_back(absl::StrCat(p.name, "/", p.role));
  ASSERT_EQ(absl::StrJoin(names, " "),
            "scheduler/scheduler kvstore-0-0/kvstore kvstore-0-1/kvstore kvstore-1-0/kvstore "
            "kvstore-1-1/kvstore trainer-0/trainer trainer-1/trainer");
  const std::string scheduler = procs[0].address;
  std::vector<std::string> addresses;
  for (int k = 1; k <= 4; ++k) {
    const Proc& p = procs[k];
    const int shard = (k - 1) / 2, replica = (k - 1) % 2;
    EXPECT_EQ(p.shard, shard) << p.name;
    EXPECT_EQ(p.replica, replica) << p.name;
    addresses.push_back(p.address);
    const std::vector<std::string> argv = Argv(cluster_dir + "/" + p.name);
    EXPECT_TRUE(Has(argv, absl::StrCat("--shard_index=", shard))) << p.name;
    EXPECT_TRUE(Has(argv, absl::StrCat("--replica_index=", replica))) << p.name;
    EXPECT_TRUE(Has(argv, "--num_shards=2")) << p.name;
    EXPECT_TRUE(Has(argv, "--scheduler=" + scheduler)) << p.name;
    EXPECT_TRUE(Has(argv, absl::StrCat("--data_dir=", cluster_dir, "/", p.name))) << p.name;
    EXPECT_NE(out.find(p.name), std::string::npos) << out;
  }
  for (int t = 5; t <= 6; ++t) {
    const std::vector<std::string> argv = Argv(cluster_dir + "/" + procs[t].name);
    // Shard-major: shard i replica j at index i * R + j.
    EXPECT_TRUE(Has(argv, "--kvstore=" + absl::StrJoin(addresses, ",")))
        << absl::StrJoin(argv, " ");
    EXPECT_TRUE(Has(argv, "--kvstore_replicas=2")) << absl::StrJoin(argv, " ");
    EXPECT_TRUE(Has(argv, "--scheduler=" + scheduler));
  }

  // `up` returned only once each shard had 2 ACTIVE replicas.
  kvstore::v1::ShardMap map = MapOf(scheduler);
  ASSERT_EQ(map.chains_size(), 2) << map.DebugString();
  for (const auto& chain : map.chains()) {
    ASSERT_EQ(chain.members_size(), 2) << map.DebugString();
    for (const auto& m : chain.members()) {
      EXPECT_EQ(m.state(), kvstore::v1::REPLICA_ACTIVE) << map.DebugString();
      EXPECT_EQ(m.address(), addresses[chain.shard() * 2 + m.replica()]);
    }
  }
  std::string table = Trainctl(absl::StrCat("--scheduler=", scheduler, " kvstore"), &rc);
  ASSERT_EQ(rc, 0) << table;
  const std::string head0 =
      absl::StrFormat("%-6d %-8d %-21s %-8s %s", 0, map.chains(0).members(0).replica(),
                      map.chains(0).members(0).address(), "ACTIVE", "head\n");
  EXPECT_NE(table.find(head0), std::string::npos) << table;
  EXPECT_NE(table.find(absl::StrCat("map version ", map.version(), ", 2 shards")),
            std::string::npos)
      << table;

  // SIGKILL the head of shard 0: the supervisor restarts it (a new
  // incarnation, no state); it rejoins behind replica 1 and catches up.
  const int head = map.chains(0).members(0).replica();
  const uint64_t old_incarnation = map.chains(0).members(0).incarnation();
  const Proc& victim = procs[1 + head];
  ASSERT_EQ(kill(victim.pid, SIGKILL), 0);
  const bool healed = PollUntil(
      absl::Seconds(30),
      [&] {
        map = MapOf(scheduler);
        const auto& members = map.chains(0).members();
        return members.size() == 2 && members[1].replica() == head &&
               members[1].incarnation() != old_incarnation &&
               members[0].state() == kvstore::v1::REPLICA_ACTIVE &&
               members[1].state() == kvstore::v1::REPLICA_ACTIVE;
      },
      absl::Milliseconds(300));
  ASSERT_TRUE(healed) << map.DebugString();
  std::string status = Trainctl("cluster status --dir=" + cluster_dir, &rc);
  EXPECT_EQ(rc, 0) << status;
  EXPECT_NE(status.find(absl::StrCat("shard 0 replica ", head, ": ACTIVE tail")), std::string::npos)
      << status;
  EXPECT_NE(status.find(absl::StrCat("shard 0 replica ", 1 - head, ": ACTIVE head")),
            std::string::npos)
      << status;
  EXPECT_EQ(Procs(cluster_dir)[1 + head].restarts, 1);

  std::string down = Trainctl("cluster down --dir=" + cluster_dir, &rc);
  EXPECT_EQ(rc, 0) << down;
  EXPECT_TRUE(PidsMentioning(cluster_dir).empty());
}

// A port `up` checked free can be taken before its server binds it (by
// another cluster's server restarting on its port, or another `up`): the
// first start of a server gets other ports and tries again, since nobody
// has its address yet. The fake's first replica finds its --listen port
// held by a socket: its bind is refused for real.
TEST_F(ClusterReplicasTest, UpGivesAServerWhosePortWasTakenOtherPorts) {
  const std::string marker = TmpDir("port-taken") + "/taken";
  ASSERT_NO_FATAL_FAILURE(Up({.name = "taken",
                              .trainers = 0,
                              .kvstore_shards = 1,
                              .kvstore_replicas = 2,
                              .env = "FAKE_PORT_TAKEN_ONCE=" + marker,
                              .flags = Fakes(false)}));
  EXPECT_EQ(cluster_->CountInLog(
                "supervisor",
                "supervisor: kvstore-0-0: a port it was given was taken before it listened; "
                "trying other ports"),
            1)
      << cluster_->Log("supervisor");
  EXPECT_EQ(access(marker.c_str(), F_OK), 0);
  EXPECT_NE(cluster_->Log("kvstore-0-0").find("Address already in use"), std::string::npos);
  int rc;
  const std::string status = Trainctl("cluster status --dir=" + dir(), &rc);
  EXPECT_EQ(rc, 0) << status;
  EXPECT_NE(status.find("shard 0 replica 0: ACTIVE"), std::string::npos) << status;
  EXPECT_NE(status.find("shard 0 replica 1: ACTIVE"), std::string::npos) << status;
}

TEST_F(ClusterReplicasTest, UpFailsClearlyWhenAReplicaNeverCatchesUp) {
  // `up` fails here: only the teardown (of whatever a failure left).
  cluster_ = TestCluster::Adopt(TmpDir("stuck"));
  const std::string& cluster_dir = dir();
  int rc;
  const std::string out = e2e::Run(
      absl::StrCat("FAKE_REPLICA_NEVER_CATCH_UP=1 ", Runfile("services/trainctl/trainctl"),
                   " cluster up --dir=", cluster_dir,
                   " --trainers=0 --kvstore_shards=1 --kvstore_replicas=2 --start_timeout_s=4", " ",
                   Fakes(false)),
      &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("trainctl: DEADLINE_EXCEEDED: the kvstore shards did not form 1 chains of 2 "
                     "ACTIVE replicas"),
            std::string::npos)
      << out;
  // Whichever replica heartbeated first is ACTIVE; the other is named, with its log.
  const std::string joining = "shard 0: 1 of 2 replicas ACTIVE (replica ";
  const size_t at = out.find(joining);
  ASSERT_NE(at, std::string::npos) << out;
  const std::string replica = out.substr(at + joining.size(), 1);
  ASSERT_TRUE(replica == "0" || replica == "1") << out;
  EXPECT_EQ(out.substr(at + joining.size() + 1, 9), " JOINING)") << out;
  EXPECT_NE(out.find(absl::StrCat(cluster_dir, "/kvstore-0-", replica, ".log")), std::string::npos)
      << out;
  // The supervisor stopped what it started.
  EXPECT_TRUE(PollUntil(
      absl::Seconds(10), [&] { return PidsMentioning(cluster_dir).empty(); },
      absl::Milliseconds(100)));
}

// The real kvstore_server replicas and the real scheduler: up returns once
// both shards have 2 ACTIVE replicas (the second caught up by a state
// transfer); a SIGKILLed head is restarted by the supervisor, rejoins as
// JOINING behind the surviving replica (now the head) and becomes ACTIVE
// again after its transfer.
TEST_F(ClusterReplicasTest, RealReplicasFormChainsAndAKilledHeadRejoins) {
  ASSERT_NO_FATAL_FAILURE(Up({.name = "real",
                              .trainers = 0,
                              .kvstore_shards = 2,
                              .kvstore_replicas = 0,
                              .restart = true}));
  const std::string& cluster_dir = dir();
  const std::string& out = cluster_->up_output();
  std::vector<Proc> procs = Procs(cluster_dir);
  ASSERT_EQ(procs.size(), 5u) << out;
  const std::string scheduler = procs[0].address;
  kvstore::v1::ShardMap map = MapOf(scheduler);
  ASSERT_EQ(map.chains_size(), 2) << map.DebugString();
  for (const auto& chain : map.chains()) {
    ASSERT_EQ(chain.members_size(), 2) << map.DebugString();
    for (const auto& m : chain.members()) {
      EXPECT_EQ(m.state(), kvstore::v1::REPLICA_ACTIVE) << map.DebugString();
      EXPECT_EQ(m.address(), procs[1 + chain.shard() * 2 + m.replica()].address);
    }
  }
  const int head = map.chains(1).members(0).replica();
  const uint64_t old_incarnation = map.chains(1).members(0).incarnation();
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(procs[1 + 2 + head].pid, SIGKILL), 0);
  bool left = false, healed = false;
  absl::Duration left_after;
  while (absl::Now() - killed < absl::Seconds(30) && !healed) {
    absl::SleepFor(absl::Milliseconds(100));
    map = MapOf(scheduler);
    const auto& members = map.chains(1).members();
    if (!left && (members.empty() || members[0].replica() != head)) {
      left = true;
      left_after = absl::Now() - killed;
    }
    healed = members.size() == 2 && members[0].replica() == 1 - head &&
             members[1].replica() == head && members[1].incarnation() != old_incarnation &&
             members[1].state() == kvstore::v1::REPLICA_ACTIVE;
  }
  ASSERT_TRUE(healed) << map.DebugString();
  // The new incarnation replaced the old one at once (it restarted within
  // the 2 s timeout: the supervisor's backoff is 1 s), or the old one timed out.
  EXPECT_TRUE(left);
  EXPECT_LT(left_after, absl::Seconds(5));
  // Shard 0 was never touched.
  EXPECT_EQ(map.chains(0).members_size(), 2);
}

// --kvstore_replicas=1: unreplicated shards exactly as before replication.
TEST_F(ClusterReplicasTest, OneReplicaKeepsUnreplicatedShards) {
  ASSERT_NO_FATAL_FAILURE(Up({.name = "unreplicated",
                              .trainers = 1,
                              .kvstore_shards = 2,
                              .kvstore_replicas = 1,
                              .restart = true,
                              .flags = Fakes(true)}));
  const std::string& cluster_dir = dir();
  const std::string& out = cluster_->up_output();
  int rc;
  std::vector<Proc> procs = Procs(cluster_dir);
  std::vector<std::string> names;
  for (const Proc& p : procs) names.push_back(absl::StrCat(p.name, "/", p.shard));
  ASSERT_EQ(absl::StrJoin(names, " "), "kvstore-0/-1 kvstore-1/-1 scheduler/-1 trainer-0/-1");
  const std::vector<std::string> argv = Argv(cluster_dir + "/kvstore-1");
  EXPECT_TRUE(Has(argv, "--shard_index=1"));
  for (const std::string& a : argv) {
    EXPECT_EQ(a.find("--replica_index"), std::string::npos);
    EXPECT_EQ(a.find("--scheduler"), std::string::npos);
  }
  const std::vector<std::string> trainer = Argv(cluster_dir + "/trainer-0");
  EXPECT_TRUE(Has(trainer, absl::StrCat("--kvstore=", procs[0].address, ",", procs[1].address)));
  for (const std::string& a : trainer) EXPECT_EQ(a.find("--kvstore_replicas"), std::string::npos);
  std::string map = Trainctl(absl::StrCat("--scheduler=", procs[2].address, " kvstore"), &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(map.rfind("no kvstore shard map yet", 0), 0u) << map;
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain
