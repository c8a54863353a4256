#include "pipeline/disk_identity.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "pipeline/backup.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

formats::BackupManifest Point(const std::string& id, const std::optional<std::string>& parent,
                              const std::optional<formats::DiskIdentity>& disk, const std::string& chain_id) {
  formats::BackupManifest m;
  m.id = id;
  m.image = id + ".qcow2";
  m.digest_table = id + ".digests";
  m.type = parent ? formats::BackupType::kIncremental : formats::BackupType::kFull;
  if (parent) m.parent = formats::ManifestParent{*parent, *parent + ".qcow2", {}};
  m.disk_identity = disk;
  m.chain_id = chain_id;
  return m;
}

ChainFolder Chain(std::vector<formats::BackupManifest> manifests) {
  ChainFolder c;
  c.dir = "/t/disk";
  uint32_t seq = 0;
  for (auto& m : manifests) c.points.push_back({m, c.PathOf(m.id + ".json"), seq++});
  return c;
}

// A disk's identity without a moved_from (and, when not given, a source).
formats::DiskIdentity Disk(std::string kind, std::string location, std::string target, uint64_t virtual_size,
                           std::string source = "") {
  formats::DiskIdentity d;
  d.kind = std::move(kind);
  d.location = std::move(location);
  d.target = std::move(target);
  d.virtual_size = virtual_size;
  d.source = std::move(source);
  return d;
}

const formats::DiskIdentity kA = Disk("file", "/srv/a.qcow2", "", 1 << 20);
const formats::DiskIdentity kB = Disk("file", "/srv/b.qcow2", "", 1 << 20);

// Moved from formats' ManifestTest (DiskIdentity::Describe became
// DescribeDisk here).
TEST(DiskIdentityTest, DescribeDiskNamesKindLocationAndSize) {
  EXPECT_EQ(DescribeDisk(Disk("file", "/srv/a.qcow2", "", 4096)), "file /srv/a.qcow2 (4 KiB)");
  EXPECT_EQ(DescribeDisk(Disk("domain", "vm1", "vdb", 1 << 20, "/srv/a.qcow2")),
            "disk vdb of domain vm1 on /srv/a.qcow2 (1 MiB)");
}

// A domain disk's identity records the file behind its target (issue 25:
// disks that swapped files); one without it (an older manifest) is not
// compared on it. Sizes are compared by the callers (moved from formats'
// ManifestTest, which compared with DiskIdentity::SameDisk).
TEST(DiskIdentityTest, DomainDiskSourceIsComparedWhereBothRecordOne) {
  const formats::DiskIdentity with_source = Disk("domain", "vm1", "vdb", 1 << 20, "/srv/a.qcow2");
  const formats::DiskIdentity older = Disk("domain", "vm1", "vdb", 1 << 20);
  const formats::DiskIdentity swapped = Disk("domain", "vm1", "vdb", 1 << 20, "/srv/b.qcow2");
  const formats::DiskIdentity resized = Disk("domain", "vm1", "vdb", 2 << 20, "/srv/a.qcow2");
  EXPECT_TRUE(SameDiskMaybeMoved(with_source, older));
  EXPECT_TRUE(SameDiskMaybeMoved(older, with_source));
  EXPECT_FALSE(SameDiskMaybeMoved(with_source, swapped));
  EXPECT_FALSE(SameDiskMaybeMoved(with_source, resized) && with_source.virtual_size == resized.virtual_size);
  EXPECT_TRUE(SameDiskMaybeMoved(with_source, resized));
}

TEST(DiskIdentityTest, OtherDiskReasonNamesBothOrNothing) {
  ChainFolder c = Chain({Point("0000-x", {}, kA, "c1"), Point("0001-x", "0000-x", kA, "c1")});
  EXPECT_EQ(OtherDiskReason(c, kA).value(), "");
  std::string why = OtherDiskReason(c, kB).value();
  EXPECT_NE(why.find("0001-x"), std::string::npos) << why;
  EXPECT_NE(why.find("file /srv/a.qcow2"), std::string::npos) << why;
  EXPECT_NE(why.find("file /srv/b.qcow2"), std::string::npos) << why;
  formats::DiskIdentity resized = kA;
  resized.virtual_size *= 2;
  EXPECT_EQ(OtherDiskReason(c, resized).value(), "");  // the size check's case
  // Older points record nothing: nothing to compare with.
  EXPECT_EQ(OtherDiskReason(Chain({Point("0000-x", {}, {}, "")}), kB).value(), "");
  // A latest point without one: the newest layer under it that has one.
  c = Chain({Point("0000-x", {}, kA, "c1"), Point("0001-x", "0000-x", {}, "")});
  EXPECT_NE(OtherDiskReason(c, kB).value().find("as its layer 0000-x records"), std::string::npos);
  EXPECT_EQ(OtherDiskReason(c, kA).value(), "");
}

TEST(DiskIdentityTest, CheckOneDiskNamesTheFirstForeignLayer) {
  ChainFolder c = Chain({Point("0000-x", {}, kA, "c1"), Point("0001-x", "0000-x", kA, "c1"),
                         Point("0002-x", "0001-x", kB, "c1"), Point("0003-x", "0002-x", kB, "c1")});
  EXPECT_TRUE(CheckOneDisk(c, {0, 1}).ok());
  Status s = CheckOneDisk(c, {0, 1, 2, 3});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(s.error().path(), "/t/disk/0002-x.json");
  EXPECT_NE(s.error().message().find("backup 0002-x is of file /srv/b.qcow2"), std::string::npos)
      << s.error().message();

  c = Chain({Point("0000-x", {}, kA, "c1"), Point("0001-x", "0000-x", kA, "c2")});
  s = CheckOneDisk(c, {0, 1});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().path(), "/t/disk/0001-x.json");
  EXPECT_NE(s.error().message().find("chain c2"), std::string::npos) << s.error().message();

  // Layers without identity (older barge) are passed over.
  c = Chain({Point("0000-x", {}, {}, ""), Point("0001-x", "0000-x", kA, "c1"), Point("0002-x", "0001-x", kA, "c1")});
  EXPECT_TRUE(CheckOneDisk(c, {0, 1, 2}).ok());
}

// A disk that `barge state migrate` moved is one disk when the point taken
// at the new place records where it came from (and only then).
TEST(DiskIdentityTest, AMoveRecordedByTheNewPointKeepsOneDisk) {
  formats::DiskIdentity moved = Disk("file", "/new/a.qcow2", "", 1 << 20);
  EXPECT_FALSE(SameDiskMaybeMoved(kA, moved));
  EXPECT_NE(OtherDiskReason(Chain({Point("0000-x", {}, kA, "c1")}), moved).value(), "");
  moved.moved_from = kA.location;
  EXPECT_TRUE(SameDiskMaybeMoved(kA, moved));
  EXPECT_EQ(OtherDiskReason(Chain({Point("0000-x", {}, kA, "c1")}), moved).value(), "");
  formats::DiskIdentity later = Disk("file", "/new/a.qcow2", "", 1 << 20);  // the next point: not moved again
  ChainFolder c = Chain({Point("0000-x", {}, kA, "c1"), Point("0001-x", "0000-x", moved, "c1"),
                         Point("0002-x", "0001-x", later, "c1")});
  EXPECT_TRUE(CheckOneDisk(c, {0, 1, 2}).ok());
  // A move from somewhere else is another disk.
  formats::DiskIdentity elsewhere = moved;
  elsewhere.moved_from = kB.location;
  c = Chain({Point("0000-x", {}, kA, "c1"), Point("0001-x", "0000-x", elsewhere, "c1")});
  Status s = CheckOneDisk(c, {0, 1});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().path(), "/t/disk/0001-x.json");
}

// What vm backup asks of RunBackup: the domain's disk as the identity,
// whatever the source's location, and changes since the chain's checkpoint.
TEST(DiskIdentityTest, RunBackupChecksADomainDiskAndItsCheckpoint) {
  testing::TempDir tmp;
  const std::string raw = tmp / "disk.raw";
  testing::WriteFile(raw, testing::RandomBytes(1 << 20, 7));
  const formats::DiskIdentity vda = Disk("domain", "vm1", "vda", 0);
  auto request = [&](std::optional<RangeList> dirty, const formats::DiskIdentity& disk, const std::string& since) {
    BackupRequest req;
    req.source.location = raw;
    req.source.format = "raw";
    req.target_dir = tmp / "t";
    req.disk_name = "vda";
    req.incremental = dirty.has_value();
    req.dirty_ranges = dirty;
    req.disk_identity = disk;
    req.since_checkpoint = since;
    req.checkpoint = since.empty() ? "cp1" : "cp2";
    req.copy.memory_bytes = 8 << 20;
    req.copy.threads = 2;
    return RunBackup(PosixEnv(), req);
  };
  auto full = request(std::nullopt, vda, "");
  ASSERT_TRUE(full.ok()) << full.error().ToString();
  ASSERT_TRUE(full->manifest.disk_identity.has_value());
  EXPECT_EQ(full->manifest.disk_identity->location, "vm1");
  EXPECT_EQ(full->manifest.disk_identity->target, "vda");
  EXPECT_EQ(full->manifest.disk_identity->virtual_size, 1u << 20);  // the source's size

  const RangeList dirty{{0, 65536}};
  auto stale = request(dirty, vda, "cp0");
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(stale.error().message().find("since checkpoint cp0"), std::string::npos) << stale.error().message();
  EXPECT_NE(stale.error().message().find("ends at checkpoint cp1"), std::string::npos) << stale.error().message();

  auto other = request(dirty, Disk("domain", "vm2", "vda", 0), "cp1");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message().find("disk vda of domain vm1"), std::string::npos) << other.error().message();
  EXPECT_NE(other.error().message().find("disk vda of domain vm2"), std::string::npos) << other.error().message();

  auto inc = request(dirty, vda, "cp1");
  ASSERT_TRUE(inc.ok()) << inc.error().ToString();
  EXPECT_EQ(inc->manifest.chain_id, full->manifest.chain_id);
  EXPECT_EQ(inc->manifest.disk_identity, full->manifest.disk_identity);
}

}  // namespace
}  // namespace barge::pipeline
