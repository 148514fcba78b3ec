// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw,
// "Parallel Random Numbers: As Easy as 1, 2, 3" (SC 2011), bit-compatible with
// philox4x32_10 of the Random123 distribution.
//
// Internal to the CPU kernels (and their tests). The stream layout used by
// the random ops is documented in basic_kernels.cc (PhiloxBlock and below).
#ifndef DTRAIN_LIBS_OPS_CPU_PHILOX_H_
#define DTRAIN_LIBS_OPS_CPU_PHILOX_H_

#include <cstdint>

namespace dtrain {
namespace ops {
namespace cpu {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1

struct Philox4x32 {
  uint32_t v[4];
};

// One Philox round: two 32x32->64 multiplies, a key xor and a permutation.
inline void PhiloxRound(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
  uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * ctr[0];
  uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * ctr[2];
  uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  uint32_t c1 = ctr[1], c3 = ctr[3];
  ctr[0] = hi1 ^ c1 ^ k0;
  ctr[1] = lo1;
  ctr[2] = hi0 ^ c3 ^ k1;
  ctr[3] = lo0;
}

// philox4x32_10(ctr, key): ten rounds, the key bumped by (W0, W1) between
// rounds.
inline Philox4x32 Philox4x32_10(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    PhiloxRound(ctr.v, k0, k1);
  }
  return ctr;
}

// The four 32-bit outputs of block `block` of the stream of `seed`:
// key = {low 32 bits of seed, high 32 bits}, counter = {low 32 bits of block,
// high 32 bits of block, 0, 0}. Stream element j is output j % 4 of block
// j / 4.
inline Philox4x32 PhiloxBlock(uint64_t seed, uint64_t block) {
  Philox4x32 ctr = {{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}};
  return Philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// A uniform float in [0, 1) from the top 24 bits of `bits` (k * 2^-24).
inline float BitsToUniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// A uniform float in (0, 1] from the top 24 bits ((k + 1) * 2^-24): safe for
// log() in Box-Muller.
inline float BitsToUniformOpenZero(uint32_t bits) {
  return static_cast<float>((bits >> 8) + 1u) * (1.0f / 16777216.0f);
}

}  // namespace cpu
}  // namespace ops
}  // namespace dtrain

#endif  // DTRAIN_LIBS_OPS_CPU_PHILOX_H_
