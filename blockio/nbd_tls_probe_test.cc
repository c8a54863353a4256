// ServerCertificateWords: GnuTLS's verification verdict in words (issue
// 36); and the probe's own failures, which leave libnbd's words standing.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "blockio/nbd_tls_probe.h"

namespace barge {
namespace {

using C = ServerCertificateCheck;
const std::string kCa = "the CA of the certificates folder (its ca-cert.pem)";

TEST(ServerCertificateWordsTest, EachProblemNamesItsCause) {
  C check;
  check.problems = C::kSignerNotFound;
  EXPECT_EQ(ServerCertificateWords(check, "127.0.0.1", kCa),
            "the server's certificate is not signed by the CA of the certificates folder (its ca-cert.pem)");

  check.problems = C::kExpired;
  check.activation = 1577836800;  // 2020-01-01
  check.expiration = 1609459200;  // 2021-01-01
  EXPECT_EQ(ServerCertificateWords(check, "h", kCa), "the server's certificate expired on 2021-01-01 00:00:00 UTC");

  check.problems = C::kNotActivated;
  EXPECT_EQ(ServerCertificateWords(check, "h", kCa),
            "the server's certificate is not valid until 2020-01-01 00:00:00 UTC");

  check.problems = C::kUnexpectedOwner;
  check.names = {"elsewhere.example", "192.0.2.7"};
  EXPECT_EQ(ServerCertificateWords(check, "localhost", kCa),
            "the server's certificate names elsewhere.example, 192.0.2.7, not localhost");
}

TEST(ServerCertificateWordsTest, SeveralProblemsAreJoinedAndMissingFactsStillSayTheCause) {
  C check;
  check.problems = C::kSignerNotFound | C::kExpired | C::kUnexpectedOwner;
  EXPECT_EQ(ServerCertificateWords(check, "nbd.example", "a CA this system trusts"),
            "the server's certificate is not signed by a CA this system trusts; the server's certificate has "
            "expired; the server's certificate does not name nbd.example");
  check.problems = C::kNotActivated;
  EXPECT_EQ(ServerCertificateWords(check, "h", kCa), "the server's certificate is not valid yet");
}

TEST(ServerCertificateWordsTest, OtherReasonsAndNoProblem) {
  C check;
  EXPECT_EQ(ServerCertificateWords(check, "h", kCa), "");
  check.problems = C::kOther;
  EXPECT_EQ(ServerCertificateWords(check, "h", kCa), "the server's certificate failed verification for another reason");
  check.problems = C::kRevoked | C::kInsecureAlgorithm | C::kSignatureFailure;
  EXPECT_EQ(ServerCertificateWords(check, "h", kCa),
            "the server's certificate is revoked; the server's certificate is signed with an insecure algorithm; "
            "the server's certificate's signature does not verify");
}

// A listener on 127.0.0.1 that accepts once and sends `greeting` then
// closes; its port.
int ServeOnce(const std::string& greeting, std::thread& thread) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 1) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  thread = std::thread([fd, greeting] {
    int c = ::accept(fd, nullptr, nullptr);
    if (c >= 0) {
      (void)!::send(c, greeting.data(), greeting.size(), MSG_NOSIGNAL);
      ::close(c);
    }
    ::close(fd);
  });
  return ntohs(addr.sin_port);
}

TEST(ProbeNbdServerCertificateTest, NoNbdServerIsAnErrorNotAVerdict) {
  std::thread server;
  int port = ServeOnce("SSH-2.0-OpenSSH_9.2\r\n and more bytes", server);
  ASSERT_GT(port, 0);
  auto check = ProbeNbdServerCertificate("127.0.0.1", std::to_string(port), "", std::chrono::milliseconds(2000));
  server.join();
  ASSERT_FALSE(check.ok());
  EXPECT_NE(check.error().message().find("fixed-newstyle"), std::string::npos) << check.error().ToString();
}

TEST(ProbeNbdServerCertificateTest, ServerThatHangsUpIsAnError) {
  std::thread server;
  int port = ServeOnce("", server);
  ASSERT_GT(port, 0);
  auto check = ProbeNbdServerCertificate("127.0.0.1", std::to_string(port), "", std::chrono::milliseconds(2000));
  server.join();
  EXPECT_FALSE(check.ok());
}

}  // namespace
}  // namespace barge
