#include "libs/data/dataset.h"

#include <algorithm>

namespace dtrain::data {

const char* SplitName(Split split) { return split == Split::kTrain ? "train" : "test"; }

Dataset Subset(const Dataset& data, int64_t n) {
  const int64_t count = std::clamp<int64_t>(n, 0, data.size);
  Dataset out = data;
  out.size = count;
  if (data.source) return out;
  // The clamps keep a hand-built, inconsistent Dataset from reading out of bounds.
  const int64_t pixels = std::min<int64_t>(count * data.channels * data.rows * data.cols,
                                           static_cast<int64_t>(data.images.size()));
  out.images.assign(data.images.begin(), data.images.begin() + pixels);
  out.labels.assign(data.labels.begin(),
                    data.labels.begin() + std::min<int64_t>(count, data.labels.size()));
  return out;
}

}  // namespace dtrain::data
