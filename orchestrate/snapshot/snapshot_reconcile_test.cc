// Table tests of the apply decision (desired set + stored states + the
// image's list -> actions) and of the config parser.
#include "orchestrate/snapshot/snapshot_reconcile.h"

#include <gtest/gtest.h>

namespace barge::orchestrate {
namespace {

using S = SnapshotState;
using K = ActionKind;

DesiredSnapshot Want(const std::string& uuid, const std::string& name = "",
                     std::optional<DesiredRollback> rollback = std::nullopt) {
  return {uuid, name.empty() ? uuid : name, rollback};
}

StoredSnapshot Have(const std::string& uuid, S state, const std::string& name = "", uint64_t counter = 0) {
  StoredSnapshot s;
  s.uuid = uuid;
  s.display_name = name.empty() ? uuid : name;
  s.state = state;
  s.rollback_counter = counter;
  return s;
}

std::vector<formats::SnapshotInfo> Image(std::initializer_list<std::string> names) {
  std::vector<formats::SnapshotInfo> out;
  int id = 1;
  for (const auto& n : names) {
    formats::SnapshotInfo s;
    s.id = std::to_string(id++);
    s.name = n;
    out.push_back(s);
  }
  return out;
}

// "kind:uuid" per action, plus ":counter" for rollbacks and creates with one.
std::vector<std::string> Plan(const std::vector<DesiredSnapshot>& desired, const std::vector<StoredSnapshot>& stored,
                              const std::vector<formats::SnapshotInfo>& image) {
  std::vector<std::string> out;
  for (const SnapshotAction& a : ReconcileSnapshots({desired}, stored, image)) {
    std::string s = std::string(ActionKindName(a.kind)) + ":" + a.uuid;
    if ((a.kind == K::kRollback || a.kind == K::kCreate || a.kind == K::kAdopt) && a.rollback_counter) {
      s += ":" + std::to_string(a.rollback_counter);
    }
    if (a.discard_newer) s += ":discard";
    out.push_back(s);
  }
  return out;
}

using V = std::vector<std::string>;

struct Case {
  const char* name;
  std::vector<DesiredSnapshot> desired;
  std::vector<StoredSnapshot> stored;
  std::vector<formats::SnapshotInfo> image;
  V expected;
};

TEST(SnapshotReconcile, Table) {
  const DesiredRollback r2{2, false}, r3d{3, true};
  const std::vector<Case> cases = {
      {"nothing", {}, {}, {}, {}},
      {"create three", {Want("a"), Want("b"), Want("c")}, {}, {}, V{"create:a", "create:b", "create:c"}},
      {"steady", {Want("a")}, {Have("a", S::kCreated)}, Image({"a"}), {}},
      {"rename", {Want("a", "new")}, {Have("a", S::kCreated, "old")}, Image({"a"}), V{"rename:a"}},
      {"unlisted is deleted", {}, {Have("a", S::kCreated)}, Image({"a"}), V{"delete:a"}},
      {"unlisted and gone is forgotten", {}, {Have("a", S::kCreated)}, {}, V{"forget:a"}},
      {"rollback when the counter rises", {Want("a", "", r2)}, {Have("a", S::kCreated, "", 1)}, Image({"a"}),
       V{"rollback:a:2"}},
      {"no rollback at the same counter", {Want("a", "", r2)}, {Have("a", S::kCreated, "", 2)}, Image({"a"}), {}},
      {"rollback with discard", {Want("a", "", r3d)}, {Have("a", S::kCreated)}, Image({"a"}),
       V{"rollback:a:3:discard"}},
      {"a new snapshot's counter is its baseline", {Want("a", "", r2)}, {}, {}, V{"create:a:2"}},
      {"implicitly deleted and listed: ignored", {Want("a")}, {Have("a", S::kImplicitlyDeleted)}, {}, {}},
      {"implicitly deleted, listed, even with a rollback", {Want("a", "", r3d)}, {Have("a", S::kImplicitlyDeleted)},
       Image({"a"}), {}},
      {"implicitly deleted and unlisted: forgotten", {}, {Have("a", S::kImplicitlyDeleted)}, {}, V{"forget:a"}},
      {"created but vanished", {Want("a")}, {Have("a", S::kCreated)}, {}, V{"mark_implicitly_deleted:a"}},
      {"interrupted create that made it", {Want("a")}, {Have("a", S::kCreating)}, Image({"a"}), V{"adopt:a"}},
      {"interrupted create that did not", {Want("a")}, {Have("a", S::kCreating)}, {}, V{"create:a"}},
      {"interrupted delete that made it", {}, {Have("a", S::kDeleting)}, {}, V{"forget:a"}},
      {"interrupted delete that did not", {}, {Have("a", S::kDeleting)}, Image({"a"}), V{"delete:a"}},
      {"error, still there: adopted, then its rollback", {Want("a", "", r2)}, {Have("a", S::kError, "", 1)},
       Image({"a"}), V{"adopt:a:1", "rollback:a:2"}},
      {"error, missing: created again", {Want("a")}, {Have("a", S::kError)}, {}, V{"create:a"}},
      {"unknown snapshots of the image are left alone", {Want("a")}, {}, Image({"a", "manual"}), V{"adopt:a"}},
      {"order: forget, vanished, delete, adopt, rename, rollback, create",
       {Want("new"), Want("ren", "R", r2), Want("gone"), Want("adopt")},
       {Have("old", S::kCreated), Have("lost", S::kCreated), Have("ren", S::kCreated, "r"), Have("gone", S::kCreated),
        Have("adopt", S::kCreating)},
       Image({"old", "ren", "adopt"}),
       V{"forget:lost", "mark_implicitly_deleted:gone", "delete:old", "adopt:adopt", "rename:ren", "rollback:ren:2",
         "create:new"}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Plan(c.desired, c.stored, c.image), c.expected) << c.name;
  }
}

TEST(SnapshotReconcile, ParseConfig) {
  auto c = ParseApplyConfig(R"({"snapshots": [
      {"uuid": "u1", "display_name": "first"},
      {"uuid": "u2", "rollback": {"counter": 3, "discard_newer": true}, "extra": 1},
      {"uuid": "u3", "rollback": null}]})");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  ASSERT_EQ(c->snapshots.size(), 3u);
  EXPECT_EQ(c->snapshots[0].display_name, "first");
  EXPECT_FALSE(c->snapshots[0].rollback.has_value());
  EXPECT_EQ(c->snapshots[1].display_name, "u2");
  ASSERT_TRUE(c->snapshots[1].rollback.has_value());
  EXPECT_EQ(c->snapshots[1].rollback->counter, 3u);
  EXPECT_TRUE(c->snapshots[1].rollback->discard_newer);
  EXPECT_FALSE(c->snapshots[2].rollback.has_value());
  EXPECT_TRUE(ParseApplyConfig(R"({"snapshots": []})").ok());
  for (const char* bad : {"", "[]", "{}", R"({"snapshots": {}})", R"({"snapshots": [{}]})",
                          R"({"snapshots": [{"uuid": ""}]})", R"({"snapshots": [{"uuid": "a"}, {"uuid": "a"}]})",
                          R"({"snapshots": [{"uuid": "a", "rollback": {"counter": -1}}]})",
                          R"({"snapshots": [{"uuid": "a", "rollback": {}}]})",
                          R"({"snapshots": [{"uuid": "a", "display_name": 5}]})"}) {
    auto r = ParseApplyConfig(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << bad;
  }
  auto long_uuid = ParseApplyConfig(R"({"snapshots": [{"uuid": ")" + std::string(300, 'x') + R"("}]})");
  EXPECT_FALSE(long_uuid.ok());
}

}  // namespace
}  // namespace barge::orchestrate
