// Parsing what an HTTP server sends before the body: the status line and
// the header fields barge reads (Content-Range, ETag, Last-Modified,
// Content-Type, Location). The bytes are untrusted: every function accepts
// any input and reports what it could not read (fuzz/http_head_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace barge {

// One response's head, built line by line as libcurl hands them over. A
// redirect's head is followed by the next response's: a status line
// starts a fresh head.
struct HttpResponseHead {
  int status = 0;  // 0 until a status line was read
  std::string etag;
  std::string last_modified;
  std::string content_type;  // lower case, parameters dropped ("text/html")
  std::string content_range;  // as sent, trimmed
  std::optional<uint64_t> content_length;
  bool malformed = false;  // a line that is no header; the response is refused
};

// Adds one line ("Name: value\r\n" or "HTTP/1.1 206 Partial Content\r\n").
// The blank line that ends the head changes nothing.
void AddHttpHeadLine(std::string_view line, HttpResponseHead& head);

// "bytes FIRST-LAST/TOTAL" (TOTAL may be "*": unknown) or "bytes */TOTAL"
// (a 416's form: first and last unset). nullopt for anything else, for
// LAST < FIRST and for LAST >= TOTAL.
struct ContentRange {
  std::optional<uint64_t> first, last;
  std::optional<uint64_t> total;
};
std::optional<ContentRange> ParseContentRange(std::string_view value);

}  // namespace barge
