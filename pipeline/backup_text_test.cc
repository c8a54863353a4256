// What `barge backup` says: the resume note before the copy, and the
// summary (base and catalog image, changes by digest and what the record
// missed, the clean-cluster sample that turned an incremental into a full).
#include "pipeline/backup_text.h"

#include <gtest/gtest.h>

#include "formats/units.h"

namespace barge::pipeline {
namespace {

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(BackupTextTest, ResumeNote) {
  ResumeNote resumed;
  resumed.resumed = true;
  resumed.staged_bytes = 1024;
  resumed.total_bytes = 4096;
  EXPECT_EQ(ResumeNoteText(resumed),
            "resuming from " + formats::HumanBytes(1024) + " staged (of " + formats::HumanBytes(4096) + ")\n");
  ResumeNote refused;
  refused.problem = "the journal is unreadable";
  EXPECT_EQ(ResumeNoteText(refused), "staged data not reusable: the journal is unreadable, starting over\n");
}

TEST(BackupTextTest, FullOnACatalogImageBase) {
  BackupResult r;
  r.manifest.id = "p1";
  r.manifest.type = formats::BackupType::kFull;
  r.manifest.reason = "first backup";
  r.manifest.base = formats::ManifestBase{};
  r.manifest.base->chain = "/b/base";
  r.manifest.base->id = "f0";
  r.manifest.data_clusters = 2;
  r.manifest.zero_clusters = 1;
  r.image_path = "/b/vm/p1.qcow2";
  const std::string text = BackupResultText(r, {"nbd://host/x", "snap1", "debian", ""});
  EXPECT_EQ(text.rfind(std::string(formats::BackupTypeName(formats::BackupType::kFull)) +
                           " backup p1 of nbd://host/x at snapshot 'snap1'\n  reason:   first backup\n",
                       0),
            0u)
      << text;
  EXPECT_TRUE(Has(text, "  base:     /b/base@f0 (catalog image debian) (3 clusters differ)\n")) << text;
  EXPECT_FALSE(Has(text, "changed:")) << text;
}

TEST(BackupTextTest, DigestsAndWhatTheBitmapMissed) {
  BackupResult r;
  r.manifest.type = formats::BackupType::kIncremental;
  r.manifest.changed_by = "bitmap+digests";
  r.manifest.missed_clusters = 2;
  r.digest_changed_clusters = 1;
  r.clean_sample.clusters = 8;
  r.clean_sample.differing = 3;
  r.replaced = "the disk was replaced";
  const std::string text = BackupResultText(r, {"/d.raw", "", "", "cbt0"});
  EXPECT_TRUE(Has(text, "\n  changed:  1 cluster by SHA-256 digest; 2 of them missed by the bitmap 'cbt0' (it drifted; "
                        "they were written)"))
      << text;
  EXPECT_TRUE(Has(text, ": 3 differ, so a full was taken instead of the incremental")) << text;
  EXPECT_TRUE(Has(BackupResultText(r, {"/d.raw", "", "", ""}), "missed by the extents file")) << text;
}

}  // namespace
}  // namespace barge::pipeline
