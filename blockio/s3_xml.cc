// The small XML reader of S3 answers (blockio/s3_xml.h): element search by
// name, entity decoding, no DTDs, no namespaces beyond ignoring them.
#include "blockio/s3_xml.h"

#include <cctype>
#include <charconv>
#include <ctime>

namespace barge {
namespace {

// Appends the code point `cp` as UTF-8 (nothing for an invalid one).
void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string Decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text[i] != '&') {
      out += text[i++];
      continue;
    }
    const size_t semi = text.find(';', i);
    if (semi == std::string_view::npos || semi - i > 12) {
      out += text[i++];
      continue;
    }
    const std::string_view name = text.substr(i + 1, semi - i - 1);
    if (name == "amp") out += '&';
    else if (name == "lt") out += '<';
    else if (name == "gt") out += '>';
    else if (name == "quot") out += '"';
    else if (name == "apos") out += '\'';
    else if (name.size() > 1 && name[0] == '#') {
      const bool hex = name[1] == 'x' || name[1] == 'X';
      const std::string_view digits = name.substr(hex ? 2 : 1);
      uint32_t cp = 0;
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), cp, hex ? 16 : 10);
      if (ec != std::errc() || p != digits.data() + digits.size() || digits.empty()) {
        out.append(text.substr(i, semi - i + 1));
      } else {
        AppendUtf8(cp, out);
      }
    } else {
      out.append(text.substr(i, semi - i + 1));  // unknown: kept as sent
    }
    i = semi + 1;
  }
  return out;
}

bool IsTrue(std::string_view xml, std::string_view tag) {
  auto t = XmlText(xml, tag);
  return t && *t == "true";
}

std::optional<uint64_t> Number(std::string_view text) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

Error Malformed(std::string_view what) {
  return Error::Corruption("the object store sent a malformed " + std::string(what) + " answer");
}

}  // namespace

std::vector<std::string_view> XmlElements(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  if (tag.empty()) return out;
  const std::string open = "<" + std::string(tag);
  const std::string close = "</" + std::string(tag) + ">";
  size_t pos = 0;
  while (pos < xml.size()) {
    const size_t at = xml.find(open, pos);
    if (at == std::string_view::npos) break;
    const size_t after = at + open.size();
    if (after >= xml.size()) break;
    const char next = xml[after];
    if (next != '>' && next != ' ' && next != '\t' && next != '\r' && next != '\n' && next != '/') {
      pos = after;  // <TagLonger>
      continue;
    }
    const size_t gt = xml.find('>', after);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {  // <Tag/>: empty
      out.push_back(xml.substr(gt + 1, 0));
      pos = gt + 1;
      continue;
    }
    const size_t end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

std::optional<std::string> XmlText(std::string_view xml, std::string_view tag) {
  auto all = XmlElements(xml, tag);
  if (all.empty()) return std::nullopt;
  return Decode(all.front());
}

std::optional<S3ErrorBody> ParseS3Error(std::string_view xml) {
  auto code = XmlText(xml, "Code");
  if (!code || code->empty()) return std::nullopt;
  S3ErrorBody out;
  // A code is a word: anything else in it is dropped, so that a hostile
  // server cannot put a line break or a terminal escape in our messages.
  for (char c : code->substr(0, 64)) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') out.code += c;
  }
  if (out.code.empty()) return std::nullopt;
  out.message = XmlText(xml, "Message").value_or("").substr(0, 300);
  for (char& c : out.message) {
    if (static_cast<unsigned char>(c) < ' ' || c == 0x7f) c = ' ';
  }
  return out;
}

Result<S3ObjectPage> ParseListObjectsV2(std::string_view xml) {
  if (XmlElements(xml, "ListBucketResult").empty()) return Malformed("ListObjectsV2");
  S3ObjectPage page;
  for (std::string_view entry : XmlElements(xml, "Contents")) {
    S3ObjectInfo o;
    auto key = XmlText(entry, "Key");
    auto size = Number(XmlText(entry, "Size").value_or(""));
    if (!key || !size) return Malformed("ListObjectsV2");
    o.key = std::move(*key);
    o.size = *size;
    o.etag = XmlText(entry, "ETag").value_or("");
    o.last_modified = XmlText(entry, "LastModified").value_or("");
    page.objects.push_back(std::move(o));
  }
  page.truncated = IsTrue(xml, "IsTruncated");
  page.next_token = XmlText(xml, "NextContinuationToken").value_or("");
  if (page.truncated && page.next_token.empty()) return Malformed("ListObjectsV2 (truncated without a token)");
  return page;
}

Result<S3PartPage> ParseListParts(std::string_view xml) {
  if (XmlElements(xml, "ListPartsResult").empty()) return Malformed("ListParts");
  S3PartPage page;
  for (std::string_view entry : XmlElements(xml, "Part")) {
    auto number = Number(XmlText(entry, "PartNumber").value_or(""));
    auto size = Number(XmlText(entry, "Size").value_or(""));
    if (!number || *number < 1 || *number > 10000 || !size) return Malformed("ListParts");
    page.parts.push_back(S3Part{static_cast<int>(*number), XmlText(entry, "ETag").value_or(""), *size});
  }
  page.truncated = IsTrue(xml, "IsTruncated");
  page.next_marker = XmlText(xml, "NextPartNumberMarker").value_or("");
  if (page.truncated && page.next_marker.empty()) return Malformed("ListParts (truncated without a marker)");
  return page;
}

Result<S3UploadPage> ParseListMultipartUploads(std::string_view xml) {
  if (XmlElements(xml, "ListMultipartUploadsResult").empty()) return Malformed("ListMultipartUploads");
  S3UploadPage page;
  for (std::string_view entry : XmlElements(xml, "Upload")) {
    auto key = XmlText(entry, "Key");
    auto id = XmlText(entry, "UploadId");
    if (!key || !id || id->empty()) return Malformed("ListMultipartUploads");
    page.uploads.push_back(S3MultipartUpload{std::move(*key), std::move(*id), XmlText(entry, "Initiated").value_or("")});
  }
  page.truncated = IsTrue(xml, "IsTruncated");
  page.next_key_marker = XmlText(xml, "NextKeyMarker").value_or("");
  page.next_upload_id_marker = XmlText(xml, "NextUploadIdMarker").value_or("");
  if (page.truncated && page.next_key_marker.empty()) {
    return Malformed("ListMultipartUploads (truncated without a marker)");
  }
  return page;
}

Result<std::string> ParseInitiateMultipart(std::string_view xml) {
  auto id = XmlText(xml, "UploadId");
  if (!id || id->empty()) return Malformed("CreateMultipartUpload");
  return std::move(*id);
}

// --- Object Lock (issue 40) ---

std::string_view S3LockModeName(S3LockMode mode) {
  return mode == S3LockMode::kCompliance ? "COMPLIANCE" : "GOVERNANCE";
}

std::string S3IsoTime(int64_t unix_seconds) {
  const time_t t = static_cast<time_t>(unix_seconds);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char text[32];
  strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::optional<int64_t> ParseS3IsoTime(std::string_view text) {
  // YYYY-MM-DDTHH:MM:SS[.fraction][Z]
  if (text.size() < 19 || text.size() > 40) return std::nullopt;
  auto field = [&](size_t at, size_t n) { return Number(text.substr(at, n)); };
  const auto year = field(0, 4), month = field(5, 2), day = field(8, 2);
  const auto hour = field(11, 2), minute = field(14, 2), second = field(17, 2);
  if (!year || !month || !day || !hour || !minute || !second || text[4] != '-' || text[7] != '-' ||
      text[10] != 'T' || text[13] != ':' || text[16] != ':') {
    return std::nullopt;
  }
  if (*year < 1970 || *month < 1 || *month > 12 || *day < 1 || *day > 31 || *hour > 23 || *minute > 59 ||
      *second > 60) {
    return std::nullopt;
  }
  std::string_view rest = text.substr(19);
  if (rest.starts_with('.')) {
    size_t digits = 1;
    while (digits < rest.size() && std::isdigit(static_cast<unsigned char>(rest[digits]))) ++digits;
    if (digits == 1) return std::nullopt;
    rest.remove_prefix(digits);
  }
  if (!(rest.empty() || rest == "Z")) return std::nullopt;
  struct tm tm {};
  tm.tm_year = static_cast<int>(*year) - 1900;
  tm.tm_mon = static_cast<int>(*month) - 1;
  tm.tm_mday = static_cast<int>(*day);
  tm.tm_hour = static_cast<int>(*hour);
  tm.tm_min = static_cast<int>(*minute);
  tm.tm_sec = static_cast<int>(*second);
  return static_cast<int64_t>(timegm(&tm));
}

Result<bool> ParseObjectLockConfiguration(std::string_view xml) {
  if (XmlElements(xml, "ObjectLockConfiguration").empty()) return Malformed("GetObjectLockConfiguration");
  return XmlText(xml, "ObjectLockEnabled").value_or("") == "Enabled";
}

Result<S3Retention> ParseRetention(std::string_view xml) {
  if (XmlElements(xml, "Retention").empty()) return Malformed("GetObjectRetention");
  const std::string mode = XmlText(xml, "Mode").value_or("");
  const auto until = ParseS3IsoTime(XmlText(xml, "RetainUntilDate").value_or(""));
  if ((mode != "COMPLIANCE" && mode != "GOVERNANCE") || !until) return Malformed("GetObjectRetention");
  return S3Retention{mode == "COMPLIANCE" ? S3LockMode::kCompliance : S3LockMode::kGovernance, *until};
}

}  // namespace barge
