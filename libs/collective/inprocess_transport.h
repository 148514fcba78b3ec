// In-process transport: ranks are threads of one process (for example one
// trainer driving several devices, or tests).
//
// Nothing is staged: a send publishes its buffer, and the receiving thread
// copies (or reduces) straight out of the sender's memory into its own, so a
// message costs one pass over memory. Ranks meet through a process-wide
// registry keyed by TransportOptions::job_id; the store only checks that all
// ranks are really in this process. A rank whose transport is aborted or
// destroyed makes the peers' pending operations with it fail.
#ifndef DTRAIN_LIBS_COLLECTIVE_INPROCESS_TRANSPORT_H_
#define DTRAIN_LIBS_COLLECTIVE_INPROCESS_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "libs/collective/transport.h"

namespace dtrain {
namespace collective {

// Registers this rank and waits (until options.deadline) for the peers in
// options.peers to register. FAILED_PRECONDITION if a peer registered from
// another process.
absl::StatusOr<std::unique_ptr<Transport>> CreateInProcessTransport(
    const TransportOptions& options);

}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_INPROCESS_TRANSPORT_H_
