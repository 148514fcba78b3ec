// Zero-copy encoding of the kvstore's data messages (protos/kvstore.proto)
// as gRPC byte buffers.
//
// PushRequest, InitRequest and PullResponse are ordinary protobuf messages
// whose bulk lies in a repeated Chunk field (`bytes data`). Serializing them
// with protobuf would copy every value twice per side; here the header
// fields go through protobuf while chunk data is spliced in as gRPC slices
// that reference the caller's memory, and decoding hands back views into the
// received slices. The bytes on the wire are exactly the protobuf encoding,
// so any gRPC client of the .proto interoperates.
//
//   std::vector<wire::OutChunk> chunks = {{/*item=*/0, /*offset=*/0, slice}};
//   grpc::ByteBuffer message = wire::Encode(header, /*chunks_field=*/5, chunks);
//   ...
//   wire::Decoded decoded;
//   PushRequest header;
//   DT_RETURN_IF_ERROR(wire::Decode(message, 5, &header, &decoded));
//   for (const wire::InChunk& c : decoded.chunks) Use(c.item, c.offset, c.data);
//
// Thread-safety: the functions are thread-safe; a Decoded is a plain value.
#ifndef DTRAIN_LIBS_KVSTORE_WIRE_H_
#define DTRAIN_LIBS_KVSTORE_WIRE_H_

#include <google/protobuf/message_lite.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace kvstore {
namespace wire {

// Field numbers of Chunk (protos/kvstore.proto).
inline constexpr int kChunkItemField = 1;
inline constexpr int kChunkOffsetField = 2;
inline constexpr int kChunkDataField = 3;

// The chunks field of each data message.
inline constexpr int kInitChunksField = 3;  // InitRequest.chunks
inline constexpr int kPushChunksField = 5;  // PushRequest.chunks
inline constexpr int kPullChunksField = 2;  // PullResponse.chunks

struct OutChunk {
  int32_t item = 0;
  int64_t offset = 0;
  // Sent without copying; gRPC holds a reference until the bytes are written.
  grpc::Slice data;
};

// `header` serialized by protobuf, then `chunks` as repeated Chunk field
// number `chunks_field`. `header` should not carry chunks itself.
grpc::ByteBuffer Encode(const google::protobuf::MessageLite& header, int chunks_field,
                        const std::vector<OutChunk>& chunks);

struct InChunk {
  int32_t item = 0;
  int64_t offset = 0;
  // Views into Decoded::slices, in order.
  std::vector<absl::string_view> data;
  size_t size = 0;  // total bytes of `data`
};

struct Decoded {
  // References to the message's memory; keep them while using the views. A
  // deque, because a small slice stores its bytes inside the grpc::Slice
  // object: its address must not change. (Moving a Decoded is fine.)
  std::deque<grpc::Slice> slices;
  std::vector<InChunk> chunks;
};

// Parses `buffer`: every field except `chunks_field` is merged into
// `header` by protobuf; chunks are appended to out->chunks with their data
// left in place. kInvalidArgument when the bytes are not a valid message
// (truncated, bad wire type, a header protobuf rejects).
absl::Status Decode(const grpc::ByteBuffer& buffer, int chunks_field,
                    google::protobuf::MessageLite* header, Decoded* out);

// A slice over bytes kept alive by `owner` (released when gRPC drops the
// last reference).
grpc::Slice SharedSlice(std::shared_ptr<const void> owner, const char* data, size_t size);

// A byte buffer holding `message`'s protobuf encoding (one copy; for small
// messages).
grpc::ByteBuffer SerializeSmall(const google::protobuf::MessageLite& message);

// Parses a small message from `buffer` (copies it first). kInvalidArgument
// naming `what` when protobuf rejects it.
absl::Status ParseSmall(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message,
                        absl::string_view what);

}  // namespace wire
}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_WIRE_H_
