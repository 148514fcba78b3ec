// What a worker's pushes send for each slice, under the compression it
// chose (types.h, CompressionSpec): the values as they are, narrowed to
// f16/bf16, or top-k pairs with error feedback. Both ParameterServer
// implementations (client.h, in_process.h) encode every pushed slice here.
//
// Top-k keeps, per slice, the residual: what earlier pushes did not send.
// A push of round r sends the k largest-magnitude entries of
// (gradient + residual) and keeps the rest as the new residual, so every
// gradient entry reaches the shard eventually (Deep Gradient Compression,
// Lin et al. 2018; Stich et al. 2018).
//
//   PushEncoder encoder;
//   DT_RETURN_IF_ERROR(encoder.SetCompression({Compression::kTopK, 0.01}));
//   const CompressionSpec c = encoder.compression();  // once per request
//   DT_ASSIGN_OR_RETURN(auto bytes, encoder.Encode(c, spec, round, src));
//   // send *bytes (or the caller's own src bytes when bytes is null)
//
// Thread-safety: thread-safe. Pushes of one slice are expected in round
// order (as a worker issues them); a retry of a round re-sends its bytes.
#ifndef DTRAIN_LIBS_KVSTORE_PUSH_ENCODER_H_
#define DTRAIN_LIBS_KVSTORE_PUSH_ENCODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/kvstore/types.h"

namespace dtrain {
namespace kvstore {

class PushEncoder {
 public:
  // Pushes encoded from now on use `c`; kInvalidArgument for an invalid one
  // (ValidateCompression). Switching away from top-k drops the residuals.
  absl::Status SetCompression(const CompressionSpec& c);
  CompressionSpec compression() const;

  // The wire bytes of round `round` of slice `spec` whose values
  // (spec.count elements of spec.dtype) start at `src`, under `c` (a
  // request's items share one: compression(), read once per request); null
  // when the values travel as they are (the key's dtype is the wire dtype).
  // Top-k: a retry (the round and compression of this slice's last Encode)
  // returns the same bytes and leaves the residual alone; any other round
  // than the next starts from a zero residual (the worker resynchronized).
  // kInvalidArgument for an invalid `c` or a top-k push of a slice above
  // kMaxTopKSliceElements.
  absl::StatusOr<std::shared_ptr<const std::string>> Encode(const CompressionSpec& c,
                                                            const SliceSpec& spec, int64_t round,
                                                            const char* src);

  // The residual top-k keeps for a slice (empty if none); for tests.
  std::vector<float> Residual(const std::string& key, int32_t slice) const;

 private:
  struct SliceState {
    absl::Mutex mu;
    int64_t round ABSL_GUARDED_BY(mu) = 0;            // of `last`
    CompressionSpec compression ABSL_GUARDED_BY(mu);  // of `last`
    std::shared_ptr<const std::string> last ABSL_GUARDED_BY(mu);
    std::vector<float> residual ABSL_GUARDED_BY(mu);
  };

  mutable absl::Mutex mu_;
  CompressionSpec compression_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<std::string, int32_t>, std::shared_ptr<SliceState>> slices_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_PUSH_ENCODER_H_
