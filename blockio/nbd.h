// NBD exports (qemu-nbd, nbdkit, a libvirt pull-mode backup) as sources and
// sinks through libnbd, with allocation extents from "base:allocation" and
// dirty ranges from a "qemu:dirty-bitmap:NAME" meta context.
#pragma once

#include <chrono>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "blockio/extent.h"
#include "blockio/sink.h"
#include "blockio/source.h"

namespace barge {

// One reconnect after a dropped connection (NbdRetryPolicy::on_reconnect).
struct NbdReconnect {
  std::string uri;        // the export as RedactNbdUri shows it
  std::string reason;     // why the connection was taken as dropped (libnbd's text)
  uint32_t attempts = 0;  // connection attempts this took (1: the first worked)
  std::chrono::milliseconds waited{0};  // backoff slept before the attempts, in all
  uint64_t reissued_bytes = 0;          // bytes of commands sent again on the new connection
};

// What happens when a connection drops mid-transfer (the server closes it,
// the network resets it, or it answers nothing for stall_timeout): the
// connection is replaced with backoff and only the commands that had not
// completed are sent again; commands that completed are not. A server's
// error reply on a live connection (EIO, ENOSPC) is an answer, not a drop,
// and is never retried. Reads, writes, zeroes, trims and flushes are all
// idempotent at a fixed offset, so sending one again is safe.
// The same bounds apply to the first connection when no server answers it
// (refused, unreachable, timed out, no Unix socket yet): a server that
// starts late is waited for. A server that refuses (TLS, no such export)
// fails the open at once.
struct NbdRetryPolicy {
  // Connection attempts per drop; 0: a drop fails at once. The count starts
  // again once a command completes on a new connection.
  uint32_t attempts = 5;
  // Longest an outage may last, from the drop until a command completes
  // again (the attempts stop when the next backoff would pass it).
  std::chrono::milliseconds max_time{60000};
  // Backoff before the first attempt, doubled before each next, capped.
  std::chrono::milliseconds first_delay{200};
  std::chrono::milliseconds max_delay{5000};
  // A connection with commands outstanding and no reply for this long is
  // taken as dropped (a stalled network or server). Zero: wait forever.
  std::chrono::milliseconds stall_timeout{30000};
  // Called after each reconnect, from the thread that made it (any
  // thread); must be thread-safe and quick. May be empty.
  std::function<void(const NbdReconnect&)> on_reconnect;
  // Re-establishes what carries the connections before each reconnect
  // attempt (and each retry of the first connection): an ssh forward of a
  // unix socket restarts a forward that died with its ssh session
  // (orchestrate/libvirt/ssh_forward.h), so the attempt does not knock at
  // a dead local socket. Returns OK when the transport is (again) there.
  // A retryable error counts as that attempt's failure (the next attempt
  // tries again, within the bounds); any other error ends the reconnecting
  // at once with that error (a transport refused for good). Called from
  // any thread, possibly from several at once: must be thread-safe. May
  // block (a new ssh login). May be empty.
  std::function<Status()> restore_transport;
  // May be null; when set true, a backoff in progress ends with kCancelled.
  // Must outlive the source or sink.
  const std::atomic<bool>* cancel = nullptr;
};

// TLS for one export. TLS requested (required set, an nbds:// URI, a
// certificates folder or a PSK file, here or as the URI's tls-certificates=
// and tls-psk-file= parameters) means TLS required: a server that does not
// offer it is refused (kNotSupported naming the server), never used in
// plaintext. Files named here are read by libnbd; checking their
// permissions is the caller's (pipeline/nbd_endpoint.h).
struct NbdTls {
  bool required = false;
  // x509: ca-cert.pem, and client-cert.pem + client-key.pem when the server
  // verifies its peers. The server's certificate is always verified.
  std::string certificates_dir;
  // PSK: a file of "username:hexkey" lines.
  std::string psk_file;
  // The PSK identity; "" = the URI's user part, else libnbd's default (the
  // login name).
  std::string username;
};

struct NbdOptions {
  // Connections to open. Used only when the server advertises multi-conn
  // (its promise that connections see each other's writes and flushes);
  // otherwise one. qemu-nbd advertises it only with --shared greater than 1.
  // If an extra connection fails, the object keeps the ones it has.
  // 0: automatic, 4 in plaintext; over TLS one per core of this machine, at
  // most 4 (each connection's records are decrypted by the thread that
  // reads it, so connections beyond the cores add no decryption and only
  // contend; on 2 cores 4 TLS connections cost more wall and CPU time than
  // 2, on both ends: docs/benchmarks.md). A number given is used as is.
  uint32_t connections = 0;
  // The cores the automatic count over TLS assumes; 0: this machine's
  // (std::thread::hardware_concurrency()).
  uint32_t cores = 0;
  // Largest single NBD read or write; larger calls are split. Also capped by
  // the server's advertised maximum block size. 0: 256 KiB (nbdcopy's size),
  // with and without TLS: with full request queues, 1 MiB over TLS cost
  // qemu-nbd twice the CPU and the copy 1.4x nbdcopy's time
  // (docs/benchmarks.md, bench/nbd_tls.sh).
  uint32_t request_bytes = 0;
  // Meta context to request at connect time for DirtyRanges, e.g.
  // "qemu:dirty-bitmap:backup-vda". Empty: none. When set and the server
  // does not offer it, opening fails with kNotFound.
  std::string dirty_bitmap_context;
  // Longest wait for the first connection's handshake (a full qemu-nbd
  // accepts the socket and then stays silent). Extra connections wait at
  // most 2 s and are dropped on timeout. A timeout is kIoError with errno
  // ETIMEDOUT, marked retryable.
  std::chrono::milliseconds connect_timeout{10000};
  // Reconnection after a drop (each connection of the pool by itself).
  NbdRetryPolicy retry;
  NbdTls tls;
};

// True for URIs libnbd's nbd_connect_uri understands: nbd://, nbds://,
// nbd+unix://, nbds+unix://, nbd+vsock://, nbds+vsock://.
bool IsNbdUri(std::string_view uri);

// The one form in which a location is shown or recorded (messages, --json,
// manifests, records, metrics, catalog). What names the source stays:
// scheme, host, port, path or export, harmless parameters (socket=) in
// their order. What is a credential goes: for an NBD URI the whole user
// part of the authority ("user:secret@": the user is the TLS PSK
// identity); for any other URI (qemu+ssh://root:pw@host) the password,
// the user staying; and every query parameter naming a credential or its
// file (tls-*, keyfile=, pkipath=, and names with key, pass, secret,
// token, psk, cert, pki, cred or auth). Text that is no URI is returned
// unchanged.
std::string RedactUri(std::string_view location);
// RedactUri, by its older name.
std::string RedactNbdUri(std::string_view location);

// `text` (a message) with every URI in it ("scheme://..." up to a blank or
// a quote) as RedactUri shows it; the rest unchanged.
std::string RedactUrisIn(std::string_view text);

// `error` without the credentials of a connection to `uri` with `tls`:
// libnbd's and GnuTLS's texts name the PSK file, the PSK identity and the
// certificates folder ("keys.psk: username alice was not found in PSK
// file"); each such value, and any URI, is replaced by a placeholder
// ("<tls-psk-file>", "<tls-username>"). Code, errno, path and range stay.
Error WithoutNbdSecrets(const Error& error, std::string_view uri, const NbdTls& tls);

// Whether `uri` asks for TLS itself: an nbds scheme, or a tls-certificates=
// or tls-psk-file= parameter.
bool NbdUriRequestsTls(std::string_view uri);

// The value of query parameter `name` in `uri`, percent-decoded; "" when
// absent.
std::string NbdUriParam(std::string_view uri, std::string_view name);

// The server `uri` names, for messages: "HOST:PORT" (port 10809 when none
// is given) or "unix socket PATH".
std::string NbdServerName(std::string_view uri);

// A connected NBD export, read side. Thread-safe: each call borrows one of
// the connections (waiting while all are busy), so up to connections()
// calls run in parallel.
class NbdSource : public BlockSource {
 public:
  // Number of connections actually open (1 without multi-conn).
  virtual uint32_t connections() const = 0;

  // Ranges the server's dirty-bitmap context (NbdOptions::dirty_bitmap_context)
  // flags dirty (bit 0) within [offset, offset+length), normalized. Servers
  // may answer in pieces; this loops until the range is covered.
  // Returns:
  //   the dirty ranges (possibly empty);
  //   kNotSupported when no dirty-bitmap context was requested;
  //   kInvalidArgument for a range beyond the export;
  //   kCorruption when the server's reply makes no progress or goes backwards;
  //   kIoError (with errno) when the request fails.
  virtual Result<RangeList> DirtyRanges(uint64_t offset, uint64_t length) = 0;
};

// Connects to `uri` read-only (nbd_connect_uri). Extents() uses
// "base:allocation" when offered: hole+zero -> kHole, zero -> kZero, all
// else (including a hole without the zero bit, which may read non-zero)
// -> kData. Errors and name() carry the URI as RedactNbdUri gives it.
// A TLS handshake that fails (a server certificate not signed by the CA,
// a PSK the server does not know) is kIoError naming the server.
Result<std::unique_ptr<NbdSource>> OpenNbd(const std::string& uri, const NbdOptions& options = {});

// The same as OpenNbd, as a plain BlockSource.
Result<std::unique_ptr<BlockSource>> OpenNbdSource(const std::string& uri,
                                                   const NbdOptions& options = {});

// Dirty ranges of `source` if it is an NbdSource, else kNotSupported.
Result<RangeList> NbdDirtyRanges(BlockSource& source, uint64_t offset, uint64_t length);

// Connects to a writable export. Capabilities follow what the server
// advertises: can_zero (NBD_CMD_WRITE_ZEROES; tried with the fast-zero flag
// first when offered), can_trim; zero_initialized is always false and the
// size is fixed. Opening a read-only export is kNotSupported (errno EROFS).
// Thread-safe for disjoint ranges, like every BlockSink.
Result<std::unique_ptr<BlockSink>> OpenNbdSink(const std::string& uri,
                                               const NbdOptions& options = {});

}  // namespace barge
