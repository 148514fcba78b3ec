#include "libs/kvstore/shard_map.h"

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace kvstore {
namespace {

const v1::Chain* FindChain(const v1::ShardMap& map, int shard) {
  for (const v1::Chain& c : map.chains()) {
    if (c.shard() == shard) return &c;
  }
  return nullptr;
}

int IndexOf(const v1::Chain& chain, int replica) {
  for (int i = 0; i < chain.members_size(); ++i) {
    if (chain.members(i).replica() == replica) return i;
  }
  return -1;
}

}  // namespace

const v1::ChainMember* FindMember(const v1::ShardMap& map, int shard, int replica) {
  const v1::Chain* c = FindChain(map, shard);
  if (c == nullptr) return nullptr;
  int i = IndexOf(*c, replica);
  return i < 0 ? nullptr : &c->members(i);
}

const v1::ChainMember* ChainHead(const v1::ShardMap& map, int shard) {
  const v1::Chain* c = FindChain(map, shard);
  if (c == nullptr || c->members_size() == 0) return nullptr;
  return c->members(0).state() == v1::REPLICA_ACTIVE ? &c->members(0) : nullptr;
}

const v1::ChainMember* ChainTail(const v1::ShardMap& map, int shard) {
  const v1::Chain* c = FindChain(map, shard);
  if (c == nullptr) return nullptr;
  for (int i = c->members_size() - 1; i >= 0; --i) {
    if (c->members(i).state() == v1::REPLICA_ACTIVE) return &c->members(i);
  }
  return nullptr;
}

const v1::ChainMember* Successor(const v1::ShardMap& map, int shard, int replica) {
  const v1::Chain* c = FindChain(map, shard);
  if (c == nullptr) return nullptr;
  int i = IndexOf(*c, replica);
  return i < 0 || i + 1 >= c->members_size() ? nullptr : &c->members(i + 1);
}

const v1::ChainMember* Predecessor(const v1::ShardMap& map, int shard, int replica) {
  const v1::Chain* c = FindChain(map, shard);
  if (c == nullptr) return nullptr;
  int i = IndexOf(*c, replica);
  return i <= 0 ? nullptr : &c->members(i - 1);
}

std::string DescribeChain(const v1::ShardMap& map, int shard) {
  std::string out = absl::StrCat("shard ", shard, " (map version ", map.version(), "):");
  const v1::Chain* c = FindChain(map, shard);
  if (c == nullptr || c->members_size() == 0) return out + " no replicas";
  for (int i = 0; i < c->members_size(); ++i) {
    const v1::ChainMember& m = c->members(i);
    absl::StrAppend(&out, i == 0 ? " " : " -> ", "r", m.replica(), "@", m.address(),
                    m.state() == v1::REPLICA_JOINING ? " (joining)" : "");
  }
  return out;
}

}  // namespace kvstore
}  // namespace dtrain
