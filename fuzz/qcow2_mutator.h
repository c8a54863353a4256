// A structure-aware libFuzzer mutator for qcow2 images: it finds the
// metadata of the image it is given (header fields and extensions, the
// backing name, L1 and L2 entries, refcount table and block entries, the
// bitmap directory and bitmap tables, the snapshot table and snapshot L1
// tables, compressed payloads) and edits those fields with values chosen to
// break one rule at a time (offsets pointed at other structures or past the
// end, flags flipped, huge counts), so inputs keep passing the header checks
// and reach the code behind them. Byte-level libFuzzer mutation is mixed in.
// The format is in docs/formats/qcow2.md; the design is in docs/security.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace barge::fuzz {

// What a mutable field is part of.
enum class FieldKind : uint8_t {
  kHeader,
  kExtension,      // extension record type/len and the bitmaps extension's fields
  kL1,
  kL2,             // standard or extended L2 entry (word 0; word 1 as kL2Bitmap)
  kL2Bitmap,
  kRefcountTable,
  kRefcountBlock,  // one refcount entry (1 byte for widths below 8 bits)
  kBitmapDirectory,
  kBitmapTable,
  kSnapshot,       // snapshot table entry fields
  kSnapshotL1,
  kCompressedPayload,  // whole payload range of a compressed cluster
  kCount,
};

struct Field {
  uint64_t offset = 0;  // byte offset in the image
  uint32_t width = 0;   // bytes (1, 2, 4, 8; payload ranges: their length)
  FieldKind kind = FieldKind::kHeader;
};

// Every field of `image` the mutator may edit, found by a tolerant walk
// that follows offsets only while they stay inside the image (bounded:
// at most a few thousand entries per kind). Empty when the magic is wrong.
std::vector<Field> FindQcow2Fields(std::span<const uint8_t> image);

// libFuzzer's LLVMFuzzerCustomMutator for one qcow2 image: edits
// data[0..size) in place (the result may be up to max_size bytes) and
// returns the new size. Deterministic for a given seed. With the
// environment variable BARGE_FUZZ_BYTES_ONLY set it only calls
// LLVMFuzzerMutate (for comparing the two).
size_t MutateQcow2(uint8_t* data, size_t size, size_t max_size, unsigned int seed);

// Several files in one input, joined by kFileMarker (the chain target reads
// file 0 as the top image and file i as "layer<i>").
inline constexpr std::string_view kFileMarker = "BARGE-FUZZ-FILE";
std::vector<std::span<const uint8_t>> SplitFiles(std::span<const uint8_t> input);

// MutateQcow2 on one of the files of a joined input (sometimes also adds,
// drops or duplicates a file).
size_t MutateQcow2Files(uint8_t* data, size_t size, size_t max_size, unsigned int seed);

}  // namespace barge::fuzz
