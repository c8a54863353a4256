// barge replicate through the real CLI: raw and qcow2 (bitmaps, compressed
// clusters) to three destinations, checked with qemu-img and barge compare;
// expected checksum wrong (nothing ready, no temporaries); reuse of a good
// copy; --backing keep (top layer only, same backing name) to three folders,
// refused where it cannot apply, and verify without the base.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Barge;
using testing::RunOk;
using testing::RunResult;
using testing::ShellQuote;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

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
  json r = RunResult(cmd + " --expected-sha512 " + sha);
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
  json map = RunResult(Barge() + " map --json " + ShellQuote(src))["extents"];
  ASSERT_TRUE(std::any_of(map.begin(), map.end(), [](const json& e) { return e.value("compressed", false); }))
      << "source has no compressed clusters: " << map.dump();

  std::string cmd = Barge() + " replicate " + ShellQuote(src) + " --json --verify";
  for (int i = 0; i < 3; ++i) cmd += " --to " + ShellQuote(dir / ("copy" + std::to_string(i) + ".qcow2"));
  json r = RunResult(cmd);
  EXPECT_EQ(r["format"], "qcow2");
  EXPECT_EQ(r["bitmaps"].size(), 2u);
  json want = BitmapsOf(src);
  ASSERT_EQ(want.size(), 2u);
  // The bitmap as `bitmap dump` reports it, less the image's name.
  auto dump_b1 = [](const std::string& image) {
    json d = RunResult(Barge() + " bitmap dump --json " + ShellQuote(image) + " b1");
    EXPECT_EQ(d.value("image", ""), image);
    d.erase("image");
    return d;
  };
  json b1_src = dump_b1(src);
  ASSERT_FALSE(b1_src.value("dirty", json::array()).empty()) << b1_src.dump();
  for (const auto& d : r["destinations"]) {
    EXPECT_EQ(d["state"], "ready") << d.dump();
    std::string path = d["path"];
    RunOk("qemu-img check -q " + ShellQuote(path));
    RunOk("qemu-img compare -q " + ShellQuote(src) + " " + ShellQuote(path));
    RunOk(Barge() + " compare " + ShellQuote(src) + " " + ShellQuote(path));
    EXPECT_EQ(BitmapsOf(path), want);
    EXPECT_EQ(dump_b1(path), b1_src);
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
  json r = RunResult(Barge() + " replicate --json " + ShellQuote(src) + " --to " + ShellQuote(a) + " --to " +
                     ShellQuote(b) + " --expected-sha512 " + sha);
  EXPECT_EQ(r["destinations"][0]["state"], "reused");
  EXPECT_EQ(r["destinations"][1]["state"], "ready");
  // Without it: decided after the pass, still not rewritten; --verify
  // re-reads the reused copy.
  r = RunResult(Barge() + " replicate --json --verify " + ShellQuote(src) + " --to " + ShellQuote(a));
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

// base.qcow2 (random data, text, a hole, a zero run) and top.qcow2 over it,
// naming it by the relative name "base.qcow2": a persistent bitmap, data
// writes and zero writes (over data and over the hole). Returns top's path.
std::string MakeChain(const TempDir& dir) {
  std::string raw = dir / "seed.raw";
  MakeRaw(raw, 16);
  std::string base = dir / "base.qcow2";
  RunOk("qemu-img convert -f raw -O qcow2 " + ShellQuote(raw) + " " + ShellQuote(base));
  fs::remove(raw);
  std::string top = dir / "top.qcow2";
  RunOk("qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 " + ShellQuote(top));
  RunOk("qemu-img bitmap --add " + ShellQuote(top) + " cbt0");
  RunOk("qemu-io -f qcow2 -c 'write -P 0x5a 1M 192K' -c 'write -z 3M 128K' -c 'write -P 0x6b 9M 64K'"
        " -c 'write -z 5M 64K' -c 'write -P 0x7c 12M 1536' " + ShellQuote(top));
  return top;
}

// `qemu-img map --output=json` of an image's chain without host offsets and
// file names, neighbours with the same attributes merged: which layer holds
// what, per guest range.
json LayerMap(const std::string& image) {
  json map = json::parse(RunOk("qemu-img map --output=json " + ShellQuote(image)));
  json out = json::array();
  for (json e : map) {
    e.erase("offset");
    e.erase("filename");
    if (!out.empty()) {
      json& last = out.back();
      json a = last, b = e;
      for (auto* x : {&a, &b}) {
        x->erase("start");
        x->erase("length");
      }
      if (a == b && last["start"].get<uint64_t>() + last["length"].get<uint64_t>() == e["start"]) {
        last["length"] = last["length"].get<uint64_t>() + e["length"].get<uint64_t>();
        continue;
      }
    }
    out.push_back(e);
  }
  return out;
}

json InfoOf(const std::string& image) {
  return json::parse(RunOk("qemu-img info --output=json " + ShellQuote(image)));
}

TEST(ReplicateCliTest, BackingKeepCopiesTheTopLayerToThreeFolders) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir dir;
  std::string top = MakeChain(dir);
  json src_info = InfoOf(top);
  ASSERT_EQ(src_info["backing-filename"], "base.qcow2");
  json src_map = LayerMap(top);
  json want_bitmaps = BitmapsOf(top);
  ASSERT_EQ(want_bitmaps.size(), 1u);
  std::string flat = dir / "flat.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(top) + " " + ShellQuote(flat));
  std::string sha = Sha512File(flat);

  // The user delivers the base first: a byte copy beside each copy.
  std::string cmd = Barge() + " replicate " + ShellQuote(top) + " --backing keep --verify --json";
  for (int i = 0; i < 3; ++i) {
    fs::path folder = dir.path() / ("disk" + std::to_string(i));
    fs::create_directories(folder);
    fs::copy_file(dir / "base.qcow2", folder / "base.qcow2");
    cmd += " --to " + ShellQuote((folder / "top.qcow2").string());
  }
  json r = RunResult(cmd);
  EXPECT_EQ(r["sha512"], sha);  // of the guest view, as with flatten
  EXPECT_EQ(r["format"], "qcow2");
  EXPECT_EQ(r["backing_file"], "base.qcow2");
  EXPECT_EQ(r["bitmaps"], json::array({"cbt0"}));
  ASSERT_EQ(r["destinations"].size(), 3u);
  for (const auto& d : r["destinations"]) {
    EXPECT_EQ(d["state"], "ready") << d.dump();
    EXPECT_EQ(d["verified"], true);
    std::string path = d["path"];
    json info = InfoOf(path);
    EXPECT_EQ(info["backing-filename"], src_info["backing-filename"]);
    EXPECT_EQ(info["backing-filename-format"], "qcow2");
    EXPECT_EQ(info["full-backing-filename"], (fs::path(path).parent_path() / "base.qcow2").string());
    EXPECT_EQ(BitmapsOf(path), want_bitmaps);
    RunOk("qemu-img check -q " + ShellQuote(path));
    RunOk("qemu-img compare -q " + ShellQuote(top) + " " + ShellQuote(path));
    // The same clusters in the top layer (data, zero), the rest from the base.
    EXPECT_EQ(LayerMap(path), src_map) << path;
    json rec = json::parse(std::ifstream(path + ".sha512.json"));
    EXPECT_EQ(rec["sha512"], sha);
    EXPECT_EQ(rec["backing_file"], "base.qcow2");
    EXPECT_EQ(rec["verified"], true);
    EXPECT_TRUE(NoTemporaries(fs::path(path).parent_path()));
  }
  // Only the top layer was written: far smaller than the guest data.
  EXPECT_LT(fs::file_size(dir / "disk0/top.qcow2"), 2 * kMiB);

  // A second run finds matching copies and leaves them alone.
  r = RunResult(cmd);
  for (const auto& d : r["destinations"]) {
    EXPECT_EQ(d["state"], "reused") << d.dump();
    EXPECT_EQ(d["verified"], true);
  }
  // A kept-backing copy is no match for a flattened one: refused, not reused.
  auto res = testing::Run(Barge() + " replicate " + ShellQuote(top) + " --to " +
                          ShellQuote(dir / "disk0/top.qcow2"));
  EXPECT_NE(res.exit_code, 0);
  EXPECT_NE(res.output.find("--force"), std::string::npos) << res.output;
}

TEST(ReplicateCliTest, BackingKeepIsRefusedWithoutABackingFileOrForRawOutput) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir dir;
  std::string top = MakeChain(dir);
  fs::create_directories(dir.path() / "out");
  std::string copy = dir / "out/copy";
  struct Case {
    std::string args;
    std::string says;
  };
  const Case cases[] = {
      {"--format raw " + ShellQuote(top), "raw file cannot name a backing file"},
      {ShellQuote(dir / "base.qcow2"), "has no backing file"},
      {"--format qcow2 " + ShellQuote(dir / "flat.raw"), "is not a qcow2 image"},
  };
  RunOk("qemu-img convert -O raw " + ShellQuote(dir / "base.qcow2") + " " + ShellQuote(dir / "flat.raw"));
  for (const Case& c : cases) {
    auto res = testing::Run(Barge() + " replicate --backing keep --verify " + c.args + " --to " +
                            ShellQuote(copy));
    EXPECT_NE(res.exit_code, 0) << c.args;
    EXPECT_NE(res.output.find("InvalidArgument"), std::string::npos) << res.output;
    EXPECT_NE(res.output.find(c.says), std::string::npos) << res.output;
    EXPECT_NE(res.output.find("--backing flatten"), std::string::npos) << res.output;
    EXPECT_TRUE(fs::is_empty(dir.path() / "out")) << c.args;
  }
  // Flatten (the default) copies the guest view and names no backing file.
  RunOk(Barge() + " replicate " + ShellQuote(top) + " --to " + ShellQuote(copy));
  RunOk("qemu-img compare -q " + ShellQuote(top) + " " + ShellQuote(copy));
  EXPECT_FALSE(InfoOf(copy).contains("backing-filename"));
}

TEST(ReplicateCliTest, BackingKeepVerifyFailsOnlyTheCopyWithoutItsBase) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir dir;
  std::string top = MakeChain(dir);
  std::string cmd = Barge() + " replicate " + ShellQuote(top) + " --backing keep --json";
  for (int i = 0; i < 3; ++i) {
    fs::path folder = dir.path() / ("disk" + std::to_string(i));
    fs::create_directories(folder);
    if (i != 1) fs::copy_file(dir / "base.qcow2", folder / "base.qcow2");
    cmd += " --to " + ShellQuote((folder / "top.qcow2").string());
  }
  auto res = testing::Run(cmd + " --verify");
  EXPECT_NE(res.exit_code, 0) << res.output;
  // The report of every copy, then the error that failed the run.
  json r = testing::ResultOf(res.stdout_text);
  EXPECT_EQ(testing::ErrorOf(res.stdout_text).value("exit_code", -1), res.exit_code) << res.output;
  ASSERT_EQ(r["destinations"].size(), 3u);
  EXPECT_EQ(r["destinations"][0]["state"], "ready");
  EXPECT_EQ(r["destinations"][2]["state"], "ready");
  const json& missing = r["destinations"][1];
  EXPECT_EQ(missing["state"], "failed");
  std::string error = missing.value("error", json::object()).value("message", "");
  EXPECT_NE(error.find("backing file 'base.qcow2' not found at " + (dir / "disk1/base.qcow2")),
            std::string::npos)
      << missing.dump();
  EXPECT_TRUE(fs::is_empty(dir.path() / "disk1"));
  for (int i : {0, 2}) {
    std::string path = dir / ("disk" + std::to_string(i) + "/top.qcow2");
    RunOk("qemu-img compare -q " + ShellQuote(top) + " " + ShellQuote(path));
  }

  // Without --verify the copy is written without its base; delivered
  // afterwards, the chain reads as the source.
  r = RunResult(cmd);
  EXPECT_EQ(r["destinations"][1]["state"], "ready");
  EXPECT_EQ(r["destinations"][1]["verified"], false);
  fs::copy_file(dir / "base.qcow2", dir / "disk1/base.qcow2");
  RunOk("qemu-img compare -q " + ShellQuote(top) + " " + ShellQuote(dir / "disk1/top.qcow2"));
}

}  // namespace
}  // namespace barge
