// Issue 23 §2: a chain over a shared base (`barge backup --base`). A clone
// of a golden image (qemu-img create -b, a few qemu-io writes, one of them
// zeroing a base cluster) stores only the clusters that differ, reads
// identical to the clone with qemu-img alone, restores and verifies
// through its base; the base point is kept by forget and merge (and `list`
// says why); a damaged base fails the dependent's verify naming the base's
// file; a moved base is a clear NotFound naming where it was expected; a
// reference left by a dependent that is gone blocks nothing.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "formats/digest.h"
#include "formats/digest_table.h"
#include "formats/manifest.h"
#include "formats/strong_digest_table.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::Barge;
using testing::Has;
using testing::PointIds;
using testing::Q;
using testing::ReadJson;
using testing::RunOk;
using testing::TempDir;

constexpr uint64_t kSize = 4 << 20;
constexpr uint64_t kCluster = 64 << 10;

class SharedBaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    golden_ = dir_ / "golden.raw";
    clone_ = dir_ / "clone.qcow2";
    target_ = dir_ / "bk";
    testing::WriteFile(golden_, testing::RandomBytes(kSize, 23));
    RunOk("qemu-io -f raw -c 'write -P 0xab 2M 64k' " + Q(golden_) + " >/dev/null");
    // Uncompressed, so that the test can damage one cluster in place.
    RunOk(Barge() + " backup --source " + Q(golden_) + " --target " + Q(target_) + " --name golden --compress none");
    RunOk("qemu-img create -q -f qcow2 -b golden.raw -F raw " + Q(clone_));
    // Two new clusters, one base cluster zeroed, one new one, and one
    // cluster rewritten with the bytes it already had (allocated in the
    // clone, equal to the base: not stored).
    RunOk("qemu-io -f qcow2 -c 'write -P 0x55 512k 128k' -c 'write -z 1M 64k' -c 'write -P 0x66 3M 64k' "
          "-c 'write -P 0xab 2M 64k' " + Q(clone_) + " >/dev/null");
  }

  json BackupClone(const std::string& extra = "") {
    return testing::RunResult(Barge() + " backup --source " + Q(clone_) + " --target " + Q(target_) +
                              " --name clone --base golden --json" + extra);
  }

  std::string GoldenDir() const { return target_ + "/golden"; }
  std::string CloneDir() const { return target_ + "/clone"; }

  // Bytes the top layer of `image` itself holds (data or zero clusters).
  static uint64_t TopLayerBytes(const std::string& image) {
    json map = json::parse(RunOk("qemu-img map --output=json " + Q(image)));
    uint64_t bytes = 0;
    for (const json& e : map) {
      if (e.value("depth", -1) == 0 && (e.value("data", false) || e.value("zero", false)) &&
          e.value("present", true)) {
        bytes += e.at("length").get<uint64_t>();
      }
    }
    return bytes;
  }

  // Damages (in place) the stored bytes of the guest cluster at
  // `guest_offset` of the uncompressed qcow2 `image`.
  static void DamageBaseAt(const std::string& image, uint64_t guest_offset) {
    json map = json::parse(RunOk("qemu-img map --output=json " + Q(image)));
    int64_t host = -1;
    for (const json& e : map) {
      const uint64_t start = e.at("start"), length = e.at("length");
      if (e.value("data", false) && e.contains("offset") && start <= guest_offset && guest_offset < start + length) {
        host = e.at("offset").get<int64_t>() + static_cast<int64_t>(guest_offset - start);
      }
    }
    ASSERT_GE(host, 0) << map.dump();
    std::fstream f(image, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(host + 100);
    f.write("DAMAGED!", 8);
  }

  TempDir dir_;
  std::string golden_, clone_, target_;
};

TEST_F(SharedBaseTest, CloneStoresOnlyItsDifferencesAndQemuReadsIt) {
  json r = BackupClone();
  const std::vector<std::string> golden_ids = PointIds(GoldenDir());
  ASSERT_EQ(golden_ids.size(), 1u);
  EXPECT_EQ(r.at("base"), "../golden@" + golden_ids[0]);
  EXPECT_EQ(r.at("type"), "full");
  const std::string image = r.at("image");
  const json m = ReadJson(r.at("manifest").get<std::string>());
  ASSERT_TRUE(m.contains("base"));
  EXPECT_EQ(m.at("base").at("chain"), "../golden");
  EXPECT_EQ(m.at("base").at("id"), golden_ids[0]);
  EXPECT_EQ(m.at("base").at("image_digest"), ReadJson(GoldenDir() + "/" + golden_ids[0] + ".json").at("image_digest").at("value"));
  EXPECT_TRUE(m.at("parent").is_null());
  // Its own chain: another disk, another chain id.
  EXPECT_NE(m.at("chain_id"), ReadJson(GoldenDir() + "/" + golden_ids[0] + ".json").at("chain_id"));

  // 2 + 1 (zeroed) + 1 clusters differ; the cluster rewritten with equal
  // bytes is not stored.
  EXPECT_EQ(TopLayerBytes(image), 4 * kCluster);
  EXPECT_EQ(m.at("counts").at("zero_clusters"), 1);
  EXPECT_EQ(m.at("counts").at("data_clusters"), 3);

  // qemu-img alone: backing by a relative name, chain intact, same bytes.
  json info = json::parse(RunOk("qemu-img info --output=json " + Q(image)));
  EXPECT_EQ(info.at("backing-filename"), "../golden/" + golden_ids[0] + ".qcow2");
  EXPECT_EQ(info.at("backing-filename-format"), "qcow2");
  RunOk("qemu-img info --backing-chain " + Q(image) + " >/dev/null");
  RunOk("qemu-img check -q " + Q(image));
  RunOk("qemu-img compare -q " + Q(clone_) + " " + Q(image));

  // The base knows: a reference file, and list says it.
  EXPECT_EQ(std::distance(fs::directory_iterator(GoldenDir() + "/.bases"), fs::directory_iterator{}), 1);
  json golden_list = testing::RunResult(Barge() + " list " + Q(GoldenDir()) + " --json");
  EXPECT_EQ(golden_list.at("points").at(0).at("base_of").size(), 1u);
  std::string text = RunOk(Barge() + " list " + Q(GoldenDir()));
  EXPECT_TRUE(Has(text, "base of 1 chain")) << text;

  // Restore flattens through the base; verify covers it.
  const std::string restored = dir_ / "restored.raw";
  RunOk(Barge() + " restore " + Q(CloneDir()) + " --to " + Q(restored) + " --no-sync");
  RunOk("qemu-img compare -q -F raw " + Q(clone_) + " " + Q(restored));
  RunOk(Barge() + " verify " + Q(CloneDir()));

  // Later incrementals stack as usual.
  RunOk("qemu-io -f qcow2 -c 'write -P 0x77 64k 64k' " + Q(clone_) + " >/dev/null");
  const std::string extents = dir_ / "dirty.json";
  testing::WriteExtentsFile(extents, {{64 << 10, 64 << 10}}, kSize);
  RunOk(Barge() + " backup --source " + Q(clone_) + " --target " + Q(target_) +
        " --name clone --incremental --dirty-extents " + Q(extents));
  const std::vector<std::string> clone_ids = PointIds(CloneDir());
  ASSERT_EQ(clone_ids.size(), 2u);
  RunOk("qemu-img compare -q " + Q(clone_) + " " + Q(CloneDir() + "/" + clone_ids[1] + ".qcow2"));
  RunOk(Barge() + " verify " + Q(CloneDir()) + " --all");

  // Merging the clone's chain keeps it over its base: the merged point
  // stores what its layers stored and still names the base.
  RunOk(Barge() + " merge " + Q(CloneDir()) + " --through 1");
  ASSERT_EQ(PointIds(CloneDir()), std::vector<std::string>{clone_ids[1]});
  const std::string merged = CloneDir() + "/" + clone_ids[1] + ".qcow2";
  EXPECT_EQ(json::parse(RunOk("qemu-img info --output=json " + Q(merged))).at("backing-filename"),
            "../golden/" + golden_ids[0] + ".qcow2");
  EXPECT_EQ(TopLayerBytes(merged), 5 * kCluster);
  RunOk("qemu-img check -q " + Q(merged));
  RunOk("qemu-img compare -q " + Q(clone_) + " " + Q(merged));
  RunOk(Barge() + " verify " + Q(CloneDir()));
  EXPECT_EQ(testing::RunResult(Barge() + " list " + Q(GoldenDir()) + " --json").at("points").at(0).at("base_of").size(),
            1u);
}

TEST_F(SharedBaseTest, BasePointIsKeptByForgetAndMerge) {
  BackupClone();
  const std::string base_id = PointIds(GoldenDir())[0];
  // The golden chain goes on: an incremental after its base point.
  RunOk("qemu-io -f raw -c 'write -P 0x12 0 64k' " + Q(golden_) + " >/dev/null");
  const std::string extents = dir_ / "golden-dirty.json";
  testing::WriteExtentsFile(extents, {{0, 64 << 10}}, kSize);
  RunOk(Barge() + " backup --source " + Q(golden_) + " --target " + Q(target_) +
        " --name golden --incremental --dirty-extents " + Q(extents));
  ASSERT_EQ(PointIds(GoldenDir()).size(), 2u);
  const std::string newest = PointIds(GoldenDir())[1];

  // merge through the newer point would fold the base away: refused, said.
  auto merged = testing::Run(Barge() + " merge " + Q(GoldenDir()) + " --through " + newest);
  EXPECT_EQ(merged.exit_code, 1) << merged.output;
  EXPECT_TRUE(Has(merged.output, "base of 1 chain")) << merged.output;
  EXPECT_TRUE(fs::exists(GoldenDir() + "/" + base_id + ".json"));

  // forget keeping only the newest keeps the base too, and says why.
  json f = testing::RunResult(Barge() + " forget " + Q(GoldenDir()) + " --keep-last 1 --json");
  EXPECT_TRUE(Has(f.dump(), "base of 1 chain")) << f.dump(2);
  EXPECT_EQ(PointIds(GoldenDir()).size(), 2u);
  RunOk(Barge() + " verify " + Q(CloneDir()));

  // A dependent that is gone (its folder removed) protects nothing: its
  // stale reference is swept and the point goes.
  fs::remove_all(CloneDir());
  RunOk(Barge() + " forget " + Q(GoldenDir()) + " --keep-last 1");
  EXPECT_EQ(PointIds(GoldenDir()), std::vector<std::string>{newest});
  EXPECT_TRUE(fs::is_empty(GoldenDir() + "/.bases"));
}

TEST_F(SharedBaseTest, StaleReferenceOfAKilledBackupBlocksNothing) {
  // What a --base backup killed after writing its reference (before its
  // commit) leaves: a reference whose dependent never committed a point.
  fs::create_directories(CloneDir());
  fs::create_directories(GoldenDir() + "/.bases");
  const std::string base_id = PointIds(GoldenDir())[0];
  testing::WriteText(GoldenDir() + "/.bases/0123456789abcdef0123456789abcdef.json",
                     json({{"format", "barge-base-ref"},
                           {"version", 1},
                           {"dependent", "../clone"},
                           {"chain_id", "0123456789abcdef0123456789abcdef"},
                           {"base_id", base_id}})
                         .dump());
  json golden_list = testing::RunResult(Barge() + " list " + Q(GoldenDir()) + " --json");
  EXPECT_TRUE(golden_list.at("points").at(0).at("base_of").empty());
  RunOk("qemu-io -f raw -c 'write -P 0x12 0 64k' " + Q(golden_) + " >/dev/null");
  const std::string extents = dir_ / "golden-dirty.json";
  testing::WriteExtentsFile(extents, {{0, 64 << 10}}, kSize);
  RunOk(Barge() + " backup --source " + Q(golden_) + " --target " + Q(target_) +
        " --name golden --incremental --dirty-extents " + Q(extents));
  RunOk(Barge() + " merge " + Q(GoldenDir()) + " --through 1");
  EXPECT_EQ(PointIds(GoldenDir()).size(), 1u);
  EXPECT_TRUE(fs::is_empty(GoldenDir() + "/.bases"));
  // A backup over the merged point works as over any.
  BackupClone();
  RunOk(Barge() + " verify " + Q(CloneDir()));
}

TEST_F(SharedBaseTest, DamagedBaseFailsTheDependentsVerifyNamingTheBase) {
  BackupClone();
  const std::string base_image = GoldenDir() + "/" + PointIds(GoldenDir())[0] + ".qcow2";
  // A cluster the clone does not override (at 2.5 MiB): damage its bytes.
  DamageBaseAt(base_image, 2560u << 10);
  auto v = testing::Run(Barge() + " verify " + Q(CloneDir()));
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_TRUE(Has(v.output, base_image)) << v.output;
}

// "verify of a chain verifies its base too": the base point is verified as
// a point of its own chain, and said so; a base cluster that the clone
// overrides (never read through the clone) is still checked.
TEST_F(SharedBaseTest, VerifyOfTheCloneVerifiesItsBasePointAndSaysSo) {
  BackupClone();
  const std::string base_id = PointIds(GoldenDir())[0];
  json ok = testing::RunResult(Barge() + " verify " + Q(CloneDir()) + " --json");
  ASSERT_EQ(ok.at("bases").size(), 1u) << ok.dump(2);
  EXPECT_EQ(ok.at("bases").at(0).at("id"), base_id);
  EXPECT_EQ(ok.at("bases").at(0).at("chain"), fs::weakly_canonical(GoldenDir()).string());
  EXPECT_EQ(ok.at("bases").at(0).at("result"), "passed");
  EXPECT_TRUE(Has(RunOk(Barge() + " verify " + Q(CloneDir())), "verified base " + base_id)) << "text";
  // The golden chain's own verify has no base.
  EXPECT_TRUE(testing::RunResult(Barge() + " verify " + Q(GoldenDir()) + " --json").at("bases").empty());

  // The clone overrides 512 KiB..640 KiB: damage the base there.
  const std::string base_image = GoldenDir() + "/" + base_id + ".qcow2";
  DamageBaseAt(base_image, 512u << 10);
  auto v = testing::Run(Barge() + " verify " + Q(CloneDir()));
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_TRUE(Has(v.output, "base " + base_id)) << v.output;
  EXPECT_TRUE(Has(v.output, base_image)) << v.output;
  // The clone's own data still restores (it never reads that cluster).
  RunOk(Barge() + " restore " + Q(CloneDir()) + " --to " + Q(dir_ / "r.raw") + " --no-sync");
  RunOk("qemu-img compare -q -F raw " + Q(clone_) + " " + Q(dir_ / "r.raw"));
}

// The clone is compared with its base by SHA-256, never by xxh3: a base
// whose xxh3 entry for a cluster the clone changed is forged to the clone's
// bytes (what a guest would need an XXH3 collision for) still gets that
// cluster stored. The golden chain keeps a strong table (--changed-by
// digests), so the clone's backup does not read the base at all.
TEST_F(SharedBaseTest, ForgedXxh3OfTheBaseDoesNotHideAChange) {
  fs::remove_all(GoldenDir());
  RunOk(Barge() + " backup --source " + Q(golden_) + " --target " + Q(target_) +
        " --name golden --compress none --changed-by digests");
  const std::string id = PointIds(GoldenDir())[0];
  const uint64_t forged_cluster = (512u << 10) / kCluster;  // the clone wrote 0x55 there
  std::vector<std::byte> clone_bytes(kCluster, std::byte{0x55});
  const std::string digests = GoldenDir() + "/" + id + ".digests";
  auto table = formats::DecodeDigestTable(testing::ReadFile(digests));
  ASSERT_TRUE(table.ok());
  for (auto& e : table->entries) {
    if (e.cluster_index == forged_cluster) e.digest = formats::HashCluster(clone_bytes, kCluster);
  }
  testing::WriteFile(digests, formats::EncodeDigestTable(*table));
  auto m = formats::DecodeManifest(testing::Slurp(testing::ManifestPath(GoldenDir(), id)));
  ASSERT_TRUE(m.ok());
  m->image_digest = formats::ImageDigestOf(*table, m->image_digest_algorithm);
  auto text = formats::EncodeManifest(*m);
  ASSERT_TRUE(text.ok());
  testing::WriteText(testing::ManifestPath(GoldenDir(), id), *text);
  auto strong = formats::DecodeStrongDigestTable(testing::ReadFile(GoldenDir() + "/" + m->strong_digest_table));
  ASSERT_TRUE(strong.ok());
  strong->image_digest = m->image_digest;  // bound to the forged point; entries untouched
  testing::WriteFile(GoldenDir() + "/" + m->strong_digest_table, formats::EncodeStrongDigestTable(*strong));

  json r = BackupClone();
  const std::string image = r.at("image");
  EXPECT_EQ(TopLayerBytes(image), 4 * kCluster);
  json map = json::parse(RunOk("qemu-img map --output=json " + Q(image)));
  bool stored = false;
  for (const json& e : map) {
    const uint64_t start = e.at("start"), length = e.at("length");
    if (e.value("depth", -1) == 0 && start <= forged_cluster * kCluster && forged_cluster * kCluster < start + length) {
      stored = e.value("data", false);
    }
  }
  EXPECT_TRUE(stored) << map.dump();
  RunOk("qemu-img compare -q " + Q(clone_) + " " + Q(image));
  // The clone's point keeps the whole source's SHA-256 table: its first
  // digest incremental reads no point of the chain.
  const json cm = ReadJson(r.at("manifest").get<std::string>());
  EXPECT_FALSE(cm.value("strong_digest_table", "").empty()) << cm.dump(2);
  json inc = testing::RunResult(Barge() + " backup --source " + Q(clone_) + " --target " + Q(target_) +
                                " --name clone --incremental --changed-by digests --json");
  EXPECT_EQ(inc.at("digest_changed_clusters"), 0);
  EXPECT_FALSE(inc.contains("strong_computed_bytes")) << inc.dump(2);
}

TEST_F(SharedBaseTest, MovedOrMissingBaseIsAClearError) {
  BackupClone();
  fs::rename(GoldenDir(), target_ + "/golden-moved");
  auto r = testing::Run(Barge() + " restore " + Q(CloneDir()) + " --to " + Q(dir_ / "out.raw") + " --no-sync");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, "NotFound")) << r.output;
  EXPECT_TRUE(Has(r.output, GoldenDir())) << r.output;
  auto v = testing::Run(Barge() + " verify " + Q(CloneDir()));
  EXPECT_NE(v.exit_code, 0) << v.output;
  EXPECT_TRUE(Has(v.output, GoldenDir())) << v.output;
  // `list` of the clone showed its points without a word: it warns that
  // the base is gone (and lists the points all the same).
  auto l = testing::Run(Barge() + " list " + Q(CloneDir()));
  EXPECT_EQ(l.exit_code, 0) << l.output;
  EXPECT_TRUE(Has(l.output, "warning")) << l.output;
  EXPECT_TRUE(Has(l.output, "cannot be restored")) << l.output;
  EXPECT_TRUE(Has(l.output, GoldenDir())) << l.output;
  // Back in its place, all is well again.
  fs::rename(target_ + "/golden-moved", GoldenDir());
  RunOk(Barge() + " verify " + Q(CloneDir()));
  auto back = testing::Run(Barge() + " list " + Q(CloneDir()));
  EXPECT_EQ(back.exit_code, 0) << back.output;
  EXPECT_FALSE(Has(back.output, "cannot be restored")) << back.output;

  // A base of another size, or naming itself, is refused before anything is written.
  testing::WriteFile(dir_ / "small.raw", testing::RandomBytes(kSize / 2, 3));
  auto small = testing::Run(Barge() + " backup --source " + Q(dir_ / "small.raw") + " --target " + Q(target_) +
                            " --name small --base golden");
  EXPECT_EQ(small.exit_code, 1) << small.output;
  EXPECT_FALSE(fs::exists(target_ + "/small"));
  auto none = testing::Run(Barge() + " backup --source " + Q(clone_) + " --target " + Q(target_) +
                           " --name other --base nosuch");
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_TRUE(Has(none.output, target_ + "/nosuch")) << none.output;
}

// `replicate` and the image catalog: a backing image in the catalog named
// as the base directly (`--base image:NAME`). Its first use backs a ready
// copy up as chain NAME of the target (marked with the image's SHA-512);
// later clones stand on that same point; qemu-img reads each clone's
// chain by its relative backing name; verify and restore go through it;
// the point is protected as any base; an image not in the catalog, or a
// chain of that name that is not the image's, is a clear error.
TEST_F(SharedBaseTest, CatalogImageIsNamedAsTheBaseDirectly) {
  const std::string catalog = dir_ / "catalog.db";
  const std::string disk1 = dir_ / "disk1";
  const std::string disk2 = dir_ / "disk2";
  const std::string target = dir_ / "bk-cat";
  fs::create_directories(disk1);
  fs::create_directories(disk2);
  RunOk(Barge() + " image add golden --catalog " + Q(catalog) + " --source " + Q(golden_) + " --disk " + Q(disk1));
  auto backup = [&](const std::string& name) {
    return testing::RunResult(Barge() + " backup --source " + Q(clone_) + " --target " + Q(target) + " --name " +
                              name + " --base image:golden --catalog " + Q(catalog) + " --json");
  };
  json first = backup("clone1");
  ASSERT_TRUE(first.contains("base_image")) << first.dump(2);
  EXPECT_EQ(first.at("base_image").at("imported"), true);
  EXPECT_EQ(first.at("base_image").at("copy"), disk1 + "/golden.raw");
  const std::string golden_dir = target + "/golden";
  const std::vector<std::string> golden_ids = PointIds(golden_dir);
  ASSERT_EQ(golden_ids.size(), 1u);
  EXPECT_EQ(first.at("base"), "../golden@" + golden_ids[0]);
  const json marker = ReadJson(golden_dir + "/.catalog-image.json");
  EXPECT_EQ(marker.at("image"), "golden");
  EXPECT_EQ(marker.at("point"), golden_ids[0]);
  EXPECT_EQ(marker.at("sha512"), ReadJson(disk1 + "/golden.raw.sha512.json").at("sha512"));

  // The clone's point holds only its differences and reads unaided.
  const std::string image = first.at("image");
  EXPECT_EQ(TopLayerBytes(image), 4 * kCluster);
  EXPECT_EQ(json::parse(RunOk("qemu-img info --output=json " + Q(image))).at("backing-filename"),
            "../golden/" + golden_ids[0] + ".qcow2");
  RunOk("qemu-img check -q " + Q(image));
  RunOk("qemu-img compare -q " + Q(clone_) + " " + Q(image));
  RunOk(Barge() + " verify " + Q(target + "/clone1"));
  const std::string restored = dir_ / "restored-cat.raw";
  RunOk(Barge() + " restore " + Q(target + "/clone1") + " --to " + Q(restored) + " --no-sync");
  RunOk("qemu-img compare -q -F raw " + Q(clone_) + " " + Q(restored));

  // A second clone stands on the same point: the image is not read again.
  RunOk(Barge() + " image sync golden --catalog " + Q(catalog) + " --disks " + Q(disk2));
  json second = backup("clone2");
  EXPECT_EQ(second.at("base_image").at("imported"), false);
  EXPECT_EQ(second.at("base_image").at("point"), golden_ids[0]);
  EXPECT_EQ(PointIds(golden_dir).size(), 1u);
  RunOk("qemu-img compare -q " + Q(clone_) + " " + Q(second.at("image").get<std::string>()));
  EXPECT_TRUE(Has(RunOk(Barge() + " list " + Q(golden_dir)), "base of 2 chains"));

  // The image's chain goes on (a later point); forget keeping only the
  // newest keeps the base point, and says why.
  RunOk(Barge() + " backup --source " + Q(disk1 + "/golden.raw") + " --source-format raw --target " + Q(target) +
        " --name golden --incremental --changed-by digests");
  ASSERT_EQ(PointIds(golden_dir).size(), 2u);
  json f = testing::RunResult(Barge() + " forget " + Q(golden_dir) + " --keep-last 1 --json");
  EXPECT_TRUE(Has(f.dump(), "base of 2 chains")) << f.dump(2);
  EXPECT_EQ(PointIds(golden_dir).size(), 2u);
  // The catalog's own removal (cleanup of unused copies) may drop a copy:
  // the base is the chain's point, not the copy.
  RunOk(Barge() + " image cleanup --catalog " + Q(catalog) + " --unused-for 0");
  RunOk(Barge() + " verify " + Q(target + "/clone2"));
  // A third clone still stands on the marked point.
  EXPECT_EQ(backup("clone3").at("base_image").at("point"), golden_ids[0]);

  // Errors: an image the catalog lacks; a chain of the image's name that is
  // not the image's.
  auto none = testing::Run(Barge() + " backup --source " + Q(clone_) + " --target " + Q(target) +
                           " --name clone4 --base image:nosuch --catalog " + Q(catalog));
  EXPECT_EQ(none.exit_code, 1) << none.output;
  // One line, the flag named once: "barge: NotFound: --base image:nosuch: no image 'nosuch' in the catalog".
  EXPECT_TRUE(Has(none.output, "NotFound: --base image:nosuch: no image 'nosuch' in the catalog")) << none.output;
  EXPECT_EQ(none.output.find("image:nosuch"), none.output.rfind("image:nosuch")) << none.output;
  EXPECT_FALSE(fs::exists(target + "/clone4"));
  auto other = testing::Run(Barge() + " backup --source " + Q(clone_) + " --target " + Q(target_) +
                            " --name clone4 --base image:golden --catalog " + Q(catalog));
  EXPECT_EQ(other.exit_code, 1) << other.output;
  EXPECT_TRUE(Has(other.output, "not made from the catalog's image")) << other.output;
  EXPECT_FALSE(fs::exists(target_ + "/clone4"));
}

}  // namespace
}  // namespace barge
