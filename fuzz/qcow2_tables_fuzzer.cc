// libFuzzer target: the qcow2 tables behind the header, each parsed on its
// own so a bad one does not hide the others: the bitmap directory, every
// bitmap's table and data (dirty ranges), and the internal snapshot table.
// Inputs are whole images, edited by the structure-aware mutator.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "blockio/memory.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_image.h"
#include "formats/qcow2_snapshot.h"
#include "fuzz/qcow2_mutator.h"

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return barge::fuzz::MutateQcow2(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge;
  using namespace barge::formats;
  const std::byte* p = reinterpret_cast<const std::byte*>(data);
  std::vector<std::byte> bytes(p, p + size);
  auto file = std::make_unique<MemorySource>(bytes, "fuzz.qcow2");
  auto header = qcow2::ReadHeader(*file);
  if (!header.ok()) return 0;
  auto snapshots = qcow2::ReadSnapshotTable(*file, *header);
  (void)snapshots.ok();
  auto dir = qcow2::ReadBitmapDirectory(*file, *header);
  if (!dir.ok() || dir->empty()) return 0;
  // Dirty ranges need an image; an empty L1 keeps its guest view out of it.
  ImageInfo info;
  info.path = "fuzz.qcow2";
  info.format = ImageFormat::kQcow2;
  qcow2::Qcow2Image image(std::move(file), *header, {}, info);
  // No bound here: each data cluster may be named once, so the work is
  // bounded by the file (a repeated one was a 16M-range blow-up).
  for (const qcow2::BitmapEntry& e : *dir) (void)ReadBitmapDirtyRanges(image, e.info.name).ok();
  return 0;
}
