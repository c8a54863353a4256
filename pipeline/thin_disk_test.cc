// Thin disks (issue 24): runs of holes cost nothing per cluster in backup,
// verify and restore; points whose image digest uses the version 1 fold
// (written before the zero-run fold) still verify, restore and take
// incrementals.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "formats/digest_table.h"
#include "formats/manifest.h"
#include "pipeline/backup.h"
#include "pipeline/chain.h"
#include "pipeline/restore.h"
#include "tests/testing/backup_testing.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;

CopyOptions Knobs() {
  CopyOptions o;
  o.memory_bytes = 8 * kMiB;
  o.threads = 2;
  return o;
}

Status Backup(const std::string& raw, const std::string& target, std::optional<RangeList> dirty) {
  return testing::BackupRawFile(raw, target, std::move(dirty));
}

// Writes `data` at `offset` of a file (made sparse with `size` when new).
void WriteAt(const std::string& path, uint64_t size, uint64_t offset, const std::vector<std::byte>& data) {
  if (!fs::exists(path)) {
    std::ofstream(path).close();
    fs::resize_file(path, size);
  }
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

std::vector<std::byte> ReadAt(const std::string& path, uint64_t offset, uint64_t length) {
  std::vector<std::byte> out(length);
  std::ifstream f(path, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(length));
  return out;
}

uint64_t AllocatedBytes(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return uint64_t(st.st_blocks) * 512;
}

Result<VerifyReport> VerifyAll(const std::string& dir) {
  VerifyRequest req;
  req.path = dir;
  req.all_points = true;
  req.copy = Knobs();
  return RunVerify(PosixEnv(), req);
}

Result<RestoreResult> Restore(const std::string& dir, const std::string& at, const std::string& out,
                              const std::string& format = "raw") {
  RestoreRequest req;
  req.chain_dir = dir;
  req.at = at;
  req.destination = out;
  req.output_format = format;
  req.force = true;
  req.copy = Knobs();
  return RunRestore(PosixEnv(), req);
}

// A 64 GiB disk holding 3 MiB: the copy never walks its million clusters
// one by one (zero runs travel as one chunk), and backup, verify and
// restore are correct: data where it was, zeros (and holes) elsewhere.
TEST(ThinDiskTest, BackupVerifyRestoreOfAHugeThinDisk) {
  TempDir tmp;
  const std::string raw = tmp / "thin.raw";
  const uint64_t size = 64 * kGiB;
  const std::vector<uint64_t> at = {0, 17 * kGiB + 3 * 65536, size - kMiB};
  for (size_t i = 0; i < at.size(); ++i) WriteAt(raw, size, at[i], testing::RandomBytes(kMiB, 10 + i));
  ASSERT_TRUE(Backup(raw, tmp.path().string(), std::nullopt).ok());
  const std::string dir = tmp / "d";
  auto chain = LoadChainFolder(PosixEnv(), dir);
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(chain->points[0].manifest.image_digest_algorithm, formats::ImageDigestAlgorithm::kZeroRunFold);
  EXPECT_EQ(chain->points[0].manifest.data_clusters, 3 * kMiB / 65536);

  auto report = VerifyAll(dir);
  ASSERT_TRUE(report.ok()) << report.error().ToString();
  EXPECT_TRUE(report->ok()) << report->failure->ToString();

  const std::string out = tmp / "out.raw";
  auto restored = Restore(dir, "", out);
  ASSERT_TRUE(restored.ok()) << restored.error().ToString();
  EXPECT_EQ(fs::file_size(out), size);
  EXPECT_LT(AllocatedBytes(out), 64 * kMiB);  // holes stay holes
  for (size_t i = 0; i < at.size(); ++i) {
    EXPECT_EQ(ReadAt(out, at[i], kMiB), testing::RandomBytes(kMiB, 10 + i)) << "run " << i;
  }
  EXPECT_EQ(ReadAt(out, 40 * kGiB, kMiB), std::vector<std::byte>(kMiB));

  const std::string q = tmp / "out.qcow2";
  auto as_qcow2 = Restore(dir, "", q, "qcow2");
  ASSERT_TRUE(as_qcow2.ok()) << as_qcow2.error().ToString();
  EXPECT_LT(fs::file_size(q), 64 * kMiB);

  // An incremental of 1 MiB on top folds its parent's digests by entries.
  WriteAt(raw, size, 30 * kGiB, testing::RandomBytes(kMiB, 99));
  ASSERT_TRUE(Backup(raw, tmp.path().string(), RangeList{{30 * kGiB, kMiB}}).ok());
  report = VerifyAll(dir);
  ASSERT_TRUE(report.ok()) << report.error().ToString();
  EXPECT_TRUE(report->ok()) << report->failure->ToString();
  restored = Restore(dir, "", out);
  ASSERT_TRUE(restored.ok()) << restored.error().ToString();
  EXPECT_EQ(ReadAt(out, 30 * kGiB, kMiB), testing::RandomBytes(kMiB, 99));
}

// A digest table that lists data where the image has a hole: verify, which
// skips the run, still finds the missing cluster.
TEST(ThinDiskTest, HoleWhereTheDigestsSayDataIsCorruption) {
  TempDir tmp;
  const std::string raw = tmp / "thin.raw";
  WriteAt(raw, 4 * kGiB, kGiB, testing::RandomBytes(kMiB, 3));
  ASSERT_TRUE(Backup(raw, tmp.path().string(), std::nullopt).ok());
  const std::string dir = tmp / "d";
  auto chain = LoadChainFolder(PosixEnv(), dir);
  ASSERT_TRUE(chain.ok());
  const formats::BackupManifest& m = chain->points[0].manifest;
  // Claim one more data cluster in the middle of the hole, digest and
  // image digest made consistent, as a damaged image would look.
  const std::string table_path = chain->PathOf(m.digest_table);
  std::vector<std::byte> bytes = testing::ReadFile(table_path);
  auto table = formats::DecodeDigestTable(bytes);
  ASSERT_TRUE(table.ok());
  const uint64_t missing = 2 * kGiB / 65536;
  table->entries.push_back({missing, {1, 2}});
  testing::WriteFile(table_path, formats::EncodeDigestTable(*table));
  formats::BackupManifest changed = m;
  changed.image_digest = formats::ImageDigestOf(*table, m.image_digest_algorithm);
  std::string text = formats::EncodeManifest(changed).value();
  testing::WriteFile(chain->points[0].manifest_path, std::vector<std::byte>(
      reinterpret_cast<const std::byte*>(text.data()), reinterpret_cast<const std::byte*>(text.data()) + text.size()));

  auto report = VerifyAll(dir);
  ASSERT_TRUE(report.ok()) << report.error().ToString();
  ASSERT_FALSE(report->ok());
  EXPECT_EQ(report->failure->code(), ErrorCode::kCorruption);
  EXPECT_NE(report->failure->ToString().find("cluster " + std::to_string(missing)), std::string::npos)
      << report->failure->ToString();
  auto restored = Restore(dir, "", tmp / "out.raw");
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.error().code(), ErrorCode::kCorruption);
}

// Rewrites the manifests of `dir` as barge wrote them before the zero-run
// fold: algorithm xxh3-128-cluster-fold and the version 1 image digest of
// each point (parents' digests as their children record them).
void MakeVersion1(const std::string& dir) {
  auto chain = LoadChainFolder(PosixEnv(), dir);
  ASSERT_TRUE(chain.ok()) << chain.error().ToString();
  std::vector<formats::DigestTable> tables;
  std::vector<formats::Digest128> v1;
  for (const ChainPoint& p : chain->points) {
    auto table = formats::DecodeDigestTable(testing::ReadFile(chain->PathOf(p.manifest.digest_table)));
    ASSERT_TRUE(table.ok());
    tables.push_back(*table);
    std::vector<const formats::DigestTable*> layers;
    for (const auto& t : tables) layers.push_back(&t);
    auto merged = formats::MergeDigestTables(layers);
    ASSERT_TRUE(merged.ok());
    v1.push_back(formats::ImageDigestOf(*merged, formats::ImageDigestAlgorithm::kClusterFold));
  }
  for (size_t i = 0; i < chain->points.size(); ++i) {
    formats::BackupManifest m = chain->points[i].manifest;
    ASSERT_NE(m.image_digest, v1[i]);  // the two folds differ
    m.image_digest_algorithm = formats::ImageDigestAlgorithm::kClusterFold;
    m.image_digest = v1[i];
    if (m.parent) m.parent->image_digest = v1[i - 1];
    std::string text = formats::EncodeManifest(m).value();
    ASSERT_NE(text.find("xxh3-128-cluster-fold"), std::string::npos);
    testing::WriteFile(chain->points[i].manifest_path,
                       std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                              reinterpret_cast<const std::byte*>(text.data()) + text.size()));
  }
}

TEST(ThinDiskTest, Version1PointsStillVerifyRestoreAndTakeIncrementals) {
  TempDir tmp;
  const std::string raw = tmp / "disk.raw";
  const uint64_t size = 8 * kMiB;
  WriteAt(raw, size, kMiB, testing::RandomBytes(2 * kMiB, 5));
  ASSERT_TRUE(Backup(raw, tmp.path().string(), std::nullopt).ok());
  WriteAt(raw, size, 5 * kMiB, testing::RandomBytes(kMiB, 6));
  WriteAt(raw, size, kMiB, std::vector<std::byte>(256 * kKiB));  // zero clusters over data
  ASSERT_TRUE(Backup(raw, tmp.path().string(), RangeList{{5 * kMiB, kMiB}, {kMiB, 256 * kKiB}}).ok());
  const std::string dir = tmp / "d";
  MakeVersion1(dir);
  if (HasFatalFailure()) return;

  auto report = VerifyAll(dir);
  ASSERT_TRUE(report.ok()) << report.error().ToString();
  EXPECT_TRUE(report->ok()) << report->failure->ToString();
  const std::vector<std::byte> want = testing::ReadFile(raw);
  auto restored = Restore(dir, "", tmp / "out.raw");
  ASSERT_TRUE(restored.ok()) << restored.error().ToString();
  EXPECT_EQ(testing::ReadFile(tmp / "out.raw"), want);

  // A new incremental over a version 1 point is a version 2 point.
  WriteAt(raw, size, 7 * kMiB, testing::RandomBytes(kMiB, 8));
  ASSERT_TRUE(Backup(raw, tmp.path().string(), RangeList{{7 * kMiB, kMiB}}).ok());
  auto chain = LoadChainFolder(PosixEnv(), dir);
  ASSERT_TRUE(chain.ok());
  ASSERT_EQ(chain->points.size(), 3u);
  EXPECT_EQ(chain->points[1].manifest.image_digest_algorithm, formats::ImageDigestAlgorithm::kClusterFold);
  EXPECT_EQ(chain->points[2].manifest.image_digest_algorithm, formats::ImageDigestAlgorithm::kZeroRunFold);
  report = VerifyAll(dir);
  ASSERT_TRUE(report.ok()) << report.error().ToString();
  EXPECT_TRUE(report->ok()) << report->failure->ToString();
  restored = Restore(dir, "1", tmp / "out.raw");
  ASSERT_TRUE(restored.ok()) << restored.error().ToString();
  EXPECT_EQ(restored->image_digest, chain->points[1].manifest.image_digest);
  restored = Restore(dir, "", tmp / "out.raw");
  ASSERT_TRUE(restored.ok()) << restored.error().ToString();
  EXPECT_EQ(testing::ReadFile(tmp / "out.raw"), testing::ReadFile(raw));
}

}  // namespace
}  // namespace barge::pipeline
