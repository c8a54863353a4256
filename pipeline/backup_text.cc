#include "pipeline/backup_text.h"

#include <sstream>

#include "formats/units.h"

namespace barge::pipeline {

using formats::HumanBytes;

std::string ResumeNoteText(const ResumeNote& note) {
  if (!note.resumed) return "staged data not reusable: " + note.problem + ", starting over\n";
  return "resuming from " + HumanBytes(note.staged_bytes) + " staged (of " + HumanBytes(note.total_bytes) + ")" +
         (note.problem.empty() ? "" : "; copied again from " + note.problem) + "\n";
}

std::string BackupResultText(const BackupResult& r, const BackupTextContext& c) {
  const auto& m = r.manifest;
  std::ostringstream t;
  t << formats::BackupTypeName(m.type) << " backup " << m.id << " of " << c.source
    << (c.snapshot.empty() ? "" : " at snapshot '" + c.snapshot + "'") << "\n"
    << "  reason:   " << m.reason << "\n"
    << "  image:    " << r.image_path << "\n"
    << (m.base ? "  base:     " + m.base->chain + "@" + m.base->id +
                     (c.catalog_image.empty() ? "" : " (catalog image " + c.catalog_image + ")") + " (" +
                     std::to_string(m.data_clusters + m.zero_clusters) + " clusters differ)\n"
               : std::string())
    << "  read:     " << HumanBytes(r.bytes_read);
  if (m.type == formats::BackupType::kIncremental) t << " (dirty " << HumanBytes(m.dirty_bytes) << ")";
  if (!m.changed_by.empty()) {
    t << "\n  changed:  " << r.digest_changed_clusters << (r.digest_changed_clusters == 1 ? " cluster" : " clusters")
      << " by SHA-256 digest";
    if (m.missed_clusters) {
      t << "; " << *m.missed_clusters << " of them missed by the "
        << (c.dirty_bitmap.empty() ? std::string("extents file") : "bitmap '" + c.dirty_bitmap + "'")
        << (*m.missed_clusters ? " (it drifted; they were written)" : "");
    }
  }
  if (r.clean_sample.clusters > 0) {
    t << "\n  checked:  " << r.clean_sample.clusters << " unchanged clusters sampled ("
      << HumanBytes(r.clean_sample.bytes_read) << ")"
      << (r.replaced.empty() ? ": they match the chain"
                             : ": " + std::to_string(r.clean_sample.differing) +
                                   " differ, so a full was taken instead of the incremental");
  }
  if (r.resume && r.resume->resumed) {
    t << " (resumed: " << HumanBytes(r.resume->staged_bytes) << " taken from the staged image)";
  }
  t << "\n  written:  " << HumanBytes(r.image_bytes) << " (" << m.compression << ")\n"
    << "  digest:   xxh3-128:" << m.image_digest.ToHex() << "\n"
    << "  duration: " << formats::HumanSeconds(r.seconds) << "\n";
  return t.str();
}

}  // namespace barge::pipeline
