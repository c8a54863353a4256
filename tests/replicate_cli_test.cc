// barge replicate through the real CLI: raw and qcow2 (bitmaps, compressed
// clusters) to three destinations, checked with qemu-img and barge compare;
// expected checksum wrong (nothing ready, no temporaries); reuse of a good
// copy.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::RunOk;
using testing::ShellQuote;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

std::string Barge() { return ShellQuote(testing::BargeBinary()); }

// 12 MiB + 3 sectors: random data, compressible text, a hole, a zero run.
void MakeRaw(const std::string& path, uint64_t seed) {
  std::vector<std::byte> bytes = testing::RandomBytes(12 * kMiB + 1536, seed);
  for (uint64_t i = 2 * kMiB; i < 4 * kMiB; ++i) bytes[i] = std::byte('a' + (i / 7) % 13);
  std::fill(bytes.begin() + 5 * kMiB, bytes.begin() + 7 * kMiB, std::byte{0});
  testing::WriteFile(path, bytes);
  // Punch a real hole so the source has one.
  RunOk("fallocate -p -o " + std::to_string(5 * kMiB) + " -l " + std::to_string(kMiB) + " " +
        ShellQuote(path) + " || true");
}

json LastJson(const std::string& output) {
  // The result object is the last top-level JSON document (pretty-printed).
  auto pos = output.rfind("\n{\n");
  std::string text = pos == std::string::npos ? output.substr(output.find('{')) : output.substr(pos + 1);
  auto j = json::parse(text, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << output;
  return j;
}

std::string Sha512File(const std::string& path) {
  std::string out = RunOk("sha512sum " + ShellQuote(path));
  return out.substr(0, 128);
}

bool NoTemporaries(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".barge-tmp") != std::string::npos) return false;
  }
  return true;
}

json BitmapsOf(const std::string& image) {
  json info = json::parse(RunOk("qemu-img info --output=json " + ShellQuote(image)));
  return info["format-specific"]["data"].value("bitmaps", json::array());
}

TEST(ReplicateCliTest, RawToThreeDestinations) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  std::string src = dir / "base.raw";
  MakeRaw(src, 11);
  std::string sha = Sha512File(src);
  std::string cmd = Barge() + " replicate " + ShellQuote(src) + " --json --verify";
  for (int i = 0; i < 3; ++i) {
    fs::create_directories(dir.path() / ("disk" + std::to_string(i)));
    cmd += " --to " + ShellQuote(dir / ("disk" + std::to_string(i) + "/base.raw"));
  }
  json r = LastJson(RunOk(cmd + " --expected-sha512 " + sha));
  EXPECT_EQ(r["sha512"], sha);
  EXPECT_EQ(r["format"], "raw");
  ASSERT_EQ(r["destinations"].size(), 3u);
  for (const auto& d : r["destinations"]) {
    EXPECT_EQ(d["state"], "ready") << d.dump();
    EXPECT_EQ(d["verified"], true);
    std::string path = d["path"];
    RunOk("qemu-img compare -q -f raw -F raw " + ShellQuote(src) + " " + ShellQuote(path));
    RunOk(Barge() + " compare " + ShellQuote(src) + " " + ShellQuote(path));
    EXPECT_EQ(Sha512File(path), sha);
    json rec = json::parse(std::ifstream(path + ".sha512.json"));
    EXPECT_EQ(rec["sha512"], sha);
    EXPECT_EQ(rec["source"], src);
    EXPECT_TRUE(NoTemporaries(fs::path(path).parent_path()));
  }
  // Holes stay holes: the hole and the zero run are not allocated.
  struct stat st;
  ASSERT_EQ(::stat((dir / "disk0/base.raw").c_str(), &st), 0);
  EXPECT_LT(uint64_t(st.st_blocks) * 512, 11 * kMiB);
}

TEST(ReplicateCliTest, Qcow2WithBitmapsAndCompressedClustersToThree) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir dir;
  std::string raw = dir / "seed.raw";
  MakeRaw(raw, 12);
  std::string src = dir / "base.qcow2";
  RunOk("qemu-img convert -c -f raw -O qcow2 " + ShellQuote(raw) + " " + ShellQuote(src));
  // Two bitmaps with different granularities; writes dirty the enabled
  // ones; then b2 is disabled.
  RunOk("qemu-img bitmap --add " + ShellQuote(src) + " b1");
  RunOk("qemu-img bitmap --add -g 128K " + ShellQuote(src) + " b2");
  RunOk("qemu-io -f qcow2 -c 'write -P 0x5a 1M 64K' -c 'write -P 0x6b 9M 300K' " + ShellQuote(src));
  RunOk("qemu-img bitmap --disable " + ShellQuote(src) + " b2");
  std::string map = RunOk(Barge() + " map --json " + ShellQuote(src));
  ASSERT_NE(map.find("\"compressed\": true"), std::string::npos) << "source has no compressed clusters";

  std::string cmd = Barge() + " replicate " + ShellQuote(src) + " --json --verify";
  for (int i = 0; i < 3; ++i) cmd += " --to " + ShellQuote(dir / ("copy" + std::to_string(i) + ".qcow2"));
  json r = LastJson(RunOk(cmd));
  EXPECT_EQ(r["format"], "qcow2");
  EXPECT_EQ(r["bitmaps"].size(), 2u);
  json want = BitmapsOf(src);
  ASSERT_EQ(want.size(), 2u);
  std::string b1_src = RunOk(Barge() + " bitmap dump --json " + ShellQuote(src) + " b1");
  for (const auto& d : r["destinations"]) {
    EXPECT_EQ(d["state"], "ready") << d.dump();
    std::string path = d["path"];
    RunOk("qemu-img check -q " + ShellQuote(path));
    RunOk("qemu-img compare -q " + ShellQuote(src) + " " + ShellQuote(path));
    RunOk(Barge() + " compare " + ShellQuote(src) + " " + ShellQuote(path));
    EXPECT_EQ(BitmapsOf(path), want);
    EXPECT_EQ(RunOk(Barge() + " bitmap dump --json " + ShellQuote(path) + " b1"), b1_src);
  }
  // The SHA-512 is the logical content's: the same as the raw conversion's.
  std::string flat = dir / "flat.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(src) + " " + ShellQuote(flat));
  EXPECT_EQ(r["sha512"], Sha512File(flat));
}

TEST(ReplicateCliTest, WrongExpectedChecksumMakesNothingReady) {
  TempDir dir;
  std::string src = dir / "base.raw";
  MakeRaw(src, 13);
  std::string wrong(128, '0');
  std::string cmd = Barge() + " replicate " + ShellQuote(src) + " --expected-sha512 " + wrong;
  for (int i = 0; i < 3; ++i) cmd += " --to " + ShellQuote(dir / ("copy" + std::to_string(i) + ".raw"));
  auto res = testing::Run(cmd);
  EXPECT_NE(res.exit_code, 0);
  EXPECT_NE(res.output.find(wrong), std::string::npos) << res.output;
  EXPECT_NE(res.output.find(Sha512File(src)), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("mismatch"), std::string::npos) << res.output;
  for (int i = 0; i < 3; ++i) {
    std::string p = dir / ("copy" + std::to_string(i) + ".raw");
    EXPECT_FALSE(fs::exists(p));
    EXPECT_FALSE(fs::exists(p + ".sha512.json"));
  }
  EXPECT_TRUE(NoTemporaries(dir.path()));
}

TEST(ReplicateCliTest, ExistingGoodCopyIsReused) {
  TempDir dir;
  std::string src = dir / "base.raw";
  MakeRaw(src, 14);
  std::string sha = Sha512File(src);
  std::string a = dir / "a.raw", b = dir / "b.raw";
  RunOk(Barge() + " replicate " + ShellQuote(src) + " --to " + ShellQuote(a));
  struct stat before;
  ASSERT_EQ(::stat(a.c_str(), &before), 0);

  // With the expected checksum: decided from the record, the source is not
  // even needed for a; b is written.
  json r = LastJson(RunOk(Barge() + " replicate --json " + ShellQuote(src) + " --to " + ShellQuote(a) +
                          " --to " + ShellQuote(b) + " --expected-sha512 " + sha));
  EXPECT_EQ(r["destinations"][0]["state"], "reused");
  EXPECT_EQ(r["destinations"][1]["state"], "ready");
  // Without it: decided after the pass, still not rewritten; --verify
  // re-reads the reused copy.
  r = LastJson(RunOk(Barge() + " replicate --json --verify " + ShellQuote(src) + " --to " + ShellQuote(a)));
  EXPECT_EQ(r["destinations"][0]["state"], "reused");
  EXPECT_EQ(r["destinations"][0]["verified"], true);
  struct stat after;
  ASSERT_EQ(::stat(a.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  EXPECT_EQ(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
  EXPECT_TRUE(NoTemporaries(dir.path()));

  // A different file under the name is refused without --force, replaced with it.
  std::string other = dir / "other.raw";
  MakeRaw(other, 15);
  auto res = testing::Run(Barge() + " replicate " + ShellQuote(other) + " --to " + ShellQuote(a));
  EXPECT_NE(res.exit_code, 0);
  EXPECT_NE(res.output.find("--force"), std::string::npos) << res.output;
  EXPECT_EQ(Sha512File(a), sha);
  RunOk(Barge() + " replicate --force " + ShellQuote(other) + " --to " + ShellQuote(a));
  EXPECT_EQ(Sha512File(a), Sha512File(other));
}

TEST(ReplicateCliTest, BackingKeepIsRefusedClearly) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  std::string base = dir / "base.raw";
  MakeRaw(base, 16);
  std::string top = dir / "top.qcow2";
  RunOk("qemu-img create -q -f qcow2 -b base.raw -F raw " + ShellQuote(top));
  auto res = testing::Run(Barge() + " replicate --backing keep " + ShellQuote(top) + " --to " +
                 ShellQuote(dir / "copy.qcow2"));
  EXPECT_NE(res.exit_code, 0);
  EXPECT_NE(res.output.find("NotSupported"), std::string::npos) << res.output;
  // Flatten (the default) copies the guest view.
  RunOk(Barge() + " replicate " + ShellQuote(top) + " --to " + ShellQuote(dir / "copy.qcow2"));
  RunOk("qemu-img compare -q " + ShellQuote(top) + " " + ShellQuote(dir / "copy.qcow2"));
  json info = json::parse(RunOk("qemu-img info --output=json " + ShellQuote(dir / "copy.qcow2")));
  EXPECT_FALSE(info.contains("backing-filename"));
}

}  // namespace
}  // namespace barge
