#include "libs/data/open.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/base/status.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/npy.h"
#include "libs/data/tar.h"

namespace dtrain::data {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("data.", field, ": ", why));
}

absl::Status ErrnoStatus(const std::string& path, absl::string_view what) {
  const int e = errno;
  std::string message = absl::StrCat(path, ": cannot ", what, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(message);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::StatusOr<Fd> OpenFile(const std::string& path, int64_t* size) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(path, "open");
  Fd owned(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(path, "stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  *size = st.st_size;
  return owned;
}

absl::Status PreadFully(int fd, const std::string& path, int64_t offset, int64_t n, char* out) {
  int64_t done = 0;
  while (done < n) {
    ssize_t got = pread(fd, out + done, n - done, offset + done);
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(path, "read");
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(path, ": file ends at byte ", offset + done,
                                              ", expected ", offset + n, " bytes"));
    }
    done += got;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, int64_t max_bytes) {
  int64_t size = 0;
  DT_ASSIGN_OR_RETURN(Fd fd, OpenFile(path, &size));
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, more than the ", max_bytes, " allowed"));
  }
  std::string out(size, '\0');
  DT_RETURN_IF_ERROR(PreadFully(fd.get(), path, 0, size, out.data()));
  return out;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Sorted names in `dir` (no "." or ".."; hidden files left out).
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(dir, "list the directory");
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    names.push_back(e->d_name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : absl::StrCat(dir, "/", name);
}

bool IsImageName(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  return absl::EndsWith(lower, ".png") || absl::EndsWith(lower, ".jpg") ||
         absl::EndsWith(lower, ".jpeg");
}

int DefaultThreads(int requested) {
  if (requested > 0) return requested;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 8);
}

// Runs fn(i) for i in [0, n) on `threads` threads.
template <typename Fn>
void ParallelFor(int64_t n, int threads, Fn fn) {
  threads = static_cast<int>(std::min<int64_t>(threads, n));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int64_t i = next.fetch_add(64); i < n; i = next.fetch_add(64)) {
        for (int64_t j = i; j < std::min(n, i + 64); ++j) fn(j);
      }
    });
  }
  for (std::thread& t : pool) t.join();
}

// ---- Sources ----

class ImageFolderSource : public Source {
 public:
  ImageFolderSource(std::vector<std::string> files, std::vector<int32_t> labels,
                    DecodeOptions options)
      : files_(std::move(files)), labels_(std::move(labels)), options_(options) {}
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int32_t label(int64_t i) const override { return labels_[i]; }
  absl::Status Read(int64_t i, Image* image) const override {
    absl::StatusOr<std::string> bytes = ReadWholeFile(files_[i], int64_t{1} << 30);
    if (!bytes.ok()) return bytes.status();
    absl::Status decoded = DecodeImageInto(*bytes, options_, image);
    if (!decoded.ok()) return Annotate(decoded, Describe(i));
    return absl::OkStatus();
  }
  const DecodeOptions* decode_options() const override { return &options_; }
  absl::Status ReadEncoded(int64_t i, std::string* bytes) const override {
    absl::StatusOr<std::string> read = ReadWholeFile(files_[i], int64_t{1} << 30);
    if (!read.ok()) return read.status();
    *bytes = *std::move(read);
    return absl::OkStatus();
  }
  std::string Describe(int64_t i) const override {
    return absl::StrCat(files_[i], " (sample ", i, ")");
  }

 private:
  std::vector<std::string> files_;
  std::vector<int32_t> labels_;
  DecodeOptions options_;
};

class WebDatasetSource : public Source {
 public:
  struct Shard {
    std::string path;
    Fd fd;
  };
  struct Sample {
    int32_t shard;
    int32_t label;
    int64_t offset;
    int64_t size;
    std::string name;
  };
  WebDatasetSource(std::vector<Shard> shards, std::vector<Sample> samples, DecodeOptions options)
      : shards_(std::move(shards)), samples_(std::move(samples)), options_(options) {}
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  int32_t label(int64_t i) const override { return samples_[i].label; }
  absl::Status Read(int64_t i, Image* image) const override {
    const Sample& s = samples_[i];
    const Shard& shard = shards_[s.shard];
    thread_local std::string bytes;
    bytes.resize(s.size);
    DT_RETURN_IF_ERROR(PreadFully(shard.fd.get(), shard.path, s.offset, s.size, bytes.data()));
    absl::Status decoded = DecodeImageInto(bytes, options_, image);
    if (!decoded.ok()) return Annotate(decoded, Describe(i));
    return absl::OkStatus();
  }
  const DecodeOptions* decode_options() const override { return &options_; }
  absl::Status ReadEncoded(int64_t i, std::string* bytes) const override {
    const Sample& s = samples_[i];
    const Shard& shard = shards_[s.shard];
    bytes->resize(s.size);
    return PreadFully(shard.fd.get(), shard.path, s.offset, s.size, bytes->data());
  }
  std::string Describe(int64_t i) const override {
    return absl::StrCat(shards_[samples_[i].shard].path, " member ", samples_[i].name, " (sample ",
                        i, ")");
  }

 private:
  std::vector<Shard> shards_;
  std::vector<Sample> samples_;
  DecodeOptions options_;
};

class NpySource : public Source {
 public:
  NpySource(std::string path, Fd fd, NpyHeader header, int channels, int rows, int cols,
            std::vector<int32_t> labels)
      : path_(std::move(path)),
        fd_(std::move(fd)),
        header_(std::move(header)),
        channels_(channels),
        rows_(rows),
        cols_(cols),
        labels_(std::move(labels)) {}
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int32_t label(int64_t i) const override { return labels_[i]; }
  absl::Status Read(int64_t i, Image* image) const override {
    const int64_t elements = int64_t{channels_} * rows_ * cols_;
    const int64_t bytes = elements * NpyItemSize(header_.dtype);
    image->channels = channels_;
    image->height = rows_;
    image->width = cols_;
    if (header_.dtype == NpyDtype::kF32) {
      image->u8.clear();
      image->f32.resize(elements);
      return PreadFully(fd_.get(), path_, header_.data_offset + i * bytes, bytes,
                        reinterpret_cast<char*>(image->f32.data()));
    }
    // uint8 C x H x W to the decoders' H x W x C.
    image->f32.clear();
    image->u8.resize(elements);
    if (channels_ == 1) {
      return PreadFully(fd_.get(), path_, header_.data_offset + i * bytes, bytes,
                        reinterpret_cast<char*>(image->u8.data()));
    }
    std::string planar(bytes, '\0');
    DT_RETURN_IF_ERROR(
        PreadFully(fd_.get(), path_, header_.data_offset + i * bytes, bytes, planar.data()));
    const int64_t plane = int64_t{rows_} * cols_;
    for (int c = 0; c < channels_; ++c) {
      for (int64_t p = 0; p < plane; ++p) {
        image->u8[p * channels_ + c] = static_cast<uint8_t>(planar[c * plane + p]);
      }
    }
    return absl::OkStatus();
  }
  std::string Describe(int64_t i) const override {
    return absl::StrCat(path_, " row ", i, " (sample ", i, ")");
  }

 private:
  std::string path_;
  Fd fd_;
  NpyHeader header_;
  int channels_, rows_, cols_;
  std::vector<int32_t> labels_;
};

// Samples `indices` of another source (skip_corrupt leaves the bad out).
class IndexedSource : public Source {
 public:
  IndexedSource(std::shared_ptr<const Source> base, std::vector<int64_t> indices)
      : base_(std::move(base)), indices_(std::move(indices)) {}
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  int32_t label(int64_t i) const override { return base_->label(indices_[i]); }
  absl::Status Read(int64_t i, Image* image) const override {
    return base_->Read(indices_[i], image);
  }
  std::string Describe(int64_t i) const override { return base_->Describe(indices_[i]); }

 private:
  std::shared_ptr<const Source> base_;
  std::vector<int64_t> indices_;
};

// ---- Opening ----

DecodeOptions Decoding(const DataConfig& c) {
  DecodeOptions o;
  o.channels = c.channels;
  o.max_pixels = c.max_image_pixels;
  return o;
}

absl::StatusOr<std::shared_ptr<const Source>> OpenImageFolder(const DataConfig& c,
                                                              const std::string& root,
                                                              std::vector<std::string>* classes) {
  if (!IsDir(root)) {
    errno = ENOENT;
    if (access(root.c_str(), F_OK) == 0) errno = ENOTDIR;
    return ErrnoStatus(root, "open the image folder");
  }
  DT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  std::vector<std::string> files;
  std::vector<int32_t> labels;
  for (const std::string& name : names) {
    const std::string dir = Join(root, name);
    if (!IsDir(dir)) continue;
    const int32_t label = static_cast<int32_t>(classes->size());
    classes->push_back(name);
    DT_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDir(dir));
    for (const std::string& e : entries) {
      if (!IsImageName(e)) continue;
      files.push_back(Join(dir, e));
      labels.push_back(label);
    }
  }
  if (classes->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(root, ": no class subdirectories; an image_folder is root/<class>/<image>"));
  }
  return std::make_shared<ImageFolderSource>(std::move(files), std::move(labels), Decoding(c));
}

// "dir/000123.seg.png" -> key "dir/000123", extension "seg.png".
std::pair<std::string, std::string> SplitKey(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) return {name, ""};
  return {name.substr(0, dot), absl::AsciiStrToLower(name.substr(dot + 1))};
}

absl::StatusOr<std::shared_ptr<const Source>> OpenWebDataset(const DataConfig& c,
                                                             const std::string& location) {
  DT_ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandLocation(location));
  std::vector<WebDatasetSource::Shard> shards;
  std::vector<WebDatasetSource::Sample> samples;
  for (const std::string& path : paths) {
    int64_t file_size = 0;
    DT_ASSIGN_OR_RETURN(Fd fd, OpenFile(path, &file_size));
    absl::StatusOr<std::vector<TarMember>> members = ParseTarStream(
        fd.get(), file_size,
        [](absl::string_view name) { return absl::EndsWith(absl::AsciiStrToLower(name), ".cls"); });
    if (!members.ok()) return Annotate(members.status(), absl::StrCat("shard ", path));
    const int32_t shard = static_cast<int32_t>(shards.size());
    // Members of one sample are adjacent (WebDataset's convention).
    std::string key;
    const TarMember* image = nullptr;
    const TarMember* cls = nullptr;
    auto finish = [&]() -> absl::Status {
      if (key.empty()) return absl::OkStatus();
      if (image == nullptr || cls == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard ", path, ": sample '", key, "' has no ", image == nullptr ? "image" : ".cls",
            " member; a sample is <key>.png|jpg|jpeg and <key>.cls, adjacent in the tar"));
      }
      int32_t label = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(cls->content), &label) || label < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard ", path, " member ", cls->name, ": '", absl::CEscape(cls->content.substr(0, 32)),
            "' is not a class index (a non-negative decimal integer)"));
      }
      samples.push_back({shard, label, image->offset, image->size, image->name});
      return absl::OkStatus();
    };
    for (const TarMember& m : *members) {
      auto [k, ext] = SplitKey(m.name);
      if (k != key) {
        DT_RETURN_IF_ERROR(finish());
        key = k;
        image = cls = nullptr;
      }
      const TarMember** slot = nullptr;
      if (ext == "png" || ext == "jpg" || ext == "jpeg") slot = &image;
      if (ext == "cls") slot = &cls;
      if (slot == nullptr) continue;  // other members (e.g. .json) are ignored
      if (*slot != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("shard ", path, ": sample '", key,
                                                       "' has two ", ext == "cls" ? "" : "image ",
                                                       ext, " members"));
      }
      *slot = &m;
    }
    DT_RETURN_IF_ERROR(finish());
    shards.push_back({path, std::move(fd)});
  }
  return std::make_shared<WebDatasetSource>(std::move(shards), std::move(samples), Decoding(c));
}

absl::StatusOr<std::vector<int32_t>> ReadLabelsNpy(const std::string& path) {
  DT_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, int64_t{1} << 32));
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(bytes);
  if (!h.ok()) return Annotate(h.status(), path);
  if (h->shape.size() != 1 || h->dtype == NpyDtype::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": labels must be a 1-D integer array, got ", NpyDtypeName(h->dtype),
                     " of shape (", absl::StrJoin(h->shape, ", "), ")"));
  }
  if (static_cast<int64_t>(bytes.size()) != h->data_offset + h->data_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes.size() - h->data_offset,
                                            " data bytes, the header says ", h->data_bytes));
  }
  std::vector<int32_t> labels(h->shape[0]);
  const char* p = bytes.data() + h->data_offset;
  const int item = NpyItemSize(h->dtype);
  for (int64_t i = 0; i < h->shape[0]; ++i) {
    int64_t v = 0;
    switch (h->dtype) {
      case NpyDtype::kU8:
        v = static_cast<uint8_t>(p[i]);
        break;
      case NpyDtype::kI8:
        v = static_cast<int8_t>(p[i]);
        break;
      default: {
        uint64_t raw = 0;
        std::memcpy(&raw, p + i * item, item);  // little-endian host
        const bool is_signed =
            h->dtype == NpyDtype::kI16 || h->dtype == NpyDtype::kI32 || h->dtype == NpyDtype::kI64;
        if (is_signed && item < 8 && (raw >> (item * 8 - 1)) & 1) raw |= ~uint64_t{0} << (item * 8);
        v = static_cast<int64_t>(raw);
        if (h->dtype == NpyDtype::kU64 && raw > uint64_t{INT32_MAX}) v = -1;
      }
    }
    if (v < 0 || v > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": label ", v, " of sample ", i, " is not a class index"));
    }
    labels[i] = static_cast<int32_t>(v);
  }
  return labels;
}

absl::StatusOr<std::shared_ptr<const Source>> OpenNpy(const DataConfig& c, const std::string& dir,
                                                      int* channels, int* rows, int* cols) {
  const std::string x_path = Join(dir, "x.npy"), y_path = Join(dir, "y.npy");
  int64_t file_size = 0;
  DT_ASSIGN_OR_RETURN(Fd fd, OpenFile(x_path, &file_size));
  std::string head(std::min<int64_t>(file_size, (1 << 20) + 12), '\0');
  DT_RETURN_IF_ERROR(PreadFully(fd.get(), x_path, 0, head.size(), head.data()));
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(head);
  if (!h.ok()) return Annotate(h.status(), x_path);
  if (h->dtype != NpyDtype::kU8 && h->dtype != NpyDtype::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(x_path, ": images must be uint8 or float32, got ", NpyDtypeName(h->dtype)));
  }
  if (h->shape.size() == 3) h->shape.insert(h->shape.begin() + 1, 1);
  if (h->shape.size() != 4 || h->shape[1] < 1 || h->shape[1] > 4 || h->shape[2] < 1 ||
      h->shape[3] < 1 || h->shape[2] > kMaxImageSide || h->shape[3] > kMaxImageSide) {
    return absl::InvalidArgumentError(
        absl::StrCat(x_path, ": shape (", absl::StrJoin(h->shape, ", "),
                     ") is not N x C x H x W (or N x H x W) with 1..4 channels"));
  }
  if (file_size != h->data_offset + h->data_bytes) {
    return absl::DataLossError(absl::StrCat(x_path, ": ", file_size - h->data_offset,
                                            " data bytes, the header's shape needs ",
                                            h->data_bytes));
  }
  DT_ASSIGN_OR_RETURN(std::vector<int32_t> labels, ReadLabelsNpy(y_path));
  if (static_cast<int64_t>(labels.size()) != h->shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat(x_path, " holds ", h->shape[0], " images but ",
                                                   y_path, " holds ", labels.size(),
                                                   " labels; they must agree"));
  }
  *channels = static_cast<int>(h->shape[1]);
  *rows = static_cast<int>(h->shape[2]);
  *cols = static_cast<int>(h->shape[3]);
  if (c.channels > 0 && c.channels != *channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        x_path, " holds ", *channels, "-channel images, the spec says channels: ", c.channels));
  }
  return std::make_shared<NpySource>(x_path, std::move(fd), *h, *channels, *rows, *cols,
                                     std::move(labels));
}

}  // namespace

absl::StatusOr<Dataset> OpenDataset(const DataConfig& c, Split split, const std::string& idx_dir,
                                    int64_t max_samples) {
  DT_RETURN_IF_ERROR(ValidateDataConfig(c));
  const std::string& location = split == Split::kTrain ? c.train : c.test;
  if (c.is_idx()) {
    std::string dir = !location.empty() ? location : !c.train.empty() ? c.train : idx_dir;
    if (dir.empty()) dir = kDefaultFashionMnistDir;
    return LoadFashionMnist(dir, split, max_samples);
  }
  Dataset data;
  data.location = location;
  if (location.empty()) return data;  // no test set
  std::shared_ptr<const Source> source;
  int channels = c.channels, rows = c.height, cols = c.width;
  if (c.format == "image_folder") {
    DT_ASSIGN_OR_RETURN(source, OpenImageFolder(c, location, &data.class_names));
  } else if (c.format == "webdataset") {
    DT_ASSIGN_OR_RETURN(source, OpenWebDataset(c, location));
  } else {
    int nc = 0, nr = 0, ncol = 0;
    DT_ASSIGN_OR_RETURN(source, OpenNpy(c, location, &nc, &nr, &ncol));
    if (channels == 0) channels = nc;
    if (rows == 0 && c.transforms.crop_height == 0 && c.transforms.resize == 0) {
      rows = nr;
      cols = ncol;
    }
  }
  if (source->size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(SplitName(split), " data at '", location, "': no samples"));
  }
  data.transforms = split == Split::kTrain ? c.transforms : c.transforms.Deterministic();
  // The shape, when the spec leaves it open: the first sample's.
  if (channels == 0 || rows == 0) {
    Image first;
    DT_RETURN_IF_ERROR(source->Read(0, &first));
    if (channels == 0) channels = first.channels;
    if (rows == 0) {
      rows = data.transforms.crop_height > 0 ? data.transforms.crop_height : first.height;
      cols = data.transforms.crop_width > 0 ? data.transforms.crop_width : first.width;
      if (data.transforms.resize > 0 && data.transforms.crop_height == 0) {
        return Bad("height", "with resize and no crop, give height and width");
      }
    }
  }
  DT_RETURN_IF_ERROR(ValidateTransforms(data.transforms, channels).ok()
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError(absl::StrCat(
                               "data.", ValidateTransforms(data.transforms, channels).message())));
  // Labels.
  int num_classes = c.num_classes;
  if (num_classes == 0) {
    num_classes = data.class_names.empty() ? 0 : static_cast<int>(data.class_names.size());
    if (num_classes == 0) {
      for (int64_t i = 0; i < source->size(); ++i) {
        num_classes = std::max(num_classes, source->label(i) + 1);
      }
    }
  }
  if (!data.class_names.empty() && static_cast<int>(data.class_names.size()) > num_classes) {
    return absl::InvalidArgumentError(absl::StrCat(
        location, " has ", data.class_names.size(), " class directories (",
        absl::StrJoin(data.class_names.begin(),
                      data.class_names.begin() + std::min<size_t>(5, data.class_names.size()),
                      ", "),
        data.class_names.size() > 5 ? ", ..." : "", ") but num_classes is ", num_classes));
  }
  for (int64_t i = 0; i < source->size(); ++i) {
    if (source->label(i) >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(source->Describe(i), ": label ",
                                                     source->label(i), " is out of range (",
                                                     "num_classes is ", num_classes, ")"));
    }
  }
  // Every sample decodes to the shape (in parallel).
  const int64_t n = source->size();
  std::vector<char> bad(n, 0);
  std::mutex mu;
  absl::Status first_error;
  int64_t first_bad = n;
  ParallelFor(n, DefaultThreads(c.data_threads), [&](int64_t i) {
    thread_local Image image;
    absl::Status s = source->Read(i, &image);
    if (s.ok()) {
      s = CheckTransforms(image, data.transforms, channels, rows, cols);
      if (!s.ok()) s = Annotate(s, source->Describe(i));
    }
    if (s.ok()) return;
    bad[i] = 1;
    std::lock_guard<std::mutex> lock(mu);
    if (i < first_bad) {
      first_bad = i;
      first_error = s;
    }
  });
  if (!first_error.ok()) {
    if (!c.skip_corrupt || !absl::IsDataLoss(first_error)) {
      std::string hint = absl::IsDataLoss(first_error)
                             ? " (set skip_corrupt: true to leave corrupt images out)"
                             : "";
      return absl::Status(first_error.code(),
                          absl::StrCat(SplitName(split), " data: ", first_error.message(), hint));
    }
    // Only corrupt files are skipped; a wrong size or a bomb still fails.
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < n; ++i) {
      if (!bad[i]) {
        keep.push_back(i);
        continue;
      }
      Image image;
      absl::Status s = source->Read(i, &image);
      if (!s.ok() && !absl::IsDataLoss(s)) {
        return absl::Status(s.code(), absl::StrCat(SplitName(split), " data: ", s.message()));
      }
    }
    data.corrupt_skipped = n - static_cast<int64_t>(keep.size());
    if (keep.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(location, ": every image is corrupt"));
    }
    source = std::make_shared<IndexedSource>(source, std::move(keep));
  }
  data.size = source->size();
  data.channels = channels;
  data.rows = rows;
  data.cols = cols;
  data.num_classes = num_classes;
  data.source = std::move(source);
  if (max_samples > 0 && max_samples < data.size) return Subset(data, max_samples);
  return data;
}

absl::Status CheckInputShape(const Dataset& data, const std::vector<int64_t>& shape,
                             const std::string& model) {
  if (data.size == 0) return absl::OkStatus();
  const std::vector<int64_t> have = {data.channels, data.rows, data.cols};
  int64_t want = 1;
  for (int64_t d : shape) want *= d;
  // A model that flattens its input takes the same values in another shape.
  if (have == shape || (shape.size() == 1 && want == have[0] * have[1] * have[2])) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the data at '", data.location, "' are ", absl::StrJoin(have, " x "), " images but model ",
      model, " takes ", absl::StrJoin(shape, " x "),
      "; set data.channels, height and width (with resize/crop transforms) to the model's input"));
}

DatasetSummary Summarize(const Dataset& data) {
  DatasetSummary s;
  s.size = data.size;
  s.channels = data.channels;
  s.rows = data.rows;
  s.cols = data.cols;
  s.num_classes = data.num_classes;
  s.class_names = data.class_names;
  s.corrupt_skipped = data.corrupt_skipped;
  for (int64_t i = 0; i < data.size; ++i) {
    const int32_t label = data.label(i);
    if (label >= static_cast<int32_t>(s.histogram.size())) s.histogram.resize(label + 1, 0);
    ++s.histogram[label];
  }
  if (static_cast<int>(s.histogram.size()) < s.num_classes) s.histogram.resize(s.num_classes, 0);
  return s;
}

}  // namespace dtrain::data
