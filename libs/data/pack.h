// Writing datasets out: WebDataset shards (what `trainctl data pack`
// makes), .npy arrays and image folders. Tests write Fashion-MNIST in each
// format with these and check that the readers give back the same samples.
//
//   DT_ASSIGN_OR_RETURN(Dataset train, LoadFashionMnist(dir, Split::kTrain));
//   PackOptions o;
//   o.shard_size = 10000;
//   DT_ASSIGN_OR_RETURN(std::vector<std::string> shards,
//                       WriteWebDataset(train, "/data/fmnist", "train", o));
//   // /data/fmnist/train-000000.tar ... train-000005.tar; the location to
//   // give the job is BraceLocation(shards).
//
// Samples keep their order (sample i is the i-th sample of the shards, in
// shard order). Images are encoded losslessly as PNG unless o.jpeg_quality
// > 0. Source-backed datasets are decoded and re-encoded (8-bit images
// only). Files are written to a temporary name and renamed.
//
// Thread-safe: the functions have no shared state.
#ifndef DTRAIN_LIBS_DATA_PACK_H_
#define DTRAIN_LIBS_DATA_PACK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/dataset.h"
#include "libs/data/image.h"

namespace dtrain::data {

struct PackOptions {
  int64_t shard_size = 10000;  // samples per shard, > 0
  int jpeg_quality = 0;        // 0: PNG; 1..100: JPEG at this quality
};

// Sample i of `data` as 8-bit pixels (H x W x C), before any transforms.
absl::StatusOr<Image> SampleImage(const Dataset& data, int64_t i);

// Writes <dir>/<prefix>-000000.tar, ... and returns their paths.
absl::StatusOr<std::vector<std::string>> WriteWebDataset(const Dataset& data,
                                                         const std::string& dir,
                                                         const std::string& prefix,
                                                         const PackOptions& options);

// "<dir>/<prefix>-{000000..000005}.tar" for shards written by WriteWebDataset.
std::string BraceLocation(const std::string& dir, const std::string& prefix, int64_t shards);

// Writes <dir>/x.npy (uint8, N x C x H x W) and <dir>/y.npy (int64).
absl::Status WriteNpyDataset(const Dataset& data, const std::string& dir);

// Writes <root>/<class name>/<index, 6 digits>.png; classes named
// class_names[label] when given, else by the label zero-padded to sort in
// label order.
absl::Status WriteImageFolder(const Dataset& data, const std::string& root,
                              const std::vector<std::string>& class_names);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_PACK_H_
