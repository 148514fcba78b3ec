// Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017): 70000 grayscale 28x28
// images of clothing in 10 classes, 60000 for training and 10000 for test.
//
//   DT_ASSIGN_OR_RETURN(Dataset train, LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain));
//   // train.size == 60000, train.labels[0] == 9 ("ankle boot")
//
// The Debian package dataset-fashion-mnist installs the four files of the
// original distribution into kDefaultFashionMnistDir:
//
//   train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
//   t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz
//
// A directory holding the uncompressed files (the same names without ".gz",
// as torchvision leaves them) works too.
//
// The data are plain host bytes; nothing here knows about tensors.
// Thread-safe: the functions have no shared state.
#ifndef DTRAIN_LIBS_DATA_FASHION_MNIST_H_
#define DTRAIN_LIBS_DATA_FASHION_MNIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/dataset.h"

namespace dtrain::data {

inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int kFashionMnistClasses = 10;
inline constexpr int kFashionMnistRows = 28;
inline constexpr int kFashionMnistCols = 28;

// Loads one split from `dir` (see the top of this file for the file names).
// Checks that the images are 28x28, that there are as many labels as images
// and that every label is below 10. Errors name the file and the defect; when
// a file is missing the message says to install dataset-fashion-mnist or to
// pass --data_dir. `max_samples` > 0 loads only the first `max_samples`
// images and labels (a job's train_limit or test_limit), decompressing no
// more of the files than that (idx.h: what is then left unchecked).
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split,
                                         int64_t max_samples = 0);

// Returns the name of class `label`: "t-shirt", "trouser", "pullover",
// "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot" for
// 0..9, and "unknown" for anything else.
const char* FashionMnistClassName(int label);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_FASHION_MNIST_H_
