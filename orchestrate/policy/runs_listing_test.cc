// `runs list`'s reading: the catalog files of --catalog flags, the records
// of several files as one table, and a point's fate.
#include "orchestrate/policy/runs_listing.h"

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

// A finished run of policy "p" started at `started`, recorded in `path`.
void Record(const std::string& path, const std::string& source, const std::string& started) {
  auto c = PolicyCatalog::Open(PosixEnv(), path);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  RunRecord r;
  r.run_id = "p-" + started;
  r.policy = "p";
  r.source = source;
  r.source_kind = "image";
  r.trigger = "schedule";
  r.host = "h";
  r.started_at = started;
  r.result = "success";
  auto id = (*c)->BeginRun(r);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*c)->FinishRun(*id, r).ok());
}

TEST(ListedCatalogsTest, FilesAndRecordsFolders) {
  barge::testing::TempDir dir;
  Env& env = PosixEnv();
  ASSERT_TRUE(env.CreateDir(dir / "records").ok());
  Record(dir / "records/b.db", "disk", "2026-11-20T02:00:00Z");
  Record(dir / "records/a.db", "disk", "2026-11-21T02:00:00Z");
  ASSERT_TRUE(env.WriteFileAtomic(dir / "records/notes.txt", std::string_view("x")).ok());
  Record(dir / "one.db", "other", "2026-11-19T02:00:00Z");

  auto files = ListedCatalogs(env, {dir / "records/", dir / "one.db"});
  ASSERT_TRUE(files.ok()) << files.error().ToString();
  EXPECT_EQ(*files, (std::vector<std::string>{dir / "records/a.db", dir / "records/b.db", dir / "one.db"}));

  auto missing = ListedCatalogs(env, {dir / "none.db"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(env.Exists(dir / "none.db"));  // listing creates nothing
  ASSERT_TRUE(env.CreateDir(dir / "empty").ok());
  EXPECT_EQ(ListedCatalogs(env, {dir / "empty"}).error().code(), ErrorCode::kNotFound);

  // One table, newest first, cut at the limit, each with its file.
  int warnings = 0;
  auto warn = [&warnings](const std::string&, const std::string&) { ++warnings; };
  auto runs = ListRunsOf(env, *files, {}, std::nullopt, warn);
  ASSERT_TRUE(runs.ok()) << runs.error().ToString();
  ASSERT_EQ(runs->size(), 3u);
  EXPECT_EQ((*runs)[0].first.started_at, "2026-11-21T02:00:00Z");
  EXPECT_EQ((*runs)[0].second, dir / "records/a.db");
  EXPECT_EQ((*runs)[2].second, dir / "one.db");
  auto limited = ListRunsOf(env, *files, {"p", "disk", 1}, std::nullopt, warn);
  ASSERT_TRUE(limited.ok());
  ASSERT_EQ(limited->size(), 1u);
  EXPECT_EQ(limited->front().second, dir / "records/a.db");
  EXPECT_EQ(warnings, 0);
}

TEST(PolicyNameFromFlagTest, AFileNamesItsPolicy) {
  barge::testing::TempDir dir;
  EXPECT_EQ(*PolicyNameFromFlag(PosixEnv(), "nightly"), "nightly");
  EXPECT_EQ(*PolicyNameFromFlag(PosixEnv(), ""), "");
  ASSERT_TRUE(PosixEnv().WriteFileAtomic(dir / "bad.yaml", std::string_view("name: [")).ok());
  EXPECT_FALSE(PolicyNameFromFlag(PosixEnv(), dir / "bad.yaml").ok());
}

TEST(PointFateTest, MergedRemovedOrPartly) {
  RunRecord r;
  EXPECT_EQ(PointFate(r), "");
  r.point_state = "present";
  EXPECT_EQ(PointFate(r), "");
  r.point_state = "partly removed";
  EXPECT_EQ(PointFate(r), "point partly removed");
  r.point_state = "removed";
  r.points = {{"/c", "b"}, {"/c2", "b"}};
  r.point_states = {"merged into f2", "merged into f2"};
  EXPECT_EQ(PointFate(r), "point merged into f2");
  EXPECT_EQ(PartState(r, 1), "merged into f2");
  r.point_states = {"merged into f2"};  // part 1 has no state: present
  EXPECT_EQ(PartState(r, 1), "present");
  EXPECT_EQ(PointFate(r), "point removed");
}

}  // namespace
}  // namespace barge::orchestrate
