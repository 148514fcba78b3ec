// Fuzz target: the kvstore's request decoding, as a shard (and, for pull
// replies, a client) does it on bytes from the network:
// libs/kvstore/wire.h (zero-copy Decode over gRPC slices), proto_convert.h
// (FromProto, DTypeFromWire), types.h (ValidateJobConfig, ValidateSliceSpec,
// CheckedNumElements), chunks.h (ChunkAssembler) and codec.h (DecodeValue, CheckPushValue,
// DecodePush).
//
// Input: byte 0 picks the message (low 3 bits), byte 1 the size of the
// gRPC slices the rest arrives in (so chunk data crosses slice boundaries);
// the rest is the message.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/kvstore/chunks.h"
#include "libs/kvstore/codec.h"
#include "libs/kvstore/proto_convert.h"
#include "libs/kvstore/types.h"
#include "libs/kvstore/wire.h"
#include "protos/kvstore.pb.h"

namespace {

namespace kv = dtrain::kvstore;
namespace wire = dtrain::kvstore::wire;
using dtrain::DType;

// Largest value a test case may make the harness decode (elements).
constexpr int64_t kMaxElements = int64_t{1} << 20;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kvstore_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

// Assembles the chunks of `decoded` for items of `sizes` bytes and decodes
// each item's bytes as `dtypes[i]`, as the shard does with a push.
void AssembleAndDecode(const std::vector<wire::InChunk>& chunks,
                       std::vector<std::pair<std::string, int64_t>> sizes,
                       const std::vector<DType>& dtypes, bool allow_empty) {
  kv::ChunkAssembler assembler(sizes);
  for (const wire::InChunk& c : chunks) {
    int64_t total = 0;
    for (absl::string_view piece : c.data) total += static_cast<int64_t>(piece.size());
    Check(total == static_cast<int64_t>(c.size), "InChunk.size is the sum of its pieces");
    if (!assembler.Add(c.item, c.offset, c.data).ok()) return;
  }
  if (!assembler.Finish(allow_empty).ok()) return;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<absl::string_view>& pieces = assembler.pieces(i);
    Check(static_cast<int64_t>(kv::TotalBytes(pieces)) == sizes[i].second ||
              (allow_empty && pieces.empty()),
          "an assembled item has its expected size");
    const int64_t width = static_cast<int64_t>(dtrain::DTypeSize(dtypes[i]));
    const int64_t count = sizes[i].second / width;
    if (pieces.empty() || count > kMaxElements) continue;
    std::vector<float> values(static_cast<size_t>(count), 1.0f);
    absl::Status s = kv::DecodeValue(pieces, dtypes[i], count, values.data(), /*accumulate=*/true);
    Check(s.ok() == (kv::CheckFloatDType(dtypes[i]).ok() && count * width == sizes[i].second),
          "DecodeValue accepts exactly float dtypes of the right size");
  }
}

// A top-k push, checked and scattered as the shard does (codec.h,
// CheckPushValue and DecodePush).
void PushTopK(const dtrain::kvstore::v1::PushRequest& header, const wire::Decoded& decoded,
              const kv::CompressionSpec& compression) {
  std::vector<std::pair<std::string, int64_t>> sizes;
  std::vector<int64_t> counts;
  for (const auto& item : header.items()) {
    absl::StatusOr<int64_t> n =
        kv::CheckedNumElements(std::vector<int64_t>(item.shape().begin(), item.shape().end()));
    if (!n.ok() || *n > kMaxElements) return;
    sizes.emplace_back(absl::StrCat("push of key '", item.key(), "'"),
                       kv::PushValueBytes(compression, DType::kF32, *n));
    counts.push_back(*n);
  }
  kv::ChunkAssembler assembler(sizes);
  for (const wire::InChunk& c : decoded.chunks) {
    if (!assembler.Add(c.item, c.offset, c.data).ok()) return;
  }
  if (!assembler.Finish(/*allow_empty=*/false).ok()) return;
  for (size_t i = 0; i < counts.size(); ++i) {
    const std::vector<absl::string_view>& pieces = assembler.pieces(i);
    if (!kv::CheckPushValue(pieces, compression, DType::kF32, counts[i]).ok()) continue;
    std::vector<float> values(static_cast<size_t>(counts[i]), 1.0f);
    kv::DecodePush(pieces, compression, DType::kF32, counts[i], values.data(), true);
  }
}

void Push(const grpc::ByteBuffer& buffer) {
  dtrain::kvstore::v1::PushRequest header;
  wire::Decoded decoded;
  if (!wire::Decode(buffer, wire::kPushChunksField, &header, &decoded).ok()) return;
  Check(header.chunks_size() == 0, "chunks are not parsed into the header");
  absl::StatusOr<kv::CompressionSpec> compression =
      kv::CompressionFromProto(header.compression(), header.topk_ratio());
  if (!compression.ok()) return;
  if (compression->method == kv::Compression::kTopK) {
    PushTopK(header, decoded, *compression);
    return;
  }
  std::vector<std::pair<std::string, int64_t>> sizes;
  std::vector<DType> dtypes;
  for (const auto& item : header.items()) {
    absl::StatusOr<DType> dtype = kv::DTypeFromWire(item.dtype());
    if (!dtype.ok()) return;
    absl::StatusOr<int64_t> n =
        kv::CheckedNumElements(std::vector<int64_t>(item.shape().begin(), item.shape().end()));
    if (!n.ok() || *n > kMaxElements) return;
    const DType on_wire = kv::WireDType(*dtype, compression->method);
    sizes.emplace_back(absl::StrCat("push of key '", item.key(), "'"),
                       *n * static_cast<int64_t>(dtrain::DTypeSize(on_wire)));
    dtypes.push_back(on_wire);
  }
  AssembleAndDecode(decoded.chunks, std::move(sizes), dtypes, /*allow_empty=*/false);
}

void Init(const std::string& bytes) {
  dtrain::kvstore::v1::InitRequest request;
  if (!request.ParseFromString(bytes)) return;
  std::vector<std::pair<std::string, int64_t>> sizes;
  std::vector<DType> dtypes;
  for (const auto& proto : request.slices()) {
    absl::StatusOr<kv::SliceSpec> spec = kv::FromProto(proto);
    if (!spec.ok() || !kv::ValidateSliceSpec(*spec).ok()) return;
    Check(spec->count >= 0 && spec->offset >= 0, "a valid slice has a non-negative range");
    absl::StatusOr<int64_t> n = kv::CheckedNumElements(spec->shape);
    Check(n.ok() && spec->offset + spec->count <= *n, "a valid slice lies inside its key");
    Check(kv::ToProto(*spec).SerializeAsString() ==
              kv::ToProto(*kv::FromProto(kv::ToProto(*spec))).SerializeAsString(),
          "SliceSpec round trip");
    if (spec->count > kMaxElements) return;
    sizes.emplace_back("init", spec->count * static_cast<int64_t>(dtrain::DTypeSize(spec->dtype)));
    dtypes.push_back(spec->dtype);
  }
  std::vector<wire::InChunk> chunks;
  for (const auto& c : request.chunks()) {
    wire::InChunk in;
    in.item = c.item();
    in.offset = c.offset();
    in.data = {c.data()};
    in.size = c.data().size();
    chunks.push_back(std::move(in));
  }
  AssembleAndDecode(chunks, std::move(sizes), dtypes, /*allow_empty=*/true);
}

void PullReply(const grpc::ByteBuffer& buffer) {
  dtrain::kvstore::v1::PullResponse header;
  wire::Decoded decoded;
  if (!wire::Decode(buffer, wire::kPullChunksField, &header, &decoded).ok()) return;
  std::vector<std::pair<std::string, int64_t>> sizes;
  std::vector<DType> dtypes;
  for (const auto& item : header.items()) {
    absl::StatusOr<DType> dtype = kv::DTypeFromWire(item.dtype());
    if (!dtype.ok() || item.bytes() < 0 || item.bytes() > kMaxElements * 4) return;
    sizes.emplace_back("pull", item.bytes());
    dtypes.push_back(*dtype);
  }
  AssembleAndDecode(decoded.chunks, std::move(sizes), dtypes, /*allow_empty=*/true);
}

void CreateJob(const grpc::ByteBuffer& buffer) {
  dtrain::kvstore::v1::CreateJobRequest request;
  if (!wire::ParseSmall(buffer, &request, "CreateJobRequest").ok()) return;
  absl::StatusOr<kv::JobConfig> config = kv::FromProto(request.config());
  if (!config.ok() || !kv::ValidateJobConfig(*config).ok()) return;
  (void)kv::DescribeJobConfig(*config);
  absl::StatusOr<kv::JobConfig> again = kv::FromProto(kv::ToProto(*config));
  Check(again.ok() && kv::ValidateJobConfig(*again).ok(), "JobConfig round trip");
}

void GetJobReply(const grpc::ByteBuffer& buffer) {
  dtrain::kvstore::v1::GetJobResponse response;
  if (!wire::ParseSmall(buffer, &response, "GetJobResponse").ok()) return;
  absl::StatusOr<kv::JobStatus> status = kv::FromProto(response);
  if (!status.ok()) return;
  for (const kv::SliceStatus& s : status->slices) (void)kv::DescribeSlice(s.spec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs each string field that is not UTF-8; expected here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int kind = data[0] & 7;
  const size_t slice_bytes = size_t{data[1]} + 1;
  const std::string message(reinterpret_cast<const char*>(data + 2), size - 2);
  std::vector<grpc::Slice> slices;
  for (size_t p = 0; p < message.size(); p += slice_bytes) {
    slices.emplace_back(message.data() + p, std::min(slice_bytes, message.size() - p));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  switch (kind) {
    case 0:
    case 5:
      Push(buffer);
      break;
    case 1:
      Init(message);
      break;
    case 2:
    case 6:
      PullReply(buffer);
      break;
    case 3:
      CreateJob(buffer);
      break;
    default:
      GetJobReply(buffer);
      break;
  }
  return 0;
}
