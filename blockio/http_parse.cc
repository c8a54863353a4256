// HTTP response heads: status line and the few fields barge reads.
#include "blockio/http_parse.h"

#include <cctype>

namespace barge {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

// A decimal number of at most 19 digits (no overflow), the whole of `s`.
std::optional<uint64_t> ParseDecimal(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

}  // namespace

void AddHttpHeadLine(std::string_view line, HttpResponseHead& head) {
  const std::string_view trimmed = Trim(line);
  if (trimmed.empty()) return;  // the end of the head
  if (trimmed.size() >= 5 && trimmed.substr(0, 5) == "HTTP/") {
    head = HttpResponseHead{};
    const size_t sp = trimmed.find(' ');
    const auto code = sp == std::string_view::npos ? std::nullopt : ParseDecimal(trimmed.substr(sp + 1, 3));
    if (!code || *code < 100 || *code > 599) {
      head.malformed = true;
      return;
    }
    head.status = static_cast<int>(*code);
    return;
  }
  const size_t colon = trimmed.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    head.malformed = true;
    return;
  }
  const std::string_view name = trimmed.substr(0, colon);
  const std::string_view value = Trim(trimmed.substr(colon + 1));
  if (EqualsNoCase(name, "etag")) {
    head.etag = value;
  } else if (EqualsNoCase(name, "last-modified")) {
    head.last_modified = value;
  } else if (EqualsNoCase(name, "content-range")) {
    head.content_range = value;
  } else if (EqualsNoCase(name, "content-length")) {
    head.content_length = ParseDecimal(value);
    if (!head.content_length) head.malformed = true;
  } else if (EqualsNoCase(name, "content-type")) {
    std::string_view type = Trim(value.substr(0, value.find(';')));
    head.content_type.clear();
    for (char c : type) head.content_type += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
}

std::optional<ContentRange> ParseContentRange(std::string_view value) {
  value = Trim(value);
  if (value.size() < 6 || !EqualsNoCase(value.substr(0, 6), "bytes ")) return std::nullopt;
  value = Trim(value.substr(6));
  const size_t slash = value.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const std::string_view range = value.substr(0, slash);
  const std::string_view total = value.substr(slash + 1);
  ContentRange out;
  if (total != "*") {
    out.total = ParseDecimal(total);
    if (!out.total) return std::nullopt;
  }
  if (range == "*") {
    if (!out.total) return std::nullopt;
    return out;
  }
  const size_t dash = range.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  out.first = ParseDecimal(range.substr(0, dash));
  out.last = ParseDecimal(range.substr(dash + 1));
  if (!out.first || !out.last || *out.last < *out.first) return std::nullopt;
  if (out.total && *out.last >= *out.total) return std::nullopt;
  return out;
}

}  // namespace barge
