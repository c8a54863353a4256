// barge catalog list: the backup catalog's trackers, checkpoints and backup
// records as a readable table and as JSON, filtered by domain; a missing
// catalog is an error and is not created.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "orchestrate/catalog/backup_catalog.h"
#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
namespace orc = barge::orchestrate;
using testing::Barge;
using testing::Q;
using testing::RunOk;
using testing::RunResult;
using testing::Sh;
using testing::TempDir;

orc::BackupRecord Record(const std::string& domain, const std::string& tracker, const std::string& checkpoint) {
  orc::BackupRecord r;
  r.domain = domain;
  r.tracker = tracker;
  r.type = "full";
  r.reason = "tracker empty";
  r.checkpoint = checkpoint;
  r.target = "/backups";
  r.started_at = "2026-11-22T15:00:00Z";
  r.finished_at = "2026-11-22T15:00:12Z";
  r.duration_seconds = 12.345;
  r.disks.push_back({"vda", "full", "tracker empty", "/backups/" + domain + "/vda",
                     "/backups/" + domain + "/vda/0000-x.qcow2", "/backups/" + domain + "/vda/0000-x.json",
                     1 << 30, 3 << 20, 1 << 20});
  return r;
}

// Two domains: vm1 with a tracker at a checkpoint and a successful and a
// failed run; vm2 with a tracker that needs a full and no runs.
void Populate(const std::string& path) {
  auto catalog = orc::BackupCatalog::Open(PosixEnv(), path);
  ASSERT_TRUE(catalog.ok()) << catalog.error().ToString();
  auto& c = **catalog;
  ASSERT_TRUE(c.CreateTracker("nightly", "vm1").ok());
  ASSERT_TRUE(c.CreateTracker("weekly", "vm2").ok());
  auto ok = c.BeginBackup(Record("vm1", "nightly", "nightly-20261122T150000Z"));
  ASSERT_TRUE(ok.ok());
  orc::CheckpointRecord cp{"nightly-20261122T150000Z", "nightly", "vm1", "2026-11-22T15:00:00Z", {"vda"}, "<x/>", ""};
  ASSERT_TRUE(c.CommitBackup(*ok, Record("vm1", "nightly", cp.name), cp, {{"vda", 1 << 30}}).ok());
  auto failed = c.BeginBackup(Record("vm1", "nightly", ""));
  ASSERT_TRUE(failed.ok());
  orc::BackupRecord why = Record("vm1", "nightly", "");
  why.result = "failed";
  why.error = "disk vda: no space left";
  ASSERT_TRUE(c.FailBackup(*failed, why).ok());
  ASSERT_TRUE(c.MarkNeedsFull("weekly", "bitmap inconsistent").ok());
}

TEST(CatalogListCliTest, TrackersCheckpointsAndRecords) {
  TempDir dir;
  const std::string db = dir / "state/catalog.db";
  Populate(db);
  auto j = RunResult(Barge() + " catalog list --json --catalog " + Q(db));
  EXPECT_EQ(j["command"], "catalog list");
  EXPECT_EQ(j["catalog"], db);
  ASSERT_EQ(j["trackers"].size(), 2u);
  EXPECT_EQ(j["trackers"][0]["name"], "nightly");
  EXPECT_EQ(j["trackers"][0]["latest_checkpoint"]["name"], "nightly-20261122T150000Z");
  EXPECT_EQ(j["trackers"][0]["latest_checkpoint"]["disks"][0]["virtual_size"], 1 << 30);
  EXPECT_EQ(j["trackers"][1]["name"], "weekly");
  EXPECT_TRUE(j["trackers"][1]["needs_full"].get<bool>());
  EXPECT_EQ(j["trackers"][1]["needs_full_reason"], "bitmap inconsistent");
  ASSERT_EQ(j["checkpoints"].size(), 1u);
  EXPECT_EQ(j["checkpoints"][0]["name"], "nightly-20261122T150000Z");
  EXPECT_EQ(j["checkpoints"][0]["tracker"], "nightly");
  EXPECT_EQ(j["checkpoints"][0]["domain"], "vm1");
  EXPECT_EQ(j["checkpoints"][0]["created_at"], "2026-11-22T15:00:00Z");
  EXPECT_EQ(j["checkpoints"][0]["disks"], nlohmann::json::array({"vda"}));
  EXPECT_FALSE(j["checkpoints"][0].contains("xml"));
  ASSERT_EQ(j["backups"].size(), 2u);
  EXPECT_EQ(j["backups"][0]["result"], "success");
  EXPECT_EQ(j["backups"][0]["duration_seconds"], 12.345);
  EXPECT_EQ(j["backups"][0]["disks"][0]["bytes_written"], 1 << 20);
  EXPECT_EQ(j["backups"][1]["result"], "failed");
  EXPECT_EQ(j["backups"][1]["error"], "disk vda: no space left");

  std::string text = RunOk(Barge() + " catalog list --catalog " + Q(db));
  for (const char* want : {"trackers (2):", "checkpoints (1):", "backups (2):", "nightly-20261122T150000Z", "incremental",
                           "full (bitmap inconsistent)", "vda 1 GiB", "12.3 s", "3 MiB",
                           "failed: disk vda: no space left"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }

  auto vm2 = RunResult(Barge() + " catalog list --json --domain vm2 --catalog " + Q(db));
  ASSERT_EQ(vm2["trackers"].size(), 1u);
  EXPECT_EQ(vm2["trackers"][0]["name"], "weekly");
  EXPECT_TRUE(vm2["checkpoints"].empty());
  EXPECT_TRUE(vm2["backups"].empty());
  EXPECT_NE(RunOk(Barge() + " catalog list --domain vm2 --catalog " + Q(db)).find("backups: none"),
            std::string::npos);
}

TEST(CatalogListCliTest, FindsTheCatalogLikeEveryCommandAndNeverCreatesOne) {
  TempDir dir;
  Populate(dir / "barge/catalog.db");
  // $XDG_STATE_HOME/barge/catalog.db, then $BARGE_CATALOG.
  auto by_xdg = RunResult("env -u BARGE_CATALOG XDG_STATE_HOME=" + Q(dir.path().string()) + " " + Barge() +
                          " catalog list --json");
  EXPECT_EQ(by_xdg["trackers"].size(), 2u);
  auto by_env = RunResult("BARGE_CATALOG=" + Q(dir / "barge/catalog.db") + " " + Barge() +
                          " catalog list --json");
  EXPECT_EQ(by_env["trackers"].size(), 2u);

  const std::string missing = dir / "nowhere/catalog.db";
  auto r = Sh(Barge() + " catalog list --catalog " + Q(missing));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(missing), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "nowhere"));
}

}  // namespace
}  // namespace barge
