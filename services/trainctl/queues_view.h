// How trainctl shows the scheduler's queues (docs/queues.md): `trainctl
// queues`'s table and where a job stands in its queue (`get`, `list`).
#ifndef DTRAIN_SERVICES_TRAINCTL_QUEUES_VIEW_H_
#define DTRAIN_SERVICES_TRAINCTL_QUEUES_VIEW_H_

#include <string>

#include "protos/scheduler.pb.h"

namespace dtrain {
namespace trainctl {

// The table of `trainctl queues`: a header, then one row per queue and
// resource its quota limits (QUOTA USED BORROWED LENT AVAILABLE), the job
// counts and preemptions on the queue's first row; a queue limiting nothing
// shows "unlimited". Without a queues file, one line saying so.
std::string QueuesTable(const scheduler::v1::ListQueuesReply& reply);

// "queue team-a, position 2" for a QUEUED job of a scheduler with queues,
// "queue team-a" for other jobs in a queue, "" for none.
std::string QueuePlace(const scheduler::v1::JobStatus& job);

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_QUEUES_VIEW_H_
