// libFuzzer target: in-place bitmap edits (formats::EditBitmaps) on the
// input bytes as an existing qcow2 image: the first bitmap found (if any) is
// rotated to a new name, and a bitmap is added. Every structure the edit
// reads (header, bitmap directory and tables, refcount table and blocks) is
// untrusted; errors are fine, crashes and sanitizer reports are not.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "blockio/memory.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_bitmap_edit.h"
#include "formats/qcow2_header.h"
#include "fuzz/qcow2_mutator.h"

// Structure-aware: edits header fields, L1/L2, refcount, bitmap and
// snapshot entries of the (valid) seed images; see qcow2_mutator.h.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return barge::fuzz::MutateQcow2(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::byte* p = reinterpret_cast<const std::byte*>(data);
  std::vector<std::byte> bytes(p, p + size);
  barge::MemorySource source(bytes, "fuzz.qcow2");
  barge::MemorySink sink(0, "fuzz.qcow2");
  if (!bytes.empty() && !sink.WriteAt(0, bytes).ok()) return 0;

  barge::formats::BitmapEdit edit;
  auto header = barge::formats::qcow2::ReadHeader(source);
  if (header.ok()) {
    auto dir = barge::formats::qcow2::ReadBitmapDirectory(source, *header);
    if (dir.ok() && !dir->empty()) edit.remove.push_back((*dir)[0].info.name);
  }
  edit.add.push_back(barge::formats::BitmapSpec{"fuzz-new", 64 << 10, true, {}});
  (void)barge::formats::EditBitmaps(source, sink, edit).ok();
  return 0;
}
