// Shared-memory transport: ranks are processes on one host.
//
// Each connected pair of ranks shares one POSIX shared-memory segment
// (shm_open + mmap) holding a single-producer/single-consumer ring buffer per
// direction and channel. A send copies into the ring, the receiver copies
// (or reduces) out of it in pieces, so the two overlap. Each rank also owns a
// small control segment with its pid, its state (alive, closed, aborted) and
// a doorbell word: a rank that has nothing to do spins briefly, then sleeps
// on its doorbell with futex(2), and peers ring it when they add data or free
// space. While sleeping it looks every few milliseconds whether peers it has
// pending operations with still exist (/proc/<pid>/stat, which also catches
// a killed-but-unreaped child), so a dead peer becomes UNAVAILABLE quickly.
//
// Segments are named "/dtrain-<job id>-..." and unlinked as soon as every
// rank has mapped them, so nothing is left in /dev/shm after a normal exit or
// a crash after creation; a rank that dies during creation can leave its
// segments behind.
#ifndef DTRAIN_LIBS_COLLECTIVE_SHM_TRANSPORT_H_
#define DTRAIN_LIBS_COLLECTIVE_SHM_TRANSPORT_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "libs/collective/transport.h"

namespace dtrain {
namespace collective {

struct ShmOptions {
  // Capacity of each ring (one per direction and channel of every pair).
  // Small enough to stay in cache, large enough to hold a few pipeline chunks.
  size_t ring_bytes = 1 << 20;
};

// Creates and maps the segments and waits (until options.deadline) until all
// ranks have mapped theirs. Every rank of the communicator must call it (it
// ends with a barrier through the store).
absl::StatusOr<std::unique_ptr<Transport>> CreateShmTransport(const TransportOptions& options,
                                                              const ShmOptions& shm);

}  // namespace collective
}  // namespace dtrain

#endif  // DTRAIN_LIBS_COLLECTIVE_SHM_TRANSPORT_H_
