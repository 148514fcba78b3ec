#include "services/trainctl/queues_view.h"

#include <cstdint>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace dtrain {
namespace trainctl {
namespace {

using scheduler::v1::QueueResources;

int64_t Amount(const QueueResources& r, const std::string& resource) {
  if (resource == "trainers") return r.trainers();
  if (resource == "cpu_devices") return r.cpu_devices();
  return r.cuda_devices();
}

constexpr char kRow[] = "%-16s %-12s %-13s %9s %6s %9s %6s %10s %8s %9s  %s";

// One row, without trailing blanks.
void AddRow(std::string* out, const std::string& row) {
  absl::StrAppend(out, absl::StripTrailingAsciiWhitespace(row), "\n");
}

}  // namespace

std::string QueuesTable(const scheduler::v1::ListQueuesReply& reply) {
  if (!reply.configured()) {
    return "no queues: the scheduler runs without a queues file (one queue, no quota; "
           "scheduler_server --queues=FILE, docs/queues.md)\n";
  }
  std::string out;
  AddRow(&out, absl::StrFormat(kRow, "QUEUE", "COHORT", "RESOURCE", "QUOTA", "USED", "BORROWED",
                               "LENT", "AVAILABLE", "PENDING", "ADMITTED", "PREEMPTED"));
  for (const scheduler::v1::QueueStatus& q : reply.queues()) {
    std::vector<std::string> preempted;
    for (const auto& [rule, n] :
         std::map<std::string, int64_t>(q.preempted().begin(), q.preempted().end())) {
      if (n > 0) preempted.push_back(absl::StrCat(n, " ", rule));
    }
    const std::string cohort = q.cohort().empty() ? "-" : q.cohort();
    const std::string counts = preempted.empty() ? "-" : absl::StrJoin(preempted, ", ");
    if (q.resources().empty()) {
      AddRow(&out, absl::StrFormat(kRow, q.name(), cohort, "-", "unlimited", "-", "-", "-", "-",
                                   absl::StrCat(q.pending()), absl::StrCat(q.admitted()), counts));
      continue;
    }
    bool first = true;
    for (const std::string& r : q.resources()) {
      AddRow(&out,
             absl::StrFormat(
                 kRow, first ? q.name() : "", first ? cohort : "", r,
                 absl::StrCat(Amount(q.quota(), r)), absl::StrCat(Amount(q.usage(), r)),
                 absl::StrCat(Amount(q.borrowed(), r)), absl::StrCat(Amount(q.lent(), r)),
                 absl::StrCat(Amount(q.available(), r)), first ? absl::StrCat(q.pending()) : "",
                 first ? absl::StrCat(q.admitted()) : "", first ? counts : ""));
      first = false;
    }
  }
  return out;
}

std::string QueuePlace(const scheduler::v1::JobStatus& job) {
  if (job.queue().empty()) return "";
  if (job.state() == scheduler::v1::QUEUED && job.queue_position() > 0) {
    return absl::StrCat("queue ", job.queue(), ", position ", job.queue_position());
  }
  return absl::StrCat("queue ", job.queue());
}

}  // namespace trainctl
}  // namespace dtrain
