// POSIX tar (ustar) archives, the container of WebDataset shards: an index
// of the regular files in an archive, and a writer.
//
//   DT_ASSIGN_OR_RETURN(std::vector<TarMember> members, ParseTar(bytes));
//   for (const TarMember& m : members) Use(m.name, bytes.substr(m.offset, m.size));
//
//   TarWriter w;
//   w.Add("000000.png", png_bytes);
//   w.Add("000000.cls", "7");
//   std::string archive = w.Finish();
//
// The parser reads the archive front to back (a shard is read sequentially,
// never extracted to disk). Accepted: ustar and GNU headers with a valid
// checksum, regular files ('0' or NUL type), directories (skipped), pax
// extended headers ('x', 'g': skipped; their path overrides are not
// supported and refused) and GNU long names ('L'). Members are refused
// when their name is absolute, contains a '..' component, or is empty;
// links, devices and FIFOs are refused; a member running past the end of
// the data is an error. Errors name the member (its index and name) and
// the byte offset. The archive ends at two zero blocks or at the end of
// the data.
//
// ParseTarStream does the same over a file descriptor, reading headers and
// the contents only of members `want_contents` selects (seeking over the
// rest), so that a rank indexes a large shard without reading its images.
//
// Thread-safe: the functions have no shared state; a TarWriter is used by
// one thread.
#ifndef DTRAIN_LIBS_DATA_TAR_H_
#define DTRAIN_LIBS_DATA_TAR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::data {

struct TarMember {
  std::string name;     // as stored, e.g. "train/000123.png"
  int64_t offset = 0;   // of its contents from the start of the archive
  int64_t size = 0;     // bytes
  std::string content;  // ParseTarStream: filled when want_contents said so
};

absl::StatusOr<std::vector<TarMember>> ParseTar(absl::string_view archive);

// Reads the archive in file `fd` (at most `file_size` bytes) from offset 0.
absl::StatusOr<std::vector<TarMember>> ParseTarStream(
    int fd, int64_t file_size, const std::function<bool(absl::string_view name)>& want_contents);

class TarWriter {
 public:
  // Appends a regular file. Names longer than 100 bytes use a GNU long-name
  // member.
  void Add(absl::string_view name, absl::string_view content);
  // The archive, with its two terminating zero blocks.
  std::string Finish();

 private:
  void Header(absl::string_view name, int64_t size, char type);
  std::string out_;
};

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_TAR_H_
