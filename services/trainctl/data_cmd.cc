#include "services/trainctl/data_cmd.h"

#include <sys/stat.h>

#include <cstdio>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/base/status.h"
#include "libs/data/data_spec.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/open.h"
#include "libs/data/pack.h"
#include "protos/scheduler.pb.h"
#include "services/trainctl/jobfile.h"

namespace dtrain {
namespace trainctl {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The format of the data at `path`, from what is there.
std::string GuessFormat(const std::string& path) {
  if (absl::StrContains(path, ".tar") || absl::StrContains(path, "{")) return "webdataset";
  if (Exists(path + "/x.npy")) return "npy";
  if (Exists(path + "/train-images-idx3-ubyte.gz") || Exists(path + "/train-images-idx3-ubyte")) {
    return "idx";
  }
  return "image_folder";
}

// A job file's data: section (its data_dir for the Fashion-MNIST default).
absl::StatusOr<data::DataConfig> FromJobFile(const std::string& file, std::string* idx_dir) {
  // The same reading as trainctl submit -f (jobfile.h).
  scheduler::v1::JobSpec spec;
  std::string model_file;  // a job file of a model file reads the same; unused here
  DT_RETURN_IF_ERROR(ReadJobFile(file, &spec, &model_file));
  *idx_dir = spec.data_dir();
  return data::DataConfigFromSpec(spec.data());
}

absl::StatusOr<data::DataConfig> ConfigFor(const std::string& what, const DataCommandOptions& o,
                                           std::string* idx_dir) {
  if (!IsDir(what) && (absl::EndsWith(what, ".yaml") || absl::EndsWith(what, ".yml") ||
                       absl::EndsWith(what, ".json"))) {
    DT_ASSIGN_OR_RETURN(data::DataConfig c, FromJobFile(what, idx_dir));
    if (o.skip_corrupt) c.skip_corrupt = true;
    if (o.data_threads > 0) c.data_threads = o.data_threads;
    return c;
  }
  data::DataConfig c;
  c.format = o.data_format.empty() ? GuessFormat(what) : o.data_format;
  c.train = what;
  if (c.format == "idx") c.test = what;
  c.skip_corrupt = o.skip_corrupt;
  c.data_threads = o.data_threads;
  DT_RETURN_IF_ERROR(data::ValidateDataConfig(c));
  return c;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += absl::StrFormat("\\u%04x", ch);
    } else {
      out.push_back(ch);
    }
  }
  return out + "\"";
}

std::string ClassName(const data::DatasetSummary& s, int label) {
  return label < static_cast<int>(s.class_names.size()) ? s.class_names[label] : "";
}

std::string SummaryJson(const data::Dataset& d, const std::string& format) {
  const data::DatasetSummary s = data::Summarize(d);
  std::vector<std::string> classes;
  for (size_t c = 0; c < s.histogram.size(); ++c) {
    classes.push_back(absl::StrCat("{\"label\": ", c, ", \"name\": ", JsonString(ClassName(s, c)),
                                   ", \"samples\": ", s.histogram[c], "}"));
  }
  return absl::StrCat("{\"format\": ", JsonString(format),
                      ", \"location\": ", JsonString(d.location), ", \"samples\": ", s.size,
                      ", \"channels\": ", s.channels, ", \"height\": ", s.rows,
                      ", \"width\": ", s.cols, ", \"num_classes\": ", s.num_classes,
                      ", \"corrupt_skipped\": ", s.corrupt_skipped, ", \"classes\": [",
                      absl::StrJoin(classes, ", "), "]}");
}

void PrintSummary(const char* split, const data::Dataset& d, const std::string& format) {
  const data::DatasetSummary s = data::Summarize(d);
  std::printf("%s: %s %s\n", split, format.c_str(), d.location.c_str());
  std::printf("  samples %lld  shape %d x %d x %d  classes %d  corrupt skipped %lld\n",
              static_cast<long long>(s.size), s.channels, s.rows, s.cols, s.num_classes,
              static_cast<long long>(s.corrupt_skipped));
  std::printf("  %-6s %-20s %10s\n", "class", "name", "samples");
  for (size_t c = 0; c < s.histogram.size(); ++c) {
    std::printf("  %-6zu %-20s %10lld\n", c, ClassName(s, c).c_str(),
                static_cast<long long>(s.histogram[c]));
  }
}

int Check(const std::string& what, const DataCommandOptions& o) {
  std::string idx_dir;
  absl::StatusOr<data::DataConfig> c = ConfigFor(what, o, &idx_dir);
  if (!c.ok()) {
    std::fprintf(stderr, "trainctl: data check: %s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  const std::string format = c->is_idx() ? "idx" : c->format;
  std::vector<std::string> parts;
  for (data::Split split : {data::Split::kTrain, data::Split::kTest}) {
    if (!c->is_idx() && (split == data::Split::kTrain ? c->train : c->test).empty()) continue;
    absl::StatusOr<data::Dataset> d = data::OpenDataset(*c, split, idx_dir);
    if (!d.ok()) {
      std::fprintf(stderr, "trainctl: data check: %s split: %s\n", data::SplitName(split),
                   std::string(d.status().message()).c_str());
      return 1;
    }
    if (o.json) {
      parts.push_back(absl::StrCat("\"", data::SplitName(split), "\": ", SummaryJson(*d, format)));
    } else {
      PrintSummary(data::SplitName(split), *d, format);
    }
  }
  if (o.json) std::printf("{%s}\n", absl::StrJoin(parts, ", ").c_str());
  return 0;
}

int Pack(const std::string& src, const std::string& dst, const DataCommandOptions& o) {
  if (o.format != "webdataset") {
    std::fprintf(stderr, "trainctl: data pack: --format must be webdataset, got '%s'\n",
                 o.format.c_str());
    return 2;
  }
  if (o.shard_size <= 0 || o.jpeg_quality < 0 || o.jpeg_quality > 100) {
    std::fprintf(stderr,
                 "trainctl: data pack: --shard_size must be > 0 and --jpeg_quality in 0..100\n");
    return 2;
  }
  std::string idx_dir;
  absl::StatusOr<data::DataConfig> c = ConfigFor(src, o, &idx_dir);
  if (!c.ok()) {
    std::fprintf(stderr, "trainctl: data pack: %s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  std::vector<std::string> lines;
  for (data::Split split : {data::Split::kTrain, data::Split::kTest}) {
    if (!c->is_idx() && (split == data::Split::kTrain ? c->train : c->test).empty()) continue;
    absl::StatusOr<data::Dataset> d = data::OpenDataset(*c, split, idx_dir);
    absl::StatusOr<std::vector<std::string>> shards =
        d.ok() ? data::WriteWebDataset(*d, dst, data::SplitName(split),
                                       {.shard_size = o.shard_size, .jpeg_quality = o.jpeg_quality})
               : absl::StatusOr<std::vector<std::string>>(d.status());
    if (!shards.ok()) {
      std::fprintf(stderr, "trainctl: data pack: %s split: %s\n", data::SplitName(split),
                   std::string(shards.status().message()).c_str());
      return 1;
    }
    const std::string location = data::BraceLocation(dst, data::SplitName(split), shards->size());
    if (o.json) {
      lines.push_back(
          absl::StrCat("\"", data::SplitName(split), "\": {\"location\": ", JsonString(location),
                       ", \"samples\": ", d->size, ", \"shards\": ", shards->size(), "}"));
    } else {
      std::printf("%s: %lld samples in %zu shards: %s\n", data::SplitName(split),
                  static_cast<long long>(d->size), shards->size(), location.c_str());
    }
  }
  if (o.json) std::printf("{%s}\n", absl::StrJoin(lines, ", ").c_str());
  return 0;
}

}  // namespace

int DataMain(const std::vector<std::string>& args, const DataCommandOptions& o) {
  if (args.size() == 2 && args[0] == "check") return Check(args[1], o);
  if (args.size() == 3 && args[0] == "pack") return Pack(args[1], args[2], o);
  std::fprintf(stderr,
               "trainctl: usage: trainctl data check SPEC|PATH [--data_format=...] [-o json]\n"
               "                 trainctl data pack --format=webdataset [--shard_size=10000] "
               "[--jpeg_quality=0] SRC DST\n");
  return 2;
}

}  // namespace trainctl
}  // namespace dtrain
