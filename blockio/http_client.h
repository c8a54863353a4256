// The one HTTP(S) layer of barge (libcurl): ranged GETs of one remote
// object with TLS verified, timeouts, retry with backoff and jitter, and the
// object's identity (length, ETag, Last-Modified) checked on every answer.
// Image sources read through it (blockio/http_source.h); object storage
// (blockio/s3_client.h) sends its signed requests through Send().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "blockio/http_parse.h"

namespace barge {

// True for "http://" and "https://" locations (scheme case-insensitive).
bool IsHttpUrl(std::string_view location);

// The URL as it is shown and recorded: RedactUri's form (credential query
// parameters dropped) without any user part.
std::string RedactHttpUrl(std::string_view url);

// kInvalidArgument (naming the URL without its secrets) for a URL barge
// does not fetch: credentials in it ("user:password@": they would end up in
// process lists and records; use a netrc file), no host, blanks or control
// characters, a scheme other than http/https.
Status CheckHttpUrl(std::string_view url);

// Where and as whom s3:// locations are reached (blockio/s3_client.h). The
// cli fills it from flags and the environment; the library reads no
// environment.
struct S3Access {
  // "http(s)://HOST[:PORT]"; "" = https://s3.REGION.amazonaws.com. Plain
  // http only when the URL says so.
  std::string endpoint;
  std::string region;  // "" = us-east-1
  bool virtual_host = false;  // BUCKET.HOST instead of HOST/BUCKET
  std::string access_key_id;
  std::string secret_access_key;  // never shown, logged or recorded
  std::string session_token;      // "" = none; never shown either
};

struct HttpOptions {
  // PEM file of the certificate authorities to verify the server with;
  // "" = the system's store. Verification is never turned off.
  std::string ca_file;
  // Credentials in netrc form (machine HOST login USER password PASS),
  // used by libcurl for the URL's host only; "" = none.
  std::string netrc_file;
  // A file of request headers, one "Name: value" a line (e.g.
  // "Authorization: Bearer ..."), readable by its owner only; "" = none.
  // pipeline::HttpOptionsFor checks it and adds its lines to
  // `extra_headers` (secrets: never shown, logged or recorded).
  std::string header_file;
  int connect_timeout_ms = 15000;
  // A transfer that moves no byte for this long is cut and retried.
  int stall_timeout_ms = 30000;
  // Attempts of one request that make no progress, the first included;
  // an attempt that received bytes resets the count.
  int max_attempts = 6;
  int backoff_initial_ms = 200;  // doubled per failed attempt, with jitter
  int backoff_max_ms = 10000;
  // The time one request may spend retrying, from its first attempt (or
  // its last progress): no retry starts whose backoff would end later, and
  // the error then says "gave up after N attempts in S s". 0 = no bound
  // but max_attempts. An attempt under way is bounded by the timeouts.
  int retry_deadline_ms = 120000;
  int max_redirects = 5;  // more is refused as a redirect loop
  // AWS Signature V4 of every request (libcurl's CURLOPT_AWS_SIGV4, e.g.
  // "aws:amz:us-east-1:s3") with the keys of `s3`; "" = unsigned. Set by
  // the S3 client only, never for plain http(s) sources.
  std::string aws_sigv4;
  // Added to every request ("Name: value"; signed with it when signed):
  // the header file's lines, the S3 client's.
  std::vector<std::string> extra_headers;
  // s3:// locations (blockio/s3_client.h); unused by plain http(s) URLs.
  S3Access s3;
  // A server that serves no byte ranges has its object read once, front
  // to back, into a fresh private folder (Env::CreateTempDir, mode 0700)
  // under this folder; "" = $TMPDIR, else /tmp. The file is unlinked as
  // soon as it is open (blockio/staged_stream.h).
  std::string stage_dir;
  // Told, once, before the object is read that way: its URL as shown
  // (RedactHttpUrl), its length and the folder it is staged under. Unset =
  // nobody is told.
  std::function<void(const std::string& shown_url, uint64_t length_bytes, const std::string& dir)> on_sequential;
};

// One request of Send(): any method, a body from memory.
struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string url;             // the whole URL; "" = the client's
  std::vector<std::string> headers;  // "Name: value", besides extra_headers
  std::span<const std::byte> body;   // sent for PUT and POST
  std::string range;                 // "FIRST-LAST" or ""
};

// Its answer: the final head and up to kMaxBody bytes of the body (longer
// bodies are cut there; S3 answers are small XML documents).
struct HttpReply {
  static constexpr size_t kMaxBody = 16 << 20;
  HttpResponseHead head;
  std::string body;
  std::vector<std::string> header_lines;  // every "Name: value" of the final head
  int attempts = 0;                       // requests made, the first included
  int64_t elapsed_ms = 0;                 // from the first attempt to this answer
};

// What the server said about the object on the first request.
struct HttpObject {
  uint64_t length_bytes = 0;
  std::string etag;           // "" when the server sends none
  std::string last_modified;  // ditto
  std::string content_type;
  bool ranges = false;  // a Range request was answered with 206
};

// Requests to one URL. Thread-safe: each request takes a connection (a
// libcurl easy handle) from a pool, so several are in flight at once.
class HttpClient {
 public:
  // Refuses what CheckHttpUrl refuses; sends nothing yet.
  static Result<std::unique_ptr<HttpClient>> Create(std::string url, HttpOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  const std::string& shown_url() const { return shown_url_; }

  // Asks for the first byte (Range: bytes=0-0) and reports the object.
  // Errors: kNotFound (404, 410); kInvalidArgument for what retrying cannot
  // fix (TLS verification failed, a redirect loop, 401/403, an HTML page
  // where an image was asked for, another 4xx); kIoError after the attempts
  // for a peer that keeps failing (connection refused, 5xx, cut, stalled).
  Result<HttpObject> Probe();

  // Reads exactly out.size() bytes at `offset` of the object `expect`
  // describes (Probe's answer, ranges true). A cut or stalled transfer is
  // resumed at the first byte not yet received, after a backoff. An answer
  // whose length, ETag or Last-Modified differs from `expect` is
  // kCorruption ("changed on the server"): bytes of two versions are never
  // mixed. A body shorter or longer than asked is retried, then kIoError.
  Status ReadRange(const HttpObject& expect, uint64_t offset, std::span<std::byte> out);

  // Sends `request`, retried after a backoff with jitter when the peer
  // failed (no connection, cut, stalled, 5xx, 429), at most max_attempts
  // times; returns the last answer whatever its status. kIoError
  // (retryable) when no answer came at all; kInvalidArgument for what no
  // retry fixes (TLS verification, a bad URL).
  Result<HttpReply> Send(const HttpRequest& request);
  // The whole object in one GET without a Range (a server that serves no
  // ranges: `expect` from Probe, ranges false), handed to `write` front to
  // back as (offset, bytes). A cut or stalled transfer starts again at
  // byte 0 (`write` sees offset 0 again) after a backoff, up to
  // max_attempts in all; a body longer or shorter than expect.length_bytes
  // is such a failure. A changed object (length, ETag, Last-Modified) is
  // kCorruption; an error `write` returns ends the read with that error.
  using ChunkWriter = std::function<Status(uint64_t offset, std::span<const std::byte> bytes)>;
  Status ReadWhole(const HttpObject& expect, const ChunkWriter& write);

  // Implementation details (http_client.cc), public for its callbacks.
  struct Handle;
  struct Attempt;

 private:
  HttpClient(std::string url, HttpOptions options);
  std::unique_ptr<Handle> Acquire();
  void Release(std::unique_ptr<Handle> handle);
  // One request for [first, last] of the object into `out`; fills `attempt`.
  void Perform(Handle& handle, uint64_t first, uint64_t last, std::span<std::byte> out, Attempt& attempt);
  // Sleeps before the next attempt and returns true, or returns false at
  // once when none is left: `failed_attempts` reached max_attempts, or the
  // backoff would end past retry_deadline_ms after `start`.
  bool Backoff(int failed_attempts, std::chrono::steady_clock::time_point start);

  const std::string url_;
  const std::string shown_url_;
  const HttpOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Handle>> idle_;  // guarded by mu_
};

}  // namespace barge
