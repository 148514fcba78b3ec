#include "libs/security/job_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/base/files.h"
#include "libs/base/status.h"

namespace dtrain {
namespace security {
namespace {

std::string Mac(absl::string_view secret, absl::string_view payload) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), out, &n);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(out), n));
}

}  // namespace

std::string KvstoreJobName(absl::string_view job_id, int attempt) {
  return absl::StrCat(job_id, "-a", attempt);
}

std::string KvstoreJobName(absl::string_view job_id, int attempt, int generation) {
  if (generation <= 0) return KvstoreJobName(job_id, attempt);
  return absl::StrCat(job_id, "-a", attempt, "-g", generation);
}

std::string MintJobToken(absl::string_view secret, absl::string_view kvstore_job, absl::Time expiry,
                         int workers) {
  workers = std::min(workers, kMaxTokenWorkers);
  const std::string payload =
      workers > 0 ? absl::StrCat("v2|", kvstore_job, "|", workers, "|", absl::ToUnixSeconds(expiry))
                  : absl::StrCat("v1|", kvstore_job, "|", absl::ToUnixSeconds(expiry));
  return absl::StrCat(payload, "|", Mac(secret, payload));
}

std::string CollectiveSecret(absl::string_view secret, absl::string_view job_id, int attempt) {
  return Mac(secret, absl::StrCat("collective|v1|", job_id, "|", attempt));
}

absl::StatusOr<JobGrant> VerifyJobToken(absl::string_view secret, absl::string_view token,
                                        absl::Time now) {
  const size_t last = token.rfind('|');
  std::vector<absl::string_view> parts = absl::StrSplit(token, '|');
  const bool v2 = parts.size() == 5 && parts[0] == "v2";
  if (!v2 && (parts.size() != 4 || parts[0] != "v1")) {
    return absl::PermissionDeniedError("malformed kvstore job token");
  }
  const std::string want = Mac(secret, token.substr(0, last));
  const absl::string_view got = parts.back();
  if (got.size() != want.size() || CRYPTO_memcmp(got.data(), want.data(), want.size()) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("kvstore job token for '", parts[1], "' has a bad signature"));
  }
  JobGrant grant;
  grant.job = std::string(parts[1]);
  if (v2 && (!absl::SimpleAtoi(parts[2], &grant.workers) || grant.workers < 1 ||
             grant.workers > kMaxTokenWorkers)) {
    return absl::PermissionDeniedError("malformed kvstore job token worker count");
  }
  const absl::string_view expiry_text = parts[v2 ? 3 : 2];
  int64_t expiry = 0;
  if (!absl::SimpleAtoi(expiry_text, &expiry)) {
    return absl::PermissionDeniedError("malformed kvstore job token expiry");
  }
  if (absl::FromUnixSeconds(expiry) < now) {
    return absl::PermissionDeniedError(absl::StrCat(
        "kvstore job token for '", parts[1], "' expired at ", expiry_text, " (unix seconds)"));
  }
  return grant;
}

namespace {
thread_local const std::string* g_allowed_job = nullptr;
}  // namespace

JobScope::JobScope(const std::string* allowed) { g_allowed_job = allowed; }

JobScope::~JobScope() { g_allowed_job = nullptr; }

absl::Status JobScope::Check(absl::string_view job) {
  if (g_allowed_job == nullptr || *g_allowed_job == job) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("this call's kvstore token is for job '", *g_allowed_job, "', not '", job, "'"));
}

absl::StatusOr<std::string> ReadClusterSecret(const std::string& path) {
  absl::StatusOr<std::string> read = ReadFile(path);
  if (!read.ok()) return Annotate(read.status(), "cannot read the cluster secret");
  std::string secret(absl::StripAsciiWhitespace(*read));
  if (secret.size() < 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cluster secret ", path, " is shorter than 32 characters"));
  }
  return secret;
}

}  // namespace security
}  // namespace dtrain
