// The qcow2 internal snapshot table: parsing, encoding, lookup.
#include "formats/qcow2_snapshot.h"

#include <algorithm>

namespace barge::formats::qcow2 {

namespace {

Error Bad(const std::string& what, uint64_t offset) {
  return Error::Corruption("qcow2 snapshot table: " + what).set_offset(offset);
}

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

}  // namespace

Result<SnapshotTable> ReadSnapshotTable(BlockSource& file, const Header& h) {
  SnapshotTable out;
  if (h.nb_snapshots == 0) return out;
  if (h.nb_snapshots > kMaxSnapshots) {
    return Bad(std::to_string(h.nb_snapshots) + " snapshots, more than qemu's limit of 65536", 60);
  }
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
  uint64_t end = 0;
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
    BARGE_RETURN_IF_ERROR(need(pos + used_bytes));
    p = buf.data() + pos;
    const std::byte* extra = p + kSnapshotFixedBytes;
    s.virtual_size = h.size;
    if (extra_size >= 8) s.vm_state_size = LoadBe64(extra);
    if (extra_size >= 16) s.virtual_size = LoadBe64(extra + 8);
    if (extra_size >= 24) s.icount = LoadBe64(extra + 16);
    std::vector<std::byte> unknown;
    if (extra_size > kSnapshotKnownExtraBytes) {
      unknown.assign(extra + kSnapshotKnownExtraBytes, extra + extra_size);
    }
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
    out.unknown_extra.push_back(std::move(unknown));
    out.extra_bytes.push_back(extra_size);
    end = pos + used_bytes;
    pos = Align8(end);
  }
  out.table_bytes = end;
  return out;
}

std::vector<std::byte> EncodeSnapshotTable(const std::vector<SnapshotInfo>& snapshots,
                                           const std::vector<std::vector<std::byte>>& unknown_extra) {
  std::vector<std::byte> out;
  for (size_t i = 0; i < snapshots.size(); ++i) {
    const SnapshotInfo& s = snapshots[i];
    static const std::vector<std::byte> kNone;
    const std::vector<std::byte>& unknown = i < unknown_extra.size() ? unknown_extra[i] : kNone;
    const uint32_t extra_size = kSnapshotKnownExtraBytes + static_cast<uint32_t>(unknown.size());
    const size_t at = Align8(out.size());
    out.resize(at + kSnapshotFixedBytes + extra_size + s.id.size() + s.name.size());
    std::byte* p = out.data() + at;
    StoreBe64(p, s.l1_table_offset);
    StoreBe32(p + 8, s.l1_size);
    StoreBe16(p + 12, static_cast<uint16_t>(s.id.size()));
    StoreBe16(p + 14, static_cast<uint16_t>(s.name.size()));
    StoreBe32(p + 16, s.date_sec);
    StoreBe32(p + 20, s.date_nsec);
    StoreBe64(p + 24, s.vm_clock_nsec);
    // A VM state too large for 32 bits reads as a disk-only snapshot to
    // older programs instead of a truncated one (qemu's rule).
    StoreBe32(p + 32, s.vm_state_size <= 0xffffffffu ? static_cast<uint32_t>(s.vm_state_size) : 0);
    StoreBe32(p + 36, extra_size);
    std::byte* extra = p + kSnapshotFixedBytes;
    StoreBe64(extra, s.vm_state_size);
    StoreBe64(extra + 8, s.virtual_size);
    StoreBe64(extra + 16, s.icount);
    std::copy(unknown.begin(), unknown.end(), extra + kSnapshotKnownExtraBytes);
    std::byte* strings = extra + extra_size;
    std::copy_n(reinterpret_cast<const std::byte*>(s.id.data()), s.id.size(), strings);
    std::copy_n(reinterpret_cast<const std::byte*>(s.name.data()), s.name.size(), strings + s.id.size());
  }
  return out;
}

Result<size_t> FindSnapshot(const std::vector<SnapshotInfo>& snapshots, std::string_view id_or_name) {
  for (size_t i = 0; i < snapshots.size(); ++i) {
    if (snapshots[i].id == id_or_name) return i;
  }
  std::vector<size_t> named;
  for (size_t i = 0; i < snapshots.size(); ++i) {
    if (snapshots[i].name == id_or_name) named.push_back(i);
  }
  if (named.empty()) {
    return Error::NotFound("no snapshot with the id or name '" + std::string(id_or_name) + "'");
  }
  if (named.size() > 1) {
    std::string ids;
    for (size_t i : named) ids += (ids.empty() ? "" : ", ") + snapshots[i].id;
    return Error::InvalidArgument("the name '" + std::string(id_or_name) + "' is shared by " +
                                  std::to_string(named.size()) + " snapshots (ids " + ids +
                                  "); name the snapshot by its id");
  }
  return named.front();
}

std::string NextSnapshotId(const std::vector<SnapshotInfo>& snapshots) {
  uint64_t max_id = 0;
  for (const SnapshotInfo& s : snapshots) {
    // strtoul: optional leading white space and '+', then digits;
    // saturating like ULONG_MAX.
    size_t i = 0;
    while (i < s.id.size() && (s.id[i] == ' ' || (s.id[i] >= '\t' && s.id[i] <= '\r'))) ++i;
    if (i < s.id.size() && s.id[i] == '+') ++i;
    uint64_t v = 0;
    for (; i < s.id.size() && s.id[i] >= '0' && s.id[i] <= '9'; ++i) {
      const uint64_t digit = static_cast<uint64_t>(s.id[i] - '0');
      v = v > (UINT64_MAX - digit) / 10 ? UINT64_MAX : v * 10 + digit;
    }
    max_id = std::max(max_id, v);
  }
  // qemu prints id_max + 1 in an unsigned long, which wraps to 0.
  return std::to_string(max_id == UINT64_MAX ? 0 : max_id + 1);
}

Status ValidateSnapshotName(std::string_view name) {
  if (name.size() > kMaxSnapshotNameBytes) {
    return Error::InvalidArgument("snapshot name of " + std::to_string(name.size()) +
                                  " bytes is longer than 255 bytes");
  }
  if (name.find('\0') != std::string_view::npos) {
    return Error::InvalidArgument("snapshot name holds a NUL byte");
  }
  return OkStatus();
}

}  // namespace barge::formats::qcow2
