// Fuzzes the HTTP response head parser (blockio/http_parse.h) with what a
// hostile server may send: each input is split into lines and fed in; every
// Content-Range that parses must be consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "blockio/http_parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  barge::HttpResponseHead head;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    end = end == std::string_view::npos ? text.size() : end + 1;
    barge::AddHttpHeadLine(text.substr(start, end - start), head);
    start = end;
  }
  if (head.status != 0 && (head.status < 100 || head.status > 599)) std::abort();
  for (std::string_view value : {std::string_view(head.content_range), text}) {
    auto range = barge::ParseContentRange(value);
    if (!range) continue;
    if (range->first.has_value() != range->last.has_value()) std::abort();
    if (range->first && *range->last < *range->first) std::abort();
    if (range->first && range->total && *range->last >= *range->total) std::abort();
    if (!range->first && !range->total) std::abort();
  }
  return 0;
}
