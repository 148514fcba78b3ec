// CRC-32C (Castagnoli) checksums, as used by the checkpoint format.
//
//   uint32_t crc = crc32c::Value(data, n);
//   crc = crc32c::Extend(crc, more, m);   // == Value(data + more, n + m)
//
// The polynomial is 0x1EDC6F41 (reflected 0x82F63B78), with the usual
// initial value and final XOR of 0xFFFFFFFF, so results match iSCSI / SCTP /
// ext4 / leveldb's crc32c::Value: Value("123456789", 9) == 0xE3069283.
//
// On x86-64 CPUs with SSE4.2 (every machine this project targets) the CRC32
// instruction is used, chosen at run time; elsewhere a table-driven
// slicing-by-8 implementation. Both give identical results. Thread-safe.
#ifndef DTRAIN_LIBS_CHECKPOINT_CRC32C_H_
#define DTRAIN_LIBS_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace dtrain {
namespace checkpoint {
namespace crc32c {

// Returns the CRC-32C of the concatenation of the data that produced `crc`
// and data[0, n).
uint32_t Extend(uint32_t crc, const char* data, size_t n);

// Returns the CRC-32C of data[0, n).
inline uint32_t Value(const char* data, size_t n) { return Extend(0, data, n); }

namespace internal {

// The two implementations behind Extend, exposed for tests.
uint32_t ExtendPortable(uint32_t crc, const char* data, size_t n);
// Only valid when HardwareAvailable().
uint32_t ExtendHardware(uint32_t crc, const char* data, size_t n);
bool HardwareAvailable();

}  // namespace internal
}  // namespace crc32c
}  // namespace checkpoint
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CHECKPOINT_CRC32C_H_
