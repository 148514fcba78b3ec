// The trainer's cache of model files (docs/models.md): a job that trains a
// user's model (JobSpec.model_digest) gets its file from
// <cache dir>/<hex>, fetched from the scheduler (ClusterClient::GetModel)
// when missing, and verified against the digest before every use.
//
//   DT_RETURN_IF_ERROR(FetchModel(cluster, trainer_id, job_id, digest, path));
//
// A missing file is fetched into <path>.part-<random> and renamed to `path`
// once its SHA-256 is the digest. A file whose SHA-256 is not the digest
// (damaged in the cache, or on the way) is deleted and the call fails with
// DATA_LOSS naming both digests (the attempt fails; the next fetches it
// again). Other errors: the client's, and the file system's (errno).
// Thread-safe for different paths.
#ifndef DTRAIN_LIBS_AGENT_MODEL_CACHE_H_
#define DTRAIN_LIBS_AGENT_MODEL_CACHE_H_

#include <string>

#include "absl/status/status.h"
#include "libs/agent/cluster_client.h"

namespace dtrain {
namespace agent {

absl::Status FetchModel(ClusterClient* cluster, const std::string& trainer_id,
                        const std::string& job_id, const std::string& digest,
                        const std::string& path);

}  // namespace agent
}  // namespace dtrain

#endif  // DTRAIN_LIBS_AGENT_MODEL_CACHE_H_
