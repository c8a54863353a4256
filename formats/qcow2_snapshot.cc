// Parsing of the qcow2 internal snapshot table (list only).
#include "formats/qcow2_snapshot.h"

#include <algorithm>

namespace barge::formats::qcow2 {

namespace {

constexpr uint64_t kMaxSnapshotTableBytes = 64ull << 20;
constexpr uint32_t kMaxSnapshotExtraBytes = 1024;

Error Bad(const std::string& what, uint64_t offset) {
  return Error::Corruption("qcow2 snapshot table: " + what).set_offset(offset);
}

}  // namespace

Result<SnapshotTable> ReadSnapshotTable(BlockSource& file, const Header& h) {
  SnapshotTable out;
  if (h.nb_snapshots == 0) return out;
  const uint64_t file_size = file.size_bytes();
  // The header parser checked that the offset is aligned and inside the file.
  const uint64_t avail = std::min(file_size - h.snapshots_offset, kMaxSnapshotTableBytes);
  // Read in growing steps so a huge nb_snapshots cannot force a big buffer
  // unless the file really holds that much.
  std::vector<std::byte> buf;
  auto need = [&](uint64_t end) -> Status {
    if (end > avail) return Bad("table runs past the end of the file or 64 MiB", h.snapshots_offset);
    if (end <= buf.size()) return OkStatus();
    uint64_t want = std::min(avail, std::max<uint64_t>(end, buf.size() * 2 + 4096));
    uint64_t old = buf.size();
    buf.resize(want);
    return file.ReadAt(h.snapshots_offset + old, std::span(buf).subspan(old));
  };
  uint64_t pos = 0;
  for (uint32_t i = 0; i < h.nb_snapshots; ++i) {
    const uint64_t at = h.snapshots_offset + pos;
    const std::string label = "entry " + std::to_string(i);
    BARGE_RETURN_IF_ERROR(need(pos + kSnapshotFixedBytes));
    const std::byte* p = buf.data() + pos;
    SnapshotInfo s;
    s.l1_table_offset = LoadBe64(p);
    s.l1_size = LoadBe32(p + 8);
    const uint16_t id_size = LoadBe16(p + 12);
    const uint16_t name_size = LoadBe16(p + 14);
    s.date_sec = LoadBe32(p + 16);
    s.date_nsec = LoadBe32(p + 20);
    s.vm_clock_nsec = LoadBe64(p + 24);
    s.vm_state_size = LoadBe32(p + 32);
    const uint32_t extra_size = LoadBe32(p + 36);
    if (extra_size > kMaxSnapshotExtraBytes) return Bad(label + ": extra data too large", at + 36);
    // qemu does not pad the last entry in the file, so only the unpadded
    // bytes must be present.
    const uint64_t used_bytes = kSnapshotFixedBytes + uint64_t{extra_size} + id_size + name_size;
    const uint64_t entry_bytes = (used_bytes + 7) & ~uint64_t{7};
    BARGE_RETURN_IF_ERROR(need(pos + used_bytes));
    p = buf.data() + pos;
    const std::byte* extra = p + kSnapshotFixedBytes;
    s.virtual_size = h.size;
    if (extra_size >= 8) s.vm_state_size = LoadBe64(extra);
    if (extra_size >= 16) s.virtual_size = LoadBe64(extra + 8);
    const char* strings = reinterpret_cast<const char*>(extra + extra_size);
    s.id.assign(strings, id_size);
    s.name.assign(strings + id_size, name_size);
    if (uint64_t{s.l1_size} * 8 > kMaxL1Bytes) return Bad(label + ": L1 table larger than 32 MiB", at + 8);
    if (!IsClusterAligned(s.l1_table_offset, h.cluster_bits)) return Bad(label + ": L1 table offset not cluster aligned", at);
    if (s.l1_size > 0 && (s.l1_table_offset == 0 || s.l1_table_offset > file_size ||
                          uint64_t{s.l1_size} * 8 > file_size - s.l1_table_offset)) {
      return Bad(label + ": L1 table lies beyond the end of the file", at);
    }
    out.snapshots.push_back(std::move(s));
    pos += entry_bytes;
  }
  out.table_bytes = std::min(pos, avail);
  return out;
}

}  // namespace barge::formats::qcow2
