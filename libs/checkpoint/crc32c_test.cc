#include "libs/checkpoint/crc32c.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace dtrain {
namespace checkpoint {
namespace crc32c {
namespace {

uint32_t ValueOf(const std::string& s) { return Value(s.data(), s.size()); }

// Bit-at-a-time reference, straight from the definition.
uint32_t Reference(const std::string& s) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(ValueOf(""), 0u);
  EXPECT_EQ(ValueOf("123456789"), 0xE3069283u);
  // RFC 3720, appendix B.4.
  EXPECT_EQ(ValueOf(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(ValueOf(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(ValueOf(ascending), 0x46DD794Eu);
  EXPECT_EQ(ValueOf(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, ImplementationsAgreeAtEveryLengthAndAlignment) {
  std::mt19937 rng(42);
  std::string data(4096 + 16, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t n : {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255, 1000, 4096}) {
      std::string piece = data.substr(offset, n);
      uint32_t expected = Reference(piece);
      EXPECT_EQ(internal::ExtendPortable(0, data.data() + offset, n), expected)
          << offset << " " << n;
      if (internal::HardwareAvailable()) {
        EXPECT_EQ(internal::ExtendHardware(0, data.data() + offset, n), expected)
            << offset << " " << n;
      }
      EXPECT_EQ(Value(data.data() + offset, n), expected);
    }
  }
}

TEST(Crc32cTest, ExtendEqualsValueOfConcatenation) {
  std::string a = "checkpoint header", b = " and the records that follow it";
  EXPECT_EQ(Extend(ValueOf(a), b.data(), b.size()), ValueOf(a + b));
  EXPECT_EQ(internal::ExtendPortable(ValueOf(a), b.data(), b.size()), ValueOf(a + b));
  EXPECT_NE(ValueOf(a + b), ValueOf(b + a));
}

}  // namespace
}  // namespace crc32c
}  // namespace checkpoint
}  // namespace dtrain
