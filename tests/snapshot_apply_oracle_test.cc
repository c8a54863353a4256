// `snapshot apply` judged by qemu: the issue's scenarios on a file qemu-io
// writes between applies; after every apply qemu-img check is clean,
// qemu-img snapshot -l lists the uuids barge reports as created, and a
// rollback gives the guest data of the snapshot's moment.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "orchestrate/snapshot/snapshot_apply.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

using barge::testing::ReadFile;
using barge::testing::RunOk;
using barge::testing::ShellQuote;
using barge::testing::TempDir;

class SnapshotApplyOracle : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    img_ = dir_ / "disk.qcow2";
    RunOk("qemu-img create -f qcow2 " + ShellQuote(img_) + " 8M");
  }
  ApplyResult Apply(const std::string& json) {
    auto config = ParseApplyConfig(json);
    EXPECT_TRUE(config.ok()) << config.error().ToString();
    ApplyRequest req;
    req.target.image = img_;
    req.config = *config;
    req.catalog_path = dir_ / "catalog.db";
    auto r = ApplySnapshotConfig(Env::Default(), req);
    EXPECT_TRUE(r.ok()) << r.error().ToString();
    if (!r.ok()) return {};
    EXPECT_TRUE(r->ok());
    RunOk("qemu-img check -f qcow2 " + ShellQuote(img_));
    // qemu lists exactly the snapshots barge says are created.
    std::vector<std::string> created, listed;
    for (const auto& s : r->snapshots) {
      if (s.stored.state == SnapshotState::kCreated) created.push_back(s.stored.uuid);
    }
    std::string out = RunOk("qemu-img info -f qcow2 --output=json " + ShellQuote(img_));
    auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
    if (j.contains("snapshots")) {
      for (const auto& s : j["snapshots"]) listed.push_back(s["name"].get<std::string>());
    }
    EXPECT_EQ(listed, created);
    return *r;
  }
  void Write(int pattern, const std::string& offset, const std::string& length) {
    RunOk("qemu-io -f qcow2 -c " + ShellQuote("write -P " + std::to_string(pattern) + " " + offset + " " + length) +
          " " + ShellQuote(img_));
  }
  std::vector<std::byte> Active() {
    const std::string out = dir_ / "active.raw";
    RunOk("qemu-img convert -f qcow2 -O raw " + ShellQuote(img_) + " " + ShellQuote(out));
    return ReadFile(out);
  }
  TempDir dir_;
  std::string img_;
};

TEST_F(SnapshotApplyOracle, Scenarios) {
  Write(0x11, "0", "1M");
  const auto one = Active();
  Apply(R"({"snapshots": [{"uuid": "u1", "display_name": "one"}]})");
  Write(0x22, "512k", "1M");
  const auto two = Active();
  Apply(R"({"snapshots": [{"uuid": "u1", "display_name": "one"}, {"uuid": "u2", "display_name": "two"}]})");
  Write(0x33, "4M", "64k");
  Apply(R"({"snapshots": [{"uuid": "u1", "display_name": "one"}, {"uuid": "u2", "display_name": "two"},
                          {"uuid": "u3", "display_name": "three"}]})");
  Write(0x44, "0", "64k");
  // Rename, then roll back to the first keeping the newer ones.
  ApplyResult r = Apply(R"({"snapshots": [{"uuid": "u1", "display_name": "first", "rollback": {"counter": 1}},
                                          {"uuid": "u2", "display_name": "two"}, {"uuid": "u3", "display_name": "three"}]})");
  EXPECT_EQ(r.snapshots[0].stored.display_name, "first");
  EXPECT_EQ(Active(), one);
  // To the second, discarding the third.
  r = Apply(R"({"snapshots": [{"uuid": "u1", "display_name": "first", "rollback": {"counter": 1}},
                              {"uuid": "u2", "display_name": "two", "rollback": {"counter": 1, "discard_newer": true}},
                              {"uuid": "u3", "display_name": "three"}]})");
  EXPECT_EQ(Active(), two);
  EXPECT_EQ(r.snapshots[2].stored.state, SnapshotState::kImplicitlyDeleted);
  // Still listed: ignored and reported again.
  r = Apply(R"({"snapshots": [{"uuid": "u1", "display_name": "first", "rollback": {"counter": 1}},
                              {"uuid": "u2", "display_name": "two", "rollback": {"counter": 1}},
                              {"uuid": "u3", "display_name": "three"}]})");
  EXPECT_TRUE(r.actions.empty());
  EXPECT_EQ(r.snapshots[2].stored.state, SnapshotState::kImplicitlyDeleted);
  // The writes after a rollback copy on write: the snapshots keep their data.
  Write(0x55, "0", "2M");
  r = Apply(R"({"snapshots": [{"uuid": "u1", "display_name": "first", "rollback": {"counter": 2}},
                              {"uuid": "u2", "display_name": "two", "rollback": {"counter": 1}}]})");
  EXPECT_EQ(Active(), one);
}

}  // namespace
}  // namespace barge::orchestrate
