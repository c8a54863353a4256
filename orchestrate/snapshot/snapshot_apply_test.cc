// The apply executor on image files with a temporary catalog: the issue's
// scenarios (create three, rename one, roll back to the first keeping and
// discarding newer ones, a config that still lists implicitly deleted
// snapshots, an interrupted apply), states that survive a new process
// (a new store), and the per-disk apply lock.
#include "orchestrate/snapshot/snapshot_apply.h"

#include <gtest/gtest.h>

#include "blockio/memory.h"
#include "formats/qcow2_writer.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

class SnapshotApplyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    formats::Qcow2WriterOptions o;
    o.virtual_size = 4 << 20;
    o.compression = formats::Compression::kNone;
    MemorySink sink;
    auto w = formats::Qcow2Writer::Create(sink, o);
    ASSERT_TRUE(w.ok());
    for (uint64_t c = 0; c < (*w)->cluster_count(); c += 3) {
      ASSERT_TRUE((*w)->WriteData(c, testing::RandomBytes(65536, c)).ok());
    }
    ASSERT_TRUE((*w)->Finish().ok());
    image_ = dir_ / "disk.qcow2";
    ASSERT_TRUE(Env::Default().WriteFileAtomic(image_, sink.contents()).ok());
    catalog_ = dir_ / "state/catalog.db";
  }

  Result<ApplyResult> Apply(const std::string& config_json,
                            std::function<Status(const SnapshotAction&, std::string_view)> fault = {}) {
    auto config = ParseApplyConfig(config_json);
    EXPECT_TRUE(config.ok()) << config.error().ToString();
    if (!config.ok()) return config.error();
    ApplyRequest req;
    req.target.image = image_;
    req.config = *config;
    req.catalog_path = catalog_;
    req.fault = std::move(fault);
    return ApplySnapshotConfig(Env::Default(), req);
  }
  ApplyResult MustApply(const std::string& config_json) {
    auto r = Apply(config_json);
    EXPECT_TRUE(r.ok()) << r.error().ToString();
    if (!r.ok()) return {};
    EXPECT_TRUE(r->ok());
    for (const auto& a : r->actions) EXPECT_TRUE(a.ok) << a.error;
    return *r;
  }
  // The image's snapshot names (uuids), table order.
  std::vector<std::string> ImageNames() {
    SnapshotTarget t;
    t.image = image_;
    auto l = ListDiskSnapshots(Env::Default(), t);
    EXPECT_TRUE(l.ok());
    std::vector<std::string> out;
    if (l.ok()) {
      for (const auto& s : l->snapshots) out.push_back(s.info.name);
    }
    return out;
  }
  // "uuid=state" per listed snapshot in the result.
  static std::vector<std::string> States(const ApplyResult& r) {
    std::vector<std::string> out;
    for (const auto& s : r.snapshots) out.push_back(s.stored.uuid + "=" + std::string(SnapshotStateName(s.stored.state)));
    return out;
  }
  static std::vector<std::string> Actions(const ApplyResult& r) {
    std::vector<std::string> out;
    for (const auto& a : r.actions) out.push_back(std::string(ActionKindName(a.action.kind)) + ":" + a.action.uuid);
    return out;
  }

  testing::TempDir dir_;
  std::string image_;
  std::string catalog_;
};

using V = std::vector<std::string>;

TEST_F(SnapshotApplyTest, IssueScenarios) {
  // Create three.
  ApplyResult r = MustApply(R"({"snapshots": [{"uuid": "u1", "display_name": "one"},
                                               {"uuid": "u2", "display_name": "two"},
                                               {"uuid": "u3", "display_name": "three"}]})");
  EXPECT_EQ(Actions(r), (V{"create:u1", "create:u2", "create:u3"}));
  EXPECT_EQ(States(r), (V{"u1=created", "u2=created", "u3=created"}));
  EXPECT_EQ(ImageNames(), (V{"u1", "u2", "u3"}));
  EXPECT_TRUE(r.snapshots[0].has_usage);
  EXPECT_EQ(r.snapshots[0].stored.snapshot_id, "1");
  EXPECT_EQ(r.snapshots[0].usage.logical_referenced, 22u * 65536);

  // The same config again: nothing to do.
  r = MustApply(R"({"snapshots": [{"uuid": "u1", "display_name": "one"}, {"uuid": "u2", "display_name": "two"},
                                  {"uuid": "u3", "display_name": "three"}]})");
  EXPECT_TRUE(r.actions.empty());

  // Rename one: the display name only; the image keeps the uuid.
  r = MustApply(R"({"snapshots": [{"uuid": "u1", "display_name": "first"}, {"uuid": "u2", "display_name": "two"},
                                  {"uuid": "u3", "display_name": "three"}]})");
  EXPECT_EQ(Actions(r), V{"rename:u1"});
  EXPECT_EQ(r.snapshots[0].stored.display_name, "first");
  EXPECT_EQ(ImageNames(), (V{"u1", "u2", "u3"}));

  // Roll back to the first, keeping newer ones.
  r = MustApply(R"({"snapshots": [{"uuid": "u1", "display_name": "first", "rollback": {"counter": 1}},
                                  {"uuid": "u2", "display_name": "two"}, {"uuid": "u3", "display_name": "three"}]})");
  EXPECT_EQ(Actions(r), V{"rollback:u1"});
  EXPECT_EQ(r.snapshots[0].stored.rollback_counter, 1u);
  EXPECT_GT(r.snapshots[0].stored.last_rollback_at, 0);
  EXPECT_EQ(ImageNames(), (V{"u1", "u2", "u3"}));

  // Again with the counter raised and discard_newer: u2 and u3 go.
  r = MustApply(R"({"snapshots": [{"uuid": "u1", "display_name": "first", "rollback": {"counter": 2, "discard_newer": true}},
                                  {"uuid": "u2", "display_name": "two"}, {"uuid": "u3", "display_name": "three"}]})");
  EXPECT_EQ(Actions(r), V{"rollback:u1"});
  EXPECT_EQ(States(r), (V{"u1=created", "u2=implicitly_deleted", "u3=implicitly_deleted"}));
  EXPECT_NE(r.snapshots[1].stored.message.find("rollback to 'first'"), std::string::npos);
  EXPECT_EQ(ImageNames(), V{"u1"});

  // The controller still lists them: ignored, reported again, never recreated.
  r = MustApply(R"({"snapshots": [{"uuid": "u1", "display_name": "first", "rollback": {"counter": 2}},
                                  {"uuid": "u2", "display_name": "two"}, {"uuid": "u3", "display_name": "three"}]})");
  EXPECT_TRUE(r.actions.empty());
  EXPECT_EQ(States(r), (V{"u1=created", "u2=implicitly_deleted", "u3=implicitly_deleted"}));
  EXPECT_EQ(ImageNames(), V{"u1"});

  // Unlisted: implicitly deleted ones are forgotten, the rest deleted.
  r = MustApply(R"({"snapshots": [{"uuid": "u4"}]})");
  EXPECT_EQ(Actions(r), (V{"forget:u2", "forget:u3", "delete:u1", "create:u4"}));
  EXPECT_EQ(ImageNames(), V{"u4"});
  auto states = LoadSnapshotStates(Env::Default(), SnapshotTarget{image_, "", "", ""}, catalog_);
  ASSERT_TRUE(states.ok());
  ASSERT_EQ(states->size(), 1u);
  EXPECT_EQ((*states)[0].uuid, "u4");
  auto by_uuid = SnapshotStatesByUuid(Env::Default(), SnapshotTarget{image_, "", "", ""}, catalog_);
  ASSERT_TRUE(by_uuid.ok());
  ASSERT_EQ(by_uuid->size(), 1u);
  EXPECT_EQ(by_uuid->at("u4").state, SnapshotState::kCreated);
  // No catalog: no states, and listing creates none.
  const std::string none = catalog_ + ".none";
  auto empty = SnapshotStatesByUuid(Env::Default(), SnapshotTarget{image_, "", "", ""}, none);
  ASSERT_TRUE(empty.ok()) << empty.error().ToString();
  EXPECT_TRUE(empty->empty());
  EXPECT_FALSE(Env::Default().Exists(none));
}

TEST_F(SnapshotApplyTest, InterruptedApplyResumes) {
  // Dies after u2 is in the image but before its state says so.
  auto died = Apply(R"({"snapshots": [{"uuid": "u1"}, {"uuid": "u2"}, {"uuid": "u3"}]})",
                    [](const SnapshotAction& a, std::string_view point) -> Status {
                      if (a.uuid == "u2" && point == "after") return Error::Cancelled("killed");
                      return OkStatus();
                    });
  ASSERT_FALSE(died.ok());
  EXPECT_EQ(ImageNames(), (V{"u1", "u2"}));
  auto states = LoadSnapshotStates(Env::Default(), SnapshotTarget{image_, "", "", ""}, catalog_);
  ASSERT_TRUE(states.ok());
  ASSERT_EQ(states->size(), 2u);
  EXPECT_EQ((*states)[1].state, SnapshotState::kCreating);
  // Dies before u3's create reaches the image.
  auto died2 = Apply(R"({"snapshots": [{"uuid": "u1"}, {"uuid": "u2"}, {"uuid": "u3"}]})",
                     [](const SnapshotAction& a, std::string_view point) -> Status {
                       if (a.uuid == "u3" && point == "before") return Error::Cancelled("killed");
                       return OkStatus();
                     });
  ASSERT_FALSE(died2.ok());
  ApplyResult r = MustApply(R"({"snapshots": [{"uuid": "u1"}, {"uuid": "u2"}, {"uuid": "u3"}]})");
  EXPECT_EQ(Actions(r), V{"create:u3"});
  EXPECT_EQ(States(r), (V{"u1=created", "u2=created", "u3=created"}));
  EXPECT_EQ(ImageNames(), (V{"u1", "u2", "u3"}));
  // A delete that died after the image changed is finished by the next apply.
  auto died3 = Apply(R"({"snapshots": [{"uuid": "u1"}]})", [](const SnapshotAction& a, std::string_view point) -> Status {
    if (a.uuid == "u3" && point == "after") return Error::Cancelled("killed");
    return OkStatus();
  });
  ASSERT_FALSE(died3.ok());
  r = MustApply(R"({"snapshots": [{"uuid": "u1"}]})");
  EXPECT_EQ(Actions(r), V{"forget:u3"});
  EXPECT_EQ(ImageNames(), V{"u1"});
}

TEST_F(SnapshotApplyTest, FailuresAreRecordedAndRetried) {
  // A failing pre-hook makes the create fail: state error with the message.
  auto config = ParseApplyConfig(R"({"snapshots": [{"uuid": "u1"}]})");
  ASSERT_TRUE(config.ok());
  ApplyRequest req;
  req.target.image = image_;
  req.config = *config;
  req.catalog_path = catalog_;
  req.consistency.hooks.pre = "echo not now; exit 1";
  auto r = ApplySnapshotConfig(Env::Default(), req);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_FALSE(r->ok());
  EXPECT_EQ(States(*r), V{"u1=error"});
  EXPECT_NE(r->snapshots[0].stored.message.find("not now"), std::string::npos) << r->snapshots[0].stored.message;
  EXPECT_TRUE(ImageNames().empty());
  req.consistency.hooks.pre.clear();
  r = ApplySnapshotConfig(Env::Default(), req);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->ok());
  EXPECT_EQ(States(*r), V{"u1=created"});
}

TEST_F(SnapshotApplyTest, OneApplyPerDiskAtATime) {
  MustApply(R"({"snapshots": []})");
  // Another process's apply holds the disk's lock while this one starts.
  auto blocked = Apply(R"({"snapshots": [{"uuid": "u1"}]})", [&](const SnapshotAction&, std::string_view point) -> Status {
    if (point != "before") return OkStatus();
    auto second = Apply(R"({"snapshots": []})");
    EXPECT_FALSE(second.ok());
    if (!second.ok()) {
      EXPECT_EQ(second.error().code(), ErrorCode::kBusy) << second.error().ToString();
    }
    return OkStatus();
  });
  ASSERT_TRUE(blocked.ok()) << blocked.error().ToString();
}

TEST_F(SnapshotApplyTest, SnapshotsBargeDoesNotManageAreLeftAlone) {
  SnapshotCreateRequest manual;
  manual.target.image = image_;
  manual.name = "manual";
  ASSERT_TRUE(CreateDiskSnapshot(Env::Default(), manual).ok());
  ApplyResult r = MustApply(R"({"snapshots": [{"uuid": "u1"}]})");
  EXPECT_EQ(Actions(r), V{"create:u1"});
  r = MustApply(R"({"snapshots": []})");
  EXPECT_EQ(Actions(r), V{"delete:u1"});
  EXPECT_EQ(ImageNames(), V{"manual"});
}

}  // namespace
}  // namespace barge::orchestrate

namespace barge::orchestrate {
namespace {

// `snapshot create --uuid`: the display name goes to the catalog --catalog
// names; a catalog that cannot take it says the snapshot was made anyway.
TEST_F(SnapshotApplyTest, RecordCreatedSnapshotKeepsTheDisplayName) {
  const SnapshotTarget target{image_, "", "", ""};
  formats::SnapshotInfo created;
  created.id = "1";
  created.name = "u9";
  created.date_sec = 1700000000;
  // --catalog in a folder that does not exist: CatalogPathFromFlag's kNotFound, unwrapped.
  Status missing = RecordCreatedSnapshot(Env::Default(), target, catalog_, created, "u9", "nightly");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(missing.error().message().find("was created"), std::string::npos);

  ASSERT_TRUE(Env::Default().CreateDirs(dir_ / "state").ok());
  ASSERT_TRUE(RecordCreatedSnapshot(Env::Default(), target, catalog_, created, "u9", "nightly").ok());
  auto by_uuid = SnapshotStatesByUuid(Env::Default(), target, catalog_);
  ASSERT_TRUE(by_uuid.ok()) << by_uuid.error().ToString();
  ASSERT_EQ(by_uuid->count("u9"), 1u);
  EXPECT_EQ(by_uuid->at("u9").display_name, "nightly");
  EXPECT_EQ(by_uuid->at("u9").state, SnapshotState::kCreated);
  EXPECT_EQ(by_uuid->at("u9").snapshot_id, "1");

  // A catalog file that is no database: the record fails, wrapped.
  const std::string junk = dir_ / "junk.db";
  ASSERT_TRUE(Env::Default().WriteFileAtomic(junk, std::string(4096, 'x')).ok());
  Status bad = RecordCreatedSnapshot(Env::Default(), target, junk, created, "u9", "nightly");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("snapshot 'u9' (id 1) was created, but its display name was not recorded"),
            std::string::npos)
      << bad.error().message();
}

}  // namespace
}  // namespace barge::orchestrate
