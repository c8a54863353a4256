// The diagnostic probe of an NBD server's certificate (nbd_tls_probe.h):
// a TCP connection, the NBD fixed-newstyle greeting and NBD_OPT_STARTTLS
// (doc/proto.md of the NBD project), then a GnuTLS handshake whose
// verification callback records GnuTLS's verdict and ends the handshake.
#include "blockio/nbd_tls_probe.h"

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

namespace barge {

namespace {

std::string Utc(int64_t seconds) {
  time_t t = static_cast<time_t>(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

std::string Joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

std::string ServerCertificateWords(const ServerCertificateCheck& check, const std::string& host,
                                   const std::string& ca) {
  using C = ServerCertificateCheck;
  std::vector<std::string> clauses;
  if (check.problems & C::kSignerNotFound) clauses.push_back("the server's certificate is not signed by " + ca);
  if (check.problems & C::kExpired) {
    clauses.push_back(check.expiration ? "the server's certificate expired on " + Utc(*check.expiration)
                                       : "the server's certificate has expired");
  }
  if (check.problems & C::kNotActivated) {
    clauses.push_back(check.activation ? "the server's certificate is not valid until " + Utc(*check.activation)
                                       : "the server's certificate is not valid yet");
  }
  if (check.problems & C::kUnexpectedOwner) {
    clauses.push_back(check.names.empty() ? "the server's certificate does not name " + host
                                          : "the server's certificate names " + Joined(check.names) + ", not " +
                                                host);
  }
  if (check.problems & C::kRevoked) clauses.push_back("the server's certificate is revoked");
  if (check.problems & C::kInsecureAlgorithm) {
    clauses.push_back("the server's certificate is signed with an insecure algorithm");
  }
  if (check.problems & C::kSignatureFailure) clauses.push_back("the server's certificate's signature does not verify");
  if (clauses.empty() && (check.problems & C::kOther)) {
    clauses.push_back("the server's certificate failed verification for another reason");
  }
  std::string out;
  for (const std::string& clause : clauses) out += (out.empty() ? "" : "; ") + clause;
  return out;
}

namespace {

// Owns a socket descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

using Clock = std::chrono::steady_clock;

int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits until `fd` is ready for `events`; false on timeout or error.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    int left = MillisLeft(deadline);
    if (left == 0) return false;
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, left);
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

Result<Socket> ConnectTcp(const std::string& host, const std::string& port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Error::IoError(std::string("resolving the server: ") + gai_strerror(rc));
  }
  Error last = Error::IoError("no address to connect to");
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (s.get() < 0) {
      last = Error::FromErrno(errno, "socket", host);
      continue;
    }
    if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS || !WaitFor(s.get(), POLLOUT, deadline)) {
        last = Error::FromErrno(errno == EINPROGRESS ? ETIMEDOUT : errno, "connect", host);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        last = Error::FromErrno(err != 0 ? err : errno, "connect", host);
        continue;
      }
    }
    ::freeaddrinfo(found);
    return s;
  }
  ::freeaddrinfo(found);
  return last;
}

Status WriteAll(int fd, const unsigned char* data, size_t size, Clock::time_point deadline) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitFor(fd, POLLOUT, deadline)) return Error::FromErrno(ETIMEDOUT, "send", "");
    } else {
      return Error::FromErrno(errno, "send", "");
    }
  }
  return OkStatus();
}

Status ReadAll(int fd, unsigned char* data, size_t size, Clock::time_point deadline) {
  while (size > 0) {
    ssize_t n = ::recv(fd, data, size, 0);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n == 0) {
      return Error::IoError("the server closed the connection");
    } else if (errno == EAGAIN || errno == EINTR) {
      if (!WaitFor(fd, POLLIN, deadline)) return Error::FromErrno(ETIMEDOUT, "recv", "");
    } else {
      return Error::FromErrno(errno, "recv", "");
    }
  }
  return OkStatus();
}

uint64_t Be64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | p[i];
  return v;
}
uint32_t Be32(const unsigned char* p) { return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3]; }
void PutBe32(unsigned char* p, uint32_t v) {
  for (int i = 3; i >= 0; --i, v >>= 8) p[i] = static_cast<unsigned char>(v);
}
void PutBe64(unsigned char* p, uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = static_cast<unsigned char>(v);
}

// NBD protocol constants (doc/proto.md).
constexpr uint64_t kNbdMagic = 0x4e42444d41474943;     // "NBDMAGIC"
constexpr uint64_t kIHaveOpt = 0x49484156454F5054;     // "IHAVEOPT"
constexpr uint64_t kReplyMagic = 0x0003e889045565a9;
constexpr uint16_t kFlagFixedNewstyle = 1;
constexpr uint16_t kFlagNoZeroes = 2;
constexpr uint32_t kOptStartTls = 5;
constexpr uint32_t kRepAck = 1;

// Greeting and NBD_OPT_STARTTLS; after OK the next bytes are TLS.
Status StartTls(int fd, Clock::time_point deadline) {
  unsigned char greeting[18];
  BARGE_RETURN_IF_ERROR(ReadAll(fd, greeting, sizeof greeting, deadline));
  if (Be64(greeting) != kNbdMagic || Be64(greeting + 8) != kIHaveOpt) {
    return Error::NotSupported("the server does not speak fixed-newstyle NBD");
  }
  const uint16_t flags = static_cast<uint16_t>(greeting[16] << 8 | greeting[17]);
  if ((flags & kFlagFixedNewstyle) == 0) return Error::NotSupported("the server does not speak fixed-newstyle NBD");
  unsigned char request[20];
  PutBe32(request, kFlagFixedNewstyle | (flags & kFlagNoZeroes));
  PutBe64(request + 4, kIHaveOpt);
  PutBe32(request + 12, kOptStartTls);
  PutBe32(request + 16, 0);
  BARGE_RETURN_IF_ERROR(WriteAll(fd, request, sizeof request, deadline));
  unsigned char reply[20];
  BARGE_RETURN_IF_ERROR(ReadAll(fd, reply, sizeof reply, deadline));
  if (Be64(reply) != kReplyMagic || Be32(reply + 8) != kOptStartTls) {
    return Error::IoError("unexpected reply to NBD_OPT_STARTTLS");
  }
  if (Be32(reply + 12) != kRepAck) return Error::NotSupported("the server declined NBD_OPT_STARTTLS");
  // An ACK carries no data.
  if (Be32(reply + 16) != 0) return Error::IoError("unexpected reply to NBD_OPT_STARTTLS");
  return OkStatus();
}

// What the verification callback saw.
struct Verdict {
  std::string host;
  bool seen = false;
  ServerCertificateCheck check;
};

void ReadCertificate(gnutls_session_t session, ServerCertificateCheck& check) {
  unsigned count = 0;
  const gnutls_datum_t* peers = gnutls_certificate_get_peers(session, &count);
  if (peers == nullptr || count == 0) return;
  gnutls_x509_crt_t crt;
  if (gnutls_x509_crt_init(&crt) != GNUTLS_E_SUCCESS) return;
  if (gnutls_x509_crt_import(crt, &peers[0], GNUTLS_X509_FMT_DER) == GNUTLS_E_SUCCESS) {
    if (time_t t = gnutls_x509_crt_get_activation_time(crt); t != static_cast<time_t>(-1)) check.activation = t;
    if (time_t t = gnutls_x509_crt_get_expiration_time(crt); t != static_cast<time_t>(-1)) check.expiration = t;
    for (unsigned seq = 0;; ++seq) {
      char name[256];
      size_t size = sizeof name;
      unsigned critical = 0;
      int type = gnutls_x509_crt_get_subject_alt_name(crt, seq, name, &size, &critical);
      if (type == GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE) break;
      if (type == GNUTLS_SAN_DNSNAME) {
        check.names.emplace_back(name, size);
      } else if (type == GNUTLS_SAN_IPADDRESS && (size == 4 || size == 16)) {
        char text[INET6_ADDRSTRLEN];
        if (::inet_ntop(size == 4 ? AF_INET : AF_INET6, name, text, sizeof text) != nullptr) {
          check.names.emplace_back(text);
        }
      } else if (type < 0 && type != GNUTLS_E_SHORT_MEMORY_BUFFER) {
        break;
      }
    }
    if (check.names.empty()) {
      char cn[256];
      size_t size = sizeof cn;
      if (gnutls_x509_crt_get_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, 0, cn, &size) == GNUTLS_E_SUCCESS) {
        check.names.emplace_back(cn, size);
      }
    }
  }
  gnutls_x509_crt_deinit(crt);
}

// GnuTLS calls this once the server's certificate has arrived; it records
// the verdict and ends the handshake (the probe sends nothing more).
int OnServerCertificate(gnutls_session_t session) {
  auto* verdict = static_cast<Verdict*>(gnutls_session_get_ptr(session));
  unsigned status = 0;
  if (gnutls_certificate_verify_peers3(session, verdict->host.c_str(), &status) != GNUTLS_E_SUCCESS) return -1;
  using C = ServerCertificateCheck;
  unsigned problems = 0;
  if (status & GNUTLS_CERT_SIGNER_NOT_FOUND) problems |= C::kSignerNotFound;
  if (status & GNUTLS_CERT_EXPIRED) problems |= C::kExpired;
  if (status & GNUTLS_CERT_NOT_ACTIVATED) problems |= C::kNotActivated;
  if (status & GNUTLS_CERT_UNEXPECTED_OWNER) problems |= C::kUnexpectedOwner;
  if (status & GNUTLS_CERT_REVOKED) problems |= C::kRevoked;
  if (status & GNUTLS_CERT_INSECURE_ALGORITHM) problems |= C::kInsecureAlgorithm;
  if (status & GNUTLS_CERT_SIGNATURE_FAILURE) problems |= C::kSignatureFailure;
  if ((status & GNUTLS_CERT_INVALID) && problems == 0) problems |= C::kOther;
  verdict->check.problems = problems;
  ReadCertificate(session, verdict->check);
  verdict->seen = true;
  return -1;
}

// Frees the GnuTLS objects of one probe.
struct TlsObjects {
  gnutls_certificate_credentials_t cred = nullptr;
  gnutls_session_t session = nullptr;
  ~TlsObjects() {
    if (session != nullptr) gnutls_deinit(session);
    if (cred != nullptr) gnutls_certificate_free_credentials(cred);
  }
};

}  // namespace

Result<ServerCertificateCheck> ProbeNbdServerCertificate(const std::string& host, const std::string& port,
                                                         const std::string& ca_file,
                                                         std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  TlsObjects tls;
  if (gnutls_certificate_allocate_credentials(&tls.cred) != GNUTLS_E_SUCCESS) {
    return Error::Internal("gnutls_certificate_allocate_credentials failed");
  }
  int loaded = ca_file.empty() ? gnutls_certificate_set_x509_system_trust(tls.cred)
                               : gnutls_certificate_set_x509_trust_file(tls.cred, ca_file.c_str(), GNUTLS_X509_FMT_PEM);
  if (loaded < 0) return Error::IoError(std::string("loading the CA: ") + gnutls_strerror(loaded));
  gnutls_certificate_set_verify_function(tls.cred, OnServerCertificate);

  BARGE_ASSIGN_OR_RETURN(Socket socket, ConnectTcp(host, port, deadline));
  BARGE_RETURN_IF_ERROR(StartTls(socket.get(), deadline));

  if (gnutls_init(&tls.session, GNUTLS_CLIENT | GNUTLS_NONBLOCK) != GNUTLS_E_SUCCESS) {
    return Error::Internal("gnutls_init failed");
  }
  Verdict verdict;
  verdict.host = host;
  gnutls_session_set_ptr(tls.session, &verdict);
  if (gnutls_set_default_priority(tls.session) != GNUTLS_E_SUCCESS ||
      gnutls_credentials_set(tls.session, GNUTLS_CRD_CERTIFICATE, tls.cred) != GNUTLS_E_SUCCESS) {
    return Error::Internal("setting up the GnuTLS session failed");
  }
  gnutls_transport_set_int(tls.session, socket.get());
  int rc;
  do {
    rc = gnutls_handshake(tls.session);
    if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) {
      short events = gnutls_record_get_direction(tls.session) == 1 ? POLLOUT : POLLIN;
      if (!WaitFor(socket.get(), events, deadline)) return Error::FromErrno(ETIMEDOUT, "TLS handshake", host);
    }
  } while (rc < 0 && gnutls_error_is_fatal(rc) == 0);
  if (verdict.seen) return verdict.check;
  if (rc < 0) return Error::IoError(std::string("TLS handshake: ") + gnutls_strerror(rc));
  // The certificate verified (the callback runs on every certificate).
  return ServerCertificateCheck{};
}

}  // namespace barge
