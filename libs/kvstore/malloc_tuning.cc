#include "libs/kvstore/malloc_tuning.h"

#include <cstdlib>  // defines __GLIBC__ on glibc systems

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace dtrain {
namespace kvstore {

bool TuneMallocForBulkTransfers() {
#if defined(__GLIBC__)
  // glibc caps the mmap threshold at HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
  bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && ok;
  return ok;
#else
  return false;
#endif
}

bool ReleaseFreeMemory() {
#if defined(__GLIBC__)
  return malloc_trim(0) == 1;
#else
  return false;
#endif
}

}  // namespace kvstore
}  // namespace dtrain
