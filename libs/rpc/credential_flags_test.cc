#include "libs/rpc/credential_flags.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "libs/rpc/credentials.h"
#include "libs/security/certs.h"

namespace dtrain {
namespace rpc {
namespace {

// The flags are unset here: the environment names the files.
void SetEnv(const std::string& ca, const std::string& cert, const std::string& key) {
  for (const auto& [name, value] : {std::pair<const char*, std::string>{"DTRAIN_CA", ca},
                                    {"DTRAIN_CERT", cert},
                                    {"DTRAIN_KEY", key}}) {
    if (value.empty()) {
      unsetenv(name);
    } else {
      setenv(name, value.c_str(), 1);
    }
  }
}

TEST(CredentialFlagsTest, UseCredentialsFromFlagsSetsTheDefaultOrSaysWhatToPass) {
  unsetenv("DTRAIN_INSECURE");
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/certs";
  ASSERT_TRUE(security::InitCertDir(dir, {}).ok());

  // Nothing given: what to pass; the default stays.
  SetEnv("", "", "");
  absl::Status s = UseCredentialsFromFlags("test");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("no credentials: pass --ca, --cert and --key"), std::string::npos)
      << s;
  EXPECT_TRUE(DefaultCredentials()->insecure());
  // Some of the three: which are missing.
  SetEnv(dir + "/ca.pem", "", "");
  s = UseCredentialsFromFlags("test");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("missing: --cert --key"), std::string::npos) << s;
  EXPECT_TRUE(DefaultCredentials()->insecure());

  // All three: mutual TLS becomes the process's default.
  SetEnv(dir + "/ca.pem", dir + "/admin.pem", dir + "/admin.key");
  s = UseCredentialsFromFlags("test");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(DefaultCredentials()->insecure());

  // A file that does not load: Load's error, the default unchanged.
  SetEnv(dir + "/ca.pem", dir + "/no-such.pem", dir + "/admin.key");
  s = UseCredentialsFromFlags("test");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no-such.pem"), std::string::npos) << s;
  EXPECT_FALSE(DefaultCredentials()->insecure());

  // DTRAIN_INSECURE=1: plain text.
  setenv("DTRAIN_INSECURE", "1", 1);
  ASSERT_TRUE(UseCredentialsFromFlags("test").ok());
  EXPECT_TRUE(DefaultCredentials()->insecure());
}

}  // namespace
}  // namespace rpc
}  // namespace dtrain
