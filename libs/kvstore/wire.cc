#include "libs/kvstore/wire.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace kvstore {
namespace wire {
namespace {

// Protobuf wire types.
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLengthDelimited = 2;
constexpr int kFixed32 = 5;

// Chunks this small are copied into the framing instead of getting a slice.
constexpr size_t kCopyBelow = 512;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

uint64_t Tag(int field, int wire_type) {
  return (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type);
}

// Sequential reads over a range of slices.
class Reader {
 public:
  Reader(const std::deque<grpc::Slice>& slices, size_t first) : slices_(slices), index_(first) {
    for (size_t i = first; i < slices.size(); ++i) remaining_ += slices[i].size();
    Normalize();
  }

  size_t remaining() const { return remaining_; }

  bool Byte(uint8_t* b) {
    if (remaining_ == 0) return false;
    *b = slices_[index_].begin()[pos_];
    Advance(1);
    return true;
  }

  bool Varint(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      if (shift == 63 && b > 1) return false;
      result |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;
  }

  bool Views(size_t n, std::vector<absl::string_view>* out) {
    if (n > remaining_) return false;
    while (n > 0) {
      const grpc::Slice& s = slices_[index_];
      size_t take = std::min(n, s.size() - pos_);
      out->emplace_back(reinterpret_cast<const char*>(s.begin()) + pos_, take);
      Advance(take);
      n -= take;
    }
    return true;
  }

  bool Copy(size_t n, std::string* out) {
    if (n > remaining_) return false;
    while (n > 0) {
      const grpc::Slice& s = slices_[index_];
      size_t take = std::min(n, s.size() - pos_);
      out->append(reinterpret_cast<const char*>(s.begin()) + pos_, take);
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    pos_ += n;
    remaining_ -= n;
    Normalize();
  }
  // Moves past exhausted (and empty) slices.
  void Normalize() {
    while (index_ < slices_.size() && pos_ >= slices_[index_].size()) {
      ++index_;
      pos_ = 0;
    }
  }

  const std::deque<grpc::Slice>& slices_;
  size_t index_;
  size_t pos_ = 0;
  size_t remaining_ = 0;
};

// Skips (or copies into `copy`, if not null) a field's payload.
bool SkipPayload(Reader& r, int wire_type, std::string* copy) {
  switch (wire_type) {
    case kVarint: {
      uint64_t v;
      if (!r.Varint(&v)) return false;
      if (copy) PutVarint(copy, v);
      return true;
    }
    case kFixed64: {
      std::string tmp;
      if (!r.Copy(8, copy ? copy : &tmp)) return false;
      return true;
    }
    case kFixed32: {
      std::string tmp;
      if (!r.Copy(4, copy ? copy : &tmp)) return false;
      return true;
    }
    case kLengthDelimited: {
      uint64_t len;
      if (!r.Varint(&len) || len > r.remaining()) return false;
      if (copy) PutVarint(copy, len);
      std::string tmp;
      return r.Copy(static_cast<size_t>(len), copy ? copy : &tmp);
    }
    default:
      return false;  // groups (3, 4) and reserved types
  }
}

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", why));
}

struct Holder {
  std::shared_ptr<const void> owner;
};

void DestroyHolder(void* p) { delete static_cast<Holder*>(p); }

}  // namespace

grpc::ByteBuffer Encode(const google::protobuf::MessageLite& header, int chunks_field,
                        const std::vector<OutChunk>& chunks) {
  std::vector<grpc::Slice> slices;
  std::string framing;
  header.AppendToString(&framing);
  for (const OutChunk& c : chunks) {
    std::string inner;
    if (c.item != 0) {
      PutVarint(&inner, Tag(kChunkItemField, kVarint));
      PutVarint(&inner, static_cast<uint64_t>(static_cast<int64_t>(c.item)));
    }
    if (c.offset != 0) {
      PutVarint(&inner, Tag(kChunkOffsetField, kVarint));
      PutVarint(&inner, static_cast<uint64_t>(c.offset));
    }
    const size_t size = c.data.size();
    PutVarint(&inner, Tag(kChunkDataField, kLengthDelimited));
    PutVarint(&inner, size);
    PutVarint(&framing, Tag(chunks_field, kLengthDelimited));
    PutVarint(&framing, inner.size() + size);
    framing += inner;
    if (size < kCopyBelow) {
      framing.append(reinterpret_cast<const char*>(c.data.begin()), size);
    } else {
      slices.emplace_back(framing);
      framing.clear();
      slices.push_back(c.data);
    }
  }
  if (!framing.empty() || slices.empty()) slices.emplace_back(framing);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::Status Decode(const grpc::ByteBuffer& buffer, int chunks_field,
                    google::protobuf::MessageLite* header, Decoded* out) {
  std::vector<grpc::Slice> dumped;
  if (!buffer.Valid() && buffer.Length() == 0) {
    // An empty message: every field at its default.
  } else if (!buffer.Dump(&dumped).ok()) {
    return Malformed("unreadable byte buffer");
  }
  const size_t first = out->slices.size();
  for (grpc::Slice& s : dumped) out->slices.push_back(std::move(s));
  Reader r(out->slices, first);
  std::string header_bytes;
  while (r.remaining() > 0) {
    uint64_t tag;
    if (!r.Varint(&tag)) return Malformed("truncated field tag");
    const uint64_t field = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (field == 0) return Malformed("field number 0");
    if (field != static_cast<uint64_t>(chunks_field)) {
      PutVarint(&header_bytes, tag);
      if (!SkipPayload(r, wire_type, &header_bytes)) {
        return Malformed(
            absl::StrCat("field ", field, " is truncated or has wire type ", wire_type));
      }
      continue;
    }
    uint64_t len;
    if (wire_type != kLengthDelimited || !r.Varint(&len) || len > r.remaining()) {
      return Malformed("chunk field is not a complete length-delimited message");
    }
    const size_t end = r.remaining() - static_cast<size_t>(len);
    InChunk chunk;
    while (r.remaining() > end) {
      uint64_t ctag;
      if (!r.Varint(&ctag)) return Malformed("truncated chunk");
      const uint64_t cfield = ctag >> 3;
      const int ctype = static_cast<int>(ctag & 7);
      uint64_t v = 0;
      if (cfield == kChunkItemField && ctype == kVarint) {
        if (!r.Varint(&v)) return Malformed("truncated chunk item");
        chunk.item = static_cast<int32_t>(static_cast<int64_t>(v));
      } else if (cfield == kChunkOffsetField && ctype == kVarint) {
        if (!r.Varint(&v)) return Malformed("truncated chunk offset");
        chunk.offset = static_cast<int64_t>(v);
      } else if (cfield == kChunkDataField && ctype == kLengthDelimited) {
        if (!r.Varint(&v) || v > r.remaining() - end) return Malformed("truncated chunk data");
        chunk.data.clear();  // a repeated singular field: the last one wins
        if (!r.Views(static_cast<size_t>(v), &chunk.data)) return Malformed("chunk data");
        chunk.size = static_cast<size_t>(v);
      } else if (cfield == 0 || !SkipPayload(r, ctype, nullptr)) {
        return Malformed("bad field in chunk");
      }
      if (r.remaining() < end) return Malformed("chunk field overruns its length");
    }
    out->chunks.push_back(std::move(chunk));
  }
  if (!header->ParsePartialFromString(header_bytes)) {
    return Malformed("header fields do not parse");
  }
  return absl::OkStatus();
}

grpc::Slice SharedSlice(std::shared_ptr<const void> owner, const char* data, size_t size) {
  auto* holder = new Holder{std::move(owner)};
  return grpc::Slice(const_cast<char*>(data), size, &DestroyHolder, holder);
}

grpc::ByteBuffer SerializeSmall(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseSmall(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message,
                        absl::string_view what) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (buffer.Valid() && buffer.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  if (!message->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what, " message"));
  }
  return absl::OkStatus();
}

}  // namespace wire
}  // namespace kvstore
}  // namespace dtrain
