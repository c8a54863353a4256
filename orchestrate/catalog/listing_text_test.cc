// The text of `barge list` and `barge catalog list`: tables padded to their
// widest cell, one per chain, broken points last, the next backup of each
// tracker said in words.
#include "orchestrate/catalog/listing_text.h"

#include <gtest/gtest.h>

#include <sstream>

#include "formats/units.h"

namespace barge::orchestrate {
namespace {

pipeline::PointView Point(size_t position, const std::string& id, const std::string& chain) {
  pipeline::PointView p;
  p.position = position;
  p.manifest.id = id;
  p.manifest.reason = "because";
  p.manifest.compression = "zstd";
  p.manifest.virtual_size = 1 << 20;
  p.chain = chain;
  return p;
}

TEST(ListingTextTest, TablePadsToTheWidestCellAndTrimsLines) {
  TextTable table({"A", "BB", "C"});
  table.Add({"long", "x", ""});
  std::ostringstream out;
  table.Print(out, "  ");
  EXPECT_EQ(out.str(), "  A     BB  C\n  long  x\n");
}

TEST(ListingTextTest, VerificationInWords) {
  EXPECT_EQ(VerificationText(std::nullopt), "never");
  pipeline::LastVerification v;
  v.record.ok = false;
  v.record.verified_at = "2026-01-02T03:04:05Z";
  v.stale = true;
  EXPECT_EQ(VerificationText(v), "FAILED 2026-01-02T03:04:05Z (stale: image changed since)");
}

TEST(ListingTextTest, ChainFolderWithoutPoints) {
  pipeline::ChainListing l;
  l.chain_dir = "/b/vm";
  EXPECT_EQ(ChainListingText(l), "/b/vm: no backups\n");
}

TEST(ListingTextTest, OneTablePerChainThenTheBrokenPoints) {
  pipeline::ChainListing l;
  l.chain_dir = "/b/vm";
  l.points = {Point(0, "f1", "f1"), Point(1, "i1", "f1"), Point(2, "f2", "f2"), Point(3, "lost", "")};
  l.points[1].parent_position = 0;
  l.points[1].manifest.type = formats::BackupType::kIncremental;
  l.points[0].dependents = {"/b/other"};
  l.chain_order = {"f1", "f2"};
  l.virtual_size = 1 << 20;
  const std::string text = ChainListingText(l);
  EXPECT_EQ(text.rfind("/b/vm: 4 points in 2 chains, ", 0), 0u) << text;
  const size_t c1 = text.find("chain 1 (full f1):"), c2 = text.find("chain 2 (full f2):"),
               broken = text.find("broken (a parent is missing or does not match):");
  ASSERT_NE(c1, std::string::npos) << text;
  ASSERT_NE(c2, std::string::npos) << text;
  ASSERT_NE(broken, std::string::npos) << text;
  EXPECT_LT(c1, c2);
  EXPECT_LT(c2, broken);
  EXPECT_NE(text.find("base of 1 chain; because"), std::string::npos) << text;
  EXPECT_NE(text.find("MISSING"), std::string::npos) << text;  // no image stat: the file is missing
  EXPECT_GT(text.find("lost"), broken);
}

TEST(ListingTextTest, CatalogSaysWhatTheNextBackupIs) {
  CatalogListing c;
  c.path = "/cat.db";
  TrackerRecord fresh, full, incr;
  fresh.name = "t1";
  full.name = "t2";
  full.latest_checkpoint = "cp";
  full.needs_full = true;
  full.needs_full_reason = "bitmap inconsistent";
  incr.name = "t3";
  incr.latest_checkpoint = "cp3";
  c.trackers = {fresh, full, incr};
  BackupRecord b;
  b.id = 7;
  b.domain = "vm1";
  b.result = "running";
  b.disks.resize(2);
  b.disks[0].bytes_read = 1024;
  b.disks[1].bytes_read = 1024;
  c.backups = {b};
  const std::string text = CatalogListingText(c, "vm1");
  EXPECT_EQ(text.rfind("catalog /cat.db (domain vm1)\n", 0), 0u) << text;
  EXPECT_NE(text.find("full (no checkpoint yet)"), std::string::npos) << text;
  EXPECT_NE(text.find("full (bitmap inconsistent)"), std::string::npos) << text;
  EXPECT_NE(text.find("incremental"), std::string::npos) << text;
  EXPECT_NE(text.find("checkpoints: none"), std::string::npos) << text;
  EXPECT_NE(text.find("backups (1):"), std::string::npos) << text;
  EXPECT_NE(text.find(formats::HumanBytes(2048)), std::string::npos) << text;  // the disks' total
}

}  // namespace
}  // namespace barge::orchestrate
