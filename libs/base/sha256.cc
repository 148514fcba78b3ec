#include "libs/base/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"

namespace dtrain {

struct Sha256::Ctx {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  DT_CHECK(ctx_->md != nullptr && EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() = default;

void Sha256::Update(absl::string_view data) {
  DT_CHECK(EVP_DigestUpdate(ctx_->md, data.data(), data.size()) == 1);
}

std::string Sha256::HexDigest() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  DT_CHECK(EVP_DigestFinal_ex(ctx_->md, out, &n) == 1);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(out), n));
}

std::string Sha256Hex(absl::string_view data) {
  Sha256 h;
  h.Update(data);
  return h.HexDigest();
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", path));
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (true) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      close(fd);
      return ErrnoToStatus(e, absl::StrCat("reading ", path));
    }
    if (n == 0) break;
    h.Update(absl::string_view(buf.data(), static_cast<size_t>(n)));
  }
  close(fd);
  return h.HexDigest();
}

}  // namespace dtrain
