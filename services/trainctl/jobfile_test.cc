#include "services/trainctl/jobfile.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace trainctl {
namespace {

namespace v1 = scheduler::v1;
using ::testing::HasSubstr;

absl::Status Parse(const std::string& text, v1::JobSpec* spec) {
  return ParseJobFile("job.yaml", text, spec);
}

TEST(JobFileTest, FlagNamesAndFieldNamesGiveTheSameSpec) {
  v1::JobSpec by_field, by_flag;
  ASSERT_TRUE(Parse("name: a\nglobal_batch_size: 128\nsync:\n  mode: KVSTORE\n"
                    "  consistency: BOUNDED_DELAY\n  max_staleness: 3\n"
                    "  gradient_compression: bf16\n",
                    &by_field)
                  .ok());
  absl::Status s = Parse(
      "name: a\nbatch_size: 128\nsync: KVSTORE\nconsistency: BOUNDED_DELAY\n"
      "max_staleness: 3\ngradient_compression: bf16\n",
      &by_flag);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(by_flag.global_batch_size(), 128);
  EXPECT_EQ(by_flag.sync().mode(), v1::KVSTORE);
  EXPECT_EQ(by_flag.sync().consistency(), v1::BOUNDED_DELAY);
  EXPECT_EQ(by_flag.sync().max_staleness(), 3);
  EXPECT_EQ(by_flag.sync().gradient_compression(), "bf16");
  EXPECT_EQ(by_flag.SerializeAsString(), by_field.SerializeAsString());
}

TEST(JobFileTest, ModelFileIsTrainctlsNotTheSpecs) {
  v1::JobSpec spec;
  std::string model_file;
  absl::Status s =
      ParseJobFile("job.yaml", "name: mine\nmodel_file: net.onnx\nepochs: 2\n", &spec, &model_file);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(model_file, "net.onnx");
  EXPECT_EQ(spec.name(), "mine");
  EXPECT_EQ(spec.epochs(), 2);
  EXPECT_TRUE(spec.model().empty());
  // Not a string: named with its line.
  s = ParseJobFile("job.yaml", "name: mine\nmodel_file: 3\n", &spec, &model_file);
  EXPECT_THAT(std::string(s.message()), HasSubstr("job.yaml:2: \"model_file\" expects the path"));
  // Where no model file is taken (data check), it is an unknown field.
  EXPECT_FALSE(Parse("name: mine\nmodel_file: net.onnx\n", &spec).ok());
  // A file without one clears it.
  ASSERT_TRUE(ParseJobFile("job.yaml", "name: b\n", &spec, &model_file).ok());
  EXPECT_EQ(model_file, "");
}

TEST(JobFileTest, JsonTakesTheFlagNamesToo) {
  v1::JobSpec spec;
  absl::Status s = ParseJobFile("job.json", R"({"name": "a", "batch_size": 64, "sync": "ALLREDUCE",
    "lr": 0.1, "seed": "18446744073709551615"})",
                                &spec);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(spec.global_batch_size(), 64);
  EXPECT_EQ(spec.sync().mode(), v1::ALLREDUCE);
  EXPECT_DOUBLE_EQ(spec.lr(), 0.1);
  EXPECT_EQ(spec.seed(), 18446744073709551615ull);
}

TEST(JobFileTest, UnknownFieldNamesTheLineAndTheClosestField) {
  v1::JobSpec spec;
  absl::Status s = Parse("name: a\n\n# comment\nbatchsize: 128\n", &spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "job.yaml:4: unknown field \"batchsize\"; did you mean \"batch_size\"?");
  s = Parse("name: a\nlearning_rate: 0.1\n", &spec);
  EXPECT_THAT(s.message(), HasSubstr("job.yaml:2: unknown field \"learning_rate\""));
  s = Parse("name: a\nsync:\n  mode: KVSTORE\n  consistncy: SYNCHRONOUS\n", &spec);
  EXPECT_EQ(s.message(),
            "job.yaml:4: unknown field \"consistncy\" in \"sync\"; did you mean \"consistency\"?");
  s = Parse("name: a\nzzzzzzzzzz: 1\n", &spec);
  EXPECT_THAT(s.message(), HasSubstr("job.yaml:2: unknown field \"zzzzzzzzzz\"; the fields of "
                                     "JobSpec are: "));
  EXPECT_THAT(s.message(), HasSubstr("global_batch_size"));
  s = ParseJobFile("job.json", "{\n  \"name\": \"a\",\n  \"epoch\": 3\n}", &spec);
  EXPECT_EQ(s.message(), "job.json:3: unknown field \"epoch\"; did you mean \"epochs\"?");
}

TEST(JobFileTest, WrongTypesNameTheLineAndWhatTheFieldExpects) {
  v1::JobSpec spec;
  absl::Status s = Parse("name: a\nepochs: ten\n", &spec);
  EXPECT_EQ(s.message(), "job.yaml:2: \"epochs\" expects an integer, got \"ten\"");
  s = Parse("name: a\nepochs: 2.5\n", &spec);
  EXPECT_EQ(s.message(), "job.yaml:2: \"epochs\" expects an integer, got 2.5");
  s = Parse("name: a\nsync: KVSTOR\n", &spec);
  EXPECT_EQ(s.message(), "job.yaml:2: \"sync\" must be one of ALLREDUCE, KVSTORE, got \"KVSTOR\"");
  s = Parse("name: a\nhybridize: yes\n", &spec);
  EXPECT_EQ(s.message(), "job.yaml:2: \"hybridize\" expects true or false, got \"yes\"");
  s = Parse("name: 12\n", &spec);
  EXPECT_EQ(s.message(), "job.yaml:1: \"name\" expects a string, got 12; quote it");
  s = Parse("name: a\nseed: 18446744073709551615\n", &spec);
  EXPECT_THAT(s.message(), HasSubstr("job.yaml:2: \"seed\": "));
  EXPECT_THAT(s.message(), HasSubstr("is too large to be read exactly; quote it"));
  s = Parse("name: a\nsync:\n  mode: 3\n", &spec);
  EXPECT_THAT(s.message(), HasSubstr("job.yaml:3: \"sync.mode\" must be one of"));
}

TEST(JobFileTest, AFieldGivenTwiceUnderTwoNamesIsRefused) {
  v1::JobSpec spec;
  absl::Status s = Parse("name: a\nglobal_batch_size: 64\nbatch_size: 128\n", &spec);
  EXPECT_EQ(s.message(),
            "job.yaml:3: \"batch_size\" and \"global_batch_size\" (line 2) set the same field; "
            "keep one");
  s = Parse("sync:\n  consistency: SYNCHRONOUS\nconsistency: ASYNCHRONOUS\n", &spec);
  EXPECT_THAT(s.message(), HasSubstr("job.yaml:3: \"consistency\" and \"sync.consistency\" "
                                     "(line 2) set the same field"));
}

TEST(JobFileTest, YamlErrorsNameTheFileAndLine) {
  v1::JobSpec spec;
  absl::Status s = Parse("name: a\n\tepochs: 2\n", &spec);
  EXPECT_EQ(s.message(), "job.yaml:2: tabs are not allowed in indentation; use spaces");
  s = ParseJobFile("job.json", "{\"name\": ", &spec);
  EXPECT_THAT(s.message(), HasSubstr("job.json: not valid JSON"));
}

}  // namespace
}  // namespace trainctl
}  // namespace dtrain
