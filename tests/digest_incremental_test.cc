// Incrementals by digest (`barge backup --incremental --changed-by digests`
// and `bitmap+digests`, docs/formats/backup.md "Strong digest table"):
// against a bitmap incremental of the same changes, zeroed and discarded
// clusters, a drifted bitmap, a forged xxh3 table (docs/security.md), and a
// policy's default for a source without a bitmap. qemu-img and qemu-io are
// the oracles.
#include <gtest/gtest.h>

#include <filesystem>

#include "formats/digest.h"
#include "formats/digest_table.h"
#include "formats/manifest.h"
#include "formats/strong_digest_table.h"
#include "tests/incremental_support.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using namespace incremental_testing;
using testing::TempDir;

constexpr uint64_t kDiskSize = 8 * kMiB;
constexpr uint64_t kCluster = 64 * kKiB;

// Every op changes what its clusters read (so a bitmap at cluster
// granularity and the digests find the same clusters): new data, data
// zeroed (write -z), data discarded, a partial write, the last cluster.
const std::vector<Op> kInitial = {{Op::kWrite, 0, 3 * kMiB, 0x10}, {Op::kWrite, 5 * kMiB, 2 * kMiB, 0x20}};
const std::vector<std::vector<Op>> kSteps = {
    {{Op::kWrite, 64 * kKiB, 4 * kKiB, 0x41}, {Op::kWrite, 4 * kMiB, 128 * kKiB, 0x42}},
    {{Op::kZero, 1 * kMiB, 256 * kKiB}, {Op::kWrite, kDiskSize - kCluster, kCluster, 0x43}},
    {{Op::kDiscard, 2 * kMiB, 512 * kKiB}, {Op::kWrite, 100000, 70000, 0x44}},
    {},  // nothing changed: an empty incremental
};

std::string Raw(const std::string& image, const std::string& out) {
  RunOk("qemu-img convert -f qcow2 -O raw " + Q(image) + " " + Q(out));
  return out;
}

formats::BackupManifest Manifest(const std::string& chain, const std::string& id) {
  auto m = formats::DecodeManifest(testing::Slurp(testing::ManifestPath(chain, id)));
  EXPECT_TRUE(m.ok()) << m.error().ToString();
  return m.ok() ? *m : formats::BackupManifest{};
}

// The chain's latest point reads as `raw`, through barge and qemu-img.
void ExpectLatestIs(const TempDir& tmp, const std::string& chain, const std::string& raw) {
  std::vector<std::string> ids = PointIds(chain);
  ASSERT_FALSE(ids.empty());
  std::string image = chain + "/" + ids.back() + ".qcow2";
  RunOk("qemu-img check -q " + Q(image));
  RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(image) + " " + Q(raw));
  std::string out = tmp / "restored.raw";
  RunOk(Barge() + " restore " + Q(chain) + " --to " + Q(out));
  EXPECT_TRUE(SameFile(out, raw)) << "barge restore of " << ids.back();
  fs::remove(out);
}

TEST(DigestIncrementalTest, SameLayersAsABitmapIncremental) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir tmp;
  const std::string image = tmp / "disk.qcow2";
  const std::string by_bitmap = tmp / "bitmap", by_digest = tmp / "digest";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " " + std::to_string(kDiskSize));
  ApplyOps(image, kInitial);
  // The digest chain's full is plain (no SHA-256 table): its first digest
  // incremental computes the table from the chain, the next ones read it.
  RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(by_bitmap) + " --name vda");
  RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(by_digest) + " --name vda");
  RunOk("qemu-img bitmap --add --enable " + Q(image) + " cbt0");

  for (size_t k = 0; k < kSteps.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    if (!kSteps[k].empty()) ApplyOps(image, kSteps[k]);
    RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(by_bitmap) +
          " --name vda --incremental --dirty-bitmap cbt0");
    nlohmann::json r = testing::RunResult(Barge() + " backup --source " + Q(image) + " --target " + Q(by_digest) +
                                          " --name vda --incremental --changed-by digests --json");
    EXPECT_EQ(r.at("changed_by"), "digests");
    EXPECT_EQ(r.contains("strong_computed_bytes"), k == 0) << r.dump();
    RunOk("qemu-img bitmap --clear " + Q(image) + " cbt0");

    std::string a = by_bitmap + "/vda/" + PointIds(by_bitmap + "/vda").back();
    std::string b = by_digest + "/vda/" + PointIds(by_digest + "/vda").back();
    // The same clusters, stored the same way: equal layers (contents and
    // allocation) and equal per-layer digest tables.
    RunOk("qemu-img compare -q -s " + Q(LayerAlone(a + ".qcow2")) + " " + Q(LayerAlone(b + ".qcow2")));
    EXPECT_TRUE(SameFile(a + ".digests", b + ".digests"));
    auto ma = Manifest(by_bitmap + "/vda", fs::path(a).filename());
    auto mb = Manifest(by_digest + "/vda", fs::path(b).filename());
    EXPECT_EQ(ma.image_digest, mb.image_digest);
    EXPECT_EQ(ma.data_clusters, mb.data_clusters);
    EXPECT_EQ(ma.zero_clusters, mb.zero_clusters);
    EXPECT_EQ(r.at("digest_changed_clusters"), ma.data_clusters + ma.zero_clusters);
    EXPECT_EQ(mb.changed_by, "digests");
    EXPECT_EQ(mb.dirty_source, "digests:sha256");
    EXPECT_EQ(mb.strong_digest_table, fs::path(b).filename().string() + ".sha256");
    EXPECT_TRUE(fs::exists(b + ".sha256"));
    if (kSteps[k].empty()) {
      EXPECT_EQ(mb.data_clusters + mb.zero_clusters, 0u);
    }
    ExpectLatestIs(tmp, by_digest + "/vda", Raw(image, tmp / "now.raw"));
  }
  RunOk(Barge() + " verify --all " + Q(by_digest + "/vda"));
}

TEST(DigestIncrementalTest, BitmapPlusDigestsCatchesADriftedBitmap) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir tmp;
  const std::string image = tmp / "disk.qcow2", target = tmp / "t", chain = target + "/vda";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " " + std::to_string(kDiskSize));
  ApplyOps(image, kInitial);
  RunOk("qemu-img bitmap --add --enable " + Q(image) + " cbt0");
  RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(target) + " --name vda --changed-by digests");
  // A tracked write, then the bitmap stops tracking (as a lost bitmap, or
  // a CBT provider that dropped writes) and two more changes go unseen.
  ApplyOps(image, {{Op::kWrite, 0, kCluster, 0x51}});
  RunOk("qemu-img bitmap --disable " + Q(image) + " cbt0");
  ApplyOps(image, {{Op::kWrite, 6 * kMiB, 2 * kCluster, 0x52}, {Op::kZero, 5 * kMiB, kCluster}});

  auto run = testing::Run(Barge() + " backup --source " + Q(image) + " --target " + Q(target) +
                          " --name vda --incremental --dirty-bitmap cbt0 --changed-by bitmap+digests --json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // The NDJSON follows docs/json.md (schema and event order).
  std::string checked = tmp / "out.ndjson";
  testing::WriteText(checked, run.stdout_text);
  RunOk("python3 " + Q(std::string(BARGE_SOURCE_DIR) + "/tests/json_schema_test.py") + " --check 0 backup < " +
        Q(checked));
  uint64_t missed_bytes = 0;
  std::vector<std::pair<uint64_t, uint64_t>> missed;
  for (const auto& e : testing::Events(run.stdout_text)) {
    if (e.at("event") != "bitmap_missed") continue;
    missed.emplace_back(e.at("offset"), e.at("length"));
    missed_bytes += e.at("length").get<uint64_t>();
    EXPECT_EQ(e.at("record"), "bitmap:cbt0");
  }
  std::vector<std::pair<uint64_t, uint64_t>> want = {{5 * kMiB, kCluster}, {6 * kMiB, 2 * kCluster}};
  EXPECT_EQ(missed, want);
  EXPECT_NE(run.output.find("barge: missed change: bitmap 'cbt0' did not record bytes"), std::string::npos);
  nlohmann::json r = testing::ResultOf(run.stdout_text);
  EXPECT_EQ(r.at("missed_clusters"), 3);
  EXPECT_EQ(r.at("changed_by"), "bitmap+digests");
  formats::BackupManifest m = Manifest(chain, PointIds(chain).back());
  ASSERT_TRUE(m.missed_clusters.has_value());
  EXPECT_EQ(*m.missed_clusters, 3u);
  EXPECT_EQ(m.changed_by, "bitmap+digests");
  // Written anyway: the point is the disk.
  ExpectLatestIs(tmp, chain, Raw(image, tmp / "now.raw"));

  // A bitmap that kept up: nothing missed, and readable output says so.
  RunOk("qemu-img bitmap --clear " + Q(image) + " cbt0 && qemu-img bitmap --enable " + Q(image) + " cbt0");
  ApplyOps(image, {{Op::kWrite, 3 * kMiB, kCluster, 0x53}});
  std::string text = RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(target) +
                           " --name vda --incremental --dirty-bitmap cbt0 --changed-by bitmap+digests");
  EXPECT_NE(text.find("0 of them missed"), std::string::npos) << text;
  EXPECT_EQ(Manifest(chain, PointIds(chain).back()).missed_clusters, 0u);
  ExpectLatestIs(tmp, chain, Raw(image, tmp / "now.raw"));

  // A plain bitmap incremental keeps the chain's SHA-256 table (hashing
  // only what it copies): the next digest incremental reads the table,
  // computes nothing from the chain, and finds exactly the one new change.
  RunOk("qemu-img bitmap --clear " + Q(image) + " cbt0");
  ApplyOps(image, {{Op::kWrite, 2 * kMiB, kCluster, 0x54}, {Op::kZero, 0, kCluster}});
  RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(target) +
        " --name vda --incremental --dirty-bitmap cbt0");
  EXPECT_FALSE(Manifest(chain, PointIds(chain).back()).strong_digest_table.empty());
  ApplyOps(image, {{Op::kWrite, 7 * kMiB, kCluster, 0x55}});
  nlohmann::json r2 = testing::RunResult(Barge() + " backup --source " + Q(image) + " --target " + Q(target) +
                                         " --name vda --incremental --changed-by digests --json");
  EXPECT_EQ(r2.at("digest_changed_clusters"), 1);
  EXPECT_FALSE(r2.contains("strong_computed_bytes")) << r2.dump();
  ExpectLatestIs(tmp, chain, Raw(image, tmp / "now.raw"));
}

// docs/security.md: the xxh3 tables never decide what changed. The chain's
// xxh3 digests are forged to claim the latest point already holds the new
// content of a cluster (what a guest would need an xxh3 collision for; a
// test makes it by editing the files, table, image digest and manifest
// kept consistent so the chain still loads); the SHA-256 table is left
// alone. The digest incremental must still store the cluster.
TEST(DigestIncrementalTest, ForgedXxh3DoesNotHideAChange) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir tmp;
  const std::string image = tmp / "disk.qcow2", target = tmp / "t", chain = target + "/vda";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " " + std::to_string(kDiskSize));
  ApplyOps(image, kInitial);
  RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(target) + " --name vda --changed-by digests");
  const uint64_t forged_cluster = 2;
  ApplyOps(image, {{Op::kWrite, forged_cluster * kCluster, kCluster, 0x66}});

  // Forge: the full's xxh3 entry for the cluster becomes the new bytes'.
  const std::string id = PointIds(chain).back();
  std::vector<std::byte> new_bytes(kCluster, std::byte{0x66});
  auto table = formats::DecodeDigestTable(testing::ReadFile(chain + "/" + id + ".digests"));
  ASSERT_TRUE(table.ok());
  bool found = false;
  for (auto& e : table->entries) {
    if (e.cluster_index == forged_cluster) {
      e.digest = formats::HashCluster(new_bytes, kCluster);
      found = true;
    }
  }
  ASSERT_TRUE(found);
  testing::WriteFile(chain + "/" + id + ".digests", formats::EncodeDigestTable(*table));
  formats::BackupManifest m = Manifest(chain, id);
  m.image_digest = formats::ImageDigestOf(*table, m.image_digest_algorithm);
  auto text = formats::EncodeManifest(m);
  ASSERT_TRUE(text.ok());
  testing::WriteText(testing::ManifestPath(chain, id), *text);
  auto strong = formats::DecodeStrongDigestTable(testing::ReadFile(chain + "/" + m.strong_digest_table));
  ASSERT_TRUE(strong.ok());
  strong->image_digest = m.image_digest;  // bound to the forged point; entries untouched
  testing::WriteFile(chain + "/" + m.strong_digest_table, formats::EncodeStrongDigestTable(*strong));

  nlohmann::json r = testing::RunResult(Barge() + " backup --source " + Q(image) + " --target " + Q(target) +
                                        " --name vda --incremental --changed-by digests --json");
  EXPECT_EQ(r.at("digest_changed_clusters"), 1);
  const std::string inc = PointIds(chain).back();
  auto layer = formats::DecodeDigestTable(testing::ReadFile(chain + "/" + inc + ".digests"));
  ASSERT_TRUE(layer.ok());
  ASSERT_EQ(layer->entries.size(), 1u);
  EXPECT_EQ(layer->entries[0].cluster_index, forged_cluster);
  // The new point holds the disk's bytes (the forged full does not).
  RunOk("qemu-img compare -q -f qcow2 -F qcow2 " + Q(chain + "/" + inc + ".qcow2") + " " + Q(image));
}

TEST(DigestIncrementalTest, RefusesARecordWithDigestsAlone) {
  TempDir tmp;
  const std::string raw = tmp / "d.raw";
  testing::WriteFile(raw, testing::RandomBytes(1 * kMiB, 7));
  auto e = testing::RunError(Barge() + " backup --source " + Q(raw) + " --target " + Q(tmp / "t") +
                                 " --incremental --changed-by digests --dirty-extents x.json --json",
                             64);
  EXPECT_NE(e.at("message").get<std::string>().find("bitmap+digests"), std::string::npos);
  // No chain yet: a digest incremental needs a full first.
  auto none = testing::RunError(Barge() + " backup --source " + Q(raw) + " --target " + Q(tmp / "t") +
                                    " --incremental --changed-by digests --json",
                                1);
  EXPECT_NE(none.at("message").get<std::string>().find("take a full backup first"), std::string::npos);
}

// A policy source without a bitmap: digest incrementals (changed_by
// digests, the default), a full again when full_every is reached.
TEST(DigestIncrementalTest, PolicyTakesDigestIncrementalsForARawSource) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir tmp;
  const std::string raw = tmp / "disk.raw", cat = tmp / "catalog.db", target = tmp / "t";
  RunOk("truncate -s 4M " + Q(raw) + " && qemu-io -f raw -c 'write -P 0x31 0 2M' " + Q(raw) + " >/dev/null");
  fs::create_directories(target);
  const std::string policy = tmp / "p.yaml";
  testing::WriteText(policy, "name: dig\nsources:\n  - image: " + raw + "\ntargets: [" + target +
                                 "]\nretention_count: 10\nfull_every: 3\nfree_space_multiple: 1\n");
  auto run = [&](const std::string& op) {
    if (!op.empty()) RunOk("qemu-io -f raw -c " + Q(op) + " " + Q(raw) + " >/dev/null");
    nlohmann::json r = testing::RunResult("BARGE_CATALOG=" + Q(cat) + " " + Barge() + " run --force --policy " +
                                          Q(policy) + " --json");
    for (const auto& s : r.at("sources")) {
      if (s.at("source") == "disk") return s;
    }
    ADD_FAILURE() << r.dump();
    return nlohmann::json();
  };
  EXPECT_EQ(run("").at("type"), "full");
  nlohmann::json second = run("write -P 0x32 1M 64k");
  EXPECT_EQ(second.at("type"), "incremental") << second.dump();
  nlohmann::json third = run("write -z 0 128k");
  EXPECT_EQ(third.at("type"), "incremental") << third.dump();
  EXPECT_EQ(run("").at("type"), "full");  // full_every 3
  const std::string chain = target + "/dig/disk";
  std::vector<std::string> ids = PointIds(chain);
  ASSERT_EQ(ids.size(), 4u);
  formats::BackupManifest m1 = Manifest(chain, ids[1]);
  EXPECT_EQ(m1.changed_by, "digests");
  EXPECT_EQ(m1.data_clusters + m1.zero_clusters, 1u);
  formats::BackupManifest m2 = Manifest(chain, ids[2]);
  EXPECT_EQ(m2.zero_clusters, 2u);
  // The fulls keep a SHA-256 table (the chain detects by digest).
  EXPECT_FALSE(Manifest(chain, ids[0]).strong_digest_table.empty());
  EXPECT_FALSE(Manifest(chain, ids[3]).strong_digest_table.empty());
  std::string restored = tmp / "r.raw";
  RunOk(Barge() + " restore " + Q(chain) + " --at 2 --to " + Q(restored));
  EXPECT_TRUE(SameFile(restored, raw));
}

}  // namespace
}  // namespace barge
