#include "libs/data/pack.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/base/status.h"
#include "libs/data/npy.h"
#include "libs/data/tar.h"

namespace dtrain::data {
namespace {

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !written) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(tmp, ": write failed: ", std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat(path, ": rename failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status MakeDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrCat(dir, ": cannot create: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Encode(const Image& image, const PackOptions& o) {
  return o.jpeg_quality > 0 ? EncodeJpeg(image, o.jpeg_quality) : EncodePng(image);
}

}  // namespace

absl::StatusOr<Image> SampleImage(const Dataset& data, int64_t i) {
  Image image;
  if (data.source != nullptr) {
    DT_RETURN_IF_ERROR(data.source->Read(i, &image));
    if (image.u8.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(data.source->Describe(i), ": float images cannot be packed as images"));
    }
    return image;
  }
  image.channels = data.channels;
  image.height = data.rows;
  image.width = data.cols;
  const int64_t plane = int64_t{data.rows} * data.cols;
  const uint8_t* src = data.images.data() + i * plane * data.channels;
  image.u8.resize(plane * data.channels);
  for (int c = 0; c < data.channels; ++c) {
    for (int64_t p = 0; p < plane; ++p) image.u8[p * data.channels + c] = src[c * plane + p];
  }
  return image;
}

std::string BraceLocation(const std::string& dir, const std::string& prefix, int64_t shards) {
  return absl::StrFormat("%s/%s-{%06d..%06d}.tar", dir, prefix, 0, shards - 1);
}

absl::StatusOr<std::vector<std::string>> WriteWebDataset(const Dataset& data,
                                                         const std::string& dir,
                                                         const std::string& prefix,
                                                         const PackOptions& options) {
  if (options.shard_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_size must be positive, got ", options.shard_size));
  }
  if (options.jpeg_quality < 0 || options.jpeg_quality > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("jpeg quality must be in 1..100 (0: PNG), got ", options.jpeg_quality));
  }
  DT_RETURN_IF_ERROR(MakeDir(dir));
  std::vector<std::string> paths;
  const char* ext = options.jpeg_quality > 0 ? "jpg" : "png";
  for (int64_t begin = 0; begin < data.size; begin += options.shard_size) {
    TarWriter w;
    for (int64_t i = begin; i < std::min(data.size, begin + options.shard_size); ++i) {
      DT_ASSIGN_OR_RETURN(Image image, SampleImage(data, i));
      DT_ASSIGN_OR_RETURN(std::string bytes, Encode(image, options));
      const std::string key = absl::StrFormat("%09d", i);
      w.Add(absl::StrCat(key, ".", ext), bytes);
      w.Add(absl::StrCat(key, ".cls"), absl::StrCat(data.label(i)));
    }
    const std::string path =
        absl::StrFormat("%s/%s-%06d.tar", dir, prefix, begin / options.shard_size);
    DT_RETURN_IF_ERROR(WriteFileAtomically(path, w.Finish()));
    paths.push_back(path);
  }
  return paths;
}

absl::Status WriteNpyDataset(const Dataset& data, const std::string& dir) {
  DT_RETURN_IF_ERROR(MakeDir(dir));
  std::string x, y;
  const int64_t plane = int64_t{data.rows} * data.cols;
  if (data.source == nullptr) {
    x.assign(data.images.begin(), data.images.end());
  } else {
    for (int64_t i = 0; i < data.size; ++i) {
      DT_ASSIGN_OR_RETURN(Image image, SampleImage(data, i));
      if (image.channels != data.channels || image.height != data.rows ||
          image.width != data.cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            data.source->Describe(i), ": ", image.height, " x ", image.width,
            " images of one size are needed for .npy (", data.rows, " x ", data.cols, ")"));
      }
      for (int c = 0; c < data.channels; ++c) {
        for (int64_t p = 0; p < plane; ++p) {
          x.push_back(static_cast<char>(image.u8[p * data.channels + c]));
        }
      }
    }
  }
  for (int64_t i = 0; i < data.size; ++i) {
    const int64_t label = data.label(i);
    y.append(reinterpret_cast<const char*>(&label), 8);  // little-endian host
  }
  DT_RETURN_IF_ERROR(WriteFileAtomically(
      dir + "/x.npy",
      WriteNpy(NpyDtype::kU8, {data.size, data.channels, data.rows, data.cols}, x)));
  return WriteFileAtomically(dir + "/y.npy", WriteNpy(NpyDtype::kI64, {data.size}, y));
}

absl::Status WriteImageFolder(const Dataset& data, const std::string& root,
                              const std::vector<std::string>& class_names) {
  DT_RETURN_IF_ERROR(MakeDir(root));
  for (int64_t i = 0; i < data.size; ++i) {
    const int32_t label = data.label(i);
    const std::string name = label < static_cast<int32_t>(class_names.size())
                                 ? class_names[label]
                                 : absl::StrFormat("%05d", label);
    const std::string dir = absl::StrCat(root, "/", name);
    DT_RETURN_IF_ERROR(MakeDir(dir));
    DT_ASSIGN_OR_RETURN(Image image, SampleImage(data, i));
    DT_ASSIGN_OR_RETURN(std::string png, EncodePng(image));
    DT_RETURN_IF_ERROR(WriteFileAtomically(absl::StrFormat("%s/%06d.png", dir, i), png));
  }
  return absl::OkStatus();
}

}  // namespace dtrain::data
