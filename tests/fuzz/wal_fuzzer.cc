// Fuzz target: the scheduler's write-ahead log reader (libs/scheduler/wal.h)
// on any file. Half of the inputs (first byte odd) are turned into frames
// with correct CRCs first ([u16 length][payload] pieces of the input, with a
// chance of a torn or damaged last frame), so the fuzzer gets past the
// checksums.
//
// Checks beyond "no crash": Open either fails with kDataLoss (damage before
// the last record) or an errno-derived error, or returns the records; after
// a successful Open the log holds exactly those records (a second Open
// returns the same), and an Append after it is read back by a third.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/scheduler/wal.h"

namespace {

using dtrain::scheduler::Wal;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "wal_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

void PutU32(std::string* out, uint32_t v) {
  for (int k = 0; k < 4; ++k) out->push_back(static_cast<char>(v >> (8 * k)));
}

// Frames made of the input: [u16 length][payload] pieces.
std::string Frames(const uint8_t* data, size_t size) {
  std::string out;
  size_t p = 0;
  while (p + 2 <= size) {
    size_t n = data[p] | (data[p + 1] << 8);
    p += 2;
    const bool damaged = (n & 0x8000) != 0;  // a wrong CRC
    n &= 0x7fff;
    if (n > size - p) n = size - p;
    std::string payload(reinterpret_cast<const char*>(data + p), n);
    p += n;
    PutU32(&out, static_cast<uint32_t>(n));
    PutU32(&out, dtrain::scheduler::Crc32(payload) ^ (damaged ? 1u : 0u));
    out += payload;
  }
  if (p < size) out.append(reinterpret_cast<const char*>(data + p), size - p);  // torn tail
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Open logs each torn tail it cuts off; that is expected here.
  dtrain::SetMinLogLevel(dtrain::LogLevel::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = absl::StrCat("/dev/shm/wal_fuzzer.", getpid(), ".wal");
  std::string file;
  if (size > 0 && (data[0] & 1)) {
    file = Frames(data + 1, size - 1);
  } else if (size > 0) {
    file.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  }
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(file.data(), static_cast<std::streamsize>(file.size()));
  }
  std::vector<std::string> records;
  absl::StatusOr<std::unique_ptr<Wal>> wal = Wal::Open(path, &records);
  if (!wal.ok()) {
    Check(absl::IsDataLoss(wal.status()), "Open of a damaged log is DataLoss");
    return 0;
  }
  Check((*wal)->records() == static_cast<int64_t>(records.size()), "records() counts them");
  for (const std::string& r : records) Check(r.size() <= Wal::kMaxRecordBytes, "record size");
  Check((*wal)->Append("after").ok(), "Append after Open");
  wal->reset();
  std::vector<std::string> again;
  absl::StatusOr<std::unique_ptr<Wal>> reopened = Wal::Open(path, &again);
  Check(reopened.ok(), "a log Open accepted (and cut) opens again");
  Check(again.size() == records.size() + 1, "the same records and the appended one");
  for (size_t i = 0; i < records.size(); ++i) Check(again[i] == records[i], "same record");
  Check(again.back() == "after", "the appended record");
  return 0;
}
