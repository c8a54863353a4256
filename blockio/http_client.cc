// HttpClient on libcurl: one easy handle per request in flight, pooled so
// connections are reused; heads parsed by blockio/http_parse.h.
#include "blockio/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "blockio/http_parse.h"
#include "blockio/nbd.h"

namespace barge {
namespace {

std::string_view SchemeOf(std::string_view url) {
  const size_t sep = url.find("://");
  return sep == std::string_view::npos ? std::string_view{} : url.substr(0, sep);
}

bool SchemeIs(std::string_view url, std::string_view scheme) {
  const std::string_view s = SchemeOf(url);
  if (s.size() != scheme.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != scheme[i]) return false;
  }
  return true;
}

// The authority of `url` (between "://" and the next '/', '?' or '#').
std::string_view AuthorityOf(std::string_view url) {
  const size_t sep = url.find("://");
  if (sep == std::string_view::npos) return {};
  std::string_view rest = url.substr(sep + 3);
  return rest.substr(0, rest.find_first_of("/?#"));
}

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

bool IsHttpUrl(std::string_view location) { return SchemeIs(location, "http") || SchemeIs(location, "https"); }

std::string RedactHttpUrl(std::string_view url) {
  std::string shown = RedactUri(url);
  const std::string_view authority = AuthorityOf(shown);
  const size_t at = authority.rfind('@');
  if (at == std::string_view::npos) return shown;
  const size_t start = shown.find("://") + 3;
  return shown.erase(start, at + 1);
}

Status CheckHttpUrl(std::string_view url) {
  const std::string shown = RedactHttpUrl(url);
  if (!IsHttpUrl(url)) return Error::InvalidArgument("not an http:// or https:// URL").set_path(shown);
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
      return Error::InvalidArgument("a URL with blanks or control characters (percent-encode them)").set_path(shown);
    }
  }
  const std::string_view authority = AuthorityOf(url);
  if (authority.find('@') != std::string_view::npos) {
    return Error::InvalidArgument(
               "credentials in the URL are refused (they would show in process lists and records); put them in "
               "a netrc file and give --netrc-file")
        .set_path(shown);
  }
  if (authority.empty() || authority.front() == ':') return Error::InvalidArgument("a URL without a host").set_path(shown);
  return {};
}

// One libcurl easy handle; it keeps its connection between requests.
struct HttpClient::Handle {
  CURL* curl = nullptr;
  curl_slist* headers = nullptr;  // of the request in flight
  Handle() : curl(curl_easy_init()) {}
  ~Handle() {
    if (curl != nullptr) curl_easy_cleanup(curl);
    curl_slist_free_all(headers);
  }
  void SetHeaders(const std::vector<std::string>& a, const std::vector<std::string>& b) {
    curl_slist_free_all(headers);
    headers = nullptr;
    for (const auto* list : {&a, &b}) {
      for (const std::string& h : *list) headers = curl_slist_append(headers, h.c_str());
    }
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

namespace {

// Options every request shares: TLS verified, redirects bounded and never
// downgraded, timeouts, credentials, signing, the extra headers and
// `headers` (kept alive in `handle` until its next request).
void ApplyCommon(CURL* c, const std::string& url, const HttpOptions& options, HttpClient::Handle& handle,
                 const std::vector<std::string>& headers = {}) {
  const bool https = SchemeIs(url, "https");
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  // Never downgraded: an https URL is never followed to plain http.
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, https ? "https" : "http,https");
  // Signed requests are not followed: the signature names one host.
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, options.aws_sigv4.empty() ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, static_cast<long>(options.max_redirects));
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!options.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, options.ca_file.c_str());
  if (!options.netrc_file.empty()) {
    curl_easy_setopt(c, CURLOPT_NETRC, static_cast<long>(CURL_NETRC_OPTIONAL));
    curl_easy_setopt(c, CURLOPT_NETRC_FILE, options.netrc_file.c_str());
  }
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.connect_timeout_ms));
  // Stalled: under 1 byte/s for the stall time.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(options.stall_timeout_ms / 1000)));
  curl_easy_setopt(c, CURLOPT_USERAGENT, "barge");
  if (!options.aws_sigv4.empty()) {
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, options.aws_sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, options.s3.access_key_id.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, options.s3.secret_access_key.c_str());
  }
  // libcurl keeps a custom Authorization (and Cookie) header to the URL's
  // host: a redirect to another host does not carry it.
  handle.SetHeaders(options.extra_headers, headers);
  if (handle.headers != nullptr) curl_easy_setopt(c, CURLOPT_HTTPHEADER, handle.headers);
}

// Performs the request set up on `c`, its head lines to `on_header` and
// its body to `on_body`, both given `data`; curl's detail lands in `error`.
CURLcode PerformWith(CURL* c, curl_write_callback on_header, curl_write_callback on_body, void* data, char* error) {
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, data);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, data);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  const CURLcode code = curl_easy_perform(c);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
  return code;
}

}  // namespace

// What one request brought back.
struct HttpClient::Attempt {
  // In: what the answer must match (nullptr: a probe, which takes the
  // head only) and the first byte asked for.
  const HttpObject* expect = nullptr;
  // ReadWhole: the body goes to this writer, asked for without a Range.
  const HttpClient::ChunkWriter* whole = nullptr;
  uint64_t first = 0;
  std::span<std::byte> out;
  // Out.
  HttpResponseHead head;
  bool head_done = false;  // the final response's head arrived whole
  bool head_ok = false;    // a 206 for our range of `expect`'s object
  std::optional<Error> fatal;  // what no retry can fix
  std::string refused;         // why the body was not taken (retryable)
  uint64_t received = 0;
  CURLcode code = CURLE_OK;
  char curl_error[CURL_ERROR_SIZE] = {};
  std::string shown_url;
};

namespace {

std::string ChangedMessage(std::string_view what, std::string_view was, std::string_view now) {
  return "the remote file changed while it was read (" + std::string(what) + " was " +
         (was.empty() ? std::string("none") : std::string(was)) + ", now " +
         (now.empty() ? std::string("none") : std::string(now)) + "); start again to read the new version";
}

// The head of a 206 answer against the object it must belong to: sets
// head_ok, or says why the body is refused.
void ValidateHead(HttpClient::Attempt& a) {
  if (a.expect == nullptr) return;  // a probe: Probe() reads the head itself
  const HttpResponseHead& h = a.head;
  if (h.status != (a.whole != nullptr ? 200 : 206)) return;  // judged after the request
  if (h.malformed) {
    a.refused = "a malformed response head";
    return;
  }
  std::optional<uint64_t> total;  // the object's length as this answer says it
  std::optional<ContentRange> range;
  if (a.whole != nullptr) {
    total = h.content_length;
  } else {
    range = ParseContentRange(h.content_range);
    if (!range || !range->first) {
      a.refused = "a 206 answer without a valid Content-Range";
      return;
    }
    total = range->total;
  }
  if (total && *total != a.expect->length_bytes) {
    a.fatal = Error::Corruption(ChangedMessage("length", std::to_string(a.expect->length_bytes),
                                               std::to_string(*total)));
    return;
  }
  if (!a.expect->etag.empty() && h.etag != a.expect->etag) {
    a.fatal = Error::Corruption(ChangedMessage("ETag", a.expect->etag, h.etag));
    return;
  }
  if (!a.expect->last_modified.empty() && h.last_modified != a.expect->last_modified) {
    a.fatal = Error::Corruption(ChangedMessage("Last-Modified", a.expect->last_modified, h.last_modified));
    return;
  }
  if (a.whole != nullptr) {
    a.head_ok = true;
    return;
  }
  if (*range->first != a.first) {
    a.refused = "a range other than the one asked for";
    return;
  }
  if (*range->last - *range->first + 1 > a.out.size()) {
    a.refused = "a longer range than asked for";
    return;
  }
  a.head_ok = true;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto& a = *static_cast<HttpClient::Attempt*>(user);
  const std::string_view line(data, size * count);
  const bool end_of_head = line == "\r\n" || line == "\n";
  if (!end_of_head) {
    AddHttpHeadLine(line, a.head);
  } else if (a.head.status >= 200 && (a.head.status < 300 || a.head.status == 304)) {
    a.head_done = true;
    ValidateHead(a);
  }
  return size * count;
}

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto& a = *static_cast<HttpClient::Attempt*>(user);
  const size_t n = size * count;
  if (a.expect == nullptr || !a.head_ok) return CURL_WRITEFUNC_ERROR;  // head only, or refused
  if (a.whole != nullptr) {
    if (n > a.expect->length_bytes - a.received) {
      a.refused = "more bytes than the file's length";
      return CURL_WRITEFUNC_ERROR;
    }
    if (Status s = (*a.whole)(a.received, std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), n));
        !s.ok()) {
      a.fatal = s.error();
      return CURL_WRITEFUNC_ERROR;
    }
    a.received += n;
    return n;
  }
  if (n > a.out.size() - a.received) {
    a.refused = "more bytes than the range asked for";
    return CURL_WRITEFUNC_ERROR;
  }
  std::memcpy(a.out.data() + a.received, data, n);
  a.received += n;
  return n;
}

}  // namespace

HttpClient::HttpClient(std::string url, HttpOptions options)
    : url_(std::move(url)), shown_url_(RedactHttpUrl(url_)), options_(std::move(options)) {}

HttpClient::~HttpClient() = default;

Result<std::unique_ptr<HttpClient>> HttpClient::Create(std::string url, HttpOptions options) {
  BARGE_RETURN_IF_ERROR(CheckHttpUrl(url));
  GlobalInit();
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(url), std::move(options)));
}

std::unique_ptr<HttpClient::Handle> HttpClient::Acquire() {
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      auto h = std::move(idle_.back());
      idle_.pop_back();
      return h;
    }
  }
  return std::make_unique<Handle>();
}

void HttpClient::Release(std::unique_ptr<Handle> handle) {
  std::lock_guard lock(mu_);
  idle_.push_back(std::move(handle));
}

void HttpClient::Perform(Handle& handle, uint64_t first, uint64_t last, std::span<std::byte> out, Attempt& a) {
  a.first = first;
  a.out = out;
  a.shown_url = shown_url_;
  CURL* c = handle.curl;
  if (c == nullptr) {
    a.fatal = Error::Internal("curl_easy_init failed");
    return;
  }
  curl_easy_reset(c);
  const std::string range = std::to_string(first) + "-" + std::to_string(last);
  ApplyCommon(c, url_, options_, handle);
  // A server without ranges is read whole (ReadWhole): no Range asked.
  if (a.whole == nullptr) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  a.code = PerformWith(c, OnHeader, OnBody, &a, a.curl_error);
}

bool HttpClient::Backoff(int failed_attempts, std::chrono::steady_clock::time_point start) {
  if (failed_attempts >= options_.max_attempts) return false;
  thread_local std::mt19937 rng{std::random_device{}()};
  const int shift = std::min(failed_attempts - 1, 20);
  const int64_t ceiling = std::min<int64_t>(options_.backoff_max_ms, int64_t{options_.backoff_initial_ms} << shift);
  // Half fixed, half random: connections that failed together spread out.
  std::uniform_int_distribution<int64_t> jitter(ceiling / 2, std::max<int64_t>(ceiling / 2, ceiling));
  const auto pause = std::chrono::milliseconds(jitter(rng));
  if (options_.retry_deadline_ms > 0 &&
      std::chrono::steady_clock::now() + pause > start + std::chrono::milliseconds(options_.retry_deadline_ms)) {
    return false;
  }
  std::this_thread::sleep_for(pause);
  return true;
}

namespace {

// An answer no retry changes, as an Error; nullopt when a retry may help.
std::optional<Error> FinalError(const HttpClient::Attempt& a, const HttpOptions& options) {
  const int s = a.head.status;
  const int max_redirects = options.max_redirects;
  if (s == 404 || s == 410) return Error::NotFound("not found on the server (HTTP " + std::to_string(s) + ")");
  if ((s == 401 || s == 403) && !options.aws_sigv4.empty()) {
    return Error::InvalidArgument("access refused by the object store (HTTP " + std::to_string(s) +
                                  "); check the access key, the secret and the region");
  }
  if (s == 401 || s == 403) {
    std::string hint = "give credentials with --netrc-file or --header-file";
    if (!options.netrc_file.empty()) hint = "check the --netrc-file entry for this host (missing or not accepted)";
    if (!options.header_file.empty()) hint = "check the headers of --header-file (not accepted)";
    return Error::InvalidArgument("access refused by the server (HTTP " + std::to_string(s) + "); " + hint);
  }
  if (s == 416) return Error::Corruption("the server refused a range inside the file's length (HTTP 416): the remote file changed or shrank");
  if (s >= 400 && s < 500 && s != 408 && s != 429) {
    return Error::InvalidArgument("the server refused the request (HTTP " + std::to_string(s) + ")");
  }
  switch (a.code) {
    case CURLE_TOO_MANY_REDIRECTS:
      return Error::InvalidArgument("redirect loop: more than " + std::to_string(max_redirects) + " redirects");
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
      // curl's own detail names the cause (an unknown authority, a name
      // that does not match the host, an expired certificate).
      return Error::InvalidArgument(
          std::string("TLS: the server's certificate was not verified (") +
          (a.curl_error[0] != '\0' ? a.curl_error : curl_easy_strerror(a.code)) + "); " +
          (options.ca_file.empty() ? "give its authority with --ca-file"
                                   : "check that it names this host and is signed by the authority in --ca-file"));
    case CURLE_UNSUPPORTED_PROTOCOL:
      return Error::InvalidArgument("redirected to a protocol barge does not follow (only http and https; never from https to http)");
    case CURLE_URL_MALFORMAT:
      return Error::InvalidArgument("malformed URL");
    default: return std::nullopt;
  }
}

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// "gave up after N attempts[ what] in S s", the start of every message
// after the last retry.
std::string GaveUp(int attempts, std::string_view what, Clock::time_point start) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", static_cast<double>(MsSince(start)) / 1000.0);
  return "gave up after " + std::to_string(attempts) + " attempts" + std::string(what) + " in " + seconds + " s";
}

// Why a retryable attempt failed, for the message after the last one.
std::string RetryReason(const HttpClient::Attempt& a) {
  if (!a.refused.empty()) return "the server sent " + a.refused;
  if (a.code != CURLE_OK && a.code != CURLE_WRITE_ERROR) {
    return a.curl_error[0] != '\0' ? std::string(a.curl_error) : std::string(curl_easy_strerror(a.code));
  }
  const int expected = a.whole != nullptr ? 200 : 206;
  if (a.head.status != 0 && a.head.status != expected) return "HTTP " + std::to_string(a.head.status);
  return "the transfer ended early";
}

}  // namespace

Result<HttpObject> HttpClient::Probe() {
  std::byte first_byte[1];
  const auto start = Clock::now();
  for (int failures = 0;;) {
    auto handle = Acquire();
    Attempt a;
    Perform(*handle, 0, 0, first_byte, a);
    Release(std::move(handle));
    if (a.fatal) return a.fatal->set_path(shown_url_);
    if (auto e = FinalError(a, options_)) return e->set_path(shown_url_);
    const HttpResponseHead& h = a.head;
    // A head cut short (no blank line yet) is retried like any cut.
    if (a.head_done && !h.malformed && (h.status == 200 || h.status == 206)) {
      HttpObject obj;
      obj.etag = h.etag;
      obj.last_modified = h.last_modified;
      obj.content_type = h.content_type;
      if (obj.content_type == "text/html" || obj.content_type == "application/xhtml+xml") {
        return Error::InvalidArgument("the server sent a web page (Content-Type " + obj.content_type +
                                      "), not a disk image")
            .set_path(shown_url_);
      }
      if (h.status == 206) {
        const auto range = ParseContentRange(h.content_range);
        if (!range || !range->total || range->first != 0u) {
          return Error::Corruption("the server's Content-Range '" + h.content_range.substr(0, 80) +
                                   "' does not answer a request for the first byte")
              .set_path(shown_url_);
        }
        obj.length_bytes = *range->total;
        obj.ranges = true;
        return obj;
      }
      if (!h.content_length) {
        return Error::NotSupported("the server serves no byte ranges and sends no length").set_path(shown_url_);
      }
      obj.length_bytes = *h.content_length;
      return obj;
    }
    if (!Backoff(++failures, start)) {
      return Error::IoError(GaveUp(failures, "", start) + ": " + RetryReason(a)).set_path(shown_url_).set_retryable(true);
    }
  }
}

Status HttpClient::ReadRange(const HttpObject& expect, uint64_t offset, std::span<std::byte> out) {
  if (out.empty()) return {};
  if (offset > expect.length_bytes || out.size() > expect.length_bytes - offset) {
    return Error::InvalidArgument("read past the end of the remote file").set_path(shown_url_).set_range(offset, out.size());
  }
  uint64_t done = 0;
  auto start = Clock::now();
  for (int failures = 0; done < out.size();) {
    auto handle = Acquire();
    Attempt a;
    a.expect = &expect;
    Perform(*handle, offset + done, offset + out.size() - 1, out.subspan(done), a);
    Release(std::move(handle));
    done += a.received;
    if (a.fatal) return a.fatal->set_path(shown_url_).set_range(offset, out.size());
    if (done == out.size()) break;
    if (a.head.status == 200) {
      return Error::NotSupported("the server stopped serving byte ranges (HTTP 200 to a Range request)")
          .set_path(shown_url_)
          .set_range(offset, out.size());
    }
    if (auto e = FinalError(a, options_)) return e->set_path(shown_url_).set_range(offset, out.size());
    if (a.received > 0) {  // progress: a cut, resumed at the byte
      failures = 0;
      start = Clock::now();
    }
    if (!Backoff(++failures, start)) {
      return Error::IoError(GaveUp(failures, " without progress", start) + ": " + RetryReason(a))
          .set_path(shown_url_)
          .set_range(offset + done, out.size() - done)
          .set_retryable(true);
    }
  }
  return {};
}

namespace {

// What one Send() request brought back so far.
struct SendState {
  HttpReply reply;
  bool cut = false;  // the body passed HttpReply::kMaxBody
};

size_t OnSendHeader(char* data, size_t size, size_t count, void* user) {
  auto& st = *static_cast<SendState*>(user);
  std::string_view line(data, size * count);
  if (line.starts_with("HTTP/")) st.reply.header_lines.clear();  // a new response's head
  AddHttpHeadLine(line, st.reply.head);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (!line.empty() && !line.starts_with("HTTP/")) st.reply.header_lines.emplace_back(line);
  return size * count;
}

size_t OnSendBody(char* data, size_t size, size_t count, void* user) {
  auto& st = *static_cast<SendState*>(user);
  const size_t n = size * count;
  const size_t room = HttpReply::kMaxBody - std::min(HttpReply::kMaxBody, st.reply.body.size());
  if (n > room) st.cut = true;
  st.reply.body.append(data, std::min(n, room));
  return n;
}

bool RetryableStatus(int status) { return status >= 500 || status == 429 || status == 408; }

}  // namespace

Result<HttpReply> HttpClient::Send(const HttpRequest& request) {
  const std::string& url = request.url.empty() ? url_ : request.url;
  const std::string shown = request.url.empty() ? shown_url_ : RedactHttpUrl(url);
  BARGE_RETURN_IF_ERROR(CheckHttpUrl(url));
  const auto start = Clock::now();
  for (int failures = 0;;) {
    auto handle = Acquire();
    Attempt a;  // for FinalError's view of the transport
    SendState st;
    CURL* c = handle->curl;
    if (c == nullptr) return Error::Internal("curl_easy_init failed");
    curl_easy_reset(c);
    ApplyCommon(c, url, options_, *handle, request.headers);
    if (!request.range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, request.range.c_str());
    if (request.method == "HEAD") {
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (request.method == "PUT" || request.method == "POST") {
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.body.empty() ? "" : reinterpret_cast<const char*>(request.body.data()));
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    } else if (request.method != "GET") {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    }
    a.code = PerformWith(c, OnSendHeader, OnSendBody, &st, a.curl_error);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, nullptr);
    Release(std::move(handle));
    st.reply.attempts = failures + 1;
    st.reply.elapsed_ms = MsSince(start);
    if (a.code == CURLE_OK && !RetryableStatus(st.reply.head.status)) return std::move(st.reply);
    if (a.code != CURLE_OK) {
      a.head = st.reply.head;
      a.head.status = 0;  // transport only: the status is judged by the caller
      if (auto e = FinalError(a, options_)) return e->set_path(shown);
    }
    if (!Backoff(++failures, start)) {
      if (a.code == CURLE_OK) return std::move(st.reply);  // the caller reads the 5xx
      return Error::IoError(GaveUp(failures, "", start) + ": " +
                            (a.curl_error[0] != '\0' ? std::string(a.curl_error) : std::string(curl_easy_strerror(a.code))))
          .set_path(shown)
          .set_retryable(true);
    }
  }
}

Status HttpClient::ReadWhole(const HttpObject& expect, const ChunkWriter& write) {
  const auto start = Clock::now();
  for (int failures = 0;;) {
    auto handle = Acquire();
    Attempt a;
    a.expect = &expect;
    a.whole = &write;
    Perform(*handle, 0, 0, {}, a);
    Release(std::move(handle));
    if (a.fatal) return a.fatal->set_path(shown_url_);
    if (a.code == CURLE_OK && a.head_ok && a.received == expect.length_bytes) return {};
    if (auto e = FinalError(a, options_)) return e->set_path(shown_url_);
    // Every attempt starts again from byte 0: progress does not reset the
    // count, or a server that always cuts would be read forever.
    if (!Backoff(++failures, start)) {
      return Error::IoError(GaveUp(failures, "", start) +
                            " (the server serves no byte ranges, so each one starts again from the first byte): " +
                            RetryReason(a))
          .set_path(shown_url_)
          .set_retryable(true);
    }
  }
}

}  // namespace barge
