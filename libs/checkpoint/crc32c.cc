#include "libs/checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DTRAIN_CRC32C_X86 1
#include <nmmintrin.h>
#endif

namespace dtrain {
namespace checkpoint {
namespace crc32c {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

using Tables = std::array<std::array<uint32_t, 256>, 8>;

// tables[0] is the classic byte-at-a-time table; tables[k][b] is the CRC of
// byte b followed by k zero bytes, which lets the loop fold 8 bytes at once.
constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolyReflected : 0u);
    t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

inline uint32_t LoadLe32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

#ifdef DTRAIN_CRC32C_X86
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const char* data, size_t n) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  // Byte steps up to 8-byte alignment, then 8 bytes per instruction.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // x86 is little-endian, as CRC-32C expects.
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(c);
}

bool DetectSse42() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
#endif

}  // namespace

namespace internal {

uint32_t ExtendPortable(uint32_t crc, const char* data, size_t n) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo = LoadLe32(p) ^ c;
    uint32_t hi = LoadLe32(p + 4);
    c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^
        kTables[4][lo >> 24] ^ kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^
        kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
    --n;
  }
  return ~c;
}

bool HardwareAvailable() {
#ifdef DTRAIN_CRC32C_X86
  static const bool available = DetectSse42();
  return available;
#else
  return false;
#endif
}

uint32_t ExtendHardware(uint32_t crc, const char* data, size_t n) {
#ifdef DTRAIN_CRC32C_X86
  return ExtendSse42(crc, data, n);
#else
  return ExtendPortable(crc, data, n);
#endif
}

}  // namespace internal

uint32_t Extend(uint32_t crc, const char* data, size_t n) {
  if (internal::HardwareAvailable()) return internal::ExtendHardware(crc, data, n);
  return internal::ExtendPortable(crc, data, n);
}

}  // namespace crc32c
}  // namespace checkpoint
}  // namespace dtrain
