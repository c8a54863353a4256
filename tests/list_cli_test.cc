// barge list: every point of a chain folder with its position, type, time,
// sizes, parent, chain and last verification (kept by barge verify as
// <id>.verified); several chains in one folder; missing images; merges.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using testing::Barge;
using testing::Q;
using testing::ResultOf;
using testing::RunOk;
using testing::RunResult;
using testing::Sh;
using testing::TempDir;

// The warning events of a --json run's stdout (read strictly: Events).
std::vector<nlohmann::json> Warnings(const std::string& stdout_text) {
  std::vector<nlohmann::json> out;
  for (const auto& e : testing::Events(stdout_text)) {
    if (e.value("event", "") == "warning") out.push_back(e);
  }
  return out;
}

class ListCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    disk_ = dir_ / "disk.qcow2";
    chain_ = dir_ / "bk/vda";
    RunOk("qemu-img create -q -f qcow2 " + Q(disk_) + " 8M");
    RunOk("qemu-io -f qcow2 -c 'write -P 0xaa 0 1M' " + Q(disk_));
    RunOk("qemu-img bitmap --add " + Q(disk_) + " cbt0");
  }
  nlohmann::json Backup(const std::string& extra) {
    return RunResult(Barge() + " backup --json --source " + Q(disk_) + " --target " + Q(dir_ / "bk") +
                     " --name vda " + extra);
  }
  nlohmann::json Incremental(const std::string& write) {
    RunOk("qemu-io -f qcow2 -c " + Q(write) + " " + Q(disk_));
    auto r = Backup("--incremental --dirty-bitmap cbt0");
    RunOk(Barge() + " bitmap clear " + Q(disk_) + " cbt0");
    return r;
  }
  nlohmann::json List() { return RunResult(Barge() + " list --json " + Q(chain_)); }

  TempDir dir_;
  std::string disk_, chain_;
};

TEST_F(ListCliTest, EveryPointWithItsChainSizesAndVerification) {
  auto full = Backup("");
  auto inc1 = Incremental("write -P 0xbb 2M 64k");
  auto inc2 = Incremental("write -P 0xcc 3M 128k");
  auto full2 = Backup("");  // a full in the same folder starts a second chain
  auto inc3 = Incremental("write -P 0xdd 4M 64k");

  auto list = List();
  ASSERT_EQ(list["chain_dir"], chain_);
  const auto& points = list["points"];
  ASSERT_EQ(points.size(), 5u);
  const std::vector<nlohmann::json> made = {full, inc1, inc2, full2, inc3};
  uint64_t stored = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    SCOPED_TRACE(i);
    const auto& p = points[i];
    EXPECT_EQ(p["position"], i);
    EXPECT_EQ(p["id"], made[i]["id"]);
    EXPECT_EQ(p["type"], made[i]["type"]);
    EXPECT_EQ(p["reason"], made[i]["reason"]);
    EXPECT_EQ(p["parent"], made[i]["parent"]);
    EXPECT_EQ(p["started_at"], made[i]["started_at"]);
    EXPECT_EQ(p["virtual_size"], 8 << 20);
    EXPECT_EQ(p["compression"], "zstd:1");
    EXPECT_EQ(p["image_digest"], made[i]["image_digest"]);
    EXPECT_EQ(p["bytes_written"], made[i]["bytes_written"]);
    const std::string image = chain_ + "/" + p["image"].get<std::string>();
    EXPECT_EQ(p["image_bytes"], fs::file_size(image));
    EXPECT_GT(p["allocated_bytes"].get<uint64_t>(), 0u);
    EXPECT_TRUE(p["last_verification"].is_null());
    EXPECT_TRUE(p.contains("duration_seconds"));
    stored += p["image_bytes"].get<uint64_t>();
  }
  EXPECT_EQ(list["image_bytes"], stored);
  EXPECT_EQ(points[1]["dirty_bytes"], 64 << 10);
  EXPECT_EQ(points[1]["dirty_source"], "bitmap:cbt0");
  // Chains: 0..2 hang off the first full, 3..4 off the second.
  for (int i : {0, 1, 2}) EXPECT_EQ(points[i]["chain"], full["id"]);
  for (int i : {3, 4}) EXPECT_EQ(points[i]["chain"], full2["id"]);
  ASSERT_EQ(list["chains"].size(), 2u);
  EXPECT_EQ(list["chains"][0]["full"], full["id"]);
  EXPECT_EQ(list["chains"][0]["latest"], inc2["id"]);
  EXPECT_EQ(list["chains"][0]["points"].size(), 3u);
  EXPECT_EQ(list["chains"][1]["points"], nlohmann::json::array({full2["id"], inc3["id"]}));

  // Readable text: a table per chain, positions, parents by position.
  std::string text = RunOk(Barge() + " list " + Q(chain_));
  EXPECT_NE(text.find("5 points in 2 chains"), std::string::npos) << text;
  EXPECT_NE(text.find("chain 1 (full " + full["id"].get<std::string>() + ")"), std::string::npos) << text;
  EXPECT_NE(text.find("chain 2 (full " + full2["id"].get<std::string>() + ")"), std::string::npos) << text;
  EXPECT_NE(text.find("never"), std::string::npos) << text;
  EXPECT_NE(text.find("incremental"), std::string::npos) << text;
  EXPECT_NE(text.find(points[0]["started_at"].get<std::string>()), std::string::npos) << text;
  // A manifest or an image path names its folder too.
  auto by_image = RunResult(Barge() + " list --json " + Q(chain_ + "/" + points[2]["image"].get<std::string>()));
  EXPECT_EQ(by_image["points"].size(), 5u);
}

TEST_F(ListCliTest, VerifyRecordsItsOutcomeForList) {
  auto full = Backup("--compress none");  // data clusters at offsets qemu-img map shows
  auto inc = Incremental("write -P 0xbb 2M 64k");
  auto verify = RunResult(Barge() + " verify --json " + Q(chain_) + " --at 1");
  ASSERT_EQ(verify["verified"], nlohmann::json::array({inc["id"]}));

  // The record beside the manifest (docs/formats/backup.md).
  const std::string record_path = chain_ + "/" + inc["id"].get<std::string>() + ".verified";
  ASSERT_TRUE(fs::exists(record_path));
  std::ifstream f(record_path);
  auto record = nlohmann::json::parse(f, nullptr, false);
  EXPECT_EQ(record["format"], "barge-verification");
  EXPECT_EQ(record["format_version"], 1);
  EXPECT_EQ(record["id"], inc["id"]);
  EXPECT_EQ(record["result"], "ok");
  EXPECT_EQ(record["image_digest"]["algorithm"], "xxh3-128-zero-run-fold");
  EXPECT_EQ("xxh3-128:" + record["image_digest"]["value"].get<std::string>(), inc["image_digest"]);
  EXPECT_EQ(record["clusters_checked"], 128);

  auto list = List();
  EXPECT_TRUE(list["points"][0]["last_verification"].is_null());
  const auto& v = list["points"][1]["last_verification"];
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v["result"], "ok");
  EXPECT_EQ(v["verified_at"], record["verified_at"]);
  EXPECT_FALSE(v["stale"].get<bool>());
  EXPECT_EQ(v["clusters_checked"], 128);
  std::string text = RunOk(Barge() + " list " + Q(chain_));
  EXPECT_NE(text.find("ok " + record["verified_at"].get<std::string>()), std::string::npos) << text;

  // Damage the full's image data: verify fails (exit 2) and list says so
  // for the point that was checked.
  const std::string full_image = chain_ + "/" + full["id"].get<std::string>() + ".qcow2";
  auto map = nlohmann::json::parse(RunOk("qemu-img map -f qcow2 --output=json " + Q(full_image)));
  uint64_t host = 0;
  for (const auto& e : map) {
    if (e.value("data", false) && e.contains("offset")) host = e["offset"].get<uint64_t>();
  }
  ASSERT_GT(host, 0u);
  RunOk("printf 'XXXXXXXX' | dd of=" + Q(full_image) + " bs=1 seek=" + std::to_string(host + 100) +
        " conv=notrunc status=none");
  auto bad = Sh(Barge() + " verify --json " + Q(chain_) + " --at 0");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  list = List();
  const auto& failed = list["points"][0]["last_verification"];
  ASSERT_TRUE(failed.is_object()) << list.dump();
  EXPECT_EQ(failed["result"], "failed");
  EXPECT_FALSE(failed.value("error", "").empty());
  EXPECT_NE(RunOk(Barge() + " list " + Q(chain_)).find("FAILED"), std::string::npos);
  // The incremental's own record stays until it is verified again.
  EXPECT_EQ(list["points"][1]["last_verification"]["result"], "ok");
}

TEST_F(ListCliTest, AMergeDropsTheRecordsOfWhatItRewritesAndFolds) {
  auto full = Backup("");
  auto inc1 = Incremental("write -P 0xbb 2M 64k");
  auto inc2 = Incremental("write -P 0xcc 3M 64k");
  RunOk(Barge() + " verify " + Q(chain_) + " --all");
  for (const auto& p : {full, inc1, inc2}) {
    EXPECT_TRUE(fs::exists(chain_ + "/" + p["id"].get<std::string>() + ".verified"));
  }
  RunOk(Barge() + " merge " + Q(chain_) + " --through 1");
  auto list = List();
  ASSERT_EQ(list["points"].size(), 2u);
  EXPECT_EQ(list["points"][0]["id"], inc1["id"]);
  EXPECT_EQ(list["points"][0]["type"], "full");
  // Its image was rewritten by the merge: never verified since. The folded
  // point's record is gone; the untouched point keeps its own.
  EXPECT_TRUE(list["points"][0]["last_verification"].is_null());
  EXPECT_FALSE(fs::exists(chain_ + "/" + full["id"].get<std::string>() + ".verified"));
  EXPECT_EQ(list["points"][1]["last_verification"]["result"], "ok");
  RunOk(Barge() + " verify " + Q(chain_) + " --at " + inc1["id"].get<std::string>());
  EXPECT_EQ(List()["points"][0]["last_verification"]["result"], "ok");
}

// A record whose image was replaced behind barge's back (another size) is
// shown as stale; a leftover record of a point that is gone is removed by
// the next backup.
TEST_F(ListCliTest, StaleAndOrphanRecords) {
  auto full = Backup("");
  auto inc = Incremental("write -P 0xbb 2M 64k");
  RunOk(Barge() + " verify " + Q(chain_) + " --all");
  const std::string image = chain_ + "/" + full["id"].get<std::string>() + ".qcow2";
  const uint64_t size = fs::file_size(image);
  fs::resize_file(image, size + 65536);  // another file now, the same manifest
  auto list = List();
  EXPECT_TRUE(list["points"][0]["last_verification"]["stale"].get<bool>());
  // The incremental reads through the full: its record is stale too.
  EXPECT_TRUE(list["points"][1]["last_verification"]["stale"].get<bool>());
  EXPECT_NE(RunOk(Barge() + " list " + Q(chain_)).find("stale"), std::string::npos);
  // Back to its size, but modified after the record was written: still
  // stale (in-place changes keep the size); a new verify clears it.
  fs::resize_file(image, size);
  EXPECT_TRUE(List()["points"][0]["last_verification"]["stale"].get<bool>());
  RunOk(Barge() + " verify " + Q(chain_) + " --all");
  EXPECT_FALSE(List()["points"][0]["last_verification"]["stale"].get<bool>());
  EXPECT_FALSE(List()["points"][1]["last_verification"]["stale"].get<bool>());
  // Four bytes overwritten in place in the full's image right after a
  // verify: same size, possibly the same coarse timestamp as the record.
  RunOk(Barge() + " verify " + Q(chain_) + " --all");
  {
    std::fstream f(image, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 4096));
    f.write("XXXX", 4);
  }
  fs::last_write_time(image, fs::last_write_time(image) + std::chrono::seconds(1));  // a later write
  EXPECT_TRUE(List()["points"][0]["last_verification"]["stale"].get<bool>());
  EXPECT_TRUE(List()["points"][1]["last_verification"]["stale"].get<bool>());

  const std::string orphan = chain_ + "/0077-20200101T000000Z.verified";
  fs::copy_file(chain_ + "/" + inc["id"].get<std::string>() + ".verified", orphan);
  EXPECT_EQ(List()["points"].size(), 2u);  // not a point
  Incremental("write -P 0xdd 4M 64k");
  EXPECT_FALSE(fs::exists(orphan));
  EXPECT_TRUE(fs::exists(chain_ + "/" + inc["id"].get<std::string>() + ".verified"));
}

// A record that cannot be written (here: a folder squats its name, which
// even root cannot rename a file over) is a warning; the verification
// still passes. `list` warns about the unreadable record and shows never.
TEST_F(ListCliTest, UnwritableRecordIsAWarning) {
  auto full = Backup("");
  fs::create_directory(chain_ + "/" + full["id"].get<std::string>() + ".verified");
  auto r = Sh(Barge() + " verify --json " + Q(chain_));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto warnings = Warnings(r.stdout_text);
  ASSERT_EQ(warnings.size(), 1u) << r.output;
  EXPECT_NE(warnings[0].value("message", "").find("could not record the verification of " +
                                                  full["id"].get<std::string>()),
            std::string::npos)
      << r.output;
  EXPECT_EQ(ResultOf(r.stdout_text)["verified"], nlohmann::json::array({full["id"]}));
  auto listed = Sh(Barge() + " list --json " + Q(chain_));
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_TRUE(ResultOf(listed.stdout_text)["points"][0]["last_verification"].is_null());
  EXPECT_FALSE(Warnings(listed.stdout_text).empty()) << listed.output;
}

TEST_F(ListCliTest, MissingImagesEmptyFoldersAndMistakes) {
  auto full = Backup("");
  auto inc = Incremental("write -P 0xbb 2M 64k");
  fs::remove(chain_ + "/" + full["id"].get<std::string>() + ".qcow2");
  auto r = Sh(Barge() + " list --json " + Q(chain_));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto list = ResultOf(r.stdout_text);
  EXPECT_TRUE(list["points"][0]["image_bytes"].is_null());
  EXPECT_EQ(list["points"][1]["image_bytes"], fs::file_size(chain_ + "/" + inc["id"].get<std::string>() + ".qcow2"));
  EXPECT_FALSE(Warnings(r.stdout_text).empty()) << r.output;
  EXPECT_NE(RunOk(Barge() + " list " + Q(chain_) + " 2>&1").find("MISSING"), std::string::npos);

  // A broken parent link: the point is listed apart, with the reason.
  fs::remove(chain_ + "/" + full["id"].get<std::string>() + ".json");
  list = List();
  ASSERT_EQ(list["points"].size(), 1u);
  EXPECT_TRUE(list["points"][0]["chain"].is_null());
  EXPECT_NE(list["points"][0].value("broken", "").find("missing"), std::string::npos) << list.dump();
  EXPECT_NE(RunOk(Barge() + " list " + Q(chain_) + " 2>/dev/null").find("broken"), std::string::npos);

  fs::create_directories(dir_ / "empty");
  auto empty = RunResult(Barge() + " list --json " + Q(dir_ / "empty"));
  EXPECT_TRUE(empty["points"].empty());
  EXPECT_NE(RunOk(Barge() + " list " + Q(dir_ / "empty")).find("no backups"), std::string::npos);

  auto absent = Sh(Barge() + " list " + Q(dir_ / "absent"));
  EXPECT_EQ(absent.exit_code, 1) << absent.output;
  EXPECT_NE(absent.output.find("absent"), std::string::npos) << absent.output;
  EXPECT_EQ(Sh(Barge() + " list").exit_code, 64);
}

// `list TARGET` searched a chain folder whose manifests do not load as if
// it were a plain folder: the broken chain vanished from the listing. It
// is a warning naming the folder and the error, and a row of its own.
TEST_F(ListCliTest, TargetWarnsAboutAChainFolderThatDoesNotLoad) {
  auto full = Backup("");
  const std::string broken = dir_ / "bk/vdb";
  fs::create_directories(broken);
  fs::copy_file(chain_ + "/" + full["id"].get<std::string>() + ".json", broken + "/0000-20200101T000000Z.json");
  { std::ofstream(broken + "/0001-20200102T000000Z.json") << "{ not a manifest"; }
  // A folder of its own below the broken one is not searched.
  fs::create_directories(broken + "/deeper");

  auto r = Sh(Barge() + " list --json " + Q(dir_ / "bk"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto warnings = Warnings(r.stdout_text);
  ASSERT_EQ(warnings.size(), 1u) << r.output;
  EXPECT_EQ(warnings[0].value("file", ""), broken) << r.output;
  EXPECT_NE(warnings[0].value("message", "").find("0001-20200102T000000Z.json"), std::string::npos) << r.output;
  const auto folders = ResultOf(r.stdout_text)["chain_folders"];
  ASSERT_EQ(folders.size(), 1u) << r.output;
  EXPECT_EQ(folders[0]["path"], chain_);

  auto text = Sh(Barge() + " list " + Q(dir_ / "bk") + " 2>&1");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("2 chain folders below it"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("vdb  "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("CANNOT BE LOADED"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("barge: warning: " + broken + ": "), std::string::npos) << text.output;
}

}  // namespace
}  // namespace barge
