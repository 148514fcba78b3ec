// The TLS and shared-memory layers on real descriptors: a socket pair for
// TLS handshakes, memfds and POSIX segments for shared memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/net/shared_memory.h"
#include "libs/net/tls.h"

namespace dtrain {
namespace net {
namespace {

TEST(SharedMemoryTest, ASealedSegmentIsSharedWithThePeerThatMapsIt) {
  absl::StatusOr<SharedMemory> mine = SharedMemory::CreateSealed("net-test", 1 << 16);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_GE(mine->fd(), 0);
  EXPECT_EQ(mine->size(), 1u << 16);
  absl::StatusOr<SharedMemory> peer = SharedMemory::MapSealed(dup(mine->fd()), 1 << 20);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->size(), 1u << 16);
  EXPECT_EQ(peer->fd(), -1);
  std::memcpy(mine->data() + 100, "hello", 5);
  EXPECT_EQ(std::string(peer->data() + 100, 5), "hello");
  // The seal holds: the segment cannot shrink under the peer.
  EXPECT_NE(ftruncate(mine->fd(), 10), 0);
  // Too big for the receiver's limit.
  absl::StatusOr<SharedMemory> big = SharedMemory::MapSealed(dup(mine->fd()), 1 << 10);
  EXPECT_TRUE(absl::IsInvalidArgument(big.status())) << big.status();
}

TEST(SharedMemoryTest, AnUnsealedSegmentIsRefused) {
  int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  absl::StatusOr<SharedMemory> m = SharedMemory::MapSealed(fd, 1 << 20);
  EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_NE(m.status().message().find("F_SEAL_SHRINK"), std::string::npos) << m.status();
}

TEST(SharedMemoryTest, ANamedSegmentIsOpenedAtItsSizeAndUnlinkedByItsCreator) {
  const std::string name = absl::StrCat("/dtrain-net-test-", getpid());
  {
    absl::StatusOr<SharedMemory> created = SharedMemory::CreateNamed(name, 8192);
    ASSERT_TRUE(created.ok()) << created.status();
    std::memcpy(created->data(), "abc", 3);
    absl::StatusOr<SharedMemory> again = SharedMemory::CreateNamed(name, 8192);
    EXPECT_FALSE(again.ok());  // O_EXCL
    absl::StatusOr<SharedMemory> opened = SharedMemory::OpenNamed(name, 8192);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(std::string(opened->data(), 3), "abc");
    absl::StatusOr<SharedMemory> wrong = SharedMemory::OpenNamed(name, 4096);
    EXPECT_TRUE(absl::IsFailedPrecondition(wrong.status())) << wrong.status();
    // Moving keeps one owner of the name.
    SharedMemory moved = std::move(*created);
    EXPECT_EQ(moved.size(), 8192u);
  }
  absl::StatusOr<SharedMemory> gone = SharedMemory::OpenNamed(name, 8192);
  EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
}

TEST(TlsTest, AMissingCertificateFileIsNamed) {
  TlsContextOptions options;
  options.side = TlsContextOptions::Side::kServer;
  options.files = {"/nonexistent/ca.pem", "/nonexistent/cert.pem", "/nonexistent/key.pem"};
  absl::StatusOr<std::shared_ptr<SSL_CTX>> ctx = NewTlsContext(options);
  EXPECT_TRUE(absl::IsInvalidArgument(ctx.status())) << ctx.status();
  EXPECT_NE(ctx.status().message().find("/nonexistent/cert.pem"), std::string::npos)
      << ctx.status();
}

// A handshake over a socket pair with pre-shared keys `a` and `b`; true
// when both sides completed it.
bool PskHandshake(const std::string& a, const std::string& b) {
  TlsContextOptions options;
  options.psk = true;
  options.ciphersuites = "TLS_AES_128_GCM_SHA256";
  absl::StatusOr<std::shared_ptr<SSL_CTX>> ctx = NewTlsContext(options);
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  if (!ctx.ok()) return false;
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  SSL* server = SSL_new(ctx->get());
  SSL* client = SSL_new(ctx->get());
  SSL_set_fd(server, fds[0]);
  SSL_set_fd(client, fds[1]);
  SetTlsPsk(server, &a);
  SetTlsPsk(client, &b);
  int accepted = 0;
  std::thread t([&] { accepted = SSL_accept(server); });
  const int connected = SSL_connect(client);
  if (connected != 1) shutdown(fds[1], SHUT_RDWR);  // end the server's wait
  t.join();
  const bool ok = connected == 1 && accepted == 1 &&
                  std::string(SSL_get_version(client)) == "TLSv1.3" &&
                  std::string(SSL_get_cipher_name(client)) == "TLS_AES_128_GCM_SHA256";
  SSL_free(server);
  SSL_free(client);
  close(fds[0]);
  close(fds[1]);
  OpenSslErrors();  // clear the queue for the next handshake
  return ok;
}

TEST(TlsTest, PreSharedKeysMustAgree) {
  EXPECT_TRUE(PskHandshake(std::string(32, 'k'), std::string(32, 'k')));
  EXPECT_FALSE(PskHandshake(std::string(32, 'k'), std::string(32, 'x')));
}

TEST(TlsTest, OpenSslErrorsSaysWhenThereAreNone) {
  OpenSslErrors();
  EXPECT_EQ(OpenSslErrors(), "no OpenSSL error queued");
}

}  // namespace
}  // namespace net
}  // namespace dtrain
