#include "libs/kvstore/data_port_frame.h"

#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "protos/kvstore.pb.h"

namespace dtrain {
namespace kvstore {
namespace {

template <typename T>
void Put(char* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

template <typename T>
T Get(const char* in) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<T>(static_cast<T>(static_cast<unsigned char>(in[i])) << (8 * i));
  }
  return v;
}

bool KnownOp(uint16_t op) { return op >= 1 && op <= 5; }

}  // namespace

std::string DataOpName(uint16_t op) {
  const bool reply = (op & kReplyBit) != 0;
  const uint16_t base = static_cast<uint16_t>(op & ~kReplyBit);
  const char* name = nullptr;
  switch (base) {
    case 1:
      name = "HELLO";
      break;
    case 2:
      name = "PUSH";
      break;
    case 3:
      name = "PULL";
      break;
    case 4:
      name = "PUSH_PULL";
      break;
    case 5:
      name = "REPLICATE";
      break;
    case 0:
      if (reply) return "ERROR reply";
      return "op 0";
    default:
      return absl::StrCat("op ", op);
  }
  return reply ? absl::StrCat(name, " reply") : name;
}

const char* DataOpMethod(DataOp op) {
  switch (op) {
    case DataOp::kHello:
      return "Hello";
    case DataOp::kPush:
      return "Push";
    case DataOp::kPull:
      return "Pull";
    case DataOp::kPushPull:
      return "PushPull";
    case DataOp::kReplicate:
      return "Replicate";
  }
  return "Unknown";
}

void EncodeFrameHeader(const FrameHeader& h, char out[kFrameHeaderSize]) {
  Put<uint32_t>(out, kDataPortMagic);
  out[4] = static_cast<char>(h.version);
  out[5] = static_cast<char>(h.flags);
  Put<uint16_t>(out + 6, h.op);
  Put<uint32_t>(out + 8, h.arg);
  Put<uint32_t>(out + 12, h.header_bytes);
  Put<uint64_t>(out + 16, h.request_id);
  Put<uint64_t>(out + 24, h.payload_bytes);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view bytes, bool request) {
  if (bytes.size() < kFrameHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat("data port frame: ", bytes.size(),
                                                   " bytes, a header needs ", kFrameHeaderSize));
  }
  const char* in = bytes.data();
  const uint32_t magic = Get<uint32_t>(in);
  if (magic != kDataPortMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data port frame: bad magic 0x", absl::Hex(magic), " (not a kvstore data port client?)"));
  }
  FrameHeader h;
  h.version = static_cast<uint8_t>(in[4]);
  h.flags = static_cast<uint8_t>(in[5]);
  h.op = Get<uint16_t>(in + 6);
  h.arg = Get<uint32_t>(in + 8);
  h.header_bytes = Get<uint32_t>(in + 12);
  h.request_id = Get<uint64_t>(in + 16);
  h.payload_bytes = Get<uint64_t>(in + 24);
  if (h.version != kDataPortVersion) {
    return absl::InvalidArgumentError(absl::StrCat("data port frame: version ", h.version,
                                                   ", this side speaks ", kDataPortVersion));
  }
  if ((h.flags & ~kPayloadInSegment) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data port frame: unknown flags 0x", absl::Hex(h.flags)));
  }
  const bool is_reply = (h.op & kReplyBit) != 0;
  const uint16_t base = static_cast<uint16_t>(h.op & ~kReplyBit);
  // An error reply to a frame that could not be decoded names no op.
  const bool error_to_unknown = is_reply && base == 0 && h.arg != 0;
  if (is_reply == request || (!KnownOp(base) && !error_to_unknown)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data port frame: unknown ", request ? "request" : "reply", " op ", h.op));
  }
  if (h.header_bytes > kMaxFrameHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("data port frame: header of ", h.header_bytes,
                                                   " bytes (at most ", kMaxFrameHeaderBytes, ")"));
  }
  return h;
}

absl::StatusOr<std::vector<absl::string_view>> SplitPayload(absl::string_view payload,
                                                            const std::vector<int64_t>& sizes) {
  std::vector<absl::string_view> out;
  uint64_t off = 0;
  for (int64_t size : sizes) {
    if (size < 0 || static_cast<uint64_t>(size) > payload.size() - off) {
      return absl::InvalidArgumentError(absl::StrCat("data port frame: payload of ", payload.size(),
                                                     " bytes is shorter than its items"));
    }
    out.push_back(payload.substr(off, static_cast<size_t>(size)));
    off += static_cast<uint64_t>(size);
  }
  if (off != payload.size()) {
    return absl::InvalidArgumentError(absl::StrCat("data port frame: payload of ", payload.size(),
                                                   " bytes, its items need ", off));
  }
  return out;
}

absl::Status CheckRequestFrame(
    absl::string_view frame,
    const std::function<absl::StatusOr<int64_t>(const std::string& key, int slice)>& expected) {
  DT_ASSIGN_OR_RETURN(FrameHeader h, DecodeFrameHeader(frame, /*request=*/true));
  frame.remove_prefix(kFrameHeaderSize);
  if (frame.size() < h.header_bytes) {
    return absl::InvalidArgumentError("data port frame: truncated header");
  }
  const absl::string_view header = frame.substr(0, h.header_bytes);
  switch (static_cast<DataOp>(h.op)) {
    case DataOp::kHello: {
      v1::DataHello hello;
      if (!hello.ParseFromArray(header.data(), static_cast<int>(header.size()))) {
        return absl::InvalidArgumentError("data port HELLO: unparsable DataHello");
      }
      break;
    }
    case DataOp::kPull: {
      v1::PullRequest r;
      if (!r.ParseFromArray(header.data(), static_cast<int>(header.size()))) {
        return absl::InvalidArgumentError("data port PULL: unparsable PullRequest");
      }
      break;
    }
    case DataOp::kPush:
    case DataOp::kPushPull: {
      v1::PushRequest r;
      if (!r.ParseFromArray(header.data(), static_cast<int>(header.size()))) {
        return absl::InvalidArgumentError("data port PUSH: unparsable PushRequest");
      }
      if (r.chunks_size() > 0) {
        return absl::InvalidArgumentError("data port PUSH: chunks in the header");
      }
      uint64_t need = 0;
      for (const v1::PushItem& item : r.items()) {
        DT_ASSIGN_OR_RETURN(int64_t n, expected(item.key(), item.slice()));
        need += static_cast<uint64_t>(n);
      }
      if (need != h.payload_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data port PUSH: payload of ", h.payload_bytes, " bytes, its items need ", need));
      }
      return absl::OkStatus();
    }
    case DataOp::kReplicate:
      break;
  }
  if (h.payload_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data port ", DataOpName(h.op), ": unexpected payload of ", h.payload_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace kvstore
}  // namespace dtrain
