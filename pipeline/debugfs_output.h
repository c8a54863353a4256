// Readers of e2fsprogs debugfs's output (1.47): a folder's entries
// (`ls -p -r`) and an inode's times and link target (`stat`), read so that
// no name or link target can be split, dropped or spoofed by the bytes it
// holds (a line break, a quote, a backslash, bytes that are not UTF-8).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "formats/units.h"

namespace barge::pipeline {

// One entry of a folder as `ls -p` prints it.
struct ListedEntry {
  std::string name;  // raw bytes, as stored
  uint64_t inode = 0;
  uint32_t mode = 0;  // st_mode bits (type and permissions)
  uint64_t size_bytes = 0;
};

// `ls -p -r` output: "/INODE/MODE/UID/GID/NAME/SIZE/" and a line break per
// entry (SIZE empty for folders), NAME raw. A name never holds '/' (nor
// NUL), so an entry ends at the first "/SIZE/\n" after its name that is
// followed by the next entry or the end, wherever its line breaks are.
// "." and "..", and entries of inode 0, are left out. Returns the entries
// in debugfs's order, or kIoError naming the byte where the text stops
// making sense (never a shorter list).
Result<std::vector<ListedEntry>> ParseLsP(std::string_view text);

// What `stat <INODE>` says about one inode, beside the listing's facts.
struct InodeFacts {
  std::optional<formats::Timestamp> mtime;  // none when debugfs printed none
  uint64_t size_bytes = 0;
  // A symbolic link whose target sits in the inode ("Fast link dest");
  // none for a link whose target is in a data block (read it with cat).
  std::optional<std::string> fast_link_target;
};

// The output of one `debugfs -f FILE` run whose FILE held "stat <I>" for
// each of `inodes`, in that order: each inode's facts. A fast link's
// target is taken by its length ("Size:"), so a target holding a line
// break or text shaped like debugfs's own lines is read as it is.
// kIoError when an inode's block is missing or unreadable.
Result<std::vector<InodeFacts>> ParseStats(std::string_view text, const std::vector<uint64_t>& inodes);

// One stat line's time: " mtime: 0xSECONDS[:EXTRA] -- ..." (EXTRA: the
// epoch bits and nanoseconds of a large inode).
std::optional<formats::Timestamp> ParseStatTime(std::string_view value);

}  // namespace barge::pipeline
