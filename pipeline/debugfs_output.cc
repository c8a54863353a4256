// Readers of debugfs's `ls -p` and `stat` output (pipeline/debugfs_output.h).
#include "pipeline/debugfs_output.h"

#include <charconv>

namespace barge::pipeline {

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Digits (and a leading '-' where `sign`) from `pos` up to a '/'; their
// text, with `pos` moved past the '/'. nullopt when something else is there.
std::optional<std::string_view> Field(std::string_view text, size_t& pos, bool sign = false) {
  const size_t start = pos;
  if (sign && pos < text.size() && text[pos] == '-') ++pos;
  while (pos < text.size() && IsDigit(text[pos])) ++pos;
  if (pos >= text.size() || text[pos] != '/') return std::nullopt;
  std::string_view f = text.substr(start, pos - start);
  ++pos;
  return f;
}

template <typename T>
bool Number(std::string_view text, T& out, int base = 10) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, base);
  return ec == std::errc() && end == text.data() + text.size();
}

// Does an entry's tail, "/SIZE/\n", start at `slash`, followed by the next
// entry ("/" and a digit) or the end (only line breaks left)? Its end.
std::optional<size_t> EntryTail(std::string_view text, size_t slash) {
  size_t pos = slash + 1;
  while (pos < text.size() && IsDigit(text[pos])) ++pos;
  if (pos >= text.size() || text[pos] != '/') return std::nullopt;
  if (pos + 1 >= text.size() || text[pos + 1] != '\n') return std::nullopt;
  const size_t end = pos + 2;
  if (end == text.size()) return end;
  if (text[end] == '/' && end + 1 < text.size() && IsDigit(text[end + 1])) return end;
  if (text.find_first_not_of('\n', end) == std::string_view::npos) return end;
  return std::nullopt;
}

Error Unreadable(std::string_view what, size_t at) {
  return Error::IoError("debugfs's " + std::string(what) + " could not be read at byte " + std::to_string(at) +
                        " (a damaged folder in the guest's filesystem, or a debugfs this reader does not know)");
}

}  // namespace

Result<std::vector<ListedEntry>> ParseLsP(std::string_view text) {
  std::vector<ListedEntry> entries;
  size_t pos = 0;
  while (true) {
    while (pos < text.size() && text[pos] == '\n') ++pos;
    if (pos >= text.size()) break;
    const size_t start = pos;
    if (text[pos] != '/') return Unreadable("listing", start);
    ++pos;
    auto inode = Field(text, pos), mode = Field(text, pos), uid = Field(text, pos, true),
         gid = Field(text, pos, true);
    ListedEntry e;
    if (!inode || !mode || !uid || !gid || !Number(*inode, e.inode) || !Number(*mode, e.mode, 8)) {
      return Unreadable("listing", start);
    }
    // The name runs to the first '/' that starts a well-formed tail (the
    // first '/' at all, unless the name is damaged).
    const size_t name_start = pos;
    std::optional<size_t> end;
    size_t slash = name_start;
    for (; (slash = text.find('/', slash)) != std::string_view::npos; ++slash) {
      if ((end = EntryTail(text, slash))) break;
    }
    if (!end) return Unreadable("listing", start);
    e.name = std::string(text.substr(name_start, slash - name_start));
    const std::string_view size = text.substr(slash + 1, *end - slash - 3);
    if (!size.empty() && !Number(size, e.size_bytes)) return Unreadable("listing", start);
    pos = *end;
    if (e.inode == 0 || e.name == "." || e.name == "..") continue;
    entries.push_back(std::move(e));
  }
  return entries;
}

std::optional<formats::Timestamp> ParseStatTime(std::string_view value) {
  // "0x6b0b78ea:00000000 -- Sun Nov 29 ..." or "0x6b0b78ea -- ...".
  if (!value.starts_with("0x")) return std::nullopt;
  value.remove_prefix(2);
  const size_t end = value.find_first_not_of("0123456789abcdefABCDEF");
  uint32_t low = 0, extra = 0;
  if (!Number(value.substr(0, end), low, 16)) return std::nullopt;
  if (end != std::string_view::npos && value[end] == ':') {
    std::string_view rest = value.substr(end + 1);
    if (!Number(rest.substr(0, rest.find_first_not_of("0123456789abcdefABCDEF")), extra, 16)) return std::nullopt;
  }
  // ext4: the low 32 bits are signed; the extra field's two low bits extend
  // the epoch, the other 30 hold nanoseconds.
  formats::Timestamp t;
  t.seconds = static_cast<int64_t>(static_cast<int32_t>(low)) + (static_cast<int64_t>(extra & 3) << 32);
  t.nanos = static_cast<int32_t>(extra >> 2);
  if (t.nanos > 999999999) t.nanos = 0;
  return t;
}

Result<std::vector<InodeFacts>> ParseStats(std::string_view text, const std::vector<uint64_t>& inodes) {
  std::vector<InodeFacts> facts;
  size_t pos = 0;
  for (uint64_t inode : inodes) {
    // Every line before this marker was read as a line of ours, or skipped
    // by length (a link target): a marker inside a target is never found.
    const std::string marker = "debugfs: stat <" + std::to_string(inode) + ">\n";
    const size_t at = text.find(marker, pos);
    if (at == std::string_view::npos) return Unreadable("stat of inode " + std::to_string(inode), pos);
    pos = at + marker.size();
    InodeFacts f;
    bool have_size = false;
    while (pos < text.size() && !text.substr(pos).starts_with("debugfs: ")) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string_view::npos) eol = text.size();
      std::string_view line = text.substr(pos, eol - pos);
      if (line.starts_with("Fast link dest: \"")) {
        // The target, raw, exactly "Size:" bytes long, then "\"\n".
        const size_t target = pos + 17;
        if (!have_size || target + f.size_bytes + 1 > text.size() || text[target + f.size_bytes] != '"') {
          return Unreadable("link target of inode " + std::to_string(inode), pos);
        }
        f.fast_link_target = std::string(text.substr(target, f.size_bytes));
        pos = target + f.size_bytes + 1;
        if (pos < text.size() && text[pos] == '\n') ++pos;
        continue;
      }
      if (line.starts_with("User:")) {
        const size_t size_at = line.find("Size: ");
        if (size_at != std::string_view::npos) {
          std::string_view digits = line.substr(size_at + 6);
          digits = digits.substr(0, digits.find_first_not_of("0123456789"));
          have_size = Number(digits, f.size_bytes);
        }
      }
      std::string_view trimmed = line.substr(std::min(line.find_first_not_of(' '), line.size()));
      if (trimmed.starts_with("mtime: ")) f.mtime = ParseStatTime(trimmed.substr(7));
      pos = eol + 1;
    }
    facts.push_back(std::move(f));
  }
  return facts;
}

}  // namespace barge::pipeline
