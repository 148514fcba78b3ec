#include "libs/kvstore/data_port_frame.h"

#include <gtest/gtest.h>

#include <string>

#include "protos/kvstore.pb.h"

namespace dtrain {
namespace kvstore {
namespace {

std::string Frame(FrameHeader h, const std::string& header, const std::string& payload = "") {
  h.header_bytes = static_cast<uint32_t>(header.size());
  char fixed[kFrameHeaderSize];
  EncodeFrameHeader(h, fixed);
  return std::string(fixed, sizeof(fixed)) + header + payload;
}

TEST(DataPortFrame, HeaderRoundTrips) {
  FrameHeader h;
  h.flags = kPayloadInSegment;
  h.op = static_cast<uint16_t>(DataOp::kPushPull);
  h.arg = 1234;
  h.request_id = 0x0102030405060708ull;
  h.payload_bytes = (uint64_t{1} << 40) + 7;
  const std::string f = Frame(h, "abc");
  absl::StatusOr<FrameHeader> d = DecodeFrameHeader(f, /*request=*/true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->flags, kPayloadInSegment);
  EXPECT_EQ(d->op, h.op);
  EXPECT_EQ(d->arg, 1234u);
  EXPECT_EQ(d->header_bytes, 3u);
  EXPECT_EQ(d->request_id, h.request_id);
  EXPECT_EQ(d->payload_bytes, h.payload_bytes);
  // A request is not a reply.
  EXPECT_FALSE(DecodeFrameHeader(f, /*request=*/false).ok());
}

TEST(DataPortFrame, HostileHeadersNameWhatIsWrong) {
  FrameHeader ok;
  ok.op = static_cast<uint16_t>(DataOp::kPull);
  std::string f = Frame(ok, "");
  std::string bad_magic = f;
  bad_magic[0] = 'X';
  EXPECT_NE(DecodeFrameHeader(bad_magic, true).status().message().find("magic"), std::string::npos);
  FrameHeader v = ok;
  v.version = 9;
  EXPECT_NE(DecodeFrameHeader(Frame(v, ""), true).status().message().find("version 9"),
            std::string::npos);
  FrameHeader op = ok;
  op.op = 77;
  EXPECT_NE(DecodeFrameHeader(Frame(op, ""), true).status().message().find("op 77"),
            std::string::npos);
  FrameHeader big = ok;
  char fixed[kFrameHeaderSize];
  EncodeFrameHeader(big, fixed);
  fixed[12] = fixed[13] = fixed[14] = fixed[15] = '\xff';  // header_bytes = 4 GiB - 1
  EXPECT_NE(DecodeFrameHeader(std::string(fixed, sizeof(fixed)), true)
                .status()
                .message()
                .find("header of 4294967295 bytes"),
            std::string::npos);
  EXPECT_FALSE(DecodeFrameHeader(f.substr(0, 31), true).ok());
  FrameHeader flags = ok;
  flags.flags = 0x80;
  EXPECT_FALSE(DecodeFrameHeader(Frame(flags, ""), true).ok());
}

TEST(DataPortFrame, PushPayloadMustMatchTheStoresSizes) {
  v1::PushRequest r;
  r.set_job("j");
  for (int i = 0; i < 2; ++i) {
    v1::PushItem* item = r.add_items();
    item->set_key(i == 0 ? "a" : "b");
    item->set_round(1);
  }
  auto expected = [](const std::string& key, int) -> absl::StatusOr<int64_t> {
    if (key == "a") return 8;
    if (key == "b") return 4;
    return absl::NotFoundError("no key " + key);
  };
  FrameHeader h;
  h.op = static_cast<uint16_t>(DataOp::kPush);
  h.payload_bytes = 12;
  EXPECT_TRUE(CheckRequestFrame(Frame(h, r.SerializeAsString()), expected).ok());
  h.payload_bytes = 13;
  absl::Status s = CheckRequestFrame(Frame(h, r.SerializeAsString()), expected);
  EXPECT_NE(s.message().find("payload of 13 bytes, its items need 12"), std::string::npos) << s;
  r.mutable_items(1)->set_key("zz");
  h.payload_bytes = 12;
  EXPECT_TRUE(absl::IsNotFound(CheckRequestFrame(Frame(h, r.SerializeAsString()), expected)));
  // Truncated header, unparsable header, a pull with a payload.
  EXPECT_FALSE(CheckRequestFrame(Frame(h, r.SerializeAsString()).substr(0, 40), expected).ok());
  EXPECT_FALSE(CheckRequestFrame(Frame(h, "\xff\xff\xff"), expected).ok());
  FrameHeader pull;
  pull.op = static_cast<uint16_t>(DataOp::kPull);
  pull.payload_bytes = 4;
  EXPECT_NE(CheckRequestFrame(Frame(pull, ""), expected).message().find("unexpected payload"),
            std::string::npos);
}

TEST(DataPortFrame, SplitPayloadIsExact) {
  absl::StatusOr<std::vector<absl::string_view>> parts = SplitPayload("aaaabb", {4, 2});
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ((*parts)[0], "aaaa");
  EXPECT_EQ((*parts)[1], "bb");
  EXPECT_FALSE(SplitPayload("aaaabb", {4, 3}).ok());
  EXPECT_FALSE(SplitPayload("aaaabb", {4, 1}).ok());
  EXPECT_FALSE(SplitPayload("aaaabb", {-1, 7}).ok());
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain
