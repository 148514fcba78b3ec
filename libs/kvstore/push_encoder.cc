#include "libs/kvstore/push_encoder.h"

#include "absl/strings/str_cat.h"
#include "libs/kvstore/codec.h"

namespace dtrain {
namespace kvstore {

absl::Status PushEncoder::SetCompression(const CompressionSpec& c) {
  absl::Status valid = ValidateCompression(c);
  if (!valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  if (c.method != Compression::kTopK) slices_.clear();
  compression_ = c;
  return absl::OkStatus();
}

CompressionSpec PushEncoder::compression() const {
  absl::MutexLock lock(&mu_);
  return compression_;
}

absl::StatusOr<std::shared_ptr<const std::string>> PushEncoder::Encode(const CompressionSpec& c,
                                                                       const SliceSpec& spec,
                                                                       int64_t round,
                                                                       const char* src) {
  absl::Status valid = ValidateCompression(c);
  if (!valid.ok()) return valid;
  const int64_t n = spec.count;
  const size_t key_bytes = static_cast<size_t>(n) * DTypeSize(spec.dtype);
  if (c.method != Compression::kTopK) {
    const DType wire = WireDType(spec.dtype, c.method);
    if (wire == spec.dtype) return std::shared_ptr<const std::string>();
    std::vector<float> values(static_cast<size_t>(n));
    absl::Status decoded =
        DecodeValue({absl::string_view(src, key_bytes)}, spec.dtype, n, values.data(), false);
    if (!decoded.ok()) return decoded;
    return std::make_shared<const std::string>(EncodeToString(values.data(), n, wire));
  }
  if (n > kMaxTopKSliceElements) {
    return absl::InvalidArgumentError(
        absl::StrCat(DescribeSlice(spec), ": a top-k push addresses at most ",
                     kMaxTopKSliceElements, " elements (use more slices or another compression)"));
  }
  std::shared_ptr<SliceState> state;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<SliceState>& slot = slices_[{spec.key, spec.slice}];
    if (slot == nullptr) slot = std::make_shared<SliceState>();
    state = slot;
  }
  absl::MutexLock lock(&state->mu);
  if (state->last != nullptr && state->round == round && state->compression == c &&
      state->residual.size() == static_cast<size_t>(n)) {
    return state->last;  // a retry
  }
  std::vector<float>& values = state->residual;
  if (state->last == nullptr || round != state->round + 1 || state->compression != c ||
      values.size() != static_cast<size_t>(n)) {
    values.assign(static_cast<size_t>(n), 0.0f);
  }
  // values = gradient + residual.
  absl::Status decoded =
      DecodeValue({absl::string_view(src, key_bytes)}, spec.dtype, n, values.data(), true);
  if (!decoded.ok()) return decoded;
  state->last =
      std::make_shared<const std::string>(EncodeTopK(values.data(), n, TopKCount(c.topk_ratio, n)));
  state->round = round;
  state->compression = c;
  return state->last;
}

std::vector<float> PushEncoder::Residual(const std::string& key, int32_t slice) const {
  std::shared_ptr<SliceState> state;
  {
    absl::MutexLock lock(&mu_);
    auto it = slices_.find(std::make_pair(key, slice));
    if (it == slices_.end()) return {};
    state = it->second;
  }
  absl::MutexLock lock(&state->mu);
  return state->residual;
}

}  // namespace kvstore
}  // namespace dtrain
