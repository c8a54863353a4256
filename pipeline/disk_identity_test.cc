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

// Issue 36 §8: an NBD source's identity held its port, so the disk served
// on another port (a restarted qemu-nbd, a libvirt port pool) never took an
// incremental. A disk the user names is its name, whatever it is read
// through; another name, or none, is still another disk.
const formats::DiskIdentity kNbdA = Disk("nbd", "nbd://127.0.0.1:10809/", "", 1 << 20);
const formats::DiskIdentity kNbdB = Disk("nbd", "nbd://127.0.0.1:10810/", "", 1 << 20);

TEST(DiskIdentityTest, ANamedDiskIsItsNameWhateverItIsReadThrough) {
  const formats::DiskIdentity db1 = NamedIdentity("db1", 1 << 20);
  EXPECT_EQ(db1.kind, "named");
  EXPECT_EQ(db1.location, "db1");
  EXPECT_EQ(db1.source, "");  // what it was read through: the manifest's source
  EXPECT_EQ(db1.virtual_size, 1u << 20);
  EXPECT_EQ(DescribeDisk(db1), "disk named db1 by --disk-id (1 MiB)");
  EXPECT_EQ(DescribeDisk(NamedIdentity("db1", 0)), "disk named db1 by --disk-id");

  EXPECT_FALSE(SameDiskMaybeMoved(kNbdA, kNbdB));  // unnamed: the port is part of it
  EXPECT_TRUE(SameDiskMaybeMoved(db1, NamedIdentity("db1", 0)));
  EXPECT_FALSE(SameDiskMaybeMoved(db1, NamedIdentity("db2", 1 << 20)));
  EXPECT_FALSE(SameDiskMaybeMoved(db1, kNbdA));  // a named chain needs the name
  EXPECT_FALSE(SameDiskMaybeMoved(kNbdA, db1));  // and an unnamed one takes none (a full does)
}

TEST(DiskIdentityTest, OtherDiskReasonOfANamedChainSaysHowToNameTheSource) {
  ChainFolder c = Chain({Point("0000-x", {}, NamedIdentity("db1", 1 << 20), "c1"),
                         Point("0001-x", "0000-x", NamedIdentity("db1", 1 << 20), "c1")});
  EXPECT_TRUE(CheckOneDisk(c, {0, 1}).ok());
  EXPECT_EQ(OtherDiskReason(c, NamedIdentity("db1", 1 << 20)).value(), "");
  std::string unnamed = OtherDiskReason(c, kNbdB).value();
  EXPECT_NE(unnamed.find("disk named db1"), std::string::npos) << unnamed;
  EXPECT_NE(unnamed.find("NBD export nbd://127.0.0.1:10810/ (1 MiB) with no disk id"), std::string::npos) << unnamed;
  EXPECT_NE(unnamed.find("--disk-id"), std::string::npos) << unnamed;
  std::string other = OtherDiskReason(c, NamedIdentity("db2", 1 << 20)).value();
  EXPECT_NE(other.find("disk named db2"), std::string::npos) << other;
  EXPECT_EQ(other.find("with no disk id"), std::string::npos) << other;

  // A chain whose points name two disks mixes disks.
  c = Chain({Point("0000-x", {}, NamedIdentity("db1", 1 << 20), "c1"),
             Point("0001-x", "0000-x", NamedIdentity("db2", 1 << 20), "c1")});
  EXPECT_EQ(CheckOneDisk(c, {0, 1}).error().code(), ErrorCode::kCorruption);
}

TEST(DiskIdentityTest, DiskIdsAreShortPrintableWords) {
  for (const char* ok : {"db1", "serial:WD-1234", "6f1c2a9e-0d3b-4b1e-9d55-0e2f7c1b9a00", "hv1/vm1/vda", "a+b@c.d_e"}) {
    EXPECT_TRUE(CheckDiskId(ok).ok()) << ok;
  }
  for (const std::string& bad : {std::string(), std::string("-x"), std::string("a b"), std::string("a\nb"),
                                std::string("\"x\""), std::string(201, 'a')}) {
    EXPECT_EQ(CheckDiskId(bad).error().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

// What barge backup --disk-id asks of RunBackup: a named identity whose
// source RunBackup fills in; the same name read through another path
// extends the chain, no name or another is refused as another disk.
TEST(DiskIdentityTest, RunBackupOfANamedDiskFollowsItsName) {
  testing::TempDir tmp;
  const std::string a = tmp / "a.raw", b = tmp / "b.raw";
  const auto bytes = testing::RandomBytes(1 << 20, 9);
  testing::WriteFile(a, bytes);
  testing::WriteFile(b, bytes);  // the same disk, seen at another path
  auto request = [&](const std::string& source, std::optional<RangeList> dirty, const std::string& disk_id) {
    BackupRequest req;
    req.source.location = source;
    req.source.format = "raw";
    req.target_dir = tmp / "t";
    req.disk_name = "disk";
    req.incremental = dirty.has_value();
    req.dirty_ranges = dirty;
    if (!disk_id.empty()) req.disk_identity = NamedIdentity(disk_id, 0);
    req.copy.memory_bytes = 8 << 20;
    req.copy.threads = 2;
    return RunBackup(PosixEnv(), req);
  };
  auto full = request(a, std::nullopt, "db1");
  ASSERT_TRUE(full.ok()) << full.error().ToString();
  ASSERT_TRUE(full->manifest.disk_identity.has_value());
  EXPECT_EQ(full->manifest.disk_identity->kind, "named");
  EXPECT_EQ(full->manifest.disk_identity->location, "db1");
  EXPECT_EQ(full->manifest.disk_identity->source, "");
  EXPECT_EQ(full->manifest.source, a);
  EXPECT_EQ(full->manifest.disk_identity->virtual_size, 1u << 20);

  const RangeList dirty{{0, 65536}};
  auto unnamed = request(b, dirty, "");
  ASSERT_FALSE(unnamed.ok());
  EXPECT_EQ(unnamed.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(unnamed.error().message().find("with no disk id"), std::string::npos) << unnamed.error().message();
  auto other = request(b, dirty, "db2");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message().find("disk named db2"), std::string::npos) << other.error().message();
  auto bad = request(b, dirty, "a b");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);

  auto inc = request(b, dirty, "db1");
  ASSERT_TRUE(inc.ok()) << inc.error().ToString();
  EXPECT_EQ(inc->manifest.chain_id, full->manifest.chain_id);
  EXPECT_EQ(inc->manifest.disk_identity->location, "db1");
  EXPECT_EQ(inc->manifest.disk_identity, full->manifest.disk_identity);
  EXPECT_EQ(inc->manifest.source, b);
}

}  // namespace
}  // namespace barge::pipeline
