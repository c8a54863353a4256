// A full backup and five bitmap increments of a qcow2 disk, then: merge at
// several points (retention), tampered and broken chains, and restores to
// every kind of destination and with every --at form.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/incremental_support.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using namespace incremental_testing;
using testing::TempDir;

constexpr uint64_t kDiskSize = 8 * kMiB;

const std::vector<Op> kInitial = {{Op::kWrite, 0, 1 * kMiB, 0x10},
                                  {Op::kWrite, 3 * kMiB, 2 * kMiB, 0x20}};
// Step 2 writes a region no later step touches (the tamper target).
const std::vector<std::vector<Op>> kSteps = {
    {{Op::kWrite, 64 * kKiB, 8 * kKiB, 0x41}},
    {{Op::kWrite, 6 * kMiB, 256 * kKiB, 0x42}},
    {{Op::kZero, 3 * kMiB, 512 * kKiB}},
    {{Op::kDiscard, 4 * kMiB, 1 * kMiB}, {Op::kWrite, 7 * kMiB, 1 * kMiB, 0x44}},
    {{Op::kWrite, 100000, 70000, 0x45}},
};

struct Chain {
  std::string dir;                 // TARGET/vda
  std::vector<std::string> saved;  // the source at each point, raw
};

// Full + five increments from the bitmap read from the qcow2 file.
Chain MakeChain(const TempDir& tmp, const std::string& compress = "zstd:3") {
  Chain c;
  const std::string image = tmp / "disk.qcow2";
  const std::string backup = Barge() + " backup --compress " + compress + " --source " + Q(image) +
                             " --target " + Q(tmp / "t") + " --name vda";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " " + std::to_string(kDiskSize));
  ApplyOps(image, kInitial);
  auto save = [&]() {
    c.saved.push_back(tmp / ("point" + std::to_string(c.saved.size()) + ".raw"));
    RunOk("qemu-img convert -f qcow2 -O raw " + Q(image) + " " + Q(c.saved.back()));
  };
  save();
  RunOk(backup);
  RunOk("qemu-img bitmap --add --enable " + Q(image) + " cbt0");
  for (const auto& step : kSteps) {
    ApplyOps(image, step);
    save();
    RunOk(backup + " --incremental --dirty-bitmap cbt0");
    RunOk("qemu-img bitmap --clear " + Q(image) + " cbt0");
  }
  c.dir = tmp / "t/vda";
  return c;
}

// Points `first`.. restore identically through barge and qemu-img; every
// layer checks clean; verify --all passes.
void ExpectPointsFrom(const TempDir& tmp, const Chain& c, size_t first) {
  std::vector<std::string> ids = PointIds(c.dir);
  ASSERT_EQ(ids.size(), c.saved.size() - first);
  const std::string out = tmp / "restored.raw";
  for (size_t k = first; k < c.saved.size(); ++k) {
    const std::string& id = ids[k - first];
    EXPECT_EQ(id.substr(0, 4), "000" + std::to_string(k));
    RunOk(Barge() + " restore " + Q(c.dir) + " --at " + id + " --force --to " + Q(out));
    EXPECT_TRUE(SameFile(out, c.saved[k])) << "barge restore of point " << k;
    RunOk("qemu-img check -q " + Q(c.dir + "/" + id + ".qcow2"));
    fs::remove(out);
    RunOk("qemu-img convert -f qcow2 -O raw " + Q(c.dir + "/" + id + ".qcow2") + " " + Q(out));
    EXPECT_TRUE(SameFile(out, c.saved[k])) << "qemu-img convert of point " << k;
  }
  RunOk(Barge() + " verify --all " + Q(c.dir));
}

TEST(IncrementalRestoreTest, MergeAtSeveralPointsKeepsEveryRemainingPoint) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir tmp;
  Chain c = MakeChain(tmp);
  ExpectPointsFrom(tmp, c, 0);
  std::vector<std::string> ids = PointIds(c.dir);

  std::string out = RunOk(Barge() + " merge " + Q(c.dir) + " --through 0");
  EXPECT_NE(out.find("nothing to merge"), std::string::npos) << out;
  ExpectPointsFrom(tmp, c, 0);

  nlohmann::json r = RunResult(Barge() + " merge --json " + Q(c.dir) + " --through 2");
  EXPECT_EQ(r.value("id", ""), ids[2]) << r.dump();
  EXPECT_TRUE(r.value("merged", false));
  EXPECT_EQ(r["folded"].size(), 3u);
  EXPECT_EQ(r["removed"].size(), 6u);
  for (int k : {0, 1}) {
    for (const char* ext : {".json", ".qcow2", ".digests"}) {
      EXPECT_FALSE(fs::exists(c.dir + "/" + ids[k] + ext)) << ids[k] << ext;
    }
  }
  std::string info = RunOk("qemu-img info " + Q(c.dir + "/" + ids[2] + ".qcow2"));
  EXPECT_EQ(info.find("backing file"), std::string::npos) << info;
  ExpectPointsFrom(tmp, c, 2);

  // Through the latest, named by id: one full is left.
  out = RunOk(Barge() + " merge " + Q(c.dir) + " --through " + ids[5]);
  EXPECT_NE(out.find("merged 4 layers"), std::string::npos) << out;
  ExpectPointsFrom(tmp, c, 5);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(c.dir)) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  // (.verified: the record of ExpectPointsFrom's `verify --all`.)
  EXPECT_EQ(left, (std::vector<std::string>{".lock", ids[5] + ".digests", ids[5] + ".json",
                                            ids[5] + ".qcow2", ids[5] + ".verified"}));
}

TEST(IncrementalRestoreTest, TamperedMiddleLayerFailsNamingTheCluster) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir tmp;
  Chain c = MakeChain(tmp, "none");  // raw clusters: their host offsets are in the map
  std::vector<std::string> ids = PointIds(c.dir);
  const std::string layer = c.dir + "/" + ids[2] + ".qcow2";
  auto map = nlohmann::json::parse(RunOk("qemu-img map --output=json " + Q(LayerAlone(layer))));
  uint64_t guest = 0, host = 0;
  for (const auto& e : map) {
    if (e.value("data", false) && e.contains("offset") && !e.value("zero", false)) {
      guest = e["start"].get<uint64_t>();
      host = e["offset"].get<uint64_t>();
      break;
    }
  }
  ASSERT_EQ(guest, 6 * kMiB) << map.dump();
  {
    std::fstream f(layer, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(host + 100));
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x5a;
    f.seekp(static_cast<std::streamoff>(host + 100));
    f.write(&byte, 1);
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "offset 0x%llx", static_cast<unsigned long long>(guest));
  // Exit 2: corruption (docs/errors.md).
  std::string out = RunOk(Barge() + " restore " + Q(c.dir) + " --to " + Q(tmp / "r.raw"), 2);
  EXPECT_NE(out.find(hex), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(tmp / "r.raw"));
  // The error names the damaged layer file, not the top image read through.
  nlohmann::json restore_error = testing::RunError(Barge() + " restore --json " + Q(c.dir) + " --to " + Q(tmp / "r.raw"), 2);
  EXPECT_EQ(restore_error.value("file", ""), layer) << restore_error.dump();
  // So does verify of the top point (every layer's structure is sound; the
  // tampered bytes are data).
  nlohmann::json verify_top = testing::RunError(Barge() + " verify --json " + Q(c.dir) + " --at latest", 2);
  EXPECT_EQ(verify_top.value("file", ""), layer) << verify_top.dump();
  nlohmann::json error = testing::RunError(Barge() + " verify --json " + Q(c.dir), 2);
  EXPECT_EQ(error.value("code", ""), "Corruption") << error.dump();
  EXPECT_EQ(error.value("offset", ~uint64_t{0}), guest) << error.dump();
  EXPECT_NE(error.value("message", "").find(hex), std::string::npos) << error.dump();
  // The point below the tampered layer is still good.
  RunOk(Barge() + " restore " + Q(c.dir) + " --at 1 --to " + Q(tmp / "r1.raw"));
  EXPECT_TRUE(SameFile(tmp / "r1.raw", c.saved[1]));
}

TEST(IncrementalRestoreTest, MissingMiddleLayerNamesTheMissingBackup) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir tmp;
  Chain c = MakeChain(tmp);
  std::vector<std::string> ids = PointIds(c.dir);
  for (const char* ext : {".json", ".qcow2", ".digests"}) fs::remove(c.dir + "/" + ids[3] + ext);
  // A broken chain is corruption of the backup: exit 2 (docs/errors.md).
  std::string out = RunOk(Barge() + " restore " + Q(c.dir) + " --to " + Q(tmp / "r.raw"), 2);
  EXPECT_NE(out.find("parent backup " + ids[3] + " is missing"), std::string::npos) << out;
  nlohmann::json error = testing::RunError(Barge() + " verify --all --json " + Q(c.dir), 2);
  EXPECT_NE(error.dump().find(ids[3]), std::string::npos) << error.dump();
  // Points below the gap restore.
  RunOk(Barge() + " restore " + Q(c.dir) + " --at 2 --to " + Q(tmp / "r2.raw"));
  EXPECT_TRUE(SameFile(tmp / "r2.raw", c.saved[2]));
}

TEST(IncrementalRestoreTest, RestoreToEveryDestinationAndAtEveryForm) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  BARGE_REQUIRE_TOOL("qemu-nbd");
  TempDir tmp;
  Chain c = MakeChain(tmp);
  std::vector<std::string> ids = PointIds(c.dir);
  const std::string& latest = c.saved.back();

  // New qcow2: clean, same contents.
  RunOk(Barge() + " restore " + Q(c.dir) + " -O qcow2 --to " + Q(tmp / "r.qcow2"));
  RunOk("qemu-img check -q " + Q(tmp / "r.qcow2"));
  RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(tmp / "r.qcow2") + " " + Q(latest));

  // An existing non-empty file needs --force.
  testing::WriteFile(tmp / "busy.raw", testing::RandomBytes(4096, 3));
  std::string out = RunOk(Barge() + " restore " + Q(c.dir) + " --to " + Q(tmp / "busy.raw"), 1);
  EXPECT_NE(out.find("--force"), std::string::npos) << out;
  EXPECT_EQ(fs::file_size(tmp / "busy.raw"), 4096u);
  RunOk(Barge() + " restore " + Q(c.dir) + " --force --to " + Q(tmp / "busy.raw"));
  EXPECT_TRUE(SameFile(tmp / "busy.raw", latest));

  // A writable NBD export full of garbage: zero ranges must become zeros.
  const std::string target = tmp / "target.raw";
  testing::WriteFile(target, testing::RandomBytes(kDiskSize, 9));
  {
    NbdExport nbd(tmp.path().string(), "-f raw -t", target);
    out = RunOk(Barge() + " restore " + Q(c.dir) + " --to " + Q(nbd.uri()), 1);
    EXPECT_NE(out.find("--force"), std::string::npos) << out;
    RunOk(Barge() + " restore " + Q(c.dir) + " --force --to " + Q(nbd.uri()));
  }
  EXPECT_TRUE(SameFile(target, latest));

  // --at: id, position, time, latest.
  auto restore_at = [&](const std::string& at, size_t expected) {
    const std::string r = tmp / "at.raw";
    RunOk(Barge() + " restore " + Q(c.dir) + " --force --at " + Q(at) + " --to " + Q(r));
    EXPECT_TRUE(SameFile(r, c.saved[expected])) << "--at " << at;
  };
  restore_at(ids[1], 1);
  restore_at("3", 3);
  restore_at("latest", 5);
  // A time names the newest point started not after it; points made within
  // one second share it.
  auto manifest = nlohmann::json::parse(
      std::ifstream(c.dir + "/" + ids[2] + ".json"), nullptr, false);
  std::string started = manifest.value("started_at", "");
  size_t expected = 2;
  for (size_t k = 3; k < ids.size(); ++k) {
    auto m = nlohmann::json::parse(std::ifstream(c.dir + "/" + ids[k] + ".json"), nullptr, false);
    if (m.value("started_at", "") <= started) expected = k;
  }
  restore_at(started, expected);
  out = RunOk(Barge() + " restore " + Q(c.dir) + " --at 1999-01-01T00:00:00Z --to " +
                  Q(tmp / "none.raw"),
              1);
  EXPECT_NE(out.find("no backup started"), std::string::npos) << out;
}

}  // namespace
}  // namespace barge
