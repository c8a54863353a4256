// Incremental backups of a qcow2 disk tracked by a persistent bitmap, read
// three ways (the NBD export's qemu:dirty-bitmap context, the bitmap read
// from the file, an extents file): identical layers, and every point
// restores byte-identical through barge and through qemu-img.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/incremental_support.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using namespace incremental_testing;
using testing::TempDir;

constexpr uint64_t kDiskSize = 16 * kMiB;

// Changes before the full, then five increments: data, zeroes, discards,
// unaligned writes, the last cluster.
const std::vector<Op> kInitial = {{Op::kWrite, 0, 2 * kMiB, 0x10},
                                  {Op::kWrite, 5 * kMiB, 1 * kMiB, 0x20},
                                  {Op::kWrite, 12 * kMiB, 3 * kMiB, 0x30}};
const std::vector<std::vector<Op>> kSteps = {
    {{Op::kWrite, 64 * kKiB, 4 * kKiB, 0x41}, {Op::kWrite, 6 * kMiB, 128 * kKiB, 0x42}},
    {{Op::kZero, 12 * kMiB, 1 * kMiB}, {Op::kWrite, 10 * kMiB, 512 * kKiB, 0x43}},
    {{Op::kDiscard, 0, 1 * kMiB}, {Op::kWrite, 15 * kMiB, 1 * kMiB, 0x44}},
    {{Op::kWrite, 100000, 70000, 0x45}, {Op::kZero, 5 * kMiB, 64 * kKiB}},
    {{Op::kWrite, 2 * kMiB, 2 * kMiB, 0x46}, {Op::kDiscard, 13 * kMiB, 2 * kMiB}},
};

void SaveSource(const std::string& image, const std::string& out) {
  RunOk("qemu-img convert -f qcow2 -O raw " + Q(image) + " " + Q(out));
}

void ExpectEveryPointRestores(const TempDir& tmp, const std::string& chain,
                              const std::vector<std::string>& saved) {
  std::vector<std::string> ids = PointIds(chain);
  ASSERT_EQ(ids.size(), saved.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    std::string out = tmp / ("restored" + std::to_string(k) + ".raw");
    // Every other point without the final fsync: same bytes either way.
    RunOk(Barge() + " restore " + Q(chain) + " --at " + std::to_string(k) + " --to " + Q(out) +
          (k % 2 ? " --no-sync" : ""));
    EXPECT_TRUE(SameFile(out, saved[k])) << "barge restore of point " << k;
    fs::remove(out);
    RunOk("qemu-img convert -f qcow2 -O raw " + Q(chain + "/" + ids[k] + ".qcow2") + " " + Q(out));
    EXPECT_TRUE(SameFile(out, saved[k])) << "qemu-img convert of point " << k;
    fs::remove(out);
  }
}

TEST(IncrementalChainTest, NbdBitmapAndExtentsFileGiveIdenticalLayers) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  BARGE_REQUIRE_TOOL("qemu-nbd");
  TempDir tmp;
  const std::string image = tmp / "disk.qcow2";
  const std::string via_nbd = tmp / "nbd", via_bitmap = tmp / "bitmap", via_extents = tmp / "extents";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " " + std::to_string(kDiskSize));
  ApplyOps(image, kInitial);
  std::vector<std::string> saved;
  saved.push_back(tmp / "point0.raw");
  SaveSource(image, saved.back());
  {
    NbdExport nbd(tmp.path().string(), "-r -f qcow2", image);
    RunOk(Barge() + " backup --source " + Q(nbd.uri()) + " --target " + Q(via_nbd) + " --name vda");
  }
  for (const auto& target : {via_bitmap, via_extents}) {
    RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(target) + " --name vda");
  }
  RunOk("qemu-img bitmap --add --enable " + Q(image) + " cbt0");

  for (size_t k = 0; k < kSteps.size(); ++k) {
    ApplyOps(image, kSteps[k]);
    saved.push_back(tmp / ("point" + std::to_string(k + 1) + ".raw"));
    SaveSource(image, saved.back());
    {
      NbdExport nbd(tmp.path().string(), "-r -t -f qcow2 -B cbt0", image);
      RunOk(Barge() + " backup --source " + Q(nbd.uri()) + " --target " + Q(via_nbd) +
            " --name vda --incremental --dirty-bitmap cbt0");
    }
    RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(via_bitmap) +
          " --name vda --incremental --dirty-bitmap cbt0");
    std::string extents = tmp / "dirty.json";
    WriteExtentsFile(extents, kSteps[k], kDiskSize);
    RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(via_extents) +
          " --name vda --incremental --dirty-extents " + Q(extents));
    RunOk("qemu-img bitmap --clear " + Q(image) + " cbt0");
  }

  ExpectEveryPointRestores(tmp, via_nbd + "/vda", saved);
  std::vector<std::string> ids[3] = {PointIds(via_nbd + "/vda"), PointIds(via_bitmap + "/vda"),
                                     PointIds(via_extents + "/vda")};
  const std::string dirs[3] = {via_nbd + "/vda", via_bitmap + "/vda", via_extents + "/vda"};
  for (size_t k = 0; k < saved.size(); ++k) {
    std::string a = dirs[0] + "/" + ids[0][k];
    RunOk("qemu-img check -q " + Q(a + ".qcow2"));
    for (int other : {1, 2}) {
      std::string b = dirs[other] + "/" + ids[other][k];
      // Same guest contents and the same allocation, layer by layer.
      RunOk("qemu-img compare -q -s " + Q(LayerAlone(a + ".qcow2")) + " " +
            Q(LayerAlone(b + ".qcow2")));
      EXPECT_TRUE(SameFile(a + ".digests", b + ".digests")) << "point " << k << " source " << other;
      std::string map_a = RunOk("qemu-img map --output=json " + Q(LayerAlone(a + ".qcow2")));
      std::string map_b = RunOk("qemu-img map --output=json " + Q(LayerAlone(b + ".qcow2")));
      // Offsets may differ; data/zero/allocation per extent must not.
      auto strip = [](std::string m) {
        auto j = nlohmann::json::parse(m, nullptr, false);
        for (auto& e : j) e.erase("offset");
        return j.dump();
      };
      EXPECT_EQ(strip(map_a), strip(map_b)) << "point " << k << " source " << other;
    }
  }
  RunOk(Barge() + " verify --all " + Q(dirs[1]));
}

// Bitmap granularities finer and coarser than the backup's 64 KiB clusters:
// a partially dirty cluster is read whole; a coarse bit widens the work.
TEST(IncrementalChainTest, BitmapGranularityFinerAndCoarserThanClusters) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  for (uint64_t granularity : {uint64_t{512}, 4 * kKiB, 1 * kMiB}) {
    SCOPED_TRACE("granularity " + std::to_string(granularity));
    TempDir tmp;
    const std::string image = tmp / "disk.qcow2";
    RunOk("qemu-img create -q -f qcow2 " + Q(image) + " 8M");
    ApplyOps(image, {{Op::kWrite, 0, 3 * kMiB, 0x21}});
    std::vector<std::string> saved = {tmp / "p0.raw"};
    SaveSource(image, saved[0]);
    RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(tmp / "t") + " --name vda");
    RunOk("qemu-img bitmap --add --enable -g " + std::to_string(granularity) + " " + Q(image) +
          " cbt0");
    // 512 bytes inside cluster 1 and 3 KiB straddling clusters 40 and 41.
    const std::vector<std::vector<Op>> steps = {
        {{Op::kWrite, 64 * kKiB + 1024, 512, 0x31}},
        {{Op::kWrite, 41 * 64 * kKiB - 1024, 3 * kKiB, 0x32}},
    };
    const uint64_t expected_dirty[2] = {granularity < 64 * kKiB ? 64 * kKiB : granularity,
                                        granularity < 64 * kKiB ? 128 * kKiB : granularity};
    for (size_t k = 0; k < steps.size(); ++k) {
      ApplyOps(image, steps[k]);
      saved.push_back(tmp / ("p" + std::to_string(k + 1) + ".raw"));
      SaveSource(image, saved.back());
      nlohmann::json r = RunResult(Barge() + " backup --json --source " + Q(image) + " --target " +
                                   Q(tmp / "t") + " --name vda --incremental --dirty-bitmap cbt0");
      EXPECT_EQ(r.value("dirty_bytes", uint64_t{0}), expected_dirty[k]) << r.dump();
      RunOk("qemu-img bitmap --clear " + Q(image) + " cbt0");
    }
    ExpectEveryPointRestores(tmp, tmp / "t/vda", saved);
  }
}

TEST(IncrementalChainTest, DiskSizeChangeIsRefusedAndWritesNothing) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir tmp;
  const std::string image = tmp / "disk.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " 4M");
  RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(tmp / "t") + " --name vda");
  RunOk("qemu-img resize -q " + Q(image) + " 6M");
  std::string extents = tmp / "dirty.json";
  WriteExtentsFile(extents, {{Op::kWrite, 0, 4096, 1}}, 6 * kMiB);
  auto listing = [&]() {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(tmp / "t/vda")) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  };
  auto before = listing();
  std::string out = RunOk(Barge() + " backup --source " + Q(image) + " --target " + Q(tmp / "t") +
                              " --name vda --incremental --dirty-extents " + Q(extents),
                          1);
  EXPECT_NE(out.find("size changed"), std::string::npos) << out;
  EXPECT_NE(out.find("take a full backup"), std::string::npos) << out;
  EXPECT_EQ(listing(), before);
}

}  // namespace
}  // namespace barge
