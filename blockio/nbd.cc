// NBD source and sink over libnbd: a pool of connections (several only with
// multi-conn), requests split to the server's limits, block status walked
// until the asked range is covered.
#include "blockio/nbd.h"

#include "blockio/extent_builder.h"
#include "blockio/nbd_queue.h"
#include "blockio/nbd_stats.h"
#include "blockio/nbd_tls_probe.h"

#include <libnbd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace barge {

namespace {

using namespace nbd_internal;  // the connections and their queue

// NBD block status and write-zeroes lengths are 32-bit on the wire; ask for
// at most this much per command (a multiple of any sane block size).
constexpr uint64_t kMaxCommandBytes = uint64_t{1} << 30;
// Deadline for each connection after the first (see OpenExport).
constexpr std::chrono::milliseconds kExtraConnectTimeout{2000};
// Longest the diagnostic probe of a refused server certificate may take.
constexpr std::chrono::milliseconds kCertificateProbeTimeout{3000};

// What the first connection learned about the export.
struct ExportInfo {
  uint64_t size_bytes = 0;
  bool read_only = false;
  bool multi_conn = false;
  bool can_zero = false;
  bool can_fast_zero = false;
  bool can_trim = false;
  bool can_flush = false;
  bool has_allocation = false;
  uint32_t min_block_bytes = 1;
  uint32_t request_bytes = 256 * 1024;
  bool tls = false;  // TLS was negotiated on the first connection
};

// NbdOptions::request_bytes of 0: nbdcopy's size, with and without TLS.
// Over TLS 1 MiB requests (the size before issue 41) cost qemu-nbd about
// twice the CPU per byte once 64 requests were queued per connection, and
// the copy 1.4x nbdcopy's wall time; 256 KiB ran below nbdcopy's
// (docs/benchmarks.md, "Network benches").
constexpr uint32_t kDefaultRequestBytes = 256 * 1024;

// Whether TLS is requested for `uri` with `tls` (see NbdTls).
bool TlsRequested(const std::string& uri, const NbdTls& tls) {
  return tls.required || !tls.certificates_dir.empty() || !tls.psk_file.empty() || NbdUriRequestsTls(uri);
}

// Sets TLS on a handle before it connects: required when requested (an
// nbd:// URI leaves this setting as it is, so the flags' TLS holds for it
// too), and the files and identity the flags name. The URI's own tls-*
// parameters are applied by libnbd when it connects and win over these.
Status ApplyTls(nbd_handle* h, const std::string& uri, const std::string& name, const NbdTls& tls) {
  // tls-certificates= and tls-psk-file= in a URI are refused by libnbd
  // unless allowed; the caller checked the files they name.
  if (nbd_set_uri_allow_local_file(h, true) != 0) return NbdError("nbd_set_uri_allow_local_file", name);
  if (!TlsRequested(uri, tls)) return OkStatus();
  if (nbd_set_tls(h, LIBNBD_TLS_REQUIRE) != 0) return NbdError("nbd_set_tls", name);
  // Always verify the server (libnbd's default; said here so it stays so).
  if (nbd_set_tls_verify_peer(h, true) != 0) return NbdError("nbd_set_tls_verify_peer", name);
  if (!tls.certificates_dir.empty() && nbd_set_tls_certificates(h, tls.certificates_dir.c_str()) != 0) {
    return NbdError("nbd_set_tls_certificates", name);
  }
  if (!tls.psk_file.empty() && nbd_set_tls_psk_file(h, tls.psk_file.c_str()) != 0) {
    return NbdError("nbd_set_tls_psk_file", name);
  }
  if (!tls.username.empty() && nbd_set_tls_username(h, tls.username.c_str()) != 0) {
    return NbdError("nbd_set_tls_username", name);
  }
  return OkStatus();
}

// The CA file the connection to `uri` verifies the server with: the
// certificates folder's ca-cert.pem (the URI's tls-certificates= wins over
// the flag, as in libnbd), "" when none is named (the system's CAs).
std::string CaFile(const std::string& uri, const NbdTls& tls) {
  std::string dir = NbdUriParam(uri, "tls-certificates");
  if (dir.empty()) dir = tls.certificates_dir;
  if (dir.empty()) return {};
  return dir + (dir.ends_with('/') ? "" : "/") + "ca-cert.pem";
}

// Why the server's certificate was refused, by the diagnostic probe
// (nbd_tls_probe.h: libnbd says only "Error in the certificate
// verification"); "" when the probe cannot tell (then libnbd's words
// stand alone). TCP only: libnbd verifies a host name only there.
std::string DiagnoseCertificate(const std::string& uri, const NbdTls& tls) {
  if (uri.find("+unix://") != std::string::npos || uri.find("+vsock://") != std::string::npos) return {};
  const std::string server = NbdServerName(uri);
  const size_t colon = server.rfind(':');
  if (colon == std::string::npos) return {};
  std::string host = server.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string ca_file = CaFile(uri, tls);
  auto check = ProbeNbdServerCertificate(host, server.substr(colon + 1), ca_file, kCertificateProbeTimeout);
  if (!check.ok()) return {};
  // The folder is named as the flags and parameters name it, never by its
  // path (WithoutNbdSecrets keeps paths of credentials out of messages).
  return ServerCertificateWords(*check, host,
                                ca_file.empty() ? "a CA this system trusts"
                                                : "the CA of the certificates folder (its ca-cert.pem)");
}

// The error of a connect that failed with TLS requested, in words that
// name the server: a server that offers no TLS is refused (libnbd says
// ENOTSUP when the server declines STARTTLS or predates it); a failed
// handshake is the server's certificate or our credentials, named as far
// as they can be told apart: a refused certificate by its cause (the
// probe), a handshake the server ended by the credentials we offered.
// `e` is already free of secrets; the words added name none.
Error TlsConnectError(Error e, const std::string& uri, const NbdTls& tls) {
  const std::string server = NbdServerName(uri);
  if (e.errno_value() == ENOTSUP || e.errno_value() == EOPNOTSUPP) {
    return Error::NotSupported("the NBD server at " + server +
                               " does not offer TLS and TLS was requested; refusing a plaintext connection")
        .set_path(e.path());
  }
  const std::string& text = e.message();
  // A PSK with no identity: libnbd falls back to the login name, which a
  // process without a terminal (cron, systemd, a container) has none of.
  if (text.find("getlogin_r") != std::string::npos) {
    return Error::InvalidArgument("a TLS PSK needs an identity: give --tls-username or nbds://USER@" + server +
                                  "/ (libnbd's default, the login name, is not available here)")
        .set_path(e.path());
  }
  if (text.find("gnutls") != std::string::npos || text.find("TLS") != std::string::npos ||
      text.find("certificate") != std::string::npos) {
    std::string cause;
    if (text.find("certificate verification") != std::string::npos) {
      cause = DiagnoseCertificate(uri, tls);
    } else if (text.find("non-properly terminated") != std::string::npos ||
               text.find("Error in the pull function") != std::string::npos ||
               text.find("Insufficient credentials") != std::string::npos) {
      // The server ends the handshake without telling why (or, for a PSK
      // offered to a server with certificates only, GnuTLS finds no common
      // credentials); which of ours it refused follows from what we offered.
      const bool psk = !tls.psk_file.empty() || !NbdUriParam(uri, "tls-psk-file").empty();
      if (psk && text.find("Insufficient credentials") != std::string::npos) {
        cause = "the server does not take a PSK: it may expect x509 certificates (--tls-certificates)";
      } else {
        cause = psk ? "the server refused the PSK identity or its key (a key that differs from the server's, "
                      "or a user it does not know)"
                    : "the server ended the handshake: it may expect PSK, or a client certificate "
                      "(client-cert.pem and client-key.pem in the certificates folder) signed by a CA it trusts";
      }
    }
    Error out = Error::IoError("TLS handshake with the NBD server at " + server + " failed: " +
                               (cause.empty() ? text : cause + " (" + text + ")"));
    out.set_errno(e.errno_value()).set_path(e.path());
    return out;
  }
  return e;
}

// Connects with a deadline. A server that is full (qemu-nbd past --shared)
// accepts the socket but never starts the handshake, so a blocking
// nbd_connect_uri would wait forever; the asynchronous connect plus
// nbd_poll bounds that wait. A timeout is ETIMEDOUT (retryable). `uri` is
// what libnbd connects to; `name` (RedactNbdUri of it) is what errors say.
Result<std::unique_ptr<NbdHandle>> ConnectOnce(const std::string& uri, const std::string& name,
                                               const NbdOptions& options, std::chrono::milliseconds timeout) {
  BARGE_ASSIGN_OR_RETURN(auto handle, NbdHandle::Create(name));
  nbd_handle* h = handle->get();
  BARGE_RETURN_IF_ERROR(ApplyTls(h, uri, name, options.tls));
  // Meta contexts must be requested before the handshake.
  if (nbd_add_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0) {
    return NbdError("nbd_add_meta_context", name);
  }
  if (!options.dirty_bitmap_context.empty() &&
      nbd_add_meta_context(h, options.dirty_bitmap_context.c_str()) != 0) {
    return NbdError("nbd_add_meta_context", name);
  }
  if (nbd_aio_connect_uri(h, uri.c_str()) != 0) return NbdError("nbd_aio_connect_uri", name);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (nbd_aio_is_connecting(h) == 1) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Error::FromErrno(ETIMEDOUT, "nbd connect (server full or not answering)", name);
    }
    if (nbd_poll(h, static_cast<int>(std::min<int64_t>(left.count(), 1000))) == -1) {
      return NbdError("nbd_connect_uri", name);
    }
  }
  if (nbd_aio_is_ready(h) != 1) {
    // A handshake that failed leaves its reason as libnbd's last error.
    if (nbd_get_error() != nullptr && nbd_get_errno() != 0) return NbdError("nbd_connect_uri", name);
    return Error::IoError("NBD handshake did not complete").set_path(name);
  }
  return handle;
}

Result<std::unique_ptr<NbdHandle>> Connect(const std::string& uri, const std::string& name,
                                           const NbdOptions& options, std::chrono::milliseconds timeout) {
  auto handle = ConnectOnce(uri, name, options, timeout);
  if (handle.ok()) return handle;
  // libnbd's text may name the PSK file and identity: never shown.
  Error e = WithoutNbdSecrets(handle.error(), uri, options.tls);
  if (TlsRequested(uri, options.tls)) return TlsConnectError(std::move(e), uri, options.tls);
  return e;
}

Result<ExportInfo> Probe(nbd_handle* h, const std::string& uri, const NbdOptions& options) {
  ExportInfo info;
  int64_t size = nbd_get_size(h);
  if (size < 0) return NbdError("nbd_get_size", uri);
  info.size_bytes = static_cast<uint64_t>(size);
  // The nbd_can_* calls return -1 only on a closed handle; treat that as no.
  info.read_only = nbd_is_read_only(h) == 1;
  info.multi_conn = nbd_can_multi_conn(h) == 1;
  info.can_zero = nbd_can_zero(h) == 1;
  info.can_fast_zero = nbd_can_fast_zero(h) == 1;
  info.can_trim = nbd_can_trim(h) == 1;
  info.can_flush = nbd_can_flush(h) == 1;
  info.has_allocation = nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
  if (!options.dirty_bitmap_context.empty() &&
      nbd_can_meta_context(h, options.dirty_bitmap_context.c_str()) != 1) {
    return Error::NotFound("server does not offer meta context " + options.dirty_bitmap_context)
        .set_path(uri);
  }
  int64_t min_block = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
  if (min_block > 0) info.min_block_bytes = static_cast<uint32_t>(min_block);
  info.tls = nbd_get_tls_negotiated(h) == 1;
  uint32_t wanted = options.request_bytes != 0 ? options.request_bytes : kDefaultRequestBytes;
  uint64_t request = std::max<uint32_t>(wanted, 4096);
  int64_t max_block = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
  if (max_block > 0) request = std::min<uint64_t>(request, static_cast<uint64_t>(max_block));
  info.request_bytes = static_cast<uint32_t>(request);
  return info;
}

struct Export {
  ExportInfo info;
  std::unique_ptr<HandlePool> pool;
};

// A first connection that failed for want of a server (not yet listening,
// not yet reachable, or gone mid-handshake): worth another try. A refusal
// by a server that answered (no such export, TLS refused) is not.
bool ServerNotThereYet(const Error& e) {
  switch (e.errno_value()) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EPIPE:
    case ENOENT:  // a unix socket not yet made
      return true;
    default:
      return false;
  }
}

// `e` naming `name` unless it names a file or device already (a
// transport's error: NbdRetryPolicy::restore_transport).
Error WithPath(Error e, const std::string& name) {
  if (e.path().empty()) e.set_path(name);
  return e;
}

// The wait before attempt `attempt` (0-based): first_delay doubled per
// attempt, capped at max_delay.
std::chrono::milliseconds BackoffDelay(const NbdRetryPolicy& policy, uint32_t attempt) {
  if (attempt >= 20) return policy.max_delay;
  return std::min(policy.first_delay * (int64_t{1} << attempt), policy.max_delay);
}

// Sleeps `delay`, waking early with kCancelled (`what`, naming `name`) when
// the policy's cancel flag is set.
Status SleepUnlessCancelled(const NbdRetryPolicy& policy, std::chrono::milliseconds delay, const char* what,
                            const std::string& name) {
  using Clock = std::chrono::steady_clock;
  auto until = Clock::now() + delay;
  while (Clock::now() < until) {
    if (policy.cancel != nullptr && policy.cancel->load()) return Error::Cancelled(what).set_path(name);
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), until - Clock::now()));
  }
  return OkStatus();
}

// The first connection, retried as a reconnect is (NbdRetryPolicy: the
// same attempts, time bound and backoff), for a server that starts late
// or a network that comes up a moment later. A server that answers with
// a refusal fails at once.
Result<std::unique_ptr<NbdHandle>> ConnectFirst(const std::string& uri, const std::string& name,
                                                const NbdOptions& options) {
  using Clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  const NbdRetryPolicy& policy = options.retry;
  const auto start = Clock::now();
  uint32_t retries = 0;
  for (;;) {
    Result<std::unique_ptr<NbdHandle>> handle = Error::IoError("not connected");
    if (Status restored = retries > 0 && policy.restore_transport ? policy.restore_transport() : OkStatus();
        !restored.ok()) {
      if (!restored.error().retryable()) return WithPath(std::move(restored).error(), name);
      handle = std::move(restored).error();
    } else {
      handle = Connect(uri, name, options, options.connect_timeout);
      if (handle.ok() || !ServerNotThereYet(handle.error())) return handle;
    }
    auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    milliseconds delay = BackoffDelay(policy, retries);
    if (retries >= policy.attempts || elapsed + delay > policy.max_time) {
      if (retries == 0) return handle;
      Error e = std::move(handle).error();
      return Error(e.code(), "no NBD server answered: " + std::to_string(retries + 1) + " connection attempts in " +
                                 Seconds(elapsed) + " s (bounds: " + std::to_string(policy.attempts) +
                                 " retries, " + Seconds(policy.max_time) + " s); last attempt: " + e.message())
          .set_errno(e.errno_value())
          .set_retryable(true)
          .set_path(name);
    }
    BARGE_RETURN_IF_ERROR(SleepUnlessCancelled(policy, delay, "cancelled while connecting", name));
    ++retries;
  }
}

// NbdOptions::connections of 0: the count in plaintext, and the most over
// TLS (where the cores bound it).
constexpr uint32_t kAutoConnections = 4;

// How many connections to open to the export `info` describes (see
// NbdOptions::connections).
uint32_t ConnectionsWanted(const ExportInfo& info, const NbdOptions& options) {
  if (!info.multi_conn) return 1;
  if (options.connections != 0) return options.connections;
  if (!info.tls) return kAutoConnections;
  uint32_t cores = options.cores != 0 ? options.cores : std::thread::hardware_concurrency();
  return std::clamp<uint32_t>(cores, 1, kAutoConnections);
}

// Opens the first connection, learns the export, then opens the extra
// connections that multi-conn allows. An extra connection that fails is
// dropped rather than failing the open: fewer connections only cost speed.
Result<Export> OpenExport(const std::string& uri, const std::string& name, const NbdOptions& options) {
  std::vector<std::unique_ptr<NbdHandle>> handles;
  BARGE_ASSIGN_OR_RETURN(auto first, ConnectFirst(uri, name, options));
  BARGE_ASSIGN_OR_RETURN(ExportInfo info, Probe(first->get(), name, options));
  handles.push_back(std::move(first));
  const uint32_t wanted = ConnectionsWanted(info, options);
  // Extra connections get a short deadline: a server with fewer slots than
  // we asked for just stays silent, and waiting long for it gains nothing.
  auto extra_timeout = std::min(options.connect_timeout, kExtraConnectTimeout);
  while (handles.size() < wanted) {
    auto more = Connect(uri, name, options, extra_timeout);
    if (!more.ok()) break;
    handles.push_back(std::move(more).value());
  }
  return Export{info, std::make_unique<HandlePool>(std::move(handles))};
}

// One connection as a Connections::Run operation sees it: the handle, and
// Call, which runs one asynchronous command to its end as libnbd's
// synchronous calls do, but drops a connection that answers nothing for
// the stall timeout (a synchronous call would wait forever).
class Conn {
 public:
  Conn(HandlePool::Lease& lease, std::chrono::milliseconds stall_timeout)
      : lease_(lease), stall_timeout_(stall_timeout) {}
  nbd_handle* get() const { return lease_.get(); }
  // True once Call dropped the connection for a stall.
  bool stalled() const { return stalled_; }

  // Issues with `issue` (an nbd_aio_* call: its cookie, or -1) and waits.
  // Returns 0 when the command succeeded, -1 when it failed with libnbd's
  // error set (as after the synchronous call), or -1 with stalled() after
  // a stall (the connection is then closed and must not be used).
  int Call(const std::function<int64_t(nbd_handle*)>& issue) {
    using Clock = std::chrono::steady_clock;
    nbd_handle* h = lease_.get();
    if (h == nullptr) return -1;  // dropped by an earlier Call
    int64_t cookie = issue(h);
    if (cookie == -1) return -1;
    auto last_activity = Clock::now();
    for (;;) {
      int done = nbd_aio_command_completed(h, cookie);
      if (done != 0) return done == 1 ? 0 : -1;
      int timeout_ms = -1;
      if (stall_timeout_.count() > 0) {
        auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(last_activity + stall_timeout_ - Clock::now());
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
      }
      int polled = nbd_poll(h, timeout_ms);
      if (polled == -1 && !Dropped(h)) {
        // The command may still name the caller's callback data: closing
        // the connection takes it back. libnbd's error is nbd_poll's.
        lease_.Drop();
        return -1;
      }
      if (polled == 1) {
        last_activity = Clock::now();
      } else if (polled == 0 && stall_timeout_.count() > 0 && Clock::now() - last_activity >= stall_timeout_) {
        lease_.Drop();
        stalled_ = true;
        return -1;
      }
    }
  }

 private:
  HandlePool::Lease& lease_;
  const std::chrono::milliseconds stall_timeout_;
  bool stalled_ = false;
};

constexpr nbd_completion_callback kNoCompletion{nullptr, nullptr, nullptr};

// Walks NBD_CMD_BLOCK_STATUS for `context` over [offset, offset+length) and
// calls `emit` with each piece, clipped to the range, in order, as the
// reply arrives (nothing per piece is held here: the caller bounds what it
// keeps, see ExtentBuilder). The server may describe less than asked (or
// more: the last extent may run past the end); this repeats from where
// each answer stops. Replies are untrusted: one that does not start at the
// asked offset, makes no progress, holds an empty extent or more extents
// than the bytes it was asked about is kCorruption.
Status WalkBlockStatus(Conn& conn, const std::string& uri, const char* context,
                       uint64_t offset, uint64_t length,
                       const std::function<void(uint64_t, uint64_t, uint32_t)>& emit) {
  struct Reply {
    const char* context;
    const std::function<void(uint64_t, uint64_t, uint32_t)>* emit;
    uint64_t pos = 0;    // the asked offset
    uint64_t count = 0;  // the asked length
    uint64_t end = 0;    // the walk's end
    uint64_t cursor = 0;
    bool seen = false;
    std::optional<Error> bad;
  };
  auto callback = [](void* user_data, const char* metacontext, uint64_t reply_offset,
                     uint32_t* entries, size_t nr_entries, int* /*error*/) -> int {
    auto* reply = static_cast<Reply*>(user_data);
    if (std::string_view(metacontext) != reply->context || reply->bad) return 0;
    if (reply->seen) {
      reply->bad = Error::Corruption("two block status replies for one request");
      return 0;
    }
    reply->seen = true;
    if (reply_offset != reply->pos) {
      reply->bad = Error::Corruption("block status reply starts at the wrong offset");
      return 0;
    }
    const size_t descriptors = nr_entries / 2;
    if (descriptors > reply->count) {
      reply->bad = Error::Corruption("block status reply holds " + std::to_string(descriptors) + " extents for " +
                                     std::to_string(reply->count) + " bytes");
      return 0;
    }
    for (size_t i = 0; i + 1 < nr_entries && reply->cursor < reply->end; i += 2) {
      if (entries[i] == 0) {
        reply->bad = Error::Corruption("block status reply holds an empty extent");
        return 0;
      }
      uint64_t n = std::min<uint64_t>(entries[i], reply->end - reply->cursor);
      (*reply->emit)(reply->cursor, n, entries[i + 1]);
      reply->cursor += n;
    }
    return 0;
  };
  uint64_t pos = offset;
  const uint64_t end = offset + length;
  while (pos < end) {
    uint64_t count = std::min(end - pos, kMaxCommandBytes);
    Reply reply{context, &emit, pos, count, end, pos, false, std::nullopt};
    nbd_extent_callback cb{callback, &reply, nullptr};
    if (conn.Call([&](nbd_handle* h) { return nbd_aio_block_status(h, count, pos, cb, kNoCompletion, 0); }) != 0) {
      return NbdError("nbd_block_status", uri, pos, count);
    }
    if (reply.bad) return std::move(*reply.bad).set_path(uri).set_range(pos, count);
    if (!reply.seen) {
      return Error::Corruption(std::string("no block status reply for ") + context)
          .set_path(uri)
          .set_range(pos, count);
    }
    if (reply.cursor == pos) {
      return Error::Corruption("block status reply made no progress").set_path(uri).set_range(pos,
                                                                                              count);
    }
    pos = reply.cursor;
  }
  return OkStatus();
}

ExtentKind KindFromAllocation(uint32_t flags) {
  bool hole = (flags & LIBNBD_STATE_HOLE) != 0;
  bool zero = (flags & LIBNBD_STATE_ZERO) != 0;
  // A hole without the zero bit may read as non-zero (a backing file shows
  // through, for instance), so it must be read: kData.
  if (hole && zero) return ExtentKind::kHole;
  if (zero) return ExtentKind::kZero;
  return ExtentKind::kData;
}

// Splits [offset, offset + length) of request `request` into commands of at
// most `max_bytes`.
void AddCommands(std::vector<Command>& out, size_t request, uint64_t offset, const std::byte* data,
                 size_t length, uint32_t max_bytes) {
  for (size_t done = 0; done < length;) {
    size_t n = std::min<size_t>(length - done, max_bytes);
    out.push_back({request, offset + done, data + done, n});
    done += n;
  }
}

// The drops of one call since a command last completed: what the retry
// bounds count.
struct Outage {
  bool active = false;
  uint32_t attempts = 0;
  std::chrono::steady_clock::time_point start;
};

// The connections of one export and what it takes to replace a dropped
// one (NbdRetryPolicy). Thread-safe, like HandlePool.
class Connections {
 public:
  // `uri` is what connects (with its credentials); `name` what messages
  // and reports show (RedactNbdUri).
  Connections(std::string uri, std::string name, const NbdOptions& options, Export ex)
      : uri_(std::move(uri)), name_(std::move(name)), options_(options), info_(ex.info),
        pool_(std::move(ex.pool)) {}

  const std::string& name() const { return name_; }
  const ExportInfo& info() const { return info_; }
  size_t size() const { return pool_->size(); }
  HandlePool::Lease Acquire() { return pool_->Acquire(); }

  // Runs `commands`, queued on one connection among other callers'
  // batches (HandlePool::Join) and kept in flight by whichever owner
  // drives it (Drive). After a drop, a new connection takes the place of
  // the lost one and the commands that had not completed are sent again,
  // within the policy's bounds. Past them, every command not done fails
  // its request with the reason.
  void RunCommands(std::string_view operation, std::vector<Command> commands, std::vector<Status>& status,
                   const IssueFn& issue) {
    if (commands.empty()) return;
    Batch batch;
    batch.operation = operation;
    batch.issue = &issue;
    batch.commands = std::move(commands);
    batch.status = &status;
    for (Command& c : batch.commands) c.batch = &batch;
    const size_t index = pool_->Join(batch);
    if (!pool_->AwaitTurn(batch, index)) return;  // another driver finished it
    HandlePool::Lease lease(*pool_, index);
    Drive(lease, batch);
  }

  // The most commands seen in flight on one connection.
  size_t max_in_flight() const { return pool_->max_in_flight(); }

  // Runs `op` (commands through Conn::Call, which may all be repeated) on
  // the lease's connection; after a drop or a stall, on a new one, within
  // the bounds.
  Status Run(HandlePool::Lease& lease, const std::function<Status(Conn&)>& op) {
    Outage outage;
    for (;;) {
      Error reason = LostError("the connection was dropped earlier", name_, ENOTCONN);
      if (lease.get() != nullptr) {
        Conn conn(lease, options_.retry.stall_timeout);
        Status s = op(conn);
        if (s.ok()) return s;
        if (conn.stalled()) {
          reason = LostError("no reply from the NBD server for " + Seconds(options_.retry.stall_timeout) + " s",
                             name_, ETIMEDOUT);
        } else if (lease.get() != nullptr && Dropped(lease.get())) {
          reason = s.error();
        } else {
          return s;
        }
      }
      BARGE_RETURN_IF_ERROR(Reconnect(lease, outage, reason, 0));
    }
  }

 private:
  // Drives the lease's connection (DriveTurn) for every batch queued on
  // it until `mine` is finished, finishing the others as they complete;
  // then the lease goes back and an owner still waiting takes over, the
  // commands in flight staying in flight. A lost connection is replaced
  // (Reconnect) while a batch still has commands to send; past the
  // bounds, every batch on the connection fails with the reason.
  void Drive(HandlePool::Lease& lease, Batch& mine) {
    using Clock = std::chrono::steady_clock;
    const size_t index = lease.index();
    std::vector<Batch*> batches;
    std::vector<Batch*> remaining;  // of `batches`, those not finished
    Outage outage;
    auto last_answer = Clock::now();
    for (;;) {
      pool_->Batches(index, batches);
      bool progressed = false;
      std::optional<Error> lost =
          DriveTurn(*pool_, lease, name_, batches, options_.retry.stall_timeout, last_answer, progressed);
      if (progressed) outage = Outage{};
      bool mine_done = false;
      uint64_t left_bytes = 0;
      remaining.clear();
      for (Batch* b : batches) {
        if (BatchComplete(*b)) {
          mine_done |= b == &mine;
          pool_->Finish(index, b);  // its owner may free it now
          continue;
        }
        for (const Command& c : b->commands) {
          if (!c.done && (*b->status)[c.request].ok()) left_bytes += c.length;
        }
        remaining.push_back(b);
      }
      if (mine_done) return;
      if (!lost) continue;
      if (Status s = Reconnect(lease, outage, *lost, left_bytes); !s.ok()) {
        // Reconnect dropped the connection: nothing is in flight.
        for (Batch* b : remaining) {
          for (const Command& c : b->commands) {
            if (!c.done) FailCommand(c, s.error());
          }
          pool_->Finish(index, b);
        }
        return;
      }
    }
  }

  // Puts a new connection in the lease's slot, after backoff; counts the
  // attempt against `outage`. Returns kIoError (retryable) naming `reason`
  // when the bounds are passed, kCancelled when cancelled, and the
  // mismatch when the new connection shows a different export.
  Status Reconnect(HandlePool::Lease& lease, Outage& outage, const Error& reason, uint64_t reissued_bytes) {
    using Clock = std::chrono::steady_clock;
    using std::chrono::milliseconds;
    const NbdRetryPolicy& policy = options_.retry;
    if (!outage.active) outage = Outage{true, 0, Clock::now()};
    lease.Drop();
    uint32_t attempts = 0;
    milliseconds waited{0};
    std::optional<Error> last;
    for (;;) {
      auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - outage.start);
      milliseconds delay = BackoffDelay(policy, outage.attempts);
      if (outage.attempts >= policy.attempts || elapsed + delay > policy.max_time) {
        std::string message = "NBD connection lost (" + reason.message() + ")";
        if (policy.attempts == 0) {
          message += "; reconnecting is off";
        } else {
          message += " and not restored: " + std::to_string(outage.attempts) + " reconnect attempt" +
                     (outage.attempts == 1 ? "" : "s") + " in " + Seconds(elapsed) + " s (bounds: " +
                     std::to_string(policy.attempts) + " attempts, " + Seconds(policy.max_time) + " s)";
          if (last) message += "; last attempt: " + last->message();
        }
        return Error::IoError(message)
            .set_errno(reason.errno_value() != 0 ? reason.errno_value() : ECONNRESET)
            .set_retryable(true)
            .set_path(name_);
      }
      BARGE_RETURN_IF_ERROR(SleepUnlessCancelled(policy, delay, "cancelled while reconnecting", name_));
      waited += delay;
      ++outage.attempts;
      ++attempts;
      elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - outage.start);
      milliseconds timeout = std::max(milliseconds(1000), std::min(options_.connect_timeout, policy.max_time - elapsed));
      if (policy.restore_transport) {
        Status restored = policy.restore_transport();
        if (!restored.ok()) {
          if (!restored.error().retryable()) return WithPath(std::move(restored).error(), name_);
          last = std::move(restored).error();
          continue;
        }
      }
      auto handle = Connect(uri_, name_, options_, timeout);
      if (!handle.ok()) {
        last = handle.error();
        continue;
      }
      int64_t size = nbd_get_size((*handle)->get());
      if (size < 0 || static_cast<uint64_t>(size) != info_.size_bytes) {
        return Error::InvalidArgument("the export is not the same after reconnecting (size " + std::to_string(size) +
                                      ", was " + std::to_string(info_.size_bytes) + ")")
            .set_path(name_);
      }
      lease.Replace(std::move(handle).value());
      if (policy.on_reconnect) {
        NbdReconnect event;
        event.uri = name_;
        event.reason = reason.message();
        event.attempts = attempts;
        event.waited = waited;
        event.reissued_bytes = reissued_bytes;
        policy.on_reconnect(event);
      }
      return OkStatus();
    }
  }

  const std::string uri_;
  const std::string name_;
  const NbdOptions options_;
  const ExportInfo info_;
  const std::unique_ptr<HandlePool> pool_;
};

class NbdSourceImpl final : public NbdSource {
 public:
  NbdSourceImpl(std::string uri, std::string name, const NbdOptions& options, Export ex)
      : conns_(std::move(uri), std::move(name), options, std::move(ex)),
        dirty_context_(options.dirty_bitmap_context) {}

  const std::string& name() const override { return conns_.name(); }
  uint64_t size_bytes() const override { return conns_.info().size_bytes; }
  uint32_t connections() const override { return static_cast<uint32_t>(conns_.size()); }
  size_t max_in_flight() const { return conns_.max_in_flight(); }

  SourceCapabilities capabilities() const override {
    SourceCapabilities caps;
    caps.alignment_bytes = conns_.info().min_block_bytes;
    caps.preferred_request_bytes = conns_.info().request_bytes;
    caps.has_extents = conns_.info().has_allocation;
    caps.parallel_reads = conns_.size() > 1;
    // Callers per connection: while one waits for its batch, another's
    // keep the connection's queue full (HandlePool).
    caps.blocking_read_streams = static_cast<uint32_t>(conns_.size() * kCallersPerConnection);
    return caps;
  }

  Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    ReadRequest one{offset, out, {}};
    return ReadMany(std::span(&one, 1));
  }

  // Every request goes out on one connection, pipelined; after a drop, the
  // pieces not yet read go out again on a new one (Connections).
  // NBD has no short reads: a command fills its piece or fails.
  Status ReadMany(std::span<ReadRequest> requests) override {
    std::vector<Command> commands;
    std::vector<Status> status(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      status[i] = CheckRange(r.offset, r.buffer.size());
      if (status[i].ok()) {
        AddCommands(commands, i, r.offset, r.buffer.data(), r.buffer.size(), conns_.info().request_bytes);
      }
    }
    if (!commands.empty()) {
      conns_.RunCommands("nbd_pread", std::move(commands), status, [](nbd_handle* h, const Command& c) {
        // The buffer is the caller's writable ReadRequest buffer.
        return nbd_aio_pread(h, const_cast<std::byte*>(c.data), c.length, c.offset,
                             nbd_completion_callback{nullptr, nullptr, nullptr}, 0);
      });
    }
    Status first;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!status[i].ok() && first.ok()) first = status[i];
      requests[i].status = std::move(status[i]);
    }
    return first;
  }

  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override {
    if (!conns_.info().has_allocation) return BlockSource::Extents(offset, length);
    BARGE_RETURN_IF_ERROR(CheckRange(offset, length));
    // Gathered in granules: memory follows the range, not how finely the
    // server cuts its replies.
    ExtentBuilder out;
    auto lease = conns_.Acquire();
    BARGE_RETURN_IF_ERROR(conns_.Run(lease, [&](Conn& conn) {
      out = ExtentBuilder();  // a walk cut short starts again on the new connection
      return WalkBlockStatus(conn, conns_.name(), LIBNBD_CONTEXT_BASE_ALLOCATION, offset, length,
                             [&](uint64_t off, uint64_t len, uint32_t flags) {
                               out.Add(off, len, KindFromAllocation(flags));
                             });
    }));
    return out.Finish();
  }

  Result<RangeList> DirtyRanges(uint64_t offset, uint64_t length) override {
    if (dirty_context_.empty()) {
      return Error::NotSupported("no dirty-bitmap meta context was requested").set_path(conns_.name());
    }
    BARGE_RETURN_IF_ERROR(CheckRange(offset, length));
    RangeList out;
    auto lease = conns_.Acquire();
    BARGE_RETURN_IF_ERROR(conns_.Run(lease, [&](Conn& conn) {
      out.clear();
      // Widened to granules as they come (a dirty granule is copied whole;
      // clusters are coarser still): bounded however the server cuts.
      return WalkBlockStatus(conn, conns_.name(), dirty_context_.c_str(), offset, length,
                             [&](uint64_t off, uint64_t len, uint32_t flags) {
                               if (flags & 1) AppendGranularRange(out, off, len, offset, offset + length);
                             });
    }));
    return NormalizeRanges(std::move(out));
  }

 private:
  Connections conns_;
  const std::string dirty_context_;
};

class NbdSink final : public BlockSink {
 public:
  NbdSink(std::string uri, std::string name, const NbdOptions& options, Export ex)
      : conns_(std::move(uri), std::move(name), options, std::move(ex)), fast_zero_(conns_.info().can_fast_zero) {}

  const std::string& name() const override { return conns_.name(); }
  uint64_t size_bytes() const override { return conns_.info().size_bytes; }
  size_t max_in_flight() const { return conns_.max_in_flight(); }

  SinkCapabilities capabilities() const override {
    const ExportInfo& info = conns_.info();
    SinkCapabilities caps;
    caps.alignment_bytes = info.min_block_bytes;
    caps.preferred_request_bytes = info.request_bytes;
    caps.can_zero = info.can_zero;
    caps.can_trim = info.can_trim;
    caps.zero_initialized = false;  // an export holds whatever it held
    caps.can_grow = false;
    return caps;
  }

  // A write sent again after a drop lands at the same offset with the same
  // bytes: harmless if the first one reached the disk too.
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    BARGE_RETURN_IF_ERROR(CheckRange(offset, data.size()));
    std::vector<Command> commands;
    AddCommands(commands, 0, offset, data.data(), data.size(), conns_.info().request_bytes);
    std::vector<Status> status(1);
    conns_.RunCommands("nbd_pwrite", std::move(commands), status, [](nbd_handle* h, const Command& c) {
      return nbd_aio_pwrite(h, c.data, c.length, c.offset, nbd_completion_callback{nullptr, nullptr, nullptr}, 0);
    });
    return status[0];
  }

  Status WriteZeroes(uint64_t offset, uint64_t length) override {
    BARGE_RETURN_IF_ERROR(CheckRange(offset, length));
    if (!conns_.info().can_zero) return BlockSink::WriteZeroes(offset, length);
    uint64_t pos = offset;
    const uint64_t end = offset + length;
    bool fall_back = false;
    {
      auto lease = conns_.Acquire();
      // `pos` moves only past zeroes the server confirmed, so a reconnect
      // goes on from there.
      BARGE_RETURN_IF_ERROR(conns_.Run(lease, [&](Conn& conn) -> Status {
        auto zero = [&](uint64_t n, uint32_t flags) {
          return conn.Call([&](nbd_handle* h) { return nbd_aio_zero(h, n, pos, kNoCompletion, flags); });
        };
        // A failure on a connection that is gone goes back to Run.
        auto gone = [&] { return conn.get() == nullptr || Dropped(conn.get()); };
        while (pos < end) {
          uint64_t n = std::min(end - pos, kMaxCommandBytes);
          // Fast zero first: the server refuses (ENOTSUP) instead of writing
          // zeros slowly; then ask again without the flag and let the server
          // do the slow work, which still saves sending the bytes.
          if (fast_zero_ && zero(n, LIBNBD_CMD_FLAG_FAST_ZERO) == 0) {
            pos += n;
            continue;
          }
          if (fast_zero_) {
            int err = nbd_get_errno();
            Error e = NbdError("nbd_zero", conns_.name(), pos, n);
            if ((err != ENOTSUP && err != EOPNOTSUPP) || gone()) return e;
            fast_zero_ = false;  // a benign race: every thread learns the same
          }
          if (zero(n, 0) != 0) {
            int err = nbd_get_errno();
            Error e = NbdError("nbd_zero", conns_.name(), pos, n);
            if ((err != ENOTSUP && err != EOPNOTSUPP && err != EINVAL) || gone()) return e;
            fall_back = true;  // the server cannot zero after all: write zero buffers
            return OkStatus();
          }
          pos += n;
        }
        return OkStatus();
      }));
    }
    // Outside the lease: the fallback's WriteAt takes a connection itself.
    if (fall_back && pos < end) return BlockSink::WriteZeroes(pos, end - pos);
    return OkStatus();
  }

  Status Trim(uint64_t offset, uint64_t length) override {
    if (!conns_.info().can_trim) return BlockSink::Trim(offset, length);
    BARGE_RETURN_IF_ERROR(CheckRange(offset, length));
    auto lease = conns_.Acquire();
    uint64_t pos = offset;
    return conns_.Run(lease, [&](Conn& conn) -> Status {
      for (; pos < offset + length;) {
        uint64_t n = std::min(offset + length - pos, kMaxCommandBytes);
        if (conn.Call([&](nbd_handle* h) { return nbd_aio_trim(h, n, pos, kNoCompletion, 0); }) != 0) {
          return NbdError("nbd_trim", conns_.name(), pos, n);
        }
        pos += n;
      }
      return OkStatus();
    });
  }

  // With multi-conn, a flush on one connection covers completed writes on
  // all of them (the server's promise); without it there is one connection.
  // A server that does not offer flush has no volatile cache to flush. A
  // flush cut by a drop is sent again on the new connection.
  Status Flush() override {
    if (!conns_.info().can_flush) return OkStatus();
    auto lease = conns_.Acquire();
    return conns_.Run(lease, [&](Conn& conn) -> Status {
      if (conn.Call([](nbd_handle* h) { return nbd_aio_flush(h, kNoCompletion, 0); }) != 0) {
        return NbdError("nbd_flush", conns_.name());
      }
      return OkStatus();
    });
  }

 private:
  Status CheckRange(uint64_t offset, uint64_t length) const {
    const uint64_t size = conns_.info().size_bytes;
    if (offset > size || length > size - offset) {
      return Error::NoSpace("write beyond end of export (size " + std::to_string(size) + ")")
          .set_path(conns_.name())
          .set_range(offset, length);
    }
    return OkStatus();
  }

  Connections conns_;
  std::atomic<bool> fast_zero_;
};

}  // namespace

Result<std::unique_ptr<NbdSource>> OpenNbd(const std::string& uri, const NbdOptions& options) {
  if (!IsNbdUri(uri)) return Error::InvalidArgument("not an NBD URI").set_path(RedactUri(uri));
  std::string name = RedactNbdUri(uri);
  BARGE_ASSIGN_OR_RETURN(Export ex, OpenExport(uri, name, options));
  return std::unique_ptr<NbdSource>(
      new NbdSourceImpl(uri, std::move(name), options, std::move(ex)));
}

Result<std::unique_ptr<BlockSource>> OpenNbdSource(const std::string& uri,
                                                   const NbdOptions& options) {
  BARGE_ASSIGN_OR_RETURN(auto source, OpenNbd(uri, options));
  return std::unique_ptr<BlockSource>(std::move(source));
}

Result<RangeList> NbdDirtyRanges(BlockSource& source, uint64_t offset, uint64_t length) {
  auto* nbd = dynamic_cast<NbdSource*>(&source);
  if (nbd == nullptr) {
    return Error::NotSupported("not an NBD source").set_path(source.name());
  }
  return nbd->DirtyRanges(offset, length);
}

size_t NbdMaxInFlight(const BlockSource& source) {
  const auto* nbd = dynamic_cast<const NbdSourceImpl*>(&source);
  return nbd != nullptr ? nbd->max_in_flight() : 0;
}

size_t NbdMaxInFlight(const BlockSink& sink) {
  const auto* nbd = dynamic_cast<const NbdSink*>(&sink);
  return nbd != nullptr ? nbd->max_in_flight() : 0;
}

Result<std::unique_ptr<BlockSink>> OpenNbdSink(const std::string& uri, const NbdOptions& options) {
  if (!IsNbdUri(uri)) return Error::InvalidArgument("not an NBD URI").set_path(RedactUri(uri));
  std::string name = RedactNbdUri(uri);
  BARGE_ASSIGN_OR_RETURN(Export ex, OpenExport(uri, name, options));
  if (ex.info.read_only) {
    return Error::NotSupported("export is read-only").set_errno(EROFS).set_path(name);
  }
  return std::unique_ptr<BlockSink>(new NbdSink(uri, std::move(name), options, std::move(ex)));
}

}  // namespace barge
