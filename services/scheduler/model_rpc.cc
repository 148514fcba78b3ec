#include "services/scheduler/model_rpc.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"

namespace dtrain {
namespace scheduler {

absl::StatusOr<v1::PutModelReply> ReceiveModel(ModelStore* store,
                                               grpc::ServerReaderInterface<v1::ModelChunk>* in) {
  if (store == nullptr) {
    return absl::FailedPreconditionError(
        "this scheduler has no model store (start it with --data_dir)");
  }
  v1::ModelChunk chunk;
  if (!in->Read(&chunk)) {
    return absl::InvalidArgumentError("PutModel: the stream ended before its header chunk");
  }
  DT_ASSIGN_OR_RETURN(std::unique_ptr<ModelStore::Upload> up,
                      store->BeginUpload(chunk.digest(), chunk.total_bytes()));
  do {
    if (!chunk.data().empty()) DT_RETURN_IF_ERROR(up->Append(chunk.data()));
  } while (in->Read(&chunk));
  DT_ASSIGN_OR_RETURN(ModelStore::Stored s, up->Commit());
  v1::PutModelReply reply;
  reply.set_digest(s.digest);
  reply.set_total_bytes(s.bytes);
  reply.set_existed(s.existed);
  return reply;
}

absl::Status SendModel(const std::string& path, const std::string& digest,
                       grpc::ServerWriterInterface<v1::ModelChunk>* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", path));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return ErrnoToStatus(e, absl::StrCat("stat of ", path));
  }
  v1::ModelChunk header;
  header.set_digest(digest);
  header.set_total_bytes(st.st_size);
  if (!out->Write(header)) {
    close(fd);
    return absl::CancelledError("the client went away");
  }
  std::vector<char> buf(kModelChunkBytes);
  absl::Status status;
  while (true) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = ErrnoToStatus(errno, absl::StrCat("reading ", path));
      break;
    }
    if (n == 0) break;
    v1::ModelChunk c;
    c.set_data(buf.data(), static_cast<size_t>(n));
    if (!out->Write(c)) {
      status = absl::CancelledError("the client went away");
      break;
    }
  }
  close(fd);
  return status;
}

}  // namespace scheduler
}  // namespace dtrain
