// Fuzz target: the tar parser of WebDataset shards (libs/data/tar.h), on
// bytes in memory and through a file descriptor (the path trainers take).
//
// Checks beyond "no crash": both paths agree; every member lies inside the
// archive; no member name is absolute or has a '..' component.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/data/tar.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tar_fuzzer: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view archive(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<dtrain::data::TarMember>> m = dtrain::data::ParseTar(archive);
  static const std::string path = absl::StrCat("/dev/shm/tar_fuzzer.", getpid(), ".tar");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  absl::StatusOr<std::vector<dtrain::data::TarMember>> s = dtrain::data::ParseTarStream(
      fd, static_cast<int64_t>(size),
      [](absl::string_view name) { return absl::EndsWith(name, ".cls"); });
  close(fd);
  Check(m.ok() == s.ok(), "memory and stream parsers agree");
  if (!m.ok()) {
    Check(!m.status().message().empty(), "errors say something");
    return 0;
  }
  Check(m->size() == s->size(), "same member count");
  for (size_t i = 0; i < m->size(); ++i) {
    const dtrain::data::TarMember& a = (*m)[i];
    Check(a.name == (*s)[i].name && a.offset == (*s)[i].offset, "same members");
    Check(a.offset >= 512 && a.size >= 0 && a.offset + a.size <= static_cast<int64_t>(size),
          "member inside the archive");
    Check(!a.name.empty() && a.name[0] != '/', "no absolute names");
    for (absl::string_view part : absl::StrSplit(a.name, '/')) Check(part != "..", "no '..'");
    if (absl::EndsWith(a.name, ".cls")) {
      Check((*s)[i].content == archive.substr(a.offset, a.size), "contents read right");
    }
  }
  return 0;
}
