// trainctl as a user meets it before any cluster: per-command help and job
// files with mistakes (both are answered before any call to a scheduler).
#include <stdio.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs trainctl with `args`; returns stdout and stderr together.
std::string Trainctl(const std::string& args, int* rc) {
  const char* dir = std::getenv("TEST_SRCDIR");
  const std::string cmd =
      absl::StrCat(dir ? dir : ".", "/dtrain/services/trainctl/trainctl ", args, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp ? tmp : "/tmp", "/", name);
  std::ofstream(path) << text;
  return path;
}

TEST(TrainctlCliTest, SubmitHelpShowsSubmitsFlagsOnlyWithAnExample) {
  int rc;
  const std::string out = Trainctl("submit --help", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, HasSubstr("usage: trainctl submit"));
  EXPECT_THAT(out, HasSubstr("--batch_size"));
  EXPECT_THAT(out, HasSubstr("--gradient_compression"));
  EXPECT_THAT(out, HasSubstr("--model_file"));  // your own model (docs/models.md)
  EXPECT_THAT(out, HasSubstr("Example:\n  trainctl submit --name="));
  // Other commands' flags are not listed.
  EXPECT_THAT(out, Not(HasSubstr("--kvstore_shards")));
  EXPECT_THAT(out, Not(HasSubstr("--valid_days")));
  // The "submit: " prefix of the flag registry's help is dropped here.
  EXPECT_THAT(out, Not(HasSubstr("submit: learning rate")));
  EXPECT_THAT(out, HasSubstr("learning rate"));
}

TEST(TrainctlCliTest, EachCommandHasItsOwnHelp) {
  int rc;
  std::string out = Trainctl("cluster up --help", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, HasSubstr("usage: trainctl cluster up|status|down"));
  EXPECT_THAT(out, HasSubstr("--kvstore_shards"));
  EXPECT_THAT(out, Not(HasSubstr("--batch_size")));
  out = Trainctl("export --help", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, HasSubstr("usage: trainctl export JOB --out=trained.onnx"));
  EXPECT_THAT(out, HasSubstr("--epoch"));
  EXPECT_THAT(out, Not(HasSubstr("--batch_size")));
  out = Trainctl("help certs", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, HasSubstr("--valid_days=365"));
  EXPECT_THAT(out, Not(HasSubstr("--batch_size")));
  out = Trainctl("queues --help", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, HasSubstr("usage: trainctl queues | queues apply -f FILE"));
  EXPECT_THAT(out, HasSubstr("  -f "));
  EXPECT_THAT(out, Not(HasSubstr("--batch_size")));
  out = Trainctl("submit --help", &rc);
  EXPECT_THAT(out, HasSubstr("--queue "));
  // Usage errors before any call (exit 2; no scheduler runs here).
  out = Trainctl("--insecure queues apply", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("queues apply needs -f FILE"));
  out = Trainctl("--insecure queues list", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("queues takes no arguments, or apply -f FILE"));
  out = Trainctl("--help", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, HasSubstr("Commands:\n  submit"));
  EXPECT_THAT(out, HasSubstr("  queues"));
  EXPECT_THAT(out, HasSubstr("  timeline"));
  EXPECT_THAT(out, HasSubstr("--scheduler"));
  EXPECT_THAT(out, Not(HasSubstr("--batch_size")));
}

TEST(TrainctlCliTest, AJobFileWithAFlagsNameIsReadAndAMisspeltFieldIsNamedWithItsLine) {
  int rc;
  // "batch_size" is the flag's name: accepted in a job file. A misspelt
  // field is refused before any call (exit 2), naming the file, line and
  // the closest field; no scheduler is running here.
  const std::string bad = WriteFile("bad.yaml", "name: a\nmodel: lenet\nbatchsize: 128\n");
  std::string out = Trainctl(absl::StrCat("submit -f ", bad, " --insecure"), &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr(absl::StrCat(bad,
                                          ":3: unknown field \"batchsize\"; did you mean "
                                          "\"batch_size\"?")));
  const std::string typo = WriteFile("typo.json", "{\n  \"name\": \"a\",\n  \"lr\": \"fast\"\n}");
  out = Trainctl(absl::StrCat("submit -f ", typo, " --insecure"), &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr(absl::StrCat(typo, ":3: \"lr\" expects a number, got \"fast\"")));
}

}  // namespace
