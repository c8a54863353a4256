// The state-migration journal as untrusted input (it lives in the target
// folder): ParseMigrateJournal accepts what MigrateState writes, ignores a
// torn last line and refuses everything else as kCorruption; MigrateState
// touches nothing when the journal is corrupt, and cuts a torn line before
// appending.
#include "orchestrate/state/state_migrate.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

namespace fs = std::filesystem;

std::string Line(int step, const std::string& extra = "") {
  return "{\"name\":\"x\",\"step\":" + std::to_string(step) + extra + ",\"time\":\"t\"}\n";
}
std::string Begin(const std::string& from = "/a", const std::string& to = "/b") {
  return "{\"from\":\"" + from + "\",\"name\":\"begin\",\"step\":1,\"time\":\"t\",\"to\":\"" + to + "\"}\n";
}

TEST(ParseMigrateJournalTest, ReadsWhatMigrateWrites) {
  auto r = ParseMigrateJournal(Begin() + Line(2) + Line(3) + Line(4));
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].from, "/a");
  EXPECT_EQ((*r)[0].to, "/b");
  EXPECT_EQ(r->back().step, MigrateStep::kCurrent);
  EXPECT_TRUE(ParseMigrateJournal("")->empty());
}

TEST(ParseMigrateJournalTest, TornLastLineIsIgnored) {
  auto r = ParseMigrateJournal(Begin() + Line(2) + "{\"name\":\"veri");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->size(), 2u);
}

// Found by state_migrate_journal_fuzzer (corpus:
// regress_step_not_integer.jsonl): a "step" that was not an integer made
// json::value() throw, and the uncaught exception ended the process.
TEST(ParseMigrateJournalTest, NonIntegerStepIsCorruptionNotAnException) {
  for (const char* step : {"\"2026-11-22T15:01:02Z\"", "1.5", "null", "[1]", "1e300", "-1"}) {
    auto r = ParseMigrateJournal(std::string("{\"from\":\"/a\",\"step\":") + step + ",\"to\":\"/b\"}\n");
    ASSERT_FALSE(r.ok()) << step;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << step;
  }
  std::ifstream in(std::string(BARGE_SOURCE_DIR) +
                   "/fuzz/corpus/state_migrate_journal_fuzzer/regress_step_not_integer.jsonl");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(ParseMigrateJournal(text).error().code(), ErrorCode::kCorruption);
}

TEST(ParseMigrateJournalTest, RecordsAMigrationNeverWritesAreCorruption) {
  const std::vector<std::string> bad = {
      Begin() + "garbage\n" + Line(2),                         // a complete line that is no record
      Begin() + Line(4),                                       // skips to 'current'
      Line(4),                                                 // 'current' without a beginning
      Begin() + Line(2) + Line(2),                             // repeats a step
      Begin() + Line(2) + Line(3) + Line(4) + Line(5) + Line(6) + Line(7),  // past 'done'
      Begin() + Line(99),                                      // unknown step
      "{\"from\":1,\"step\":1,\"to\":\"/b\"}\n",               // folder not a string
      "{\"step\":1}\n",                                        // no folders
      Begin() + "\n",                                          // empty line
  };
  for (const std::string& text : bad) {
    auto r = ParseMigrateJournal(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << text;
  }
}

TEST(MigrateStateJournalTest, CorruptJournalTouchesNothing) {
  barge::testing::TempDir dir;
  const fs::path from = dir.path() / "from", to = dir.path() / "to";
  fs::create_directories(from);
  fs::create_directories(to);
  std::ofstream(from / "tpm.bin") << "state";
  // A journal that would say 'current' (recovery removes the old folder)
  // were its steps not out of order.
  std::ofstream(to / kMigrateJournalName) << Begin(from.string(), to.string()) + Line(4);
  auto r = MigrateState(PosixEnv(), from.string(), to.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << r.error().ToString();
  EXPECT_EQ(r.error().path(), (to / kMigrateJournalName).string());
  EXPECT_TRUE(fs::exists(from / "tpm.bin"));
  EXPECT_TRUE(fs::exists(to / kMigrateJournalName));
}

TEST(MigrateStateJournalTest, AppendCutsATornLineFirst) {
  barge::testing::TempDir dir;
  const fs::path from = dir.path() / "from", to = dir.path() / "to";
  fs::create_directories(from);
  fs::create_directories(to);
  std::ofstream(from / "tpm.bin") << "state";
  // Stopped while appending 'old-removed' after the commit point.
  std::ofstream(to / kMigrateJournalName)
      << Begin(from.string(), to.string()) + Line(2) + Line(3) + Line(4) + "{\"name\":\"old-re";
  auto r = MigrateState(PosixEnv(), from.string(), to.string());
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->recovery, "finished");
  EXPECT_FALSE(fs::exists(from));
  std::ifstream in(to / kMigrateJournalName);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto records = ParseMigrateJournal(text);
  ASSERT_TRUE(records.ok()) << records.error().ToString() << "\n" << text;
  ASSERT_EQ(records->size(), 6u);
  EXPECT_EQ(records->back().step, MigrateStep::kDone);
}

}  // namespace
}  // namespace barge::orchestrate
