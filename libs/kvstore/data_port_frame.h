// The kvstore data port's framing: how a push, pull or push-pull travels
// outside gRPC (libs/kvstore/data_port.h carries the frames).
//
// A frame is a fixed 32-byte little-endian header, a protobuf header of
// header_bytes, then payload_bytes of raw value bytes:
//
//   offset size  field
//        0    4  magic "DTKV"
//        4    1  version (kDataPortVersion)
//        5    1  flags (kPayloadInSegment: the payload lies at offset 0 of
//                the connection's shared-memory segment, not on the socket)
//        6    2  op (DataOp; a reply is its request's op | kReplyBit)
//        8    4  request: timeout in ms (0: none); reply: absl::StatusCode
//       12    4  header_bytes (<= kMaxFrameHeaderBytes)
//       16    8  request id (a reply echoes its request's)
//       24    8  payload_bytes
//
// Protobuf headers (protos/kvstore.proto): HELLO carries DataHello;
// PUSH and PUSH_PULL a PushRequest without chunks, whose items' values
// follow as the payload, concatenated in item order, each exactly its
// expected size (Store::ExpectedPushBytes); PULL a PullRequest and no
// payload. Replies: PUSH a PushResponse; PULL and PUSH_PULL a PullResponse
// without chunks whose items' values (PulledItem.bytes each) follow in
// item order; REPLICATE a ReplicateBatch / ReplicateResponse (the chain's
// link). An error reply has a non-zero status, its message as the header
// and no payload; after it the server closes the connection when the
// request's payload was not read (or the frame was malformed; the reply to
// a frame whose header could not be decoded has op 0 | kReplyBit).
//
// Nothing here does I/O; the decoder never trusts a length it did not bound.
#ifndef DTRAIN_LIBS_KVSTORE_DATA_PORT_FRAME_H_
#define DTRAIN_LIBS_KVSTORE_DATA_PORT_FRAME_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace kvstore {

inline constexpr uint32_t kDataPortMagic = 0x564B5444;  // "DTKV" little-endian
inline constexpr uint8_t kDataPortVersion = 1;
inline constexpr size_t kFrameHeaderSize = 32;
// A protobuf header lists a request's keys; 1 MiB is ~10,000 keys.
inline constexpr uint32_t kMaxFrameHeaderBytes = 1 << 20;
inline constexpr uint8_t kPayloadInSegment = 1;
inline constexpr uint16_t kReplyBit = 0x100;

enum class DataOp : uint16_t {
  kHello = 1,
  kPush = 2,
  kPull = 3,
  kPushPull = 4,
  kReplicate = 5,
};

// "HELLO", "PUSH", ...; "op <n>" for an unknown one.
std::string DataOpName(uint16_t op);
// The kvstore method a request op counts as (metrics, authorization):
// "Push", "Pull", "PushPull", "Replicate", "Hello".
const char* DataOpMethod(DataOp op);

struct FrameHeader {
  uint8_t version = kDataPortVersion;
  uint8_t flags = 0;
  uint16_t op = 0;
  uint32_t arg = 0;  // request: timeout ms; reply: status code
  uint32_t header_bytes = 0;
  uint64_t request_id = 0;
  uint64_t payload_bytes = 0;
};

void EncodeFrameHeader(const FrameHeader& header, char out[kFrameHeaderSize]);

// Decodes and checks a fixed header: the magic, the version, a known op
// (a request op when `request`, else a reply op), header_bytes bounded,
// known flags. InvalidArgument naming what is wrong.
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view bytes, bool request);

// Splits a push payload into the items' values: `sizes` are the expected
// bytes of each item, in order; InvalidArgument unless they add up to the
// payload exactly.
absl::StatusOr<std::vector<absl::string_view>> SplitPayload(absl::string_view payload,
                                                            const std::vector<int64_t>& sizes);

// The whole-frame check the server makes before it runs a request (and the
// fuzz target's entry point): decodes the fixed header, parses the op's
// protobuf header and, for pushes, checks payload_bytes against
// `expected(item index)` (the store's expected bytes; an error ends the
// check) without reading the payload. `frame` holds the fixed header,
// then the protobuf header, then possibly payload bytes.
absl::Status CheckRequestFrame(
    absl::string_view frame,
    const std::function<absl::StatusOr<int64_t>(const std::string& key, int slice)>& expected);

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_DATA_PORT_FRAME_H_
