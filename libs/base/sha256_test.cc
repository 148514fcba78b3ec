#include "libs/base/sha256.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

// FIPS 180-2's examples.
TEST(Sha256, KnownDigests) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, PiecesAndFilesGiveTheWholeDigest) {
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 11));
  Sha256 h;
  h.Update(absl::string_view(big).substr(0, 12345));
  h.Update(absl::string_view(big).substr(12345));
  const std::string whole = Sha256Hex(big);
  EXPECT_EQ(h.HexDigest(), whole);
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/big";
  std::ofstream(path, std::ios::binary) << big;
  absl::StatusOr<std::string> f = Sha256OfFile(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f, whole);
  big[100] ^= 1;
  EXPECT_NE(Sha256Hex(big), whole);
  EXPECT_EQ(Sha256OfFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dtrain
