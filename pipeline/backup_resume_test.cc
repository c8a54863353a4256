// The resume journal: checkpoints read back in order, a torn last one
// dropped, a bad header refused; the key's mismatches named; a staged
// image checked against the journal up to its first damaged cluster.
#include "pipeline/backup_resume.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "blockio/memory.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

ResumeKey Key() {
  ResumeKey k;
  k.id = "0000-20261127T000000Z";
  k.started_at = "2026-11-27T00:00:00Z";
  k.image = k.id + ".qcow2";
  k.type = "full";
  k.disk = "file:/d.raw::";
  k.virtual_size = 1 << 20;
  k.cluster_size = 65536;
  k.compression = "zstd:2";
  k.work_digest = RangesDigest({{0, 1 << 20}});
  k.tool_version = "0.1.0";
  return k;
}

JournalEntry Entry(uint64_t cluster, formats::StoredKind kind = formats::StoredKind::kData) {
  JournalEntry e;
  e.stored = {cluster, kind, kind == formats::StoredKind::kCompressed ? 100u : 0u};
  e.digest = {cluster * 3 + 1, cluster * 7 + 2};
  return e;
}

TEST(ResumeJournalTest, CheckpointsReadBackAndATornOneIsDropped) {
  TempDir dir;
  Env& env = Env::Default();
  const std::string path = dir / ".backup.barge-resume";
  std::vector<JournalEntry> kept = {Entry(0), Entry(1)};
  auto journal = ResumeJournal::Create(env, path, Key(), kept, 2, 3 * 65536);
  ASSERT_TRUE(journal.ok()) << journal.error().ToString();
  std::vector<JournalEntry> more = {Entry(4, formats::StoredKind::kCompressed), Entry(5, formats::StoredKind::kZero)};
  ASSERT_TRUE((*journal)->Append(more, 8, 4 * 65536 + 100).ok());
  EXPECT_EQ((*journal)->checkpoints(), 2u);

  auto loaded = LoadResumeJournal(env, path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  EXPECT_EQ(ResumeMismatch(loaded->key, Key()), "");
  ASSERT_EQ(loaded->entries.size(), 4u);
  EXPECT_EQ(loaded->entries[2].stored, more[0].stored);
  EXPECT_EQ(loaded->entries[3].digest, more[1].digest);
  EXPECT_EQ(loaded->next_cluster, 8u);
  EXPECT_EQ(loaded->end_bytes, 4u * 65536 + 100);
  EXPECT_FALSE(loaded->torn);

  // A crash while appending: the last record cut short counts for nothing.
  std::vector<JournalEntry> last = {Entry(9)};
  ASSERT_TRUE((*journal)->Append(last, 10, 5 * 65536).ok());
  uint64_t size = fs::file_size(path);
  fs::resize_file(path, size - 5);
  loaded = LoadResumeJournal(env, path);
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(loaded->torn);
  EXPECT_EQ(loaded->entries.size(), 4u);
  EXPECT_EQ(loaded->next_cluster, 8u);

  // A damaged header: the journal is refused.
  auto bytes = testing::ReadFile(path);
  bytes[20] ^= std::byte{1};
  testing::WriteFile(path, bytes);
  auto bad = LoadResumeJournal(env, path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kCorruption);

  ASSERT_TRUE((*journal)->Remove().ok());
  EXPECT_EQ(LoadResumeJournal(env, path).error().code(), ErrorCode::kNotFound);
}

// A vm backup's work set beside the journal reads back as written; a
// damaged one or one of another disk size is Corruption, none NotFound.
TEST(ResumeJournalTest, WorkSetReadsBackAndBadOnesAreRefused) {
  TempDir dir;
  Env& env = Env::Default();
  const std::string path = dir / "work";
  RangeList work = {{65536, 131072}, {1 << 20, 65536}};
  ASSERT_TRUE(SaveResumeWork(env, path, work, 4 << 20).ok());
  auto back = LoadResumeWork(env, path, 4 << 20);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(*back, work);
  auto other = LoadResumeWork(env, path, 8 << 20);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code(), ErrorCode::kCorruption);
  ASSERT_TRUE(env.WriteFileAtomic(path, std::string_view("{\"format\":\"barge-extents\",\"version\":1,\"ext")).ok());
  auto torn = LoadResumeWork(env, path, 4 << 20);
  ASSERT_FALSE(torn.ok());
  EXPECT_EQ(torn.error().code(), ErrorCode::kCorruption);
  auto none = LoadResumeWork(env, std::string(dir / "none"), 4 << 20);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::kNotFound);
}

TEST(ResumeJournalTest, MismatchesAreNamed) {
  ResumeKey now = Key();
  now.virtual_size = 2 << 20;
  EXPECT_NE(ResumeMismatch(Key(), now).find("size changed"), std::string::npos);
  now = Key();
  now.compression = "none";
  EXPECT_NE(ResumeMismatch(Key(), now).find("compression zstd:2, now none"), std::string::npos);
  now = Key();
  now.parent = "0003:abc";
  EXPECT_NE(ResumeMismatch(Key(), now).find("latest point"), std::string::npos);
  now = Key();
  now.work_digest = RangesDigest({{0, 65536}});
  EXPECT_NE(ResumeMismatch(Key(), now).find("blocks to copy"), std::string::npos);
  now = Key();
  now.source_stamp = "1@2";
  EXPECT_NE(ResumeMismatch(Key(), now).find("source file changed"), std::string::npos);
}

TEST(ResumeJournalTest, CheckStagedKeepsUpToTheFirstDamagedCluster) {
  TempDir dir;
  Env& env = Env::Default();
  formats::Qcow2WriterOptions o;
  o.virtual_size = 8 * 65536;
  o.compression = formats::Compression::kNone;
  const std::string staged = dir / "staged";
  LoadedJournal journal;
  {
    auto sink = env.OpenSink(staged, SinkMode::kCreateNew);
    ASSERT_TRUE(sink.ok());
    auto w = formats::Qcow2Writer::Create(**sink, o);
    ASSERT_TRUE(w.ok());
    for (uint64_t c = 0; c < 6; ++c) {
      std::vector<std::byte> data = testing::RandomBytes(65536, c);
      ASSERT_TRUE((*w)->WriteData(c, data).ok());
      journal.entries.push_back({{c, formats::StoredKind::kData, 0}, formats::HashCluster(data, 65536)});
    }
    auto end = (*w)->Sync();
    ASSERT_TRUE(end.ok());
    journal.end_bytes = *end;
    journal.next_cluster = 6;
  }
  auto all = CheckStaged(env, staged, o, journal);
  ASSERT_TRUE(all.ok()) << all.error().ToString();
  EXPECT_EQ(all->kept_entries, 6u);
  EXPECT_EQ(all->next_cluster, 6u);
  EXPECT_EQ(all->problem, "");

  // Guest cluster 3 lies at host cluster 4 (cluster 0 is the header's).
  auto bytes = testing::ReadFile(staged);
  bytes[4 * 65536 + 10] ^= std::byte{0xff};
  testing::WriteFile(staged, bytes);
  auto cut = CheckStaged(env, staged, o, journal);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->kept_entries, 3u);
  EXPECT_EQ(cut->next_cluster, 3u);
  EXPECT_NE(cut->problem.find("cluster 3"), std::string::npos) << cut->problem;

  // A journal that does not describe this layout keeps nothing.
  journal.end_bytes += 1;
  auto other = CheckStaged(env, staged, o, journal);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->kept_entries, 0u);
  EXPECT_EQ(other->next_cluster, 0u);
}

// A raw copy (replicate): journaled clusters match their digests, the rest
// below the next cluster reads as zeros; the first that does not ends what
// is kept, and the callback sees exactly the kept journaled clusters.
TEST(ResumeJournalTest, CheckStagedRawKeepsUpToTheFirstBadCluster) {
  TempDir dir;
  Env& env = Env::Default();
  const uint64_t size = 8 * 65536;
  const std::string staged = dir / "copy";
  std::vector<std::byte> file(6 * 65536, std::byte{0});
  LoadedJournal journal;
  for (uint64_t c : {0, 1, 3, 4}) {  // 2 and 5 are holes
    std::vector<std::byte> data = testing::RandomBytes(65536, c + 10);
    std::copy(data.begin(), data.end(), file.begin() + static_cast<ptrdiff_t>(c * 65536));
    journal.entries.push_back({{c, formats::StoredKind::kData, 0}, formats::HashCluster(data, 65536)});
  }
  journal.next_cluster = 6;
  testing::WriteFile(staged, file);
  std::vector<uint64_t> seen;
  auto all = CheckStagedRaw(env, staged, size, 65536, journal, [&](uint64_t c, std::span<const std::byte> b) {
    EXPECT_EQ(b.size(), 65536u);
    seen.push_back(c);
    return OkStatus();
  });
  ASSERT_TRUE(all.ok()) << all.error().ToString();
  EXPECT_EQ(all->kept_entries, 4u);
  EXPECT_EQ(all->next_cluster, 6u);
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 1, 3, 4}));

  // Bytes in a hole that should read as zeros end it there.
  file[2 * 65536 + 7] = std::byte{1};
  testing::WriteFile(staged, file);
  auto hole = CheckStagedRaw(env, staged, size, 65536, journal);
  ASSERT_TRUE(hole.ok());
  EXPECT_EQ(hole->kept_entries, 2u);
  EXPECT_EQ(hole->next_cluster, 2u);
  EXPECT_NE(hole->problem.find("zeros"), std::string::npos) << hole->problem;

  // JournalUpTo cuts the entries and the next cluster.
  LoadedJournal cut = JournalUpTo(journal, 3);
  EXPECT_EQ(cut.entries.size(), 2u);
  EXPECT_EQ(cut.next_cluster, 3u);

  // A journal whose entries are not a raw copy's keeps nothing.
  journal.entries[1].stored.kind = formats::StoredKind::kCompressed;
  auto other = CheckStagedRaw(env, staged, size, 65536, journal);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->next_cluster, 0u);
}

}  // namespace
}  // namespace barge::pipeline
