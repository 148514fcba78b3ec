// An image-classification dataset, as the DataLoader reads it: either held
// in memory as 8-bit pixels (the IDX reader's Fashion-MNIST), or a Source
// that reads and decodes sample i on demand (image folders, WebDataset
// shards, .npy arrays; see open.h), with per-sample transforms.
//
//   DT_ASSIGN_OR_RETURN(Dataset train, OpenDataset(config, Split::kTrain));
//   // train.size samples of train.channels x train.rows x train.cols floats
//   DT_ASSIGN_OR_RETURN(auto loader, DataLoader::Create(&train, options));
//
// Thread-safety: a Dataset is immutable once made; a Source's methods may
// be called from any number of threads at once.
#ifndef DTRAIN_LIBS_DATA_DATASET_H_
#define DTRAIN_LIBS_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "libs/data/image.h"
#include "libs/data/transforms.h"

namespace dtrain::data {

enum class Split { kTrain, kTest };

// "train" or "test".
const char* SplitName(Split split);

// Samples read on demand. Implementations: open.cc.
class Source {
 public:
  virtual ~Source() = default;
  // Number of samples.
  virtual int64_t size() const = 0;
  // The class index of sample `index` (0 <= index < size()); known without
  // decoding the image.
  virtual int32_t label(int64_t index) const = 0;
  // Reads and decodes sample `index`. Errors name the file (Describe).
  virtual absl::Status Read(int64_t index, Image* image) const = 0;
  // Sources of encoded images (files, tar members): the options Read
  // decodes with, for a loader that decodes and transforms in one pass
  // (DecodeAndTransform) from ReadEncoded's bytes; null for the others.
  virtual const DecodeOptions* decode_options() const { return nullptr; }
  // Sample `index`'s encoded bytes into *bytes (its I/O errors name the
  // file); Unimplemented where decode_options() is null.
  virtual absl::Status ReadEncoded(int64_t index, std::string* bytes) const {
    return absl::UnimplementedError("this source holds no encoded images");
  }
  // Where sample `index` comes from, for messages: "/data/cats/001.png",
  // "/data/train-000003.tar member 000123.png", "/data/x.npy row 17".
  virtual std::string Describe(int64_t index) const = 0;
};

// An image-classification dataset.
struct Dataset {
  int64_t size = 0;  // number of samples
  int channels = 1;  // the shape of a sample as the loader delivers it
  int rows = 0;      // image height in pixels
  int cols = 0;      // image width in pixels
  // In memory (source == nullptr): size * channels * rows * cols pixels,
  // sample-major, C x H x W, 0 = background, 255 = full intensity; and
  // size class indices.
  std::vector<uint8_t> images;
  std::vector<uint8_t> labels;
  // On demand (images and labels empty): samples 0..size-1 of `source`
  // (size may be less than source->size(): see Subset), through
  // `transforms`.
  std::shared_ptr<const Source> source;
  Transforms transforms;

  // What the checks found (open.h): classes (0: unknown), their names when
  // the format has them (image_folder), and corrupt samples left out
  // (skip_corrupt).
  int num_classes = 0;
  std::vector<std::string> class_names;
  int64_t corrupt_skipped = 0;
  std::string location;  // what it was opened from, for messages

  // The label of sample `index`.
  int32_t label(int64_t index) const {
    return source ? source->label(index) : static_cast<int32_t>(labels[index]);
  }
};

// Returns a copy of the first min(n, data.size) samples of `data` (none when
// n <= 0), for quick experiments and tests. A Source is shared, not copied.
Dataset Subset(const Dataset& data, int64_t n);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_DATASET_H_
