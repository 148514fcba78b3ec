// `trainctl data`: a dataset's checks and summary on this machine, and
// packing image folders or IDX files into WebDataset shards.
//
//   trainctl data check job.yaml          the job file's data: section
//   trainctl data check /data/fmnist/train-{000000..000005}.tar
//   trainctl data check /data/my-images   (format guessed; --data_format=...)
//   trainctl data pack --format=webdataset --shard_size=10000 SRC DST
//
// check runs the trainers' checks at open (libs/data/open.h: files, labels,
// shapes, every image decoded) and prints per split the sample count, the
// shape, the classes with their names and a per-class histogram; -o json
// prints the same as one JSON object. pack writes DST/train-NNNNNN.tar (and
// DST/test-NNNNNN.tar for IDX sources, which have both splits) and prints
// the locations to put in a job file. See docs/data.md.
#ifndef DTRAIN_SERVICES_TRAINCTL_DATA_CMD_H_
#define DTRAIN_SERVICES_TRAINCTL_DATA_CMD_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {
namespace trainctl {

struct DataCommandOptions {
  bool json = false;
  std::string data_format;            // check/pack: the source's format; "": guessed
  std::string format = "webdataset";  // pack: the output's (webdataset only)
  int64_t shard_size = 10000;
  int jpeg_quality = 0;  // pack: 0: PNG (lossless)
  bool skip_corrupt = false;
  int data_threads = 0;
};

// args: what follows "data". Returns the exit status (0 ok, 1 the data
// failed a check, 2 usage).
int DataMain(const std::vector<std::string>& args, const DataCommandOptions& o);

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_DATA_CMD_H_
