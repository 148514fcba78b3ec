// Fuzz target: the checkpoint reader (libs/checkpoint/checkpoint.h) on any
// file. Fuzzing builds accept any CRC (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION),
// so the fuzzer reaches the parsing behind the checksums.
//
// Checks beyond "no crash": every error is one of the documented codes and
// starts with "checkpoint <path>: "; what loads passes the writer's rules
// (WriteCheckpoint accepts it) and reads back the same after a round trip.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/checkpoint/checkpoint.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "checkpoint_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

const std::string& Path() {
  static const std::string path = absl::StrCat("/dev/shm/checkpoint_fuzzer.", getpid(), ".dtckpt");
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream f(Path(), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  absl::StatusOr<dtrain::checkpoint::Checkpoint> ckpt = dtrain::checkpoint::ReadCheckpoint(Path());
  if (!ckpt.ok()) {
    const absl::Status& s = ckpt.status();
    Check(absl::IsDataLoss(s) || absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s),
          "error code is DataLoss, InvalidArgument or FailedPrecondition");
    Check(absl::StartsWith(s.message(), absl::StrCat("checkpoint ", Path(), ": ")),
          "error names the path");
    Check(s.message().size() < 4096, "error message is small");
    return 0;
  }
  for (const auto& t : ckpt->tensors) {
    Check(!t.name.empty() && t.name.size() <= dtrain::checkpoint::kMaxNameLength, "name length");
    Check(t.shape.size() <= dtrain::checkpoint::kMaxRank, "rank");
    for (int64_t d : t.shape) Check(d >= 0, "dimension >= 0");
    (void)dtrain::checkpoint::ValidateRecord(t, 4);
  }
  // What the reader accepts, the writer writes, and it reads back the same.
  const std::string copy = Path() + ".copy";
  Check(dtrain::checkpoint::WriteCheckpoint(copy, *ckpt).ok(),
        "a loaded checkpoint can be written");
  absl::StatusOr<dtrain::checkpoint::Checkpoint> again = dtrain::checkpoint::ReadCheckpoint(copy);
  Check(again.ok(), "a written checkpoint reads back");
  Check(again->metadata == ckpt->metadata, "metadata round trip");
  Check(again->tensors.size() == ckpt->tensors.size(), "tensor count round trip");
  for (size_t i = 0; i < again->tensors.size(); ++i) {
    Check(again->tensors[i].name == ckpt->tensors[i].name &&
              again->tensors[i].dtype == ckpt->tensors[i].dtype &&
              again->tensors[i].shape == ckpt->tensors[i].shape &&
              again->tensors[i].data == ckpt->tensors[i].data,
          "tensor round trip");
  }
  return 0;
}
