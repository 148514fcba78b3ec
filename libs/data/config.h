// A job's dataset as configured (JobSpec.data, a job file's `data:`
// section): the fields, the checks that need no file (the scheduler's at
// submit), locations and their brace patterns, and the --data_roots check.
// Opening the data is open.h's.
//
//   DataConfig c;
//   c.format = "webdataset";
//   c.train = "/data/fmnist/train-{000000..000005}.tar";
//   DT_RETURN_IF_ERROR(ValidateDataConfig(c));
//   DT_RETURN_IF_ERROR(CheckDataRoots(c, {"/data"}));
//
// Thread-safe: the functions have no shared state.
#ifndef DTRAIN_LIBS_DATA_CONFIG_H_
#define DTRAIN_LIBS_DATA_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/image.h"
#include "libs/data/transforms.h"

namespace dtrain::data {

inline constexpr const char* kFormats[] = {"idx", "image_folder", "webdataset", "npy"};

struct DataConfig {
  std::string format;  // "" (= idx), idx, image_folder, webdataset, npy
  std::string train;   // locations (see above); test may be empty: no test set
  std::string test;
  int channels = 0;  // the model's input shape; 0: the format's own (idx: 1 x 28 x 28)
  int height = 0;
  int width = 0;
  int num_classes = 0;  // labels must be below it; 0: 10 for idx, else required
  Transforms transforms;
  bool skip_corrupt = false;
  int data_threads = 0;  // decode threads; 0: LoaderThreads (the check at open: up to 8)
  int64_t max_image_pixels = kDefaultMaxImagePixels;

  bool is_idx() const { return format.empty() || format == "idx"; }
};

// Shape, format and path checks that need no file (the scheduler runs them
// at submit): a known format, absolute paths without '..', positive shapes,
// valid transforms.
absl::Status ValidateDataConfig(const DataConfig& c);

// OK if every path `c` names lies under one of `roots` (absolute
// directories); PermissionDenied naming the path otherwise.
absl::Status CheckDataRoots(const DataConfig& c, const std::vector<std::string>& roots);

// The paths of a location: comma-separated parts, each with at most one
// {A..B} range of decimal numbers (zero-padded to A's width when A has a
// leading zero), e.g. "/d/s-{00..02}.tar" -> /d/s-00.tar, /d/s-01.tar,
// /d/s-02.tar. At most 1,000,000 paths.
absl::StatusOr<std::vector<std::string>> ExpandLocation(const std::string& location);

// Background threads for a DataLoader over `c`'s data: data_threads, else
// 1 for idx (copying pixels needs no more), else what the step leaves free:
// the cores minus `step_threads` (the step's kernel threads), at least 1.
int LoaderThreads(const DataConfig& c, int step_threads);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_CONFIG_H_
