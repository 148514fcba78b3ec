// Per-job capabilities of the kvstore: a token that lets its holder use one
// kvstore job (one attempt of one scheduler job) until it expires.
//
// The scheduler mints a token for each attempt it places and hands it to the
// attempt's trainers in their assignment; the trainers send it with every
// kvstore call (call metadata kJobTokenMetadata); a shard serves a trainer's
// call about job J only with a valid token for J. The token is an HMAC-SHA256
// under the cluster secret (`trainctl certs init` writes cluster.secret; the
// scheduler and every shard read it), so shards verify it without asking the
// scheduler:
//   v2|<kvstore job>|<workers>|<expiry, unix seconds>|<hex HMAC of the rest>
// `workers` is the attempt's world size, which a shard scales the job's caps
// by (a job of many trainers needs more calls and connections at once);
// tokens minted without it ("v1|<job>|<expiry>|<HMAC>", from a scheduler of
// an earlier release) still verify, with workers 0.
//
//   std::string t = MintJobToken(secret, KvstoreJobName("job-000007", 2), expiry, 4);
//   absl::StatusOr<JobGrant> grant = VerifyJobToken(secret, t, absl::Now());
// Nothing here knows about gRPC.
#ifndef DTRAIN_LIBS_SECURITY_JOB_TOKEN_H_
#define DTRAIN_LIBS_SECURITY_JOB_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dtrain {
namespace security {

// The call metadata key trainers send their token under.
inline constexpr char kJobTokenMetadata[] = "dtrain-kvstore-token";

// The kvstore job of attempt `attempt` of scheduler job `job_id`
// ("job-000007-a2"), as the trainers name it.
std::string KvstoreJobName(absl::string_view job_id, int attempt);
// Generation G > 0 of an attempt (a membership after a recovery in place)
// meets in a kvstore job of its own: "<job>-a<attempt>-g<G>".
std::string KvstoreJobName(absl::string_view job_id, int attempt, int generation);

// What a token grants.
struct JobGrant {
  std::string job;  // the kvstore job
  int workers = 0;  // the attempt's trainers; 0: the token does not say
};

// Trainers in one job a token may name (a bound on what a shard scales its
// caps by).
inline constexpr int kMaxTokenWorkers = 1 << 16;

// A token for `kvstore_job`, an attempt of `workers` trainers (0: unsaid),
// valid until `expiry`.
std::string MintJobToken(absl::string_view secret, absl::string_view kvstore_job, absl::Time expiry,
                         int workers = 0);

// What `token` grants, if its MAC is right under `secret` and it has not
// expired at `now`; PermissionDenied saying which is wrong otherwise.
absl::StatusOr<JobGrant> VerifyJobToken(absl::string_view secret, absl::string_view token,
                                        absl::Time now);

// The kvstore job the call running on this thread may touch, for the call's
// duration (a shard's handler runs on its call's thread). A shard opens one
// for a trainer's call after VerifyJobToken; every place that reads a job
// name from the request then calls JobScope::Check.
class JobScope {
 public:
  // `allowed` null: no restriction (an admin's or the scheduler's call, or a
  // shard without a cluster secret). Scopes do not nest.
  explicit JobScope(const std::string* allowed);
  ~JobScope();
  JobScope(const JobScope&) = delete;
  JobScope& operator=(const JobScope&) = delete;

  // OK when no scope restricts this thread or `job` is the allowed one;
  // PermissionDenied naming both otherwise.
  static absl::Status Check(absl::string_view job);
};

// The secret the ranks of attempt `attempt` of scheduler job `job_id` prove
// to each other before their collectives exchange a byte
// (Assignment.collective_secret, collective::TcpOptions::secret): the hex
// HMAC-SHA256 of "collective|v1|<job>|<attempt>" under the cluster secret.
// Every generation of the attempt (a regroup, a replacement rank) shares it;
// ranks of another attempt or job, and processes the scheduler gave no
// assignment, do not have it.
std::string CollectiveSecret(absl::string_view secret, absl::string_view job_id, int attempt);

// The cluster secret in `path` (hex, at least 32 characters; surrounding
// white space ignored). Errors name the file.
absl::StatusOr<std::string> ReadClusterSecret(const std::string& path);

}  // namespace security
}  // namespace dtrain

#endif  // DTRAIN_LIBS_SECURITY_JOB_TOKEN_H_
