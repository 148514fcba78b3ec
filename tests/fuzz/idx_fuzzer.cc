// Fuzz target: the IDX reader of the Fashion-MNIST loader
// (libs/data/idx.h) on any file. When the first input byte is odd the rest
// is gzip-compressed first (as the data set is distributed), so the fuzzer
// reaches the IDX parsing behind zlib as well as zlib's error paths.
//
// Checks beyond "no crash": every error names the file; what loads has 1 or 3
// dimensions and exactly product(dims) bytes.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/data/idx.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "idx_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = absl::StrCat("/dev/shm/idx_fuzzer.", getpid(), ".idx");
  if (size == 0) return 0;
  const bool gzip = data[0] & 1;
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (f == nullptr) return 0;
    if (size > 1) gzwrite(f, data + 1, static_cast<unsigned>(size - 1));
    gzclose(f);
  } else {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  absl::StatusOr<dtrain::data::IdxArray> a = dtrain::data::ReadIdxFile(path);
  if (!a.ok()) {
    Check(absl::StrContains(a.status().message(), path), "error names the file");
    return 0;
  }
  Check(a->dims.size() == 1 || a->dims.size() == 3, "1 or 3 dimensions");
  // The product of dims, which may overflow when one of them is 0.
  bool zero = false, overflow = false;
  int64_t n = 1;
  for (int64_t d : a->dims) {
    Check(d >= 0, "dims are not negative");
    zero |= d == 0;
    overflow |= __builtin_mul_overflow(n, d, &n);
  }
  if (zero) n = 0;
  Check(!overflow || zero, "the product of dims fits in int64");
  Check(static_cast<int64_t>(a->data.size()) == n, "data size is the product of dims");
  return 0;
}
