// barge image add/sync/status/cleanup/rescan through the real CLI: a
// backing image added on one disk, delivered to four more with at most three
// concurrent sends per ready copy, status per disk, cleanup that keeps used
// copies and removes unused ones only after the interval, and a catalog
// rebuilt from the disks.
#include <gtest/gtest.h>

#include <filesystem>

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

struct Catalog {
  TempDir dir;
  std::string db = dir / "catalog.db";
  std::string src = dir / "src.raw";
  Catalog() { testing::WriteFile(src, testing::RandomBytes(24 * kMiB, 5)); }
  std::string Disk(int i) const { return dir / ("disk" + std::to_string(i)); }
  std::string Cmd(const std::string& args) const {
    return Barge() + " image " + args + " --catalog " + ShellQuote(db);
  }
};

TEST(ImageCatalogCliTest, AddSyncStatusCleanupRescan) {
  BARGE_REQUIRE_TOOL("qemu-img");
  Catalog c;
  json added = json::parse(RunOk(c.Cmd("add base --json --source " + ShellQuote(c.src) + " --disk " +
                                       ShellQuote(c.Disk(0)))));
  EXPECT_EQ(added["state"], "ready") << added.dump();
  std::string first = added["path"];

  std::string disks = c.Disk(1) + "," + c.Disk(2) + "," + c.Disk(3) + "," + c.Disk(4);
  json sync = json::parse(RunOk(c.Cmd("sync base --json --disks " + ShellQuote(disks))));
  ASSERT_EQ(sync["copies"].size(), 4u) << sync.dump();
  for (const auto& cp : sync["copies"]) {
    EXPECT_EQ(cp["state"], "ready") << cp.dump();
    RunOk("cmp " + ShellQuote(c.src) + " " + ShellQuote(cp["path"].get<std::string>()));
  }
  // Four disks, one ready copy: it serves three at once; the fourth waits
  // and goes to the copy with the fewest active sends (a new one).
  int first_max = 0, total = 0;
  for (const auto& s : sync["senders"]) {
    EXPECT_LE(s["max_concurrent"].get<int>(), 3) << s.dump();
    total += s["sends"].get<int>();
    if (s["sender"] == first) {
      first_max = s["max_concurrent"];
      EXPECT_EQ(s["sends"], 3);
    }
  }
  EXPECT_EQ(first_max, 3) << sync.dump();
  EXPECT_EQ(total, 4);

  json status = json::parse(RunOk(c.Cmd("status base --json")));
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0]["copies"].size(), 5u);
  for (const auto& cp : status[0]["copies"]) EXPECT_EQ(cp["state"], "ready");
  EXPECT_EQ(status[0]["senders"].size(), 2u) << status.dump();

  // A VM disk on disk1 uses the copy there as its backing file.
  RunOk("qemu-img create -q -f qcow2 -b base -F raw " + ShellQuote(c.Disk(1) + "/vm.qcow2"));
  json clean = json::parse(RunOk(c.Cmd("cleanup --json --unused-for 1h")));
  EXPECT_TRUE(clean["removed"].empty()) << clean.dump();
  EXPECT_EQ(clean["in_use"].size(), 1u);
  EXPECT_EQ(clean["waiting"].size(), 4u);
  clean = json::parse(RunOk(c.Cmd("cleanup --json --unused-for 0")));
  EXPECT_EQ(clean["removed"].size(), 4u) << clean.dump();
  EXPECT_EQ(clean["in_use"].size(), 1u);
  EXPECT_TRUE(fs::exists(c.Disk(1) + "/base"));
  for (int i : {0, 2, 3, 4}) {
    EXPECT_FALSE(fs::exists(c.Disk(i) + "/base"));
    EXPECT_FALSE(fs::exists(c.Disk(i) + "/base.sha512.json"));
  }
  RunOk("qemu-img compare -q " + ShellQuote(c.Disk(1) + "/vm.qcow2") + " " + ShellQuote(c.src));

  // The catalog is rebuilt from the disks.
  fs::remove(c.db);
  fs::remove(c.db + "-wal");
  fs::remove(c.db + "-shm");
  status = json::parse(RunOk(c.Cmd("rescan --json --disks " + ShellQuote(c.Disk(1) + "," + c.Disk(2)))));
  ASSERT_EQ(status.size(), 1u) << status.dump();
  ASSERT_EQ(status[0]["copies"].size(), 1u);
  EXPECT_EQ(status[0]["copies"][0]["state"], "ready");
  EXPECT_EQ(status[0]["sha512"], RunOk("sha512sum " + ShellQuote(c.src)).substr(0, 128));
}

TEST(ImageCatalogCliTest, WrongChecksumIsFailedWithMessage) {
  Catalog c;
  auto r = testing::Run(c.Cmd("add base --source " + ShellQuote(c.src) + " --disk " + ShellQuote(c.Disk(0)) +
                     " --expected-sha512 " + std::string(128, 'a')));
  EXPECT_NE(r.exit_code, 0);
  json status = json::parse(RunOk(c.Cmd("status --json")));
  ASSERT_EQ(status.size(), 1u);
  ASSERT_EQ(status[0]["copies"].size(), 1u);
  EXPECT_EQ(status[0]["copies"][0]["state"], "failed");
  EXPECT_NE(status[0]["copies"][0]["message"].get<std::string>().find("mismatch"), std::string::npos);
  EXPECT_FALSE(fs::exists(c.Disk(0) + "/base"));
  // Sync has nothing to send from.
  EXPECT_NE(testing::Run(c.Cmd("sync base --disks " + ShellQuote(c.Disk(1)))).exit_code, 0);
}

}  // namespace
}  // namespace barge
