// Opening a job's dataset from its description (JobSpec.data, the job
// file's `data:` section): the formats, their checks, and a summary.
//
//   DataConfig c;
//   c.format = "webdataset";
//   c.train = "/data/fmnist/train-{000000..000005}.tar";
//   c.test = "/data/fmnist/test-{000000..000000}.tar";
//   c.channels = 1; c.height = 28; c.width = 28; c.num_classes = 10;
//   DT_ASSIGN_OR_RETURN(Dataset train, OpenDataset(c, Split::kTrain));
//
// Formats (docs/data.md has the user's view):
//   ""/"idx"      Fashion-MNIST IDX files in a directory (`train`, else the
//                 `idx_dir` argument, else the Debian package's); the test
//                 split from `test`, else the same directory.
//   image_folder  root/<class>/<file>.{png,jpg,jpeg}: classes are the
//                 subdirectories sorted by name (label = position), files
//                 sorted by name within a class.
//   webdataset    POSIX tar shards of <key>.{png,jpg,jpeg} + <key>.cls (the
//                 class index as decimal text), in archive order, shards in
//                 the order the location lists them. Each shard is read
//                 front to back once at open (headers and .cls members; the
//                 images are seeked over) and its images later with pread.
//   npy           a directory with x.npy (N x C x H x W, or N x H x W for one
//                 channel; uint8 or float32) and y.npy (N integer labels).
// A location is an absolute path, a comma-separated list of them, or a
// brace pattern such as /data/train-{000000..000127}.tar (ExpandLocation).
//
// Checks at open (every one an error naming the file, and for a sample its
// index): the paths exist and are readable; shapes agree with channels x
// height x width (after the transforms); every label is in
// 0..num_classes-1; and every image decodes within max_image_pixels. The
// images are decoded once, on `data_threads` threads, so a corrupt file
// fails the job when it starts, not hours in. With skip_corrupt, corrupt
// samples are left out instead and counted (Dataset::corrupt_skipped).
//
// Thread-safe: the functions have no shared state.
#ifndef DTRAIN_LIBS_DATA_OPEN_H_
#define DTRAIN_LIBS_DATA_OPEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/config.h"
#include "libs/data/dataset.h"
#include "libs/data/image.h"
#include "libs/data/transforms.h"

namespace dtrain::data {

// Opens one split (Split::kTest: the test location, with the transforms'
// deterministic version). `idx_dir` is JobSpec.data_dir for the idx format.
// An empty test location gives an empty Dataset (size 0). `max_samples` >
// 0 keeps only the first `max_samples` samples (a job's train_limit or
// test_limit; Subset), and the idx format then reads no more of its files.
absl::StatusOr<Dataset> OpenDataset(const DataConfig& c, Split split,
                                    const std::string& idx_dir = "", int64_t max_samples = 0);

// OK when `data`'s samples are `shape` = {channels, rows, cols} (a model's
// input), or a 1-D shape of as many values; InvalidArgument saying both
// shapes otherwise. An empty dataset
// (no test set) fits any shape.
absl::Status CheckInputShape(const Dataset& data, const std::vector<int64_t>& shape,
                             const std::string& model);

// What `trainctl data check` prints.
struct DatasetSummary {
  int64_t size = 0;
  int channels = 0, rows = 0, cols = 0;
  int num_classes = 0;
  std::vector<std::string> class_names;
  std::vector<int64_t> histogram;  // samples per class, num_classes entries
  int64_t corrupt_skipped = 0;
};
DatasetSummary Summarize(const Dataset& data);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_OPEN_H_
