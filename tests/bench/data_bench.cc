// data_bench: what reading your own data costs (docs/data.md), in one run.
//
//   bazel run -c opt //tests/bench:data_bench -- [--train_samples=8192] [--jpeg_images=200]
//
// 1. Jobs: a 2-rank LeNet job (two ranks in this process, in-process
//    communicators, 1 kernel thread each) on the first --train_samples
//    Fashion-MNIST images, read from the IDX files and from PNG WebDataset
//    shards the bench writes (the same pixels, the same order), best of
//    --repeats runs each: samples/s of the job, its ratio, and data_wait's
//    share of the step time.
// 2. JPEG: --jpeg_images RGB images of --jpeg_side pixels (smooth shapes,
//    quality 90), decoded + random crop (padding 4) + flip + normalize on
//    one thread (images/s per core), next to libjpeg-turbo's own `tjbench`
//    decompression figure (fps, RGB output) for the same images, and the
//    ratio.
//
// Output: key=value lines.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/image.h"
#include "libs/data/open.h"
#include "libs/data/pack.h"
#include "libs/data/transforms.h"
#include "libs/train/job.h"

ABSL_FLAG(int64_t, train_samples, 8192, "Fashion-MNIST training images per job");
ABSL_FLAG(int, repeats, 2, "runs of each job (the best counts)");
ABSL_FLAG(int, jpeg_images, 200, "JPEG images in the decode benchmark");
ABSL_FLAG(int, jpeg_side, 224, "their width and height");
ABSL_FLAG(int, jpeg_rounds, 5, "passes over them");
ABSL_FLAG(std::string, dir, "", "scratch directory (default: a new one under /tmp)");

namespace dtrain {
namespace {

class Timing : public train::JobObserver {
 public:
  void OnStep(const train::JobProgress& p, const train::StepTimes& t) override {
    data_wait += t.data_wait;
    step += t.phases.step.seconds();
  }
  double data_wait = 0, step = 0;
};

struct JobResult {
  double samples_per_second = 0;
  double data_wait_share = 0;
};

JobResult TrainTwoRanks(const data::DataConfig& d) {
  collective::InMemoryStore store;
  Timing timing[2];
  train::JobProgress progress[2];
  absl::Status st[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      collective::CommunicatorOptions co;
      co.transport = collective::TransportKind::kInProcess;
      auto comm = collective::Communicator::Create(r, 2, &store, co);
      if (!comm.ok()) {
        st[r] = comm.status();
        return;
      }
      train::JobConfig c;
      c.name = "data-bench";
      c.model = "lenet";
      c.epochs = 1;
      c.global_batch_size = 128;
      c.sgd = {.lr = 0.05f, .momentum = 0.9f};
      c.init = "kaiming";
      c.seed = 1;
      c.threads = 1;
      c.train_limit = absl::GetFlag(FLAGS_train_samples);
      c.test_limit = 1;
      c.data = d;
      c.rank = r;
      c.world_size = 2;
      c.communicator = comm->get();
      st[r] = train::RunJob(c, &timing[r], &progress[r]);
    });
  }
  for (auto& t : ranks) t.join();
  for (const absl::Status& s : st) {
    if (!s.ok()) {
      std::fprintf(stderr, "data_bench: job failed: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  JobResult r;
  r.samples_per_second = progress[0].samples_per_second;
  const double wait = timing[0].data_wait + timing[1].data_wait;
  const double step = timing[0].step + timing[1].step;
  r.data_wait_share = step > 0 ? wait / step : 0;
  return r;
}

JobResult Best(const data::DataConfig& d) {
  JobResult best;
  for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
    JobResult r = TrainTwoRanks(d);
    if (r.samples_per_second > best.samples_per_second) best = r;
  }
  return best;
}

// An RGB image of smooth shapes (what JPEG is made for).
data::Image Shapes(int side, std::mt19937* rng) {
  data::Image im;
  im.channels = 3;
  im.height = im.width = side;
  im.u8.resize(size_t{3} * side * side);
  std::uniform_int_distribution<int> u(0, side - 1), color(0, 255);
  const int bg[3] = {color(*rng), color(*rng), color(*rng)};
  for (int y = 0; y < side; ++y) {
    for (int x = 0; x < side; ++x) {
      for (int c = 0; c < 3; ++c)
        im.u8[(static_cast<size_t>(y) * side + x) * 3 + c] = (bg[c] + x / 2 + y / 3) % 256;
    }
  }
  for (int s = 0; s < 6; ++s) {
    const int cx = u(*rng), cy = u(*rng), r = side / 8 + u(*rng) / 6;
    const int col[3] = {color(*rng), color(*rng), color(*rng)};
    for (int y = std::max(0, cy - r); y < std::min(side, cy + r); ++y) {
      for (int x = std::max(0, cx - r); x < std::min(side, cx + r); ++x) {
        if ((x - cx) * (x - cx) + (y - cy) * (y - cy) > r * r) continue;
        for (int c = 0; c < 3; ++c) im.u8[(static_cast<size_t>(y) * side + x) * 3 + c] = col[c];
      }
    }
  }
  return im;
}

// tjbench's decompression frame rate (RGB output) for `path`; 0 if it
// cannot be run.
double TjbenchFps(const std::string& path) {
  const std::string cmd = absl::StrCat("tjbench ", path, " -rgb -benchtime 1 -warmup 0 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  char line[512];
  double fps = 0;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    const char* at = std::strstr(line, "Frame rate:");
    if (at != nullptr && fps == 0) fps = std::atof(at + std::strlen("Frame rate:"));
  }
  pclose(p);
  return fps;
}

int Main() {
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    char tmpl[] = "/tmp/data_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
  }
  std::printf("cores=%u\n", std::thread::hardware_concurrency());

  // 1. Jobs: IDX vs PNG shards.
  absl::StatusOr<data::Dataset> train =
      data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTrain);
  if (!train.ok()) {
    std::fprintf(stderr, "data_bench: %s\n", train.status().ToString().c_str());
    return 1;
  }
  const int64_t n = absl::GetFlag(FLAGS_train_samples);
  const data::Dataset part = data::Subset(*train, n);
  absl::StatusOr<std::vector<std::string>> shards =
      data::WriteWebDataset(part, dir, "train", {.shard_size = 2048});
  if (!shards.ok()) {
    std::fprintf(stderr, "data_bench: %s\n", shards.status().ToString().c_str());
    return 1;
  }
  data::DataConfig idx;
  idx.test = "";
  data::DataConfig png;
  png.format = "webdataset";
  png.train = data::BraceLocation(dir, "train", shards->size());
  png.channels = 1;
  png.height = png.width = 28;
  png.num_classes = 10;
  const JobResult a = Best(idx);
  const JobResult b = Best(png);
  std::printf("job=lenet_2ranks train_samples=%lld\n", static_cast<long long>(n));
  std::printf("idx_samples_per_s=%.1f\n", a.samples_per_second);
  std::printf("png_shards_samples_per_s=%.1f\n", b.samples_per_second);
  std::printf("png_over_idx_ratio=%.3f\n", b.samples_per_second / a.samples_per_second);
  std::printf("idx_data_wait_share=%.4f\n", a.data_wait_share);
  std::printf("png_shards_data_wait_share=%.4f\n", b.data_wait_share);

  // 2. JPEG decode + crop + flip + normalize on one thread vs tjbench.
  const int count = absl::GetFlag(FLAGS_jpeg_images);
  const int side = absl::GetFlag(FLAGS_jpeg_side);
  std::mt19937 rng(5);
  std::vector<std::string> jpegs;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<std::string> j = data::EncodeJpeg(Shapes(side, &rng), 90);
    if (!j.ok()) return 1;
    jpegs.push_back(*std::move(j));
  }
  data::Transforms t;
  t.crop_height = t.crop_width = side - 24;
  t.crop_padding = 4;
  t.random_crop = t.random_flip = true;
  t.mean = {0.485f, 0.456f, 0.406f};
  t.std = {0.229f, 0.224f, 0.225f};
  std::vector<float> out(size_t{3} * (side - 24) * (side - 24));
  const int rounds = absl::GetFlag(FLAGS_jpeg_rounds);
  data::Image im;  // reused, as the loader's threads do
  const absl::Time start = absl::Now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < count; ++i) {
      if (!data::DecodeImageInto(jpegs[i], {.channels = 3}, &im).ok() ||
          !data::ApplyTransforms(im, t, data::SampleSeed(1, r, i), 3, side - 24, side - 24,
                                 out.data())
               .ok()) {
        std::fprintf(stderr, "data_bench: decode failed\n");
        return 1;
      }
    }
  }
  const double ours = rounds * count / absl::ToDoubleSeconds(absl::Now() - start);
  // The two halves alone.
  absl::Time t0 = absl::Now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < count; ++i) (void)data::DecodeImageInto(jpegs[i], {.channels = 3}, &im);
  }
  const double decode_only = rounds * count / absl::ToDoubleSeconds(absl::Now() - t0);
  t0 = absl::Now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < count; ++i) {
      (void)data::ApplyTransforms(im, t, data::SampleSeed(1, r, i), 3, side - 24, side - 24,
                                  out.data());
    }
  }
  const double transforms_only = rounds * count / absl::ToDoubleSeconds(absl::Now() - t0);
  // tjbench on a few of the same images (files), averaged.
  double tj = 0;
  int measured = 0;
  for (int i = 0; i < std::min(count, 3); ++i) {
    const std::string path = absl::StrFormat("%s/img%03d.jpg", dir, i);
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) continue;
    std::fwrite(jpegs[i].data(), 1, jpegs[i].size(), f);
    std::fclose(f);
    const double fps = TjbenchFps(path);
    if (fps > 0) {
      tj += fps;
      ++measured;
    }
  }
  std::printf("jpeg_side=%d jpeg_quality=90 crop=%d pad=4 flip=1 normalize=1\n", side, side - 24);
  std::printf("jpeg_decode_crop_flip_normalize_images_per_s_per_core=%.1f\n", ours);
  std::printf("jpeg_decode_only_images_per_s_per_core=%.1f\n", decode_only);
  std::printf("crop_flip_normalize_only_images_per_s_per_core=%.1f\n", transforms_only);
  if (measured > 0) {
    tj /= measured;
    std::printf("tjbench_decompress_images_per_s=%.1f\n", tj);
    std::printf("ours_over_tjbench_ratio=%.3f\n", ours / tj);
    std::printf("decode_only_over_tjbench_ratio=%.3f\n", decode_only / tj);
  } else {
    std::printf("tjbench=missing (apt-get install libjpeg-turbo-progs; tools/setup --bench)\n");
  }
  return 0;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dtrain::Main();
}
