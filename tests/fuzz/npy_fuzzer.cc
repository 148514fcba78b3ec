// Fuzz target: the strict .npy header parser (libs/data/npy.h).
//
// Checks beyond "no crash": what parses has its data after the header, a
// byte count equal to product(shape) x item size, and writing it back with
// WriteNpy gives a header that parses to the same dtype and shape.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "libs/data/npy.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "npy_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dtrain::data::NpyHeader> h = dtrain::data::ParseNpyHeader(bytes);
  if (!h.ok()) {
    Check(!h.status().message().empty(), "errors say something");
    return 0;
  }
  Check(h->data_offset >= 10 && h->data_offset <= static_cast<int64_t>(size), "data after header");
  int64_t elements = 1;
  for (int64_t d : h->shape) elements *= d;
  Check(h->data_bytes == elements * dtrain::data::NpyItemSize(h->dtype), "byte count");
  absl::StatusOr<dtrain::data::NpyHeader> again =
      dtrain::data::ParseNpyHeader(dtrain::data::WriteNpy(h->dtype, h->shape, ""));
  Check(again.ok() && again->dtype == h->dtype && again->shape == h->shape, "round trip");
  return 0;
}
