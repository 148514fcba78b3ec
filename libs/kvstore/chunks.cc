#include "libs/kvstore/chunks.h"

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace kvstore {

ChunkAssembler::ChunkAssembler(std::vector<std::pair<std::string, int64_t>> items)
    : items_(std::move(items)), received_(items_.size(), 0), pieces_(items_.size()) {}

absl::Status ChunkAssembler::Add(int64_t item, int64_t offset,
                                 const std::vector<absl::string_view>& pieces) {
  if (item < 0 || item >= static_cast<int64_t>(items_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk for item ", item, ", but the request has ", items_.size(), " items"));
  }
  const size_t i = static_cast<size_t>(item);
  int64_t size = 0;
  for (absl::string_view p : pieces) size += static_cast<int64_t>(p.size());
  const std::string& name = items_[i].first;
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": empty chunk at offset ", offset));
  }
  if (offset != received_[i]) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": chunk at offset ", offset,
                                                   ", expected offset ", received_[i],
                                                   " (chunks arrive in order, without gaps)"));
  }
  if (size > items_[i].second - received_[i]) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": value is larger than the ", items_[i].second, " bytes expected"));
  }
  for (absl::string_view p : pieces) {
    if (!p.empty()) pieces_[i].push_back(p);
  }
  received_[i] += size;
  bytes_ += size;
  return absl::OkStatus();
}

absl::Status ChunkAssembler::Finish(bool allow_empty) const {
  for (size_t i = 0; i < items_.size(); ++i) {
    if (received_[i] == items_[i].second) continue;
    if (allow_empty && received_[i] == 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(items_[i].first, ": value has ", received_[i],
                                                   " bytes, expected ", items_[i].second));
  }
  return absl::OkStatus();
}

}  // namespace kvstore
}  // namespace dtrain
