// data_bench: what reading your own data costs (docs/data.md), in one run.
//
//   bazel run -c opt //tests/bench:data_bench -- [--train_samples=8192] [--jpeg_images=200]
//
// 1. (printed second) Jobs: a 2-rank LeNet job (two ranks in this process, in-process
//    communicators, 1 kernel thread each, decode threads by default: what
//    the step leaves free) on the first --train_samples Fashion-MNIST
//    images, read from the IDX files and from PNG WebDataset shards the
//    bench writes (the same pixels, the same order). The runs interleave
//    IDX, PNG, IDX again (--repeats times; the best of each counts), so the
//    second IDX arm is an A/A check of the machine's noise: samples/s of
//    each, the PNG/IDX ratio, the A/A ratio, and data_wait's share of the
//    step time. The same ratios by samples per CPU-second of the process
//    (decoding included): on a loaded machine the wall-clock figures swing
//    with the other processes, the CPU ones barely.
// 2. (printed first) JPEG: --jpeg_images RGB images of --jpeg_side pixels (smooth shapes,
//    quality 90, 4:2:0), decoded + random crop (padding 4) + flip +
//    normalize to float C x H x W on one thread as the loader does it
//    (DecodeAndTransform: one pass, row by row), timed by the thread's CPU
//    clock (other processes on the machine do not count), next to
//     - the same as two steps (DecodeImageInto, then ApplyTransforms);
//     - TurboJPEG's tjDecompress2 to RGB in a loop in this process: the
//       call tjbench times (our reference, written with the TurboJPEG API);
//     - Debian's tjbench itself (libjpeg-turbo-progs; tools/setup --bench)
//       on the first --tjbench_images of the same images, one process
//       each: its frame rate, divided by the share of a core it got (its
//       CPU time over its wall time, from getrusage), i.e. per core; and
//       ours on exactly those images for the ratio.
//    Rounds interleave all of them (--jpeg_rounds); the best round counts.
//
// Output: key=value lines.
#include <sys/resource.h>
#include <time.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
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
#include "libs/data/config.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/image.h"
#include "libs/data/open.h"
#include "libs/data/pack.h"
#include "libs/data/transforms.h"
#include "libs/train/job.h"

ABSL_FLAG(int64_t, train_samples, 8192, "Fashion-MNIST training images per job");
ABSL_FLAG(int, repeats, 3, "runs of each job arm, interleaved (the best counts)");
ABSL_FLAG(int, jpeg_images, 200, "JPEG images in the decode benchmark");
ABSL_FLAG(int, jpeg_side, 224, "their width and height");
ABSL_FLAG(int, tjbench_images, 4, "of them, those tjbench runs on (0.5 s each per round)");
ABSL_FLAG(int, jpeg_rounds, 5, "interleaved rounds of each measurement (the best counts)");
ABSL_FLAG(bool, jpeg, true, "run the JPEG part");
ABSL_FLAG(bool, jobs, true, "run the jobs part");
ABSL_FLAG(std::string, dir, "", "scratch directory (default: a new one under /tmp)");

namespace dtrain {
namespace {

// CPU seconds of this process (every thread) so far.
double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + 1e-6 * u.ru_utime.tv_usec + u.ru_stime.tv_sec +
         1e-6 * u.ru_stime.tv_usec;
}

// The process's CPU time per sample trained, from the first step of either
// rank to the last step of either (so without opening the data, the check
// at open and the start-up): a figure the other processes on the machine
// barely move, unlike samples per second.
struct CpuWindow {
  std::mutex mu;
  bool started = false;
  double start = 0, end = 0;
  int64_t samples = 0;

  void Step(int64_t step_samples) {
    std::lock_guard<std::mutex> lock(mu);
    if (!started) {
      started = true;
      start = end = ProcessCpuSeconds();
      return;
    }
    samples += step_samples;
    end = ProcessCpuSeconds();
  }
};

class Timing : public train::JobObserver {
 public:
  explicit Timing(CpuWindow* window) : window_(window) {}
  void OnStep(const train::JobProgress& p, const train::StepTimes& t) override {
    data_wait += t.data_wait;
    step += t.phases.step.seconds();
    window_->Step(t.samples);
  }
  double data_wait = 0, step = 0;

 private:
  CpuWindow* window_;
};

struct JobResult {
  double samples_per_second = 0;
  double samples_per_cpu_second = 0;
  double data_wait_share = 0;
};

JobResult TrainTwoRanks(const data::DataConfig& d) {
  collective::InMemoryStore store;
  CpuWindow window;
  Timing timing[2] = {Timing(&window), Timing(&window)};
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
  r.samples_per_cpu_second =
      window.end > window.start ? window.samples / (window.end - window.start) : 0;
  const double wait = timing[0].data_wait + timing[1].data_wait;
  const double step = timing[0].step + timing[1].step;
  r.data_wait_share = step > 0 ? wait / step : 0;
  return r;
}

// Seconds of CPU time this thread has used.
double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// The machine's 1-minute load average (other helpers build on it).
double LoadAverage() {
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  return load;
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

struct TjbenchResult {
  double fps = 0;       // tjbench's frame rate (wall clock)
  double per_core = 0;  // divided by the share of a core it got
};

// Debian's tjbench on `path`, decompressing to RGB for about 0.5 s;
// fps 0 if it cannot be run.
TjbenchResult Tjbench(const std::string& path) {
  const std::string cmd = absl::StrCat("tjbench ", path, " -rgb -benchtime 0.5 -warmup 0 2>&1");
  rusage before, after;
  getrusage(RUSAGE_CHILDREN, &before);
  const absl::Time start = absl::Now();
  FILE* p = popen(cmd.c_str(), "r");
  TjbenchResult r;
  if (p == nullptr) return r;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    const char* at = std::strstr(line, "Frame rate:");
    if (at != nullptr && r.fps == 0) r.fps = std::atof(at + std::strlen("Frame rate:"));
  }
  pclose(p);
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  getrusage(RUSAGE_CHILDREN, &after);
  auto seconds = [](const timeval& t) { return t.tv_sec + 1e-6 * t.tv_usec; };
  const double cpu = seconds(after.ru_utime) - seconds(before.ru_utime) + seconds(after.ru_stime) -
                     seconds(before.ru_stime);
  r.per_core = r.fps;
  if (cpu > 0 && wall > cpu) r.per_core = r.fps * wall / cpu;
  return r;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "data_bench: %s\n", what.c_str());
  return 1;
}

// 2. JPEG decode + crop + flip + normalize on one thread vs TurboJPEG's
// decompression (in this process, and Debian's tjbench).
int Jpeg(const std::string& dir) {
  const int count = absl::GetFlag(FLAGS_jpeg_images);
  const int side = absl::GetFlag(FLAGS_jpeg_side);
  const int crop = side - 24;
  std::mt19937 rng(5);
  std::vector<std::string> jpegs;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<std::string> j = data::EncodeJpeg(Shapes(side, &rng), 90);
    if (!j.ok()) return Fail(j.status().ToString());
    jpegs.push_back(*std::move(j));
  }
  std::vector<std::string> files;
  for (int i = 0; i < std::min(count, absl::GetFlag(FLAGS_tjbench_images)); ++i) {
    const std::string path = absl::StrFormat("%s/img%03d.jpg", dir, i);
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return Fail(absl::StrCat("cannot write ", path));
    std::fwrite(jpegs[i].data(), 1, jpegs[i].size(), f);
    std::fclose(f);
    files.push_back(path);
  }
  data::Transforms t;
  t.crop_height = t.crop_width = crop;
  t.crop_padding = 4;
  t.random_crop = t.random_flip = true;
  t.mean = {0.485f, 0.456f, 0.406f};
  t.std = {0.229f, 0.224f, 0.225f};
  std::vector<float> out(size_t{3} * crop * crop);
  data::Image im;  // reused, as the loader's threads do
  tjhandle tj = tjInitDecompress();
  if (tj == nullptr) return Fail("tjInitDecompress failed");
  std::vector<unsigned char> rgb(size_t{3} * side * side);
  // Best (smallest) CPU seconds per pass over the images, per measurement.
  double ours = 1e30, decode_only = 1e30, transforms_only = 1e30, turbojpeg = 1e30;
  // Per image of the tjbench set: seconds per image, tjbench's (per core)
  // and ours; and tjbench's best raw frame rate.
  std::vector<double> tj_seconds(files.size(), 1e30), our_seconds(files.size(), 1e30),
      two_step_seconds(files.size(), 1e30);
  double tjbench_fps = 0;
  // Ours: what the loader runs (decode and transforms in one pass).
  auto pipeline = [&](int i, uint64_t seed) {
    return data::DecodeAndTransform(jpegs[i], {.channels = 3}, t, seed, 3, crop, crop, &im,
                                    out.data());
  };
  // The same as two steps (the whole image decoded, then transformed).
  auto two_steps = [&](int i, uint64_t seed) {
    absl::Status s = data::DecodeImageInto(jpegs[i], {.channels = 3}, &im);
    if (s.ok()) s = data::ApplyTransforms(im, t, seed, 3, crop, crop, out.data());
    return s;
  };
  double separate = 1e30;
  std::printf("load_average_before_jpeg=%.2f\n", LoadAverage());
  for (int r = 0; r < absl::GetFlag(FLAGS_jpeg_rounds); ++r) {
    double t0 = ThreadCpuSeconds();
    for (int i = 0; i < count; ++i) {
      absl::Status s = pipeline(i, data::SampleSeed(1, r, i));
      if (!s.ok()) return Fail(s.ToString());
    }
    ours = std::min(ours, ThreadCpuSeconds() - t0);
    t0 = ThreadCpuSeconds();
    for (int i = 0; i < count; ++i) (void)two_steps(i, data::SampleSeed(1, r, i));
    separate = std::min(separate, ThreadCpuSeconds() - t0);
    t0 = ThreadCpuSeconds();
    for (int i = 0; i < count; ++i) (void)data::DecodeImageInto(jpegs[i], {.channels = 3}, &im);
    decode_only = std::min(decode_only, ThreadCpuSeconds() - t0);
    t0 = ThreadCpuSeconds();
    for (int i = 0; i < count; ++i) {
      (void)data::ApplyTransforms(im, t, data::SampleSeed(1, r, i), 3, crop, crop, out.data());
    }
    transforms_only = std::min(transforms_only, ThreadCpuSeconds() - t0);
    // What tjbench times: tjDecompress2 to RGB, flags 0, header read before.
    t0 = ThreadCpuSeconds();
    for (int i = 0; i < count; ++i) {
      if (tjDecompress2(tj, reinterpret_cast<const unsigned char*>(jpegs[i].data()),
                        jpegs[i].size(), rgb.data(), side, 0, side, TJPF_RGB, 0) != 0) {
        return Fail(absl::StrCat("tjDecompress2: ", tjGetErrorStr2(tj)));
      }
    }
    turbojpeg = std::min(turbojpeg, ThreadCpuSeconds() - t0);
    for (size_t k = 0; k < files.size(); ++k) {
      const TjbenchResult run = Tjbench(files[k]);
      if (run.per_core <= 0) continue;
      tjbench_fps = std::max(tjbench_fps, run.fps);
      tj_seconds[k] = std::min(tj_seconds[k], 1 / run.per_core);
      constexpr int kRepeats = 300;
      t0 = ThreadCpuSeconds();
      for (int j = 0; j < kRepeats; ++j) (void)pipeline(k, data::SampleSeed(1, r, j));
      our_seconds[k] = std::min(our_seconds[k], (ThreadCpuSeconds() - t0) / kRepeats);
      t0 = ThreadCpuSeconds();
      for (int j = 0; j < kRepeats; ++j) (void)two_steps(k, data::SampleSeed(1, r, j));
      two_step_seconds[k] = std::min(two_step_seconds[k], (ThreadCpuSeconds() - t0) / kRepeats);
    }
  }
  tjDestroy(tj);
  auto rate = [count](double seconds) { return count / seconds; };
  std::printf("jpeg_side=%d jpeg_quality=90 crop=%d pad=4 flip=1 normalize=1 clock=thread_cpu\n",
              side, crop);
  std::printf("jpeg_decode_crop_flip_normalize_images_per_s_per_core=%.1f\n", rate(ours));
  std::printf("jpeg_two_steps_images_per_s_per_core=%.1f\n", rate(separate));
  std::printf("one_pass_over_two_steps_ratio=%.3f\n", rate(ours) / rate(separate));
  std::printf("jpeg_decode_only_images_per_s_per_core=%.1f\n", rate(decode_only));
  std::printf("crop_flip_normalize_only_images_per_s_per_core=%.1f\n", rate(transforms_only));
  std::printf("turbojpeg_decompress_images_per_s_per_core=%.1f\n", rate(turbojpeg));
  std::printf("ours_over_turbojpeg_ratio=%.3f\n", rate(ours) / rate(turbojpeg));
  std::printf("decode_only_over_turbojpeg_ratio=%.3f\n", rate(decode_only) / rate(turbojpeg));
  double tj_total = 0, our_total = 0, two_step_total = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    tj_total += tj_seconds[k];
    our_total += our_seconds[k];
    two_step_total += two_step_seconds[k];
  }
  if (tjbench_fps > 0 && tj_total < 1e29) {
    const double images = static_cast<double>(files.size());
    std::printf("tjbench_images=%zu\n", files.size());
    std::printf("tjbench_best_frame_rate=%.1f\n", tjbench_fps);
    std::printf("tjbench_images_per_s_per_core=%.1f\n", images / tj_total);
    std::printf("ours_on_tjbench_images_per_s_per_core=%.1f\n", images / our_total);
    std::printf("ours_over_tjbench_ratio=%.3f\n", tj_total / our_total);
    std::printf("two_steps_over_tjbench_ratio=%.3f\n", tj_total / two_step_total);
  } else {
    std::printf("tjbench=missing (apt-get install libjpeg-turbo-progs; tools/setup --bench)\n");
  }
  std::printf("load_average_after=%.2f\n", LoadAverage());
  return 0;
}

// 1. Jobs: IDX vs PNG shards, interleaved, with an A/A arm.
int Jobs(const std::string& dir) {
  absl::StatusOr<data::Dataset> train =
      data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTrain);
  if (!train.ok()) return Fail(train.status().ToString());
  const int64_t n = absl::GetFlag(FLAGS_train_samples);
  const data::Dataset part = data::Subset(*train, n);
  absl::StatusOr<std::vector<std::string>> shards =
      data::WriteWebDataset(part, dir, "train", {.shard_size = 2048});
  if (!shards.ok()) return Fail(shards.status().ToString());
  data::DataConfig idx;
  data::DataConfig png;
  png.format = "webdataset";
  png.train = data::BraceLocation(dir, "train", shards->size());
  png.channels = 1;
  png.height = png.width = 28;
  png.num_classes = 10;
  std::printf("load_average_before_jobs=%.2f\n", LoadAverage());
  // Best of each arm, separately for the wall-clock and the CPU figure.
  JobResult a, b, aa;
  auto keep_best = [](const JobResult& r, JobResult* best) {
    if (r.samples_per_second > best->samples_per_second) {
      best->samples_per_second = r.samples_per_second;
      best->data_wait_share = r.data_wait_share;
    }
    best->samples_per_cpu_second = std::max(best->samples_per_cpu_second, r.samples_per_cpu_second);
  };
  for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
    keep_best(TrainTwoRanks(idx), &a);
    keep_best(TrainTwoRanks(png), &b);
    keep_best(TrainTwoRanks(idx), &aa);
  }
  std::printf("job=lenet_2ranks train_samples=%lld kernel_threads_per_rank=1 png_data_threads=%d\n",
              static_cast<long long>(n), data::LoaderThreads(png, 1));
  std::printf("idx_samples_per_s=%.1f\n", a.samples_per_second);
  std::printf("png_shards_samples_per_s=%.1f\n", b.samples_per_second);
  std::printf("png_over_idx_ratio=%.3f\n", b.samples_per_second / a.samples_per_second);
  std::printf("aa_idx_over_idx_ratio=%.3f\n", aa.samples_per_second / a.samples_per_second);
  std::printf("idx_samples_per_cpu_s=%.1f\n", a.samples_per_cpu_second);
  std::printf("png_shards_samples_per_cpu_s=%.1f\n", b.samples_per_cpu_second);
  std::printf("png_over_idx_cpu_ratio=%.3f\n", b.samples_per_cpu_second / a.samples_per_cpu_second);
  std::printf("aa_idx_over_idx_cpu_ratio=%.3f\n",
              aa.samples_per_cpu_second / a.samples_per_cpu_second);
  std::printf("idx_data_wait_share=%.4f\n", a.data_wait_share);
  std::printf("png_shards_data_wait_share=%.4f\n", b.data_wait_share);
  return 0;
}

int Main() {
  std::string dir = absl::GetFlag(FLAGS_dir);
  const bool scratch = dir.empty();  // ours: removed at the end
  if (scratch) {
    char tmpl[] = "/tmp/data_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
  }
  std::printf("cores=%u\n", std::thread::hardware_concurrency());

  // The JPEG part first: the jobs leave OpenMP threads that spin for a
  // while after each step, on the cores the decoder measures on.
  int rc = absl::GetFlag(FLAGS_jpeg) ? Jpeg(dir) : 0;
  if (rc == 0 && absl::GetFlag(FLAGS_jobs)) rc = Jobs(dir);
  if (scratch) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  return rc;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dtrain::Main();
}
