#include "services/trainctl/shard_map_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace trainctl {

using kvstore::v1::REPLICA_ACTIVE;
using kvstore::v1::REPLICA_JOINING;

std::string ChainRole(const kvstore::v1::Chain& chain, int index) {
  if (chain.members(index).state() != REPLICA_ACTIVE) return "joining";
  int active = 0, position = -1;
  for (int i = 0; i < chain.members_size(); ++i) {
    if (chain.members(i).state() != REPLICA_ACTIVE) continue;
    if (i == index) position = active;
    ++active;
  }
  if (active == 1) return "head,tail";
  if (position == 0) return "head";
  if (position == active - 1) return "tail";
  return "middle";
}

std::vector<std::string> ChainRows(const kvstore::v1::Chain& chain) {
  std::vector<std::string> rows;
  for (int i = 0; i < chain.members_size(); ++i) {
    const auto& m = chain.members(i);
    const std::string state = m.state() == REPLICA_ACTIVE    ? "ACTIVE"
                              : m.state() == REPLICA_JOINING ? "JOINING"
                                                             : "?";
    rows.push_back(absl::StrFormat("%-6d %-8d %-21s %-8s %s", chain.shard(), m.replica(),
                                   m.address(), state, ChainRole(chain, i)));
  }
  return rows;
}

absl::Status ChainsReady(const kvstore::v1::ShardMap& map, int num_shards, int replicas) {
  if (map.version() == 0) {
    return absl::UnavailableError("no kvstore shard map yet (no replica has heartbeated)");
  }
  if (map.num_shards() != num_shards) {
    return absl::UnavailableError(
        absl::StrCat("the shard map has ", map.num_shards(), " shards, not ", num_shards));
  }
  std::vector<std::string> missing;
  for (int shard = 0; shard < num_shards; ++shard) {
    const kvstore::v1::Chain* chain = nullptr;
    for (const auto& c : map.chains()) {
      if (c.shard() == shard) chain = &c;
    }
    int active = 0;
    std::vector<std::string> others;
    if (chain != nullptr) {
      for (const auto& m : chain->members()) {
        if (m.state() == REPLICA_ACTIVE) {
          ++active;
        } else {
          others.push_back(absl::StrCat("replica ", m.replica(), " JOINING"));
        }
      }
    }
    if (active < replicas) {
      missing.push_back(
          absl::StrCat("shard ", shard, ": ", active, " of ", replicas, " replicas ACTIVE",
                       others.empty() ? "" : absl::StrCat(" (", absl::StrJoin(others, ", "), ")")));
    }
  }
  if (!missing.empty()) {
    return absl::UnavailableError(absl::StrCat("kvstore shard map version ", map.version(), ": ",
                                               absl::StrJoin(missing, "; ")));
  }
  return absl::OkStatus();
}

}  // namespace trainctl
}  // namespace dtrain
