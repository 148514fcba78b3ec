#include "libs/scheduler/kvstore_map.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/message_differencer.h"
#include "libs/base/logging.h"

namespace dtrain {
namespace scheduler {
namespace {

using kvstore::v1::REPLICA_ACTIVE;
using kvstore::v1::REPLICA_JOINING;

std::string Describe(const ChainMember& m) {
  return absl::StrCat("replica ", m.replica(), " (", m.address(), ", incarnation ",
                      absl::Hex(m.incarnation()), ")");
}

// A map a replica reports, checked before it is adopted.
absl::Status ValidateMap(const ShardMap& map, int num_shards) {
  if (map.num_shards() != num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("map.num_shards: ", map.num_shards(),
                                                   " differs from num_shards ", num_shards));
  }
  std::set<int> shards;
  for (const auto& chain : map.chains()) {
    if (chain.shard() < 0 || chain.shard() >= num_shards || !shards.insert(chain.shard()).second) {
      return absl::InvalidArgumentError(absl::StrCat("map.chains.shard: ", chain.shard(),
                                                     " is out of range 0..", num_shards - 1,
                                                     " or named twice"));
    }
    std::set<int> replicas;
    for (const ChainMember& m : chain.members()) {
      const std::string where = absl::StrCat("map.chains[shard ", chain.shard(), "].members");
      if (m.replica() < 0 || !replicas.insert(m.replica()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".replica: ", m.replica(), " is negative or named twice"));
      }
      if (m.address().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".address: empty"));
      }
      if (m.state() != REPLICA_ACTIVE && m.state() != REPLICA_JOINING) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".state: ", m.state(), " is neither ACTIVE nor JOINING"));
      }
      if (m.incarnation() == 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".incarnation: must not be 0"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

KvstoreMembership::KvstoreMembership(const KvstoreMembershipOptions& options, absl::Time now)
    : options_(options),
      grace_end_(now + (options.startup_grace < absl::ZeroDuration() ? options.heartbeat_timeout
                                                                     : options.startup_grace)) {}

absl::StatusOr<KvstoreHeartbeatReply> KvstoreMembership::Heartbeat(
    const KvstoreHeartbeatRequest& request, absl::Time now) {
  if (request.shard() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("shard: ", request.shard(), " is negative"));
  }
  if (request.replica() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("replica: ", request.replica(), " is negative"));
  }
  if (request.address().empty()) {
    return absl::InvalidArgumentError("address: empty (the host:port clients and peers dial)");
  }
  if (request.incarnation() == 0) {
    return absl::InvalidArgumentError("incarnation: must not be 0 (a random id of the process)");
  }
  if (request.num_shards() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards: ", request.num_shards(), " (must be at least 1)"));
  }
  if (request.shard() >= request.num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard: ", request.shard(), " is not below num_shards ", request.num_shards()));
  }
  absl::MutexLock lock(&mu_);
  if (!chains_.empty() && static_cast<size_t>(request.num_shards()) != chains_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards: ", request.num_shards(), " differs from the shard map's ",
                     chains_.size(), "; start every kvstore replica with the same --num_shards"));
  }
  if (request.map().version() > version_) {
    absl::Status valid = ValidateMap(request.map(), request.num_shards());
    if (!valid.ok()) return valid;
  }

  bool changed = false;
  ExpireLocked(now, &changed);
  if (request.map().version() > version_) {
    DT_LOG(INFO) << "kvstore map: adopting version " << request.map().version() << " from shard "
                 << request.shard() << " replica " << request.replica() << " (ours: " << version_
                 << ")";
    AdoptLocked(request.map(), now);
    changed = false;  // the adopted version is the map's version
  }
  if (chains_.empty()) chains_.resize(request.num_shards());
  if (request.map().version() == version_ && version_ > 0 &&
      !google::protobuf::util::MessageDifferencer::Equals(request.map(), MapLocked())) {
    // Two maps of one version: a previous scheduler gave this replica a map
    // this owner never saw, and this owner's own changes reached the same
    // number. Replicas take only newer maps: raise the version.
    DT_LOG(WARNING) << "kvstore map: shard " << request.shard() << " replica " << request.replica()
                    << " follows another map of version " << version_
                    << " (a previous scheduler's); raising the version so that it takes ours";
    changed = true;
  }
  const uint64_t next = version_ + 1;
  const int shard = request.shard();
  Chain& chain = chains_[shard];
  auto find = [&chain](int replica) {
    return std::find_if(chain.begin(), chain.end(),
                        [replica](const Member& m) { return m.member.replica() == replica; });
  };
  auto it = find(request.replica());
  bool rejoin = false;
  if (it != chain.end()) {
    Member& m = *it;
    if (m.member.incarnation() != request.incarnation()) {
      DT_LOG(WARNING) << "kvstore shard " << shard << ": " << Describe(m.member)
                      << " restarted as incarnation "
                      << absl::StrCat(absl::Hex(request.incarnation()))
                      << " (its state is lost); it rejoins the chain";
      rejoin = true;
    } else if (m.member.state() == REPLICA_ACTIVE && !request.has_state() &&
               request.map().version() >= m.active_since) {
      DT_LOG(WARNING) << "kvstore shard " << shard << ": " << Describe(m.member)
                      << " is ACTIVE but reports no state; it rejoins the chain";
      rejoin = true;
    } else {
      m.last_heard = now;
      if (m.member.address() != request.address()) {
        DT_LOG(INFO) << "kvstore shard " << shard << ": " << Describe(m.member)
                     << " now listens on " << request.address();
        m.member.set_address(request.address());
        changed = true;
      }
    }
    if (rejoin) chain.erase(it);
  }
  if (rejoin || it == chain.end()) {
    const bool active_now =
        !rejoin && !std::any_of(chain.begin(), chain.end(),
                                [](const Member& m) { return m.member.state() == REPLICA_ACTIVE; });
    if (active_now && now < grace_end_) {
      // Startup grace: a replica that kept the shard's state may still
      // report the previous scheduler's map; do not create an empty shard yet.
    } else {
      Member m;
      m.member.set_replica(request.replica());
      m.member.set_address(request.address());
      m.member.set_incarnation(request.incarnation());
      m.member.set_state(active_now ? REPLICA_ACTIVE : REPLICA_JOINING);
      m.last_heard = now;
      m.active_since = active_now ? next : 0;
      DT_LOG(INFO) << "kvstore shard " << shard << ": " << Describe(m.member) << " joins as "
                   << (active_now ? "ACTIVE (a new, empty shard)" : "JOINING") << " (map version "
                   << next << ")";
      chain.push_back(std::move(m));
      changed = true;
    }
  }
  if (request.caught_up_incarnation() != 0) {
    auto from = find(request.replica());
    auto to = find(request.caught_up_replica());
    if (from != chain.end() && to != chain.end() && to == from + 1 &&
        from->member.incarnation() == request.incarnation() &&
        from->member.state() == REPLICA_ACTIVE && to->member.state() == REPLICA_JOINING &&
        to->member.incarnation() == request.caught_up_incarnation()) {
      to->member.set_state(REPLICA_ACTIVE);
      to->active_since = next;
      DT_LOG(INFO) << "kvstore shard " << shard << ": " << Describe(to->member)
                   << " caught up with replica " << request.replica()
                   << "; now ACTIVE (map version " << next << ")";
      changed = true;
    }
  }
  NormalizeLocked(shard, next, &changed);
  if (changed) {
    version_ = next;
    ++changes_;
  }
  KvstoreHeartbeatReply reply;
  *reply.mutable_map() = MapLocked();
  reply.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return reply;
}

void KvstoreMembership::Expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  bool changed = false;
  ExpireLocked(now, &changed);
  if (changed) {
    ++version_;
    ++changes_;
  }
}

void KvstoreMembership::ExpireLocked(absl::Time now, bool* changed) {
  const uint64_t next = version_ + 1;
  for (size_t shard = 0; shard < chains_.size(); ++shard) {
    Chain& chain = chains_[shard];
    bool removed = false;
    for (auto it = chain.begin(); it != chain.end();) {
      if (now - it->last_heard >= options_.heartbeat_timeout) {
        DT_LOG(WARNING) << "kvstore shard " << shard << ": " << Describe(it->member) << " ("
                        << kvstore::v1::ReplicaState_Name(it->member.state())
                        << ") not heard from for " << absl::FormatDuration(now - it->last_heard)
                        << "; it leaves the chain (map version " << next << ")";
        it = chain.erase(it);
        removed = true;
      } else {
        ++it;
      }
    }
    if (removed) {
      *changed = true;
      if (chain.empty()) {
        DT_LOG(WARNING) << "kvstore shard " << shard
                        << " has no replica left: its jobs fail until one joins (with an empty "
                           "state)";
      }
      NormalizeLocked(static_cast<int>(shard), next, changed);
    }
  }
}

void KvstoreMembership::NormalizeLocked(int shard, uint64_t next, bool* changed) {
  Chain& chain = chains_[shard];
  auto is_active = [](const Member& m) { return m.member.state() == REPLICA_ACTIVE; };
  if (!chain.empty() && std::none_of(chain.begin(), chain.end(), is_active)) {
    std::vector<std::string> names;
    for (Member& m : chain) {
      m.member.set_state(REPLICA_ACTIVE);
      m.active_since = next;
      names.push_back(Describe(m.member));
    }
    DT_LOG(WARNING) << "kvstore shard " << shard
                    << " LOST ITS STATE: no ACTIVE replica is left, so the JOINING ones ("
                    << absl::StrJoin(names, ", ")
                    << ") become ACTIVE with an empty state; jobs using this shard will find "
                       "their kvstore job gone and retry from their last checkpoint";
    *changed = true;
  }
  if (!std::is_partitioned(chain.begin(), chain.end(), is_active)) {
    std::stable_partition(chain.begin(), chain.end(), is_active);
    *changed = true;
  }
}

void KvstoreMembership::AdoptLocked(const ShardMap& map, absl::Time now) {
  chains_.assign(map.num_shards(), Chain());
  for (const auto& chain : map.chains()) {
    for (const ChainMember& cm : chain.members()) {
      Member m;
      m.member = cm;
      m.last_heard = now;
      m.active_since = map.version();
      chains_[chain.shard()].push_back(std::move(m));
    }
  }
  version_ = map.version();
  ++changes_;
  for (size_t shard = 0; shard < chains_.size(); ++shard) {
    bool changed = false;
    NormalizeLocked(static_cast<int>(shard), version_ + 1, &changed);
    if (changed) ++version_;  // a malformed order or a chain of JOINING members only
  }
}

ShardMap KvstoreMembership::Map() const {
  absl::ReaderMutexLock lock(&mu_);
  return MapLocked();
}

ShardMap KvstoreMembership::MapLocked() const {
  ShardMap map;
  map.set_version(version_);
  map.set_num_shards(static_cast<int>(chains_.size()));
  for (size_t shard = 0; shard < chains_.size(); ++shard) {
    auto* chain = map.add_chains();
    chain->set_shard(static_cast<int>(shard));
    for (const Member& m : chains_[shard]) *chain->add_members() = m.member;
  }
  return map;
}

KvstoreMembershipStats KvstoreMembership::Stats() const {
  absl::ReaderMutexLock lock(&mu_);
  KvstoreMembershipStats st;
  st.version = version_;
  st.changes = changes_;
  for (size_t shard = 0; shard < chains_.size(); ++shard) {
    int active = 0, joining = 0;
    for (const Member& m : chains_[shard]) {
      (m.member.state() == REPLICA_ACTIVE ? active : joining)++;
    }
    st.replicas.push_back({static_cast<int>(shard), {active, joining}});
  }
  return st;
}

}  // namespace scheduler
}  // namespace dtrain
