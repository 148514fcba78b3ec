// Certificates issued by certs.h carry the identity identity.h reads, and
// authz.h's rules.
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/security/authz.h"
#include "libs/security/certs.h"
#include "libs/security/identity.h"
#include "libs/security/job_token.h"

namespace dtrain {
namespace security {
namespace {

Identity Who(const std::string& name, Role role) {
  Identity id;
  id.name = name;
  id.role = role;
  return id;
}

TEST(CertsTest, InitIssuesServiceCertificatesWithTheirIdentities) {
  const std::string dir = TestTmpPath("init");
  ASSERT_TRUE(InitCertDir(dir, {}).ok());
  for (auto [name, role] :
       {std::pair{"scheduler", Role::kScheduler}, std::pair{"kvstore", Role::kKvstore},
        std::pair{"admin", Role::kAdmin}}) {
    absl::StatusOr<Identity> id =
        IdentityFromCertPem(ReadFileForTest(absl::StrCat(dir, "/", name, ".pem")));
    ASSERT_TRUE(id.ok()) << name << ": " << id.status();
    EXPECT_EQ(id->name, name);
    EXPECT_EQ(id->role, role);
    EXPECT_TRUE(id->authenticated);
    struct stat st;
    ASSERT_EQ(stat(absl::StrCat(dir, "/", name, ".key").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
  }
  EXPECT_EQ(ReadFileForTest(dir + "/cluster.secret").size(), 64u);
  // The CA is not a dtrain identity.
  EXPECT_FALSE(IdentityFromCertPem(ReadFileForTest(dir + "/ca.pem")).ok());
  // A second init would orphan every certificate: refused.
  absl::Status again = InitCertDir(dir, {});
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
}

TEST(CertsTest, IssueNamesTheHolderAndRole) {
  const std::string dir = TestTmpPath("issue");
  ASSERT_TRUE(InitCertDir(dir, {}).ok());
  CertRequest r;
  r.name = "alice";
  r.role = Role::kUser;
  r.extra_sans = {"scheduler.dtrain.svc", "10.0.0.7"};
  ASSERT_TRUE(IssueCert(dir, r).ok());
  absl::StatusOr<Identity> id = IdentityFromCertPem(ReadFileForTest(dir + "/alice.pem"));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->ToString(), "alice (user)");

  r.name = "../etc/passwd";
  EXPECT_EQ(IssueCert(dir, r).code(), absl::StatusCode::kInvalidArgument);
  r.name = "bob";
  absl::Status no_ca = IssueCert(TestTmpPath("no-such-dir"), r);
  EXPECT_EQ(no_ca.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(no_ca.message().find("trainctl certs init"), std::string::npos) << no_ca;
}

TEST(IdentityTest, RejectsWhatIsNotADtrainCertificate) {
  EXPECT_EQ(IdentityFromCertPem("hello").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseRole("root").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseRole("trainer"), Role::kTrainer);
  EXPECT_TRUE(ValidName("trainer-0"));
  EXPECT_FALSE(ValidName("-x"));
  EXPECT_FALSE(ValidName("a/b"));
  EXPECT_FALSE(ValidName(""));
}

TEST(AuthzTest, UsersOwnTheirJobs) {
  const Identity alice = Who("alice", Role::kUser), bob = Who("bob", Role::kUser);
  EXPECT_TRUE(Authorize(alice, Action::kReadJob, "alice").ok());
  EXPECT_TRUE(Authorize(alice, Action::kCancelJob, "alice").ok());
  absl::Status s = Authorize(bob, Action::kCancelJob, "alice");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("bob (user)"), std::string::npos) << s;
  EXPECT_EQ(Authorize(bob, Action::kReadJob, "alice").code(), absl::StatusCode::kPermissionDenied);
  // Jobs submitted on an insecure cluster have no owner: users cannot take them.
  EXPECT_EQ(Authorize(bob, Action::kReadJob, "").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Authorize(Who("root", Role::kAdmin), Action::kCancelJob, "alice").ok());
  EXPECT_TRUE(Authorize(Anonymous(), Action::kCancelJob, "alice").ok());
  EXPECT_FALSE(SeesAllJobs(alice));
  EXPECT_TRUE(SeesAllJobs(Who("root", Role::kAdmin)));
  EXPECT_EQ(OwnerOf(alice), "alice");
  EXPECT_EQ(OwnerOf(Anonymous()), "");
}

TEST(AuthzTest, RolesAndServices) {
  struct Case {
    Role role;
    Action action;
    bool allowed;
  };
  const Case cases[] = {
      {Role::kUser, Action::kSubmitJob, true},
      {Role::kTrainer, Action::kSubmitJob, false},
      {Role::kKvstore, Action::kListJobs, false},
      {Role::kUser, Action::kDrainTrainer, false},
      {Role::kAdmin, Action::kDrainTrainer, true},
      {Role::kUser, Action::kListQueues, true},
      {Role::kTrainer, Action::kListQueues, false},
      {Role::kUser, Action::kApplyQueues, false},
      {Role::kAdmin, Action::kApplyQueues, true},
      {Role::kUser, Action::kTrainerCall, false},
      {Role::kAdmin, Action::kTrainerCall, true},
      {Role::kTrainer, Action::kTrainerCall, true},
      {Role::kScheduler, Action::kTrainerCall, false},
      {Role::kUser, Action::kKvData, false},
      {Role::kTrainer, Action::kKvData, true},
      {Role::kScheduler, Action::kKvData, true},
      {Role::kTrainer, Action::kKvAdmin, false},
      {Role::kScheduler, Action::kKvAdmin, true},
      {Role::kUser, Action::kKvAdmin, false},
      {Role::kUser, Action::kListTrainers, true},
      {Role::kTrainer, Action::kListTrainers, false},
      {Role::kKvstore, Action::kReplicate, true},
      {Role::kTrainer, Action::kReplicate, false},
      {Role::kKvstore, Action::kKvstoreHeartbeat, true},
      {Role::kTrainer, Action::kKvstoreHeartbeat, false},
      {Role::kTrainer, Action::kReadKvstoreMap, true},
      {Role::kUser, Action::kReadKvstoreMap, true},
  };
  EXPECT_EQ(KvstoreAction("Snapshot"), Action::kKvAdmin);
  EXPECT_EQ(KvstoreAction("Replicate"), Action::kReplicate);
  EXPECT_EQ(KvstoreAction("GetShardMap"), Action::kReadKvstoreMap);
  EXPECT_EQ(KvstoreAction("PushPull"), Action::kKvData);
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(RoleName(c.role), " ", ActionName(c.action)));
    absl::Status s = Authorize(Who("x", c.role), c.action, "x");
    EXPECT_EQ(s.ok(), c.allowed) << s;
    if (!c.allowed) {
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
    }
  }
}

TEST(AuthzTest, TrainerIdsAreBoundToWhoRegisteredThem) {
  TrainerBinding b;
  const Identity t0 = Who("trainer-0", Role::kTrainer), t1 = Who("trainer-1", Role::kTrainer);
  b.Bind("tr-1", t0);
  EXPECT_TRUE(b.Check("tr-1", t0).ok());
  EXPECT_EQ(b.Check("tr-1", t1).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(b.Check("unknown", t1).ok());  // the scheduler answers NotFound
  EXPECT_TRUE(b.Check("tr-1", Anonymous()).ok());
}

TEST(JobTokenTest, GrantsOneJobUntilItExpires) {
  const std::string secret(64, 'a'), other(64, 'b');
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  const std::string job = KvstoreJobName("job-000007", 2);
  EXPECT_EQ(job, "job-000007-a2");
  const std::string token = MintJobToken(secret, job, now + absl::Hours(1));
  absl::StatusOr<JobGrant> granted = VerifyJobToken(secret, token, now);
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(granted->job, job);
  EXPECT_EQ(granted->workers, 0);  // a token that does not say (v1)
  // Another cluster's secret, an expired token, a forged job or expiry.
  EXPECT_EQ(VerifyJobToken(other, token, now).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(VerifyJobToken(secret, token, now + absl::Hours(2)).status().code(),
            absl::StatusCode::kPermissionDenied);
  std::string forged = token;
  forged.replace(forged.find("a2"), 2, "a3");
  EXPECT_EQ(VerifyJobToken(secret, forged, now).status().code(),
            absl::StatusCode::kPermissionDenied);
  // The old signature on a later expiry.
  const std::string extended = absl::StrCat(
      "v1|", job, "|", absl::ToUnixSeconds(now + absl::Hours(100)), token.substr(token.rfind('|')));
  EXPECT_EQ(VerifyJobToken(secret, extended, now + absl::Hours(2)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(VerifyJobToken(secret, "v1|x", now).status().code(),
            absl::StatusCode::kPermissionDenied);
}

// A token names its attempt's world size (what a shard scales the job's caps
// by), under the same signature: a raised count is a forgery.
TEST(JobTokenTest, ATokenNamesItsAttemptsWorkersUnderItsSignature) {
  const std::string secret(64, 'a');
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  const std::string job = KvstoreJobName("job-000007", 2);
  const std::string token = MintJobToken(secret, job, now + absl::Hours(1), 40);
  EXPECT_EQ(token.substr(0, 3), "v2|");
  absl::StatusOr<JobGrant> granted = VerifyJobToken(secret, token, now);
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(granted->job, job);
  EXPECT_EQ(granted->workers, 40);
  EXPECT_EQ(VerifyJobToken(secret, token, now + absl::Hours(2)).status().code(),
            absl::StatusCode::kPermissionDenied);
  std::string raised = token;
  raised.replace(raised.find("|40|"), 4, "|4000|");
  absl::StatusOr<JobGrant> forged = VerifyJobToken(secret, raised, now);
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(forged.status().message().find("bad signature"), std::string::npos) << forged.status();
}

// One secret per attempt of a job under one cluster secret: another attempt,
// another job or another cluster's secret gives another one.
TEST(JobTokenTest, CollectiveSecretIsPerAttempt) {
  const std::string secret(64, 'a'), other(64, 'b');
  const std::string s = CollectiveSecret(secret, "job-000007", 2);
  EXPECT_EQ(s.size(), 64u);  // hex SHA-256
  EXPECT_EQ(CollectiveSecret(secret, "job-000007", 2), s);
  EXPECT_NE(CollectiveSecret(secret, "job-000007", 3), s);
  EXPECT_NE(CollectiveSecret(secret, "job-000008", 2), s);
  EXPECT_NE(CollectiveSecret(other, "job-000007", 2), s);
  EXPECT_NE(s, MintJobToken(secret, KvstoreJobName("job-000007", 2), absl::UnixEpoch()));
}

TEST(JobTokenTest, AScopeConfinesItsThreadToOneJob) {
  EXPECT_TRUE(JobScope::Check("anything").ok());
  {
    const std::string allowed = "job-1-a1";
    JobScope scope(&allowed);
    EXPECT_TRUE(JobScope::Check("job-1-a1").ok());
    absl::Status s = JobScope::Check("job-2-a1");
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(s.message().find("job-2-a1"), std::string::npos) << s;
  }
  EXPECT_TRUE(JobScope::Check("job-2-a1").ok());
}

}  // namespace
}  // namespace security
}  // namespace dtrain
