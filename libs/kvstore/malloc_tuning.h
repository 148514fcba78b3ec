// Memory-allocator settings for processes that move large values through
// gRPC (kvstore servers, and workers that push and pull big models).
//
//   int main(int argc, char** argv) {
//     dtrain::kvstore::TuneMallocForBulkTransfers();
//     ...
//
// gRPC reads the network into freshly allocated buffers of up to a few MiB
// and frees them moments later. With glibc's defaults such buffers are
// mmap'ed and unmapped, or trimmed from the thread arenas with
// madvise(MADV_DONTNEED), each time, so every received page costs a page
// fault and a zeroing: on loopback that was a third of the kernel time of a
// push+pull. This keeps blocks below 32 MiB in the heap and freed memory in
// the process (peak memory is then held until exit, which is what a server
// wants). Process-wide; call it once, early, from main.
#ifndef DTRAIN_LIBS_KVSTORE_MALLOC_TUNING_H_
#define DTRAIN_LIBS_KVSTORE_MALLOC_TUNING_H_

namespace dtrain {
namespace kvstore {

// Returns free heap memory of every malloc arena to the OS (glibc's
// malloc_trim). TuneMallocForBulkTransfers keeps freed memory in the
// process; a server calls this after a large, rare free (a dropped job) so
// that its resident memory follows the jobs it holds. Returns whether any
// memory was released (false where not glibc).
bool ReleaseFreeMemory();

// Returns false if the C library refused a setting (non-glibc builds do
// nothing and return false).
bool TuneMallocForBulkTransfers();

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_MALLOC_TUNING_H_
