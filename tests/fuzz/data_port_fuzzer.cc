// Fuzz target: the kvstore data port's frame decoding, as a shard does it on
// bytes from a connection (libs/kvstore/data_port_frame.h): the fixed header
// (magic, version, op, bounded header length, flags), the op's protobuf
// header, and a push's payload length against the store's expected sizes,
// checked before any payload byte is read; then SplitPayload on the bytes
// that follow. Also decodes the input as a reply header, as a client does.
//
// Input: a frame as it arrives (fixed header, protobuf header, payload).
#include <google/protobuf/stubs/logging.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/kvstore/data_port_frame.h"
#include "protos/kvstore.pb.h"

namespace {

namespace kv = dtrain::kvstore;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "data_port_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

// The store of the harness: keys "w" (16 bytes) and "b" (4 KiB) of job "j".
absl::StatusOr<int64_t> Expected(const std::string& key, int slice) {
  if (slice != 0) return absl::OutOfRangeError("no such slice");
  if (key == "w") return 16;
  if (key == "b") return 4096;
  return absl::NotFoundError(absl::StrCat("no key '", key, "'"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  const absl::string_view frame(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kv::FrameHeader> h = kv::DecodeFrameHeader(frame, /*request=*/true);
  const absl::Status checked = kv::CheckRequestFrame(frame, Expected);
  if (!h.ok()) {
    Check(!checked.ok(), "a frame whose header does not decode is refused");
    Check(absl::IsInvalidArgument(h.status()), "header errors are INVALID_ARGUMENT");
    Check(!h.status().message().empty(), "header errors say what is wrong");
  } else {
    Check(h->header_bytes <= kv::kMaxFrameHeaderBytes, "header length bounded");
    Check(h->version == kv::kDataPortVersion, "one version");
    // Re-encoding gives the same fixed header.
    char again[kv::kFrameHeaderSize];
    kv::EncodeFrameHeader(*h, again);
    Check(absl::string_view(again, sizeof(again)) == frame.substr(0, kv::kFrameHeaderSize),
          "the fixed header round-trips");
    if (checked.ok() && (h->op == static_cast<uint16_t>(kv::DataOp::kPush) ||
                         h->op == static_cast<uint16_t>(kv::DataOp::kPushPull))) {
      // The payload matched the store's sizes: split what arrived of it.
      kv::v1::PushRequest r;
      const absl::string_view header = frame.substr(kv::kFrameHeaderSize, h->header_bytes);
      Check(r.ParseFromArray(header.data(), static_cast<int>(header.size())), "parsed once");
      std::vector<int64_t> sizes;
      uint64_t need = 0;
      for (const auto& item : r.items()) {
        sizes.push_back(*Expected(item.key(), item.slice()));
        need += static_cast<uint64_t>(sizes.back());
      }
      Check(need == h->payload_bytes, "payload checked against the store");
      const absl::string_view payload = frame.substr(kv::kFrameHeaderSize + h->header_bytes);
      if (payload.size() == h->payload_bytes) {
        absl::StatusOr<std::vector<absl::string_view>> parts = kv::SplitPayload(payload, sizes);
        Check(parts.ok() && parts->size() == sizes.size(), "an exact payload splits");
      }
    }
  }
  // As a reply (what a client decodes).
  absl::StatusOr<kv::FrameHeader> reply = kv::DecodeFrameHeader(frame, /*request=*/false);
  if (reply.ok()) Check((reply->op & kv::kReplyBit) != 0, "replies carry the reply bit");
  (void)kv::DataOpName(h.ok() ? h->op : 0);
  return 0;
}
