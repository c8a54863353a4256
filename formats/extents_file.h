// The dirty-extents file: a JSON list of changed byte ranges from any CBT
// provider (docs/formats/extents.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "blockio/error.h"
#include "blockio/extent.h"

namespace barge::formats {

struct ExtentsFile {
  std::optional<uint64_t> virtual_size;  // if the provider states it
  RangeList dirty;                       // normalized (sorted, merged)
};

// Accepts {"format":"barge-extents","version":1,"virtual_size":N,
// "extents":[{"offset":O,"length":L},...]} or a bare array of such objects.
// Entries with "dirty": false are skipped (nbdinfo --map --json style).
// Errors (kCorruption): not JSON, wrong types, ranges that overflow, more
// than 50 million entries, or extents beyond virtual_size.
Result<ExtentsFile> DecodeExtentsFile(std::string_view json);

}  // namespace barge::formats
