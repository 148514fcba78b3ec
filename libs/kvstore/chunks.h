// ChunkAssembler: checks the chunks of a streamed request against the sizes
// its items must have, and gathers each item's bytes (as views, no copies).
//
//   ChunkAssembler assembler({{"key 'w' slice 0", 4096}, {"key 'b' slice 0", 40}});
//   for (each received chunk) DT_RETURN_IF_ERROR(assembler.Add(item, offset, pieces));
//   DT_RETURN_IF_ERROR(assembler.Finish(/*allow_empty=*/false));
//   const std::vector<absl::string_view>& w = assembler.pieces(0);
//
// Rules (protos/kvstore.proto, Chunk): an item's chunks arrive in order,
// each starting where the previous one ended, none empty, together exactly
// the item's size; allow_empty lets an item have no chunks at all (Init's
// "start at zero"). Errors are kInvalidArgument naming the item and what is
// wrong (unknown item, out-of-order or overlapping chunk, a value larger or
// smaller than expected). The views point into the caller's buffers, which
// must outlive their use.
//
// Thread-compatible.
#ifndef DTRAIN_LIBS_KVSTORE_CHUNKS_H_
#define DTRAIN_LIBS_KVSTORE_CHUNKS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace kvstore {

class ChunkAssembler {
 public:
  // One (name for messages, expected bytes) per item.
  explicit ChunkAssembler(std::vector<std::pair<std::string, int64_t>> items);

  absl::Status Add(int64_t item, int64_t offset, const std::vector<absl::string_view>& pieces);

  absl::Status Finish(bool allow_empty) const;

  const std::vector<absl::string_view>& pieces(size_t item) const { return pieces_[item]; }
  // Bytes received so far, all items together.
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<std::pair<std::string, int64_t>> items_;
  std::vector<int64_t> received_;
  std::vector<std::vector<absl::string_view>> pieces_;
  int64_t bytes_ = 0;
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_CHUNKS_H_
