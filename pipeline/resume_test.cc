// The one resume mechanism: a site with no journal is nothing (a stray
// work set goes); a bad journal, a refusal, a key of another job, kept data
// gone or with nothing verified are discarded with the reason, journal and
// work set removed; data out of reach leaves everything; a verified prefix
// resumes; a failed copy keeps only what the next run can trust; a
// planner reads a site's record without touching it.
#include "pipeline/resume.h"

#include <gtest/gtest.h>

#include <chrono>

#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

using Outcome = ResumeDecision::Outcome;
using testing::TempDir;

ResumeKey Key() {
  ResumeKey k;
  k.id = "0001-20261129T000000Z";
  k.started_at = "2026-11-29T00:00:00Z";
  k.image = k.id + ".qcow2";
  k.type = "full";
  k.disk = "file:/d.raw::";
  k.virtual_size = 1 << 20;
  k.cluster_size = 65536;
  k.compression = "none";
  k.work_digest = RangesDigest({{0, 1 << 20}});
  k.tool_version = "0.1.0";
  return k;
}

JournalEntry Entry(uint64_t cluster) {
  JournalEntry e;
  e.stored = {cluster, formats::StoredKind::kData, 0};
  e.digest = {cluster + 1, cluster + 2};
  return e;
}

// A site in a fresh folder with a journal of `Key()` holding clusters 0-3
// and a work set.
struct Site {
  TempDir dir;
  Env& env = Env::Default();
  ResumeSite site{dir / ".job.barge-resume", dir / ".job.barge-resume-work"};

  void Write() {
    std::vector<JournalEntry> kept = {Entry(0), Entry(1), Entry(2), Entry(3)};
    auto journal = ResumeJournal::Create(env, site.journal, Key(), kept, 4, 5 * 65536);
    ASSERT_TRUE(journal.ok()) << journal.error().ToString();
    ASSERT_TRUE(SaveResumeWork(env, site.work, {{0, 1 << 20}}, 1 << 20).ok());
  }
  bool HasJournal() { return env.Exists(site.journal); }
  bool HasWork() { return env.Exists(site.work); }
};

ResumeTerms Same() {
  ResumeTerms t;
  t.expected = [](const ResumeKey&) { return Key(); };
  return t;
}

KeptCheck Verified(uint64_t next_cluster, size_t entries, std::string problem = "") {
  return KeptCheck("the staged image", [=](const LoadedJournal&) -> Result<StagedCheck> {
    return StagedCheck{entries, next_cluster, problem};
  });
}

TEST(ResumeTest, NoJournalIsNothingAndAStrayWorkSetGoes) {
  Site s;
  ASSERT_TRUE(SaveResumeWork(s.env, s.site.work, {{0, 65536}}, 1 << 20).ok());
  KeptCheck kept = Verified(4, 4);
  ResumeDecision d = FindResume(s.env, s.site, Same(), kept);
  EXPECT_EQ(d.outcome, Outcome::kNothing);
  EXPECT_FALSE(d.found());
  EXPECT_FALSE(s.HasWork());
}

TEST(ResumeTest, AVerifiedPrefixResumesAndEverythingStays) {
  Site s;
  s.Write();
  KeptCheck kept = Verified(2, 2, "cluster 2 does not match its digest");
  ResumeDecision d = FindResume(s.env, s.site, Same(), kept);
  ASSERT_EQ(d.outcome, Outcome::kResume) << d.reason;
  EXPECT_EQ(d.reason, "cluster 2 does not match its digest");
  EXPECT_EQ(d.journal.entries.size(), 4u);
  LoadedJournal cut = d.KeptJournal();
  EXPECT_EQ(cut.entries.size(), 2u);
  EXPECT_EQ(cut.next_cluster, 2u);
  EXPECT_TRUE(s.HasJournal());
  EXPECT_TRUE(s.HasWork());
  ResumeNote note = NoteOf(d, 1 << 20, 2 * 65536);
  EXPECT_TRUE(note.resumed);
  EXPECT_EQ(note.staged_bytes, 2u * 65536);
}

TEST(ResumeTest, ABadJournalIsDiscardedWithAClearReason) {
  Site s;
  ASSERT_TRUE(s.env.WriteFileAtomic(s.site.journal, std::string_view("not a journal")).ok());
  ASSERT_TRUE(SaveResumeWork(s.env, s.site.work, {{0, 65536}}, 1 << 20).ok());
  KeptCheck kept = Verified(4, 4);
  ResumeDecision d = FindResume(s.env, s.site, Same(), kept);
  EXPECT_EQ(d.outcome, Outcome::kDiscard);
  EXPECT_EQ(d.reason.rfind("its journal is unreadable (", 0), 0u) << d.reason;
  EXPECT_FALSE(s.HasJournal());
  EXPECT_FALSE(s.HasWork());
  ResumeNote note = NoteOf(d, 1 << 20, 123);
  EXPECT_FALSE(note.resumed);
  EXPECT_EQ(note.staged_bytes, 0u);
  EXPECT_EQ(note.problem, d.reason);
}

TEST(ResumeTest, AnotherJobsKeyIsDiscardedNamingWhatDiffers) {
  Site s;
  s.Write();
  ResumeTerms terms;
  terms.expected = [](const ResumeKey&) {
    ResumeKey k = Key();
    k.virtual_size = 2 << 20;
    return k;
  };
  bool verified = false;
  KeptCheck kept("the staged image", [&](const LoadedJournal&) -> Result<StagedCheck> {
    verified = true;
    return StagedCheck{4, 4, ""};
  });
  ResumeDecision d = FindResume(s.env, s.site, terms, kept);
  EXPECT_EQ(d.outcome, Outcome::kDiscard);
  EXPECT_EQ(d.reason, ResumeMismatch(Key(), terms.expected(Key())));
  EXPECT_FALSE(d.reason.empty());
  EXPECT_FALSE(verified) << "data of another job is never read";
  EXPECT_FALSE(s.HasJournal());
  EXPECT_FALSE(s.HasWork());
}

TEST(ResumeTest, ARefusalComesFirst) {
  Site s;
  ASSERT_TRUE(s.env.WriteFileAtomic(s.site.journal, std::string_view("garbage")).ok());
  ResumeTerms terms = Same();
  terms.refused = "resuming is off";
  KeptCheck kept = Verified(4, 4);
  ResumeDecision d = FindResume(s.env, s.site, terms, kept);
  EXPECT_EQ(d.outcome, Outcome::kDiscard);
  EXPECT_EQ(d.reason, "resuming is off");
  EXPECT_FALSE(s.HasJournal());
}

TEST(ResumeTest, KeptDataGoneUnreadableOrEmptyIsDiscarded) {
  struct Case {
    Result<StagedCheck> check;
    std::string reason;
  };
  const Case cases[] = {
      {Error::NotFound("no such file"), "the staged image is gone"},
      {Error::Corruption("bad header"), "the staged image cannot be read (bad header)"},
      {StagedCheck{0, 0, ""}, "nothing was staged"},
      {StagedCheck{0, 0, "cluster 0 does not match its digest"}, "cluster 0 does not match its digest"},
  };
  for (const Case& c : cases) {
    Site s;
    s.Write();
    KeptCheck kept("the staged image", [&](const LoadedJournal&) { return c.check; });
    ResumeDecision d = FindResume(s.env, s.site, Same(), kept);
    EXPECT_EQ(d.outcome, Outcome::kDiscard);
    EXPECT_EQ(d.reason, c.reason);
    EXPECT_FALSE(s.HasJournal());
  }
}

TEST(ResumeTest, DataOutOfReachLeavesTheJournalForALaterRun) {
  Site s;
  s.Write();
  StagedRaw later("the staged copy", [] { return Result<std::unique_ptr<BlockSource>>(Error::IoError("refused")); },
                  1 << 20, 65536, /*reach_later=*/true);
  ResumeDecision d = FindResume(s.env, s.site, Same(), later);
  EXPECT_EQ(d.outcome, Outcome::kLeave);
  EXPECT_EQ(d.reason, "the staged copy cannot be read (refused)");
  EXPECT_TRUE(s.HasJournal());
  // The same failure on a file that should be here: discarded.
  StagedRaw file("the staged copy", [] { return Result<std::unique_ptr<BlockSource>>(Error::IoError("refused")); },
                 1 << 20, 65536, /*reach_later=*/false);
  d = FindResume(s.env, s.site, Same(), file);
  EXPECT_EQ(d.outcome, Outcome::kDiscard);
  EXPECT_FALSE(s.HasJournal());
}

TEST(ResumeTest, ARecordReadsBackWithoutTouchingTheSite) {
  Site s;
  EXPECT_EQ(ReadResumeRecord(s.env, s.site).error().code(), ErrorCode::kNotFound);
  s.Write();
  auto record = ReadResumeRecord(s.env, s.site);
  ASSERT_TRUE(record.ok()) << record.error().ToString();
  EXPECT_EQ(record->journal.entries.size(), 4u);
  ASSERT_TRUE(record->work.has_value());
  EXPECT_EQ(TotalBytes(*record->work), 1u << 20);
  ASSERT_TRUE(s.env.WriteFileAtomic(s.site.work, std::string_view("junk")).ok());
  record = ReadResumeRecord(s.env, s.site);
  ASSERT_FALSE(record.ok());
  EXPECT_EQ(record.error().code(), ErrorCode::kCorruption);
  EXPECT_NE(record.error().message().find("its work set is unreadable"), std::string::npos);
  EXPECT_TRUE(s.HasJournal());
  EXPECT_TRUE(s.HasWork());
}

// A destination that consumes nothing (a copy stopped before its first
// chunk) and finishes as told.
class NullDestination final : public Destination {
 public:
  const std::string& name() const override { return name_; }
  Status Consume(const Chunk&) override { return OkStatus(); }
  Status Finish() override { return OkStatus(); }

 private:
  std::string name_ = "null";
};

TEST(ResumeTest, AFailedCopyKeepsOnlyWhatTheNextRunCanTrust) {
  TempDir dir;
  Env& env = Env::Default();
  std::vector<JournalEntry> kept_entries = {Entry(0)};
  auto journal = ResumeJournal::Create(env, dir / "j", Key(), kept_entries, 1, 2 * 65536);
  ASSERT_TRUE(journal.ok()) << journal.error().ToString();
  NullDestination inner;
  JournaledDestination journaled(
      inner, [] { return Result<uint64_t>(uint64_t{2 * 65536}); }, **journal, false, 1 << 20,
      std::chrono::milliseconds(2000));
  int keeps = 0;
  Status keep_status = OkStatus();
  auto keep = [&] {
    ++keeps;
    return keep_status;
  };
  const Error lost = Error::IoError("connection lost");
  // Asked to stop, or a full target: nothing is kept, nothing asked of it.
  EXPECT_FALSE(KeepAfterFailure(Error(ErrorCode::kCancelled, "stopped"), journaled, **journal, true, keep));
  EXPECT_FALSE(KeepAfterFailure(Error(ErrorCode::kNoSpace, "full"), journaled, **journal, true, keep));
  EXPECT_EQ(keeps, 0);
  // The source failed: kept when the data can be kept.
  EXPECT_TRUE(KeepAfterFailure(lost, journaled, **journal, false, keep));
  EXPECT_EQ(keeps, 1);
  keep_status = Error::IoError("cannot keep");
  EXPECT_FALSE(KeepAfterFailure(lost, journaled, **journal, false, keep));
  // The target failed: only an export written in place keeps its journal.
  ASSERT_TRUE(journaled.Finish().ok());
  ASSERT_TRUE(journaled.failed());
  keeps = 0;
  EXPECT_FALSE(KeepAfterFailure(lost, journaled, **journal, false, keep));
  EXPECT_TRUE(KeepAfterFailure(lost, journaled, **journal, true, keep));
  EXPECT_EQ(keeps, 0);
}

TEST(ResumeTest, TheBackupSiteIsTheChainFoldersJournalAndWorkSet) {
  ResumeSite site = BackupResumeSite("/c");
  EXPECT_EQ(site.journal, "/c/" + std::string(kResumeJournalName));
  EXPECT_EQ(site.work, "/c/" + std::string(kResumeWorkName));
}

}  // namespace
}  // namespace barge::pipeline
