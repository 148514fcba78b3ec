// SHA-256 (OpenSSL's) of bytes or a file, as lowercase hex: the digests of
// the model store (docs/models.md: "sha256:<hex>").
//
//   Sha256 h;
//   h.Update(chunk1);
//   h.Update(chunk2);
//   std::string hex = h.HexDigest();         // 64 characters
//   DT_ASSIGN_OR_RETURN(std::string f, Sha256OfFile("/tmp/net.onnx"));
//
// Thread-safety: a Sha256 is used by one thread at a time.
#ifndef DTRAIN_LIBS_BASE_SHA256_H_
#define DTRAIN_LIBS_BASE_SHA256_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view data);
  // The digest of everything updated so far, as 64 lowercase hex digits.
  // Ends the hash: call once.
  std::string HexDigest();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// Hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);

// Hex SHA-256 of the file at `path`, read in 1 MiB pieces. Errors follow
// errno and name the path.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_SHA256_H_
