#include "libs/kvstore/wire.h"

#include <memory>
#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "protos/kvstore.pb.h"

namespace dtrain {
namespace kvstore {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a byte buffer cut into slices at the given sizes.
grpc::ByteBuffer Cut(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Join(const wire::InChunk& c) {
  std::string out;
  for (absl::string_view p : c.data) out.append(p.data(), p.size());
  return out;
}

v1::PushRequest Header() {
  v1::PushRequest h;
  h.set_job("job");
  h.set_worker(3);
  h.set_compression(v1::COMPRESSION_BF16);
  v1::PushItem* item = h.add_items();
  item->set_key("w");
  item->set_round(7);
  item->add_shape(2);
  return h;
}

TEST(WireTest, EncodedMessagesAreProtobuf) {
  auto big = std::make_shared<std::string>(5000, 'x');
  (*big)[4999] = 'y';
  std::vector<wire::OutChunk> chunks = {{0, 0, wire::SharedSlice(big, big->data(), big->size())},
                                        {-1, 5000, grpc::Slice(std::string("tiny"))},
                                        {2, 0, grpc::Slice()}};
  grpc::ByteBuffer buffer = wire::Encode(Header(), wire::kPushChunksField, chunks);
  v1::PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.job(), "job");
  EXPECT_EQ(parsed.worker(), 3);
  EXPECT_EQ(parsed.compression(), v1::COMPRESSION_BF16);
  ASSERT_EQ(parsed.items_size(), 1);
  EXPECT_EQ(parsed.items(0).round(), 7);
  ASSERT_EQ(parsed.chunks_size(), 3);
  EXPECT_EQ(parsed.chunks(0).data(), *big);
  EXPECT_EQ(parsed.chunks(1).item(), -1);
  EXPECT_EQ(parsed.chunks(1).offset(), 5000);
  EXPECT_EQ(parsed.chunks(1).data(), "tiny");
  EXPECT_EQ(parsed.chunks(2).item(), 2);
  EXPECT_EQ(parsed.chunks(2).data(), "");
}

TEST(WireTest, DecodesProtobufAcrossSliceBoundaries) {
  v1::PushRequest full = Header();
  for (int i = 0; i < 3; ++i) {
    v1::Chunk* c = full.add_chunks();
    c->set_item(i);
    c->set_offset(100 * i);
    c->set_data(std::string(300 + i, static_cast<char>('a' + i)));
  }
  const std::string bytes = full.SerializeAsString();
  for (size_t piece : {1, 3, 7, 64, 100000}) {
    SCOPED_TRACE(piece);
    wire::Decoded decoded;
    v1::PushRequest header;
    ASSERT_TRUE(wire::Decode(Cut(bytes, piece), wire::kPushChunksField, &header, &decoded).ok());
    EXPECT_EQ(header.job(), "job");
    EXPECT_EQ(header.items(0).shape(0), 2);
    EXPECT_EQ(header.chunks_size(), 0);
    ASSERT_EQ(decoded.chunks.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(decoded.chunks[i].item, i);
      EXPECT_EQ(decoded.chunks[i].offset, 100 * i);
      EXPECT_EQ(decoded.chunks[i].size, 300u + i);
      EXPECT_EQ(Join(decoded.chunks[i]), full.chunks(i).data());
    }
  }
}

TEST(WireTest, RejectsMalformedMessages) {
  const std::string good = Header().SerializeAsString();
  for (const std::string& bad :
       {good.substr(0, good.size() - 1), std::string("\x2a\x05\x1a\x10", 4) /* chunk overrun */,
        std::string("\x0b", 1) /* group */, std::string("\x00\x01", 2) /* field 0 */,
        std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11)}) {
    wire::Decoded decoded;
    v1::PushRequest header;
    absl::Status s = wire::Decode(Cut(bad, 2), wire::kPushChunksField, &header, &decoded);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << absl::CEscape(bad);
  }
  v1::PullRequest r;
  EXPECT_FALSE(wire::ParseSmall(Cut("\x0b", 1), &r, "PullRequest").ok());
}

TEST(WireTest, SharedSliceKeepsItsOwnerAlive) {
  auto owner = std::make_shared<std::string>("payload");
  std::weak_ptr<std::string> watch = owner;
  {
    grpc::Slice s = wire::SharedSlice(owner, owner->data(), owner->size());
    owner.reset();
    EXPECT_FALSE(watch.expired());
    grpc::Slice part = s.sub(1, 3);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(part.begin()), part.size()), "ay");
  }
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
