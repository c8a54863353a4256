// A 4 TiB thin raw disk holding a few MiB (issue 24): full backup, an
// incremental from an extents file and one by digests, verify, restore to
// raw and to qcow2, and a merge are correct, and holes stay holes. Timings are
// bench/sparse_cost.sh's; this test asserts what was written.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "tests/incremental_support.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using namespace incremental_testing;
using testing::TempDir;

constexpr uint64_t kTiB = kMiB * kMiB;
constexpr uint64_t kDiskSize = 4 * kTiB;

uint64_t AllocatedBytes(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return uint64_t(st.st_blocks) * 512;
}

void WriteRandom(const std::string& disk, uint64_t offset_mib, uint64_t mib) {
  RunOk("dd if=/dev/urandom of=" + Q(disk) + " bs=1M seek=" + std::to_string(offset_mib) +
        " count=" + std::to_string(mib) + " conv=notrunc status=none");
}

TEST(ThinDiskCliTest, FourTebibyteDiskWithAFewMebibytes) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir tmp;
  const std::string disk = tmp / "thin.raw";
  RunOk("truncate -s " + std::to_string(kDiskSize) + " " + Q(disk));
  const uint64_t tib_mib = kTiB / kMiB;
  WriteRandom(disk, 0, 2);
  WriteRandom(disk, tib_mib + 7, 3);
  WriteRandom(disk, 3 * tib_mib, 1);
  WriteRandom(disk, 4 * tib_mib - 1, 1);  // the last MiB
  const std::string target = tmp / "t";
  const std::string dir = target + "/vda";
  const std::string backup = Barge() + " backup --source " + Q(disk) + " --source-format raw --target " +
                             Q(target) + " --name vda";
  RunOk(backup + " --changed-by digests");

  // 1 MiB from an extents file, then 1 MiB found by digests.
  WriteRandom(disk, 2 * tib_mib, 1);
  testing::WriteExtentsFile(tmp / "x.json", {{2 * kTiB, kMiB}}, kDiskSize);
  RunOk(backup + " --incremental --dirty-extents " + Q(tmp / "x.json"));
  WriteRandom(disk, 3 * tib_mib + 5, 1);
  RunOk(backup + " --incremental --changed-by digests");

  std::vector<std::string> ids = PointIds(dir);
  ASSERT_EQ(ids.size(), 3u);
  for (const std::string& id : ids) {
    const std::string image = dir + "/" + id + ".qcow2";
    RunOk("qemu-img check -q " + Q(image));
    EXPECT_LT(fs::file_size(image), 32 * kMiB) << id;
  }
  RunOk(Barge() + " verify --all " + Q(dir));

  // Raw restore: identical to the disk (qemu-img compares allocation first,
  // so holes cost nothing), and sparse.
  const std::string raw = tmp / "restored.raw";
  RunOk(Barge() + " restore " + Q(dir) + " --to " + Q(raw));
  EXPECT_EQ(fs::file_size(raw), kDiskSize);
  EXPECT_LT(AllocatedBytes(raw), 64 * kMiB);
  RunOk("qemu-img compare -q -f raw -F raw " + Q(disk) + " " + Q(raw));
  // The first point, through the chain, still matches what it saw there.
  const std::string raw0 = tmp / "restored0.raw";
  RunOk(Barge() + " restore " + Q(dir) + " --at 0 --to " + Q(raw0));
  testing::CommandResult differs = testing::Run("qemu-img compare -q -f raw -F raw " + Q(disk) + " " + Q(raw0));
  EXPECT_EQ(differs.exit_code, 1) << "point 0 predates the two changes";

  // qcow2 restore: unallocated where the disk has holes.
  const std::string q = tmp / "restored.qcow2";
  RunOk(Barge() + " restore " + Q(dir) + " --to " + Q(q) + " -O qcow2");
  RunOk("qemu-img check -q " + Q(q));
  EXPECT_LT(fs::file_size(q), 64 * kMiB);
  RunOk("qemu-img compare -q -f raw -F qcow2 " + Q(disk) + " " + Q(q));

  // Merging the full and the first incremental writes a full that stays
  // thin, and the chain still restores the disk.
  RunOk(Barge() + " merge " + Q(dir) + " --through 1");
  ids = PointIds(dir);
  ASSERT_EQ(ids.size(), 2u);
  const std::string merged = dir + "/" + ids[0] + ".qcow2";
  RunOk("qemu-img check -q " + Q(merged));
  EXPECT_LT(fs::file_size(merged), 32 * kMiB);
  RunOk(Barge() + " verify --all " + Q(dir));
  const std::string raw2 = tmp / "restored2.raw";
  RunOk(Barge() + " restore " + Q(dir) + " --to " + Q(raw2));
  RunOk("qemu-img compare -q -f raw -F raw " + Q(disk) + " " + Q(raw2));
}

}  // namespace
}  // namespace barge
