#include "libs/scheduler/queue_config.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/scheduler/queue_yaml.h"

namespace dtrain {
namespace scheduler {
namespace {

absl::Status LineError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("queues file line ", line, ": ", what));
}

std::string Amount(int64_t v) { return v >= kUnlimited ? "unlimited" : absl::StrCat(v); }

int ResourceByName(absl::string_view name) {
  for (int r = 0; r < kNumResources; ++r) {
    if (name == ResourceName(r)) return r;
  }
  return -1;
}

absl::Status CheckKeys(const YamlNode& map, const std::set<std::string>& allowed,
                       absl::string_view where) {
  for (const auto& [key, value] : map.items) {
    if (!allowed.count(key)) {
      return LineError(value.line, absl::StrCat("unknown key '", key, "' in ", where,
                                                " (known: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// {trainers: 1, cuda_devices: 8} -> amounts, and which were named.
absl::Status ParseResources(const YamlNode& node, absl::string_view what, absl::string_view queue,
                            Resources* out, std::array<bool, kNumResources>* named) {
  if (!node.is_map()) {
    return LineError(node.line, absl::StrCat("queue ", queue, ": ", what,
                                             " must be a mapping like {trainers: 2}"));
  }
  for (const auto& [key, value] : node.items) {
    const int r = ResourceByName(key);
    if (r < 0) {
      return LineError(value.line,
                       absl::StrCat("queue ", queue, ": unknown resource '", key, "' in ", what,
                                    " (known: trainers, cpu_devices, cuda_devices)"));
    }
    int64_t n = 0;
    if (!value.is_scalar() || !absl::SimpleAtoi(value.scalar, &n)) {
      return LineError(value.line,
                       absl::StrCat("queue ", queue, ": ", what, " ", key,
                                    " must be a whole number, got '", value.scalar, "'"));
    }
    if (n < 0) {
      return LineError(value.line,
                       absl::StrCat("queue ", queue, ": negative ", what, " ", key, " (", n, ")"));
    }
    if (n >= kUnlimited) {
      return LineError(
          value.line, absl::StrCat("queue ", queue, ": ", what, " ", key, " ", n, " is too large"));
    }
    (*out)[r] = n;
    (*named)[r] = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ParseNames(const YamlNode& node, absl::string_view what,
                                                    absl::string_view where) {
  std::vector<std::string> names;
  if (node.is_scalar() && !node.scalar.empty()) {
    names.push_back(node.scalar);  // `users: alice`
    return names;
  }
  if (!node.is_seq()) {
    return LineError(node.line,
                     absl::StrCat(where, ": ", what, " must be a list like [alice, bob]"));
  }
  for (const YamlNode& e : node.elements) {
    if (!e.is_scalar() || e.scalar.empty()) {
      return LineError(e.line, absl::StrCat(where, ": ", what, " must be names"));
    }
    if (std::find(names.begin(), names.end(), e.scalar) != names.end()) {
      return LineError(e.line, absl::StrCat(where, ": '", e.scalar, "' listed twice in ", what));
    }
    names.push_back(e.scalar);
  }
  return names;
}

struct Policies {
  WithinQueuePolicy within_queue = WithinQueuePolicy::kNever;
  ReclaimPolicy reclaim = ReclaimPolicy::kNever;
};

absl::Status ParsePolicies(const YamlNode& node, absl::string_view where, Policies* p) {
  if (!node.is_map()) {
    return LineError(node.line, absl::StrCat(where, ": preemption must be a mapping"));
  }
  if (absl::Status s = CheckKeys(node, {"within_queue", "reclaim_within_cohort"}, where); !s.ok()) {
    return s;
  }
  if (const YamlNode* w = node.Find("within_queue")) {
    if (w->scalar == "never") {
      p->within_queue = WithinQueuePolicy::kNever;
    } else if (w->scalar == "lower_priority") {
      p->within_queue = WithinQueuePolicy::kLowerPriority;
    } else {
      return LineError(w->line, absl::StrCat(where,
                                             ": within_queue must be never or "
                                             "lower_priority, got '",
                                             w->scalar, "'"));
    }
  }
  if (const YamlNode* r = node.Find("reclaim_within_cohort")) {
    if (r->scalar == "never") {
      p->reclaim = ReclaimPolicy::kNever;
    } else if (r->scalar == "lower_priority") {
      p->reclaim = ReclaimPolicy::kLowerPriority;
    } else if (r->scalar == "any") {
      p->reclaim = ReclaimPolicy::kAny;
    } else {
      return LineError(r->line, absl::StrCat(where,
                                             ": reclaim_within_cohort must be never, "
                                             "lower_priority or any, got '",
                                             r->scalar, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(QueueConfig& c) {
  // Cohorts: the same managed resources; borrowing limits within what the
  // others lend.
  std::map<std::string, std::vector<int>> cohorts;
  for (int i = 0; i < static_cast<int>(c.queues.size()); ++i) {
    if (!c.queues[i].cohort.empty()) cohorts[c.queues[i].cohort].push_back(i);
  }
  for (const auto& [cohort, members] : cohorts) {
    const QueueSpec& first = c.queues[members[0]];
    for (int m : members) {
      const QueueSpec& q = c.queues[m];
      for (int r = 0; r < kNumResources; ++r) {
        if (q.managed[r] != first.managed[r]) {
          const QueueSpec& with = q.managed[r] ? q : first;
          const QueueSpec& without = q.managed[r] ? first : q;
          return LineError(without.line,
                           absl::StrCat("queue ", without.name, " of cohort ", cohort,
                                        " has no quota for ", ResourceName(r), " but queue ",
                                        with.name, " has; name it in both (0 is fine)"));
        }
      }
    }
    for (int m : members) {
      const QueueSpec& q = c.queues[m];
      for (int r = 0; r < kNumResources; ++r) {
        if (!q.managed[r] || q.borrowing_limit[r] >= kUnlimited) continue;
        int64_t lendable = 0;
        for (int o : members) {
          if (o != m) lendable += c.queues[o].lending_limit[r];
        }
        if (q.borrowing_limit[r] > lendable) {
          return LineError(
              q.line, absl::StrCat("queue ", q.name, ": borrowing_limit ", ResourceName(r), " ",
                                   q.borrowing_limit[r], " is more than the rest of cohort ",
                                   cohort, " can lend (", lendable, ")"));
        }
      }
    }
  }
  // Users (listed, or members of a listed group): one default each.
  std::map<std::string, std::vector<std::string>> queues_of_user;
  for (const QueueSpec& q : c.queues) {
    std::vector<std::string> users = q.users;
    for (const std::string& g : q.groups) {
      auto members = c.group_members.find(g);
      if (members == c.group_members.end()) {
        return LineError(q.line, absl::StrCat("queue ", q.name, ": group '", g,
                                              "' is not defined under 'groups:'"));
      }
      users.insert(users.end(), members->second.begin(), members->second.end());
    }
    std::sort(users.begin(), users.end());
    users.erase(std::unique(users.begin(), users.end()), users.end());
    for (const std::string& u : users) queues_of_user[u].push_back(q.name);
  }
  for (const auto& [user, queue] : c.default_queue) {
    const int i = c.Find(queue);
    if (i < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("queues file: default_queues: unknown queue '", queue, "' for user ", user));
    }
    const std::vector<std::string>& in = queues_of_user[user];
    if (std::find(in.begin(), in.end(), queue) == in.end() &&
        std::find(in.begin(), in.end(), "*") == in.end()) {
      const std::vector<std::string>& star = queues_of_user["*"];
      if (std::find(star.begin(), star.end(), queue) == star.end()) {
        return absl::InvalidArgumentError(absl::StrCat("queues file: default_queues: user ", user,
                                                       " is not in queue ", queue, "'s users"));
      }
    }
  }
  for (const auto& [user, in] : queues_of_user) {
    if (c.default_queue.count(user)) continue;
    if (in.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "queues file: user ", user, " is mapped to several queues (", absl::StrJoin(in, ", "),
          "); list the user in one, or name the default under default_queues"));
    }
    c.default_queue[user] = in[0];
  }
  return absl::OkStatus();
}

}  // namespace

const char* ResourceName(int r) {
  switch (r) {
    case kTrainers:
      return "trainers";
    case kCpuDevices:
      return "cpu_devices";
    case kCudaDevices:
      return "cuda_devices";
  }
  return "?";
}

Resources& Resources::operator+=(const Resources& o) {
  for (int r = 0; r < kNumResources; ++r) v[r] += o.v[r];
  return *this;
}

Resources& Resources::operator-=(const Resources& o) {
  for (int r = 0; r < kNumResources; ++r) v[r] -= o.v[r];
  return *this;
}

bool Resources::IsZero() const {
  for (int64_t x : v) {
    if (x != 0) return false;
  }
  return true;
}

std::string Resources::ToString() const {
  std::vector<std::string> parts;
  for (int r = 0; r < kNumResources; ++r) {
    if (v[r] != 0) parts.push_back(absl::StrCat(ResourceName(r), " ", Amount(v[r])));
  }
  return parts.empty() ? "nothing" : absl::StrJoin(parts, ", ");
}

Resources GangResources(int trainers, int devices_per_trainer, bool cuda) {
  Resources r;
  r[kTrainers] = trainers;
  r[cuda ? kCudaDevices : kCpuDevices] =
      static_cast<int64_t>(trainers) * std::max(1, devices_per_trainer);
  return r;
}

const char* PolicyName(WithinQueuePolicy p) {
  return p == WithinQueuePolicy::kNever ? "never" : "lower_priority";
}

const char* PolicyName(ReclaimPolicy p) {
  switch (p) {
    case ReclaimPolicy::kNever:
      return "never";
    case ReclaimPolicy::kLowerPriority:
      return "lower_priority";
    case ReclaimPolicy::kAny:
      return "any";
  }
  return "?";
}

int QueueConfig::Find(absl::string_view name) const {
  for (int i = 0; i < static_cast<int>(queues.size()); ++i) {
    if (queues[i].name == name) return i;
  }
  return -1;
}

std::vector<int> QueueConfig::QueuesOf(absl::string_view user,
                                       const std::vector<std::string>& groups) const {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(queues.size()); ++i) {
    const QueueSpec& q = queues[i];
    bool in = false;
    for (const std::string& u : q.users) in = in || u == user || u == "*";
    for (const std::string& g : q.groups) {
      in = in || std::find(groups.begin(), groups.end(), g) != groups.end();
      auto members = group_members.find(g);
      in = in || (members != group_members.end() &&
                  std::find(members->second.begin(), members->second.end(), user) !=
                      members->second.end());
    }
    if (in) out.push_back(i);
  }
  return out;
}

absl::StatusOr<int> QueueConfig::Resolve(absl::string_view user,
                                         const std::vector<std::string>& groups,
                                         absl::string_view requested) const {
  const std::vector<int> mine = QueuesOf(user, groups);
  std::vector<std::string> names;
  for (int i : mine) names.push_back(queues[i].name);
  const std::string listing = names.empty() ? "none" : absl::StrJoin(names, ", ");
  if (!requested.empty()) {
    const int i = Find(requested);
    if (i < 0) {
      std::vector<std::string> all;
      for (const QueueSpec& q : queues) all.push_back(q.name);
      return absl::NotFoundError(absl::StrCat("unknown queue '", requested, "' (queues: ",
                                              absl::StrJoin(all, ", "), "; yours: ", listing, ")"));
    }
    if (std::find(mine.begin(), mine.end(), i) == mine.end()) {
      return absl::PermissionDeniedError(absl::StrCat("user ", user, " may not submit to queue ",
                                                      requested, " (your queues: ", listing, ")"));
    }
    return i;
  }
  auto d = default_queue.find(std::string(user));
  if (d != default_queue.end()) return Find(d->second);
  if (mine.size() == 1) return mine[0];
  if (mine.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "user ", user, " is in no queue; ask an admin to add them to the queues file"));
  }
  return absl::FailedPreconditionError(absl::StrCat("user ", user, " may use queues ", listing,
                                                    " and has no default; set the job's queue"));
}

absl::StatusOr<QueueConfig> ParseQueueConfig(absl::string_view yaml) {
  absl::StatusOr<YamlNode> root = ParseQueueYaml(yaml);
  if (!root.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("queues file ", root.status().message()));
  }
  if (!root->is_map()) return LineError(root->line, "expected a mapping with 'queues:'");
  if (absl::Status s =
          CheckKeys(*root, {"queues", "preemption", "default_queues", "groups"}, "the file");
      !s.ok()) {
    return s;
  }
  Policies defaults;
  if (const YamlNode* p = root->Find("preemption")) {
    if (absl::Status s = ParsePolicies(*p, "preemption", &defaults); !s.ok()) return s;
  }
  const YamlNode* qs = root->Find("queues");
  if (qs == nullptr || !qs->is_seq() || qs->elements.empty()) {
    return LineError(qs ? qs->line : 1, "'queues:' must be a list of queues ('- name: ...')");
  }
  QueueConfig c;
  for (const YamlNode& qn : qs->elements) {
    if (!qn.is_map()) return LineError(qn.line, "a queue must be a mapping starting '- name:'");
    QueueSpec q;
    q.line = qn.line;
    const YamlNode* name = qn.Find("name");
    if (name == nullptr || !name->is_scalar() || name->scalar.empty()) {
      return LineError(qn.line, "a queue without a name");
    }
    q.name = name->scalar;
    if (c.Find(q.name) >= 0) return LineError(name->line, absl::StrCat("queue ", q.name, " twice"));
    const std::string where = absl::StrCat("queue ", q.name);
    if (absl::Status s = CheckKeys(qn,
                                   {"name", "cohort", "quota", "borrowing_limit", "lending_limit",
                                    "weight", "users", "groups", "preemption"},
                                   where);
        !s.ok()) {
      return s;
    }
    if (const YamlNode* n = qn.Find("cohort")) {
      if (!n->is_scalar()) return LineError(n->line, absl::StrCat(where, ": cohort is a name"));
      q.cohort = n->scalar;
    }
    const YamlNode* quota = qn.Find("quota");
    if (quota == nullptr) {
      return LineError(qn.line, absl::StrCat(where, ": no quota (e.g. quota: {trainers: 4})"));
    }
    if (absl::Status s = ParseResources(*quota, "quota", q.name, &q.quota, &q.managed); !s.ok()) {
      return s;
    }
    for (int r = 0; r < kNumResources; ++r) {
      q.borrowing_limit[r] = q.cohort.empty() ? 0 : kUnlimited;
      q.lending_limit[r] = q.cohort.empty() ? 0 : q.quota[r];
    }
    for (const char* key : {"borrowing_limit", "lending_limit"}) {
      const YamlNode* n = qn.Find(key);
      if (n == nullptr) continue;
      if (q.cohort.empty()) {
        return LineError(n->line, absl::StrCat(where, ": ", key,
                                               " without a cohort (a queue borrows and lends "
                                               "only within its cohort)"));
      }
      const bool borrowing = std::string(key) == "borrowing_limit";
      std::array<bool, kNumResources> named{};
      Resources limit = borrowing ? q.borrowing_limit : q.lending_limit;
      if (absl::Status s = ParseResources(*n, key, q.name, &limit, &named); !s.ok()) return s;
      for (int r = 0; r < kNumResources; ++r) {
        if (named[r] && !q.managed[r]) {
          return LineError(n->line, absl::StrCat(where, ": ", key, " names ", ResourceName(r),
                                                 " which its quota does not"));
        }
        if (!borrowing && limit[r] > q.quota[r]) {
          return LineError(n->line, absl::StrCat(where, ": lending_limit ", ResourceName(r), " ",
                                                 limit[r], " is above its quota ", q.quota[r]));
        }
      }
      (borrowing ? q.borrowing_limit : q.lending_limit) = limit;
    }
    if (const YamlNode* n = qn.Find("weight")) {
      double w = 0;
      if (!n->is_scalar() || !absl::SimpleAtod(n->scalar, &w) || !(w > 0) || w > 1e6) {
        return LineError(
            n->line, absl::StrCat(where, ": weight must be a number > 0, got '", n->scalar, "'"));
      }
      q.weight = w;
    }
    for (const char* key : {"users", "groups"}) {
      const YamlNode* n = qn.Find(key);
      if (n == nullptr) continue;
      absl::StatusOr<std::vector<std::string>> names = ParseNames(*n, key, where);
      if (!names.ok()) return names.status();
      (std::string(key) == "users" ? q.users : q.groups) = *std::move(names);
    }
    Policies p = defaults;
    if (const YamlNode* n = qn.Find("preemption")) {
      if (absl::Status s = ParsePolicies(*n, where, &p); !s.ok()) return s;
    }
    q.within_queue = p.within_queue;
    q.reclaim_within_cohort = p.reclaim;
    c.queues.push_back(std::move(q));
  }
  if (const YamlNode* g = root->Find("groups")) {
    if (!g->is_map()) {
      return LineError(g->line, "groups must be a mapping like {ml-research: [alice, carol]}");
    }
    for (const auto& [group, members] : g->items) {
      absl::StatusOr<std::vector<std::string>> names =
          ParseNames(members, "its users", absl::StrCat("groups: ", group));
      if (!names.ok()) return names.status();
      c.group_members[group] = *std::move(names);
    }
  }
  if (const YamlNode* d = root->Find("default_queues")) {
    if (!d->is_map()) {
      return LineError(d->line, "default_queues must be a mapping like {alice: team-a}");
    }
    for (const auto& [user, queue] : d->items) {
      if (!queue.is_scalar() || queue.scalar.empty()) {
        return LineError(queue.line, absl::StrCat("default_queues: ", user, " needs a queue name"));
      }
      c.default_queue[user] = queue.scalar;
    }
  }
  if (absl::Status s = Validate(c); !s.ok()) return s;
  return c;
}

QueueConfig DefaultQueueConfig() {
  QueueConfig c;
  QueueSpec q;
  q.name = "default";
  q.users = {"*"};
  c.queues.push_back(q);  // nothing managed: no quota
  return c;
}

absl::Status CheckQuotaChange(const QueueConfig& next,
                              const std::map<std::string, Resources>& usage_by_queue) {
  std::map<std::string, std::array<int64_t, kNumResources>> cohort_borrowed, cohort_lendable;
  for (const auto& [name, usage] : usage_by_queue) {
    if (usage.IsZero()) continue;
    const int i = next.Find(name);
    if (i < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the new queues file would strand running jobs: queue ", name, " runs jobs using ",
          usage.ToString(), " and is not in it; keep the queue until they finish or drain them"));
    }
    const QueueSpec& q = next.queues[i];
    for (int r = 0; r < kNumResources; ++r) {
      if (!q.managed[r]) continue;
      const int64_t limit = std::min(kUnlimited, q.quota[r] + q.borrowing_limit[r]);
      if (usage[r] > limit) {
        return absl::FailedPreconditionError(
            absl::StrCat("the new queues file would strand running jobs: queue ", name, " uses ",
                         ResourceName(r), " ", usage[r], " > new quota ", q.quota[r],
                         " + borrowing limit ", Amount(q.borrowing_limit[r]),
                         "; raise the quota or wait for (or drain) its jobs first"));
      }
    }
  }
  for (const QueueSpec& q : next.queues) {
    if (q.cohort.empty()) continue;
    auto u = usage_by_queue.find(q.name);
    for (int r = 0; r < kNumResources; ++r) {
      if (!q.managed[r]) continue;
      const int64_t guaranteed = q.quota[r] - q.lending_limit[r];
      const int64_t used = u == usage_by_queue.end() ? 0 : u->second[r];
      cohort_borrowed[q.cohort][r] += std::max<int64_t>(0, used - guaranteed);
      cohort_lendable[q.cohort][r] += q.lending_limit[r];
    }
  }
  for (const auto& [cohort, used] : cohort_borrowed) {
    for (int r = 0; r < kNumResources; ++r) {
      if (used[r] > cohort_lendable[cohort][r]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the new queues file would strand running jobs: cohort ", cohort, " uses ",
            ResourceName(r), " ", used[r], " of its shared pool but the new quotas share only ",
            cohort_lendable[cohort][r], "; wait for (or drain) its jobs first"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace dtrain
