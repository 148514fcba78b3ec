#include "libs/data/fashion_mnist.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/base/status.h"
#include "libs/data/idx.h"

namespace dtrain::data {
namespace {

constexpr const char* kClassNames[kFashionMnistClasses] = {
    "t-shirt", "trouser", "pullover", "dress", "coat",
    "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot",
};

constexpr const char* kHint =
    "install the Debian package dataset-fashion-mnist, or pass --data_dir with a directory "
    "holding the four Fashion-MNIST files";
constexpr const char* kDamagedHint =
    "reinstall the Debian package dataset-fashion-mnist, or pass --data_dir with a directory "
    "holding intact Fashion-MNIST files";

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode);
}

// Returns the path of `name`.gz in `dir`, or of the uncompressed `name`.
absl::StatusOr<std::string> FindFile(const std::string& dir, const std::string& name, Split split) {
  const std::string gz = JoinPath(dir, name + ".gz");
  if (IsFile(gz)) return gz;
  const std::string plain = JoinPath(dir, name);
  if (IsFile(plain)) return plain;
  struct stat st;
  if (stat(dir.empty() ? "." : dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("Fashion-MNIST ", SplitName(split),
                                            " split: data directory '", dir,
                                            "' does not exist or is not a directory; ", kHint));
  }
  return absl::NotFoundError(absl::StrCat("Fashion-MNIST ", SplitName(split), " split: ", gz,
                                          " not found (nor ", plain, "); ", kHint));
}

absl::StatusOr<IdxArray> ReadPart(const std::string& dir, const std::string& name, Split split,
                                  int64_t max_samples) {
  DT_ASSIGN_OR_RETURN(std::string path, FindFile(dir, name, split));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path, max_samples);
  if (!array.ok()) {
    return Annotate(absl::Status(array.status().code(),
                                 absl::StrCat(array.status().message(), " (", kDamagedHint, ")")),
                    absl::StrCat("Fashion-MNIST ", SplitName(split), " split"));
  }
  return array;
}

}  // namespace

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split, int64_t max_samples) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_name = prefix + "-images-idx3-ubyte";
  const std::string labels_name = prefix + "-labels-idx1-ubyte";
  DT_ASSIGN_OR_RETURN(IdxArray images, ReadPart(dir, images_name, split, max_samples));
  DT_ASSIGN_OR_RETURN(IdxArray labels, ReadPart(dir, labels_name, split, max_samples));

  const std::string where =
      absl::StrCat("Fashion-MNIST ", SplitName(split), " split in '", dir, "': ");
  if (images.dims.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, images_name, " holds a ", images.dims.size(),
                     "-D array, expected 3-D images (count x 28 x 28); the files are mixed up"));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, labels_name, " holds a ", labels.dims.size(),
                     "-D array, expected 1-D labels; the files are mixed up"));
  }
  if (images.dims[1] != kFashionMnistRows || images.dims[2] != kFashionMnistCols) {
    return absl::InvalidArgumentError(absl::StrCat(where, images_name, " holds ",
                                                   absl::StrJoin(images.dims, " x "),
                                                   " images, expected 28 x 28 pixels"));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(where, images_name, " holds ", images.dims[0],
                                                   " images but ", labels_name, " holds ",
                                                   labels.dims[0], " labels; they must agree"));
  }
  if (images.dims[0] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, images_name, " holds no images"));
  }
  const auto bad = std::find_if(labels.data.begin(), labels.data.end(),
                                [](uint8_t label) { return label >= kFashionMnistClasses; });
  if (bad != labels.data.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, labels_name, ": label ", int{*bad},
                                                   " of sample ", bad - labels.data.begin(),
                                                   " is not a class index (0..9)"));
  }

  Dataset data;
  data.size = images.dims[0];
  data.rows = kFashionMnistRows;
  data.cols = kFashionMnistCols;
  data.num_classes = kFashionMnistClasses;
  for (int c = 0; c < kFashionMnistClasses; ++c) data.class_names.push_back(kClassNames[c]);
  data.location = dir;
  data.images = std::move(images.data);
  data.labels = std::move(labels.data);
  return data;
}

const char* FashionMnistClassName(int label) {
  if (label < 0 || label >= kFashionMnistClasses) return "unknown";
  return kClassNames[label];
}

}  // namespace dtrain::data
