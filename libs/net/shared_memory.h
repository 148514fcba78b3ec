// SharedMemory: a shared-memory segment mapped into this process, the one
// shared-memory layer of dtrain's transports. Two kinds:
//   - sealed anonymous segments (memfd): made by one process and passed to
//     another over a Unix socket (SCM_RIGHTS, fd()); sealed against
//     shrinking, so the receiver may map it without a truncate faulting it.
//     The kvstore data port's client segments (libs/kvstore/data_port.h).
//   - named POSIX segments (shm_open): one process creates the name, the
//     others open it by name; only this user's private (0600) segments of
//     the expected size are opened. The collective's shm transport
//     (libs/collective/shm_transport.h).
//
//   DT_ASSIGN_OR_RETURN(net::SharedMemory seg, net::SharedMemory::CreateSealed("x", 1 << 20));
//   SendWithDescriptor(socket, seg.fd());            // the peer:
//   DT_ASSIGN_OR_RETURN(net::SharedMemory peer, net::SharedMemory::MapSealed(fd, kMax));
//   std::memcpy(peer.data(), bytes, n);
//
// Errors name the segment and what failed, without a prefix (callers add
// theirs). The mapping (and a memfd's descriptor) is released on
// destruction, and a name this process created is unlinked.
//
// Thread-safety: none; a segment's bytes are shared memory (synchronize
// through them as the transport does).
#ifndef DTRAIN_LIBS_NET_SHARED_MEMORY_H_
#define DTRAIN_LIBS_NET_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dtrain {
namespace net {

class SharedMemory {
 public:
  // A new memfd of `bytes` (named `name` in /proc), sealed against
  // shrinking and against more seals, mapped; fd() passes it on.
  // kUnavailable when the kernel refuses (memfd_create, ftruncate, mmap).
  static absl::StatusOr<SharedMemory> CreateSealed(const char* name, uint64_t bytes);
  // Maps the segment `fd` a peer passed (closed here, mapped or not). It
  // must be a memfd sealed against shrinking, of 1 to `max_bytes` bytes;
  // else kInvalidArgument.
  static absl::StatusOr<SharedMemory> MapSealed(int fd, int64_t max_bytes);

  // Creates the POSIX segment `name` (O_EXCL, mode 0600) of `bytes` and maps
  // it (MAP_POPULATE); the name is unlinked by Unlink or on destruction.
  // Errors follow errno (ErrnoToStatus).
  static absl::StatusOr<SharedMemory> CreateNamed(const std::string& name, size_t bytes);
  // Opens and maps the POSIX segment `name`, which must be this user's,
  // readable by no one else (kPermissionDenied) and of `bytes`
  // (kFailedPrecondition); a missing one follows errno (kNotFound).
  static absl::StatusOr<SharedMemory> OpenNamed(const std::string& name, size_t bytes);

  SharedMemory() = default;
  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // A sealed segment's descriptor (owned here), to pass to a peer; -1 for
  // other segments.
  int fd() const { return fd_; }
  // Removes the name of a segment this process created (CreateNamed); the
  // mapping stays. Later calls, and calls on other segments, do nothing.
  void Unlink();

 private:
  void Release();

  char* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
  std::string name_;  // CreateNamed's, until unlinked
};

}  // namespace net
}  // namespace dtrain

#endif  // DTRAIN_LIBS_NET_SHARED_MEMORY_H_
