// Shared by the tests that run whole jobs (RunJob) and compare their
// per-epoch figures: data_formats_test, tests/accuracy/data_accuracy_test.
#ifndef DTRAIN_LIBS_TRAIN_JOB_TEST_UTIL_H_
#define DTRAIN_LIBS_TRAIN_JOB_TEST_UTIL_H_

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "libs/train/job.h"

namespace dtrain {
namespace train {
namespace testing {

// $TEST_TMPDIR/<name> (not created).
inline std::string TmpDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// Every epoch's progress.
class EpochRecorder : public JobObserver {
 public:
  void OnEpoch(const JobProgress& p) override { epochs.push_back(p); }
  std::vector<JobProgress> epochs;
};

// Bit for bit: memcmp, not ==.
inline bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace testing
}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_JOB_TEST_UTIL_H_
