// RunMerge on chains built from a raw file with caller-given dirty ranges:
// every remaining point restores byte-identical after a merge, after a
// failed one, and after a crash at any step of the switch-over.
#include "pipeline/merge.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "blockio/fault.h"
#include "blockio/fault_env.h"
#include "pipeline/backup.h"
#include "pipeline/chain.h"
#include "pipeline/restore.h"
#include "tests/testing/env_wrappers.h"
#include "tests/testing/backup_testing.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
// Not a multiple of the cluster size: the last cluster is short.
constexpr uint64_t kSize = 4 * kMiB + 3 * 512;

CopyOptions Knobs() {
  CopyOptions o;
  o.memory_bytes = 8 * kMiB;
  o.threads = 2;
  return o;
}

void Patch(std::vector<std::byte>& disk, uint64_t offset, uint64_t length, int pattern) {
  for (uint64_t i = 0; i < length; ++i) disk[offset + i] = std::byte(pattern ? (pattern + i / 512) : 0);
}

// A chain folder of a full backup and four incrementals; disks[k] is the
// disk as point k saw it.
struct Chain {
  std::string dir;
  std::vector<std::vector<std::byte>> disks;
  std::vector<std::string> ids;  // ids[k]: point k's id (stable across merges)
};

void Backup(const std::string& raw, const std::string& target, std::optional<RangeList> dirty) {
  Status s = testing::BackupRawFile(raw, target, std::move(dirty));
  ASSERT_TRUE(s.ok()) << s.error().ToString();
}

Chain MakeChain(const TempDir& tmp) {
  Chain c;
  std::string raw = tmp / "disk.raw";
  std::vector<std::byte> disk = testing::RandomBytes(kSize, 7);
  std::memset(disk.data() + 1 * kMiB, 0, 512 * kKiB);  // zero run in the full
  testing::WriteFile(raw, disk);
  Backup(raw, tmp.path().string(), std::nullopt);
  c.disks.push_back(disk);
  // (offset, length, pattern; 0 = zeroes)
  const std::vector<std::vector<std::array<uint64_t, 3>>> steps = {
      {{0, 64 * kKiB, 0x11}, {2 * kMiB + 4096, 8192, 0x22}},
      {{1 * kMiB, 128 * kKiB, 0x33}, {3 * kMiB, 256 * kKiB, 0}},
      {{0, 64 * kKiB, 0}, {kSize - 1024, 1024, 0x44}},
      {{512 * kKiB, 1 * kMiB, 0x55}},
  };
  for (const auto& step : steps) {
    RangeList dirty;
    for (const auto& [off, len, pat] : step) {
      Patch(disk, off, len, static_cast<int>(pat));
      dirty.push_back({off, len});
    }
    testing::WriteFile(raw, disk);
    Backup(raw, tmp.path().string(), dirty);
    c.disks.push_back(disk);
  }
  c.dir = tmp / "d";
  auto chain = LoadChainFolder(PosixEnv(), c.dir);
  if (chain.ok()) {
    for (const auto& p : chain->points) c.ids.push_back(p.manifest.id);
  }
  return c;
}

Result<std::vector<std::byte>> Restore(const std::string& dir, const std::string& at,
                                       const std::string& out) {
  RestoreRequest req;
  req.chain_dir = dir;
  req.at = at;
  req.destination = out;
  req.force = true;
  req.copy = Knobs();
  auto r = RunRestore(PosixEnv(), req);
  if (!r.ok()) return r.error();
  return testing::ReadFile(out);
}

std::set<std::string> Listing(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  names.erase(".lock");
  return names;
}

// Every point from `first` on restores to the disk it saw, named by its id
// and by its position (now k - first); the ones before are gone; verify
// --all passes.
void ExpectPointsFrom(const Chain& c, const TempDir& tmp, size_t first) {
  auto chain = LoadChainFolder(PosixEnv(), c.dir);
  ASSERT_TRUE(chain.ok()) << chain.error().ToString();
  ASSERT_EQ(chain->points.size(), c.disks.size() - first);
  for (size_t k = first; k < c.disks.size(); ++k) {
    EXPECT_EQ(chain->points[k - first].manifest.id, c.ids[k]);
    for (const std::string& at : {c.ids[k], std::to_string(k - first)}) {
      auto bytes = Restore(c.dir, at, tmp / "restored.raw");
      ASSERT_TRUE(bytes.ok()) << "point " << k << " as " << at << ": " << bytes.error().ToString();
      EXPECT_TRUE(*bytes == c.disks[k]) << "point " << k << " as " << at << " differs";
    }
  }
  VerifyRequest v;
  v.path = c.dir;
  v.all_points = true;
  v.copy = Knobs();
  auto verified = RunVerify(PosixEnv(), v);
  ASSERT_TRUE(verified.ok()) << verified.error().ToString();
  ASSERT_TRUE(verified->ok()) << verified->failure->ToString();
  EXPECT_EQ(verified->Count(VerifyOutcome::State::kPassed), c.disks.size() - first);
}

Result<MergeResult> Merge(const std::string& dir, const std::string& through, Env& env = PosixEnv()) {
  MergeRequest req;
  req.chain_dir = dir;
  req.through = through;
  req.copy = Knobs();
  return RunMerge(env, req);
}

bool JournalExists(const std::string& dir) {
  auto exists = MergeJournalExists(PosixEnv(), dir);
  EXPECT_TRUE(exists.ok()) << exists.error().ToString();
  return exists.ok() && *exists;
}

TEST(MergeTest, ThroughMiddlePointFoldsOlderLayers) {
  TempDir tmp;
  Chain c = MakeChain(tmp);
  auto before = LoadChainFolder(PosixEnv(), c.dir);
  ASSERT_TRUE(before.ok());
  const formats::BackupManifest old2 = before->points[2].manifest;

  auto r = Merge(c.dir, "2");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_TRUE(r->merged);
  ASSERT_EQ(r->folded_ids.size(), 3u);
  EXPECT_EQ(r->removed_files.size(), 6u);
  EXPECT_EQ(r->manifest.id, old2.id);
  EXPECT_EQ(r->manifest.type, formats::BackupType::kFull);
  EXPECT_FALSE(r->manifest.parent.has_value());
  EXPECT_EQ(r->manifest.image_digest, old2.image_digest);
  EXPECT_EQ(r->manifest.reason, "merged " + before->points[0].manifest.id + ".." + old2.id);
  for (const auto& f : r->removed_files) EXPECT_FALSE(fs::exists(c.dir + "/" + f)) << f;
  EXPECT_FALSE(JournalExists(c.dir));
  ExpectPointsFrom(c, tmp, 2);

  // The chain goes on: an incremental on top of the merged chain.
  std::string raw = tmp / "disk.raw";
  c.disks.push_back(c.disks.back());
  Patch(c.disks.back(), 3 * kMiB, 4096, 0x66);
  testing::WriteFile(raw, c.disks.back());
  Backup(raw, tmp.path().string(), RangeList{{3 * kMiB, 4096}});
  auto after = LoadChainFolder(PosixEnv(), c.dir);
  ASSERT_TRUE(after.ok());
  c.ids.push_back(after->latest().manifest.id);
  EXPECT_EQ(c.ids.back().substr(0, 5), "0005-");  // sequences are never reused
  ExpectPointsFrom(c, tmp, 2);
}

// Issue 12: "--at 0" is documented as the full; after a merge it said "no
// backup at position 0" (positions were the ids' numbers). Position 0 is
// the oldest point of the folder: the merged full.
TEST(MergeTest, AtZeroAfterMergeIsTheMergedFull) {
  TempDir tmp;
  Chain c = MakeChain(tmp);
  ASSERT_TRUE(Merge(c.dir, c.ids[2]).ok());
  auto bytes = Restore(c.dir, "0", tmp / "restored.raw");
  ASSERT_TRUE(bytes.ok()) << bytes.error().ToString();
  EXPECT_TRUE(*bytes == c.disks[2]);
  auto chain = LoadChainFolder(PosixEnv(), c.dir);
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(chain->points[*chain->Resolve("0")].manifest.id, c.ids[2]);
  EXPECT_EQ(chain->points[*chain->Resolve("2")].manifest.id, c.ids[4]);
  EXPECT_EQ(chain->Resolve("3").error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(chain->Resolve(c.ids[1]).error().code(), ErrorCode::kNotFound);  // folded away
}

TEST(MergeTest, DryRunSaysWhatWouldChangeAndChangesNothing) {
  TempDir tmp;
  Chain c = MakeChain(tmp);
  std::set<std::string> listing = Listing(c.dir);
  MergeRequest req;
  req.chain_dir = c.dir;
  req.through = c.ids[2];
  req.dry_run = true;
  req.copy = Knobs();
  auto r = RunMerge(PosixEnv(), req);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_TRUE(r->dry_run);
  EXPECT_FALSE(r->merged);
  EXPECT_EQ(r->folded_ids, (std::vector<std::string>{c.ids[0], c.ids[1], c.ids[2]}));
  EXPECT_EQ(r->removed_files.size(), 6u);
  EXPECT_EQ(Listing(c.dir), listing);
  ExpectPointsFrom(c, tmp, 0);
}

// Issue 12: "merge bk/nonexist" failed with ".lock: open lock failed"; a
// merge of an empty folder left a .lock behind.
TEST(MergeTest, MissingOrEmptyFolderIsNotFoundAndLeavesNoLock) {
  TempDir tmp;
  auto missing = Merge(tmp / "nonexist", "latest");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(missing.error().path(), tmp / "nonexist");
  EXPECT_EQ(missing.error().message().find(".lock"), std::string::npos) << missing.error().ToString();
  EXPECT_FALSE(fs::exists(tmp / "nonexist"));
  fs::create_directories(tmp / "empty");
  auto empty = Merge(tmp / "empty", "latest");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(fs::is_empty(tmp / "empty"));
}

TEST(MergeTest, ThroughFullIsNothingAndThroughLatestKeepsOnePoint) {
  TempDir tmp;
  Chain c = MakeChain(tmp);
  std::set<std::string> listing = Listing(c.dir);
  auto r = Merge(c.dir, "0");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_FALSE(r->merged);
  EXPECT_EQ(Listing(c.dir), listing);

  r = Merge(c.dir, "latest");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_TRUE(r->merged);
  EXPECT_EQ(r->folded_ids.size(), 5u);
  EXPECT_EQ(Listing(c.dir).size(), 3u);  // json, qcow2, digests of point 4
  ExpectPointsFrom(c, tmp, 4);
  // Twice: nothing left to fold.
  r = Merge(c.dir, c.ids[4]);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->merged);
  r = Merge(c.dir, "0");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->merged);
}

TEST(MergeTest, FailedImageWriteLeavesFolderAsItWas) {
  TempDir tmp;
  Chain c = MakeChain(tmp);
  std::set<std::string> listing = Listing(c.dir);
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kFlush}) {
    // The new image is written under its temporary name:
    // ..<image>.qcow2.merge-new.barge-tmp.
    bool wrapped = false;
    testing::FaultFilesEnv env(PosixEnv(), [&](const std::string& path, FaultInjector& faults) {
      if (!path.ends_with(".qcow2.merge-new.barge-tmp")) return;
      wrapped = true;
      faults.AddRule(FaultRule::NthAndAfter(op, op == FaultOp::kFlush ? 1 : 2));
    });
    auto r = Merge(c.dir, "3", env);
    ASSERT_TRUE(wrapped);
    ASSERT_FALSE(r.ok()) << FaultOpName(op);
    EXPECT_EQ(r.error().code(), ErrorCode::kIoError) << r.error().ToString();
    EXPECT_EQ(Listing(c.dir), listing) << FaultOpName(op);
  }
  ExpectPointsFrom(c, tmp, 0);
}

// Found by the reliability campaign (issue 13): an error while staging
// the merged image, its digest table or its manifest named the staged
// file (".NAME.merge-new"), and one while writing the journal named
// ".merge-journal.json": barge's own names, not a file the user knows. Every write, flush, link, rename and folder sync of the staging
// fails once in turn; the error names a chain file, never a staged one.
TEST(MergeTest, Issue13StagingErrorsNameTheChainFileNotTheStagedOne) {
  TempDir tmp;
  Chain c = MakeChain(tmp);
  std::set<std::string> listing = Listing(c.dir);
  FaultEnv env(PosixEnv(), tmp / "stash");
  const std::string saved = tmp / "saved";
  fs::copy(c.dir, saved, fs::copy_options::recursive);
  int tried = 0;
  for (EnvOp op : {EnvOp::kWrite, EnvOp::kSync, EnvOp::kRename, EnvOp::kLink, EnvOp::kUnlink, EnvOp::kSyncDir}) {
    for (uint64_t n = 1;; ++n) {
      env.ClearFaults();
      env.ResetCounters();
      env.FailCall(op, n, ENOSPC);
      auto r = Merge(c.dir, "3", env);
      bool fired = !env.injections().empty();
      const std::string failed_path = fired ? env.injections()[0].path : "";
      env.ClearFaults();
      if (!fired) {
        // The run without a fault merged: back to the chain before.
        fs::remove_all(c.dir);
        fs::copy(saved, c.dir, fs::copy_options::recursive);
        break;
      }
      if (r.ok() && op == EnvOp::kUnlink && failed_path.ends_with(".verified")) {
        // The folded points' verification records go after the merge is
        // done, best effort (the next backup removes what is left).
        fs::remove_all(c.dir);
        fs::copy(saved, c.dir, fs::copy_options::recursive);
        continue;
      }
      ASSERT_FALSE(r.ok()) << EnvOpName(op) << " #" << n << " " << failed_path;
      auto journal = MergeJournalExists(PosixEnv(), c.dir);
      ASSERT_TRUE(journal.ok());
      ++tried;
      EXPECT_EQ(r.error().path().find(".merge-new"), std::string::npos) << r.error().ToString();
      EXPECT_EQ(r.error().path().find(".barge-tmp"), std::string::npos) << r.error().ToString();
      EXPECT_EQ(r.error().path().find("merge-journal"), std::string::npos) << r.error().ToString();
      EXPECT_TRUE(r.error().path().starts_with(c.dir)) << r.error().ToString();
      EXPECT_EQ(r.error().code(), ErrorCode::kNoSpace) << r.error().ToString();
      if (*journal) {
        // Committed: the next job completes it (CrashAtEveryStep...); the
        // switch-over's errors name the chain folder too.
        fs::remove_all(c.dir);
        fs::copy(saved, c.dir, fs::copy_options::recursive);
        continue;
      }
      if (Listing(c.dir) != listing) {
        // Only the folder sync after the journal's removal fails once the
        // merge is complete: then it stays done.
        EXPECT_EQ(op, EnvOp::kSyncDir) << "#" << n << " " << failed_path;
        fs::remove_all(c.dir);
        fs::copy(saved, c.dir, fs::copy_options::recursive);
      }
    }
  }
  EXPECT_GT(tried, 5);
  ExpectPointsFrom(c, tmp, 0);
}

bool IsJournal(const std::string& path) { return path.ends_with(std::string(kMergeJournalName)); }

// Stops the merge right after its k-th durability boundary (flush, folder
// sync, rename, link, unlink) as a killed process would, for every k, then
// lets the next job (a restore, or the merge run again) finish the work.
// This covers every step of the switch-over (after the staging, after the
// journal, after each rename and removal, after the journal's removal)
// and every point of the staging before it.
TEST(MergeTest, CrashAtEveryStepIsCompletedByTheNextJob) {
  TempDir tmp;
  Chain c = MakeChain(tmp);
  std::string pristine = tmp / "pristine";
  fs::copy(c.dir, pristine, fs::copy_options::recursive);
  int boundaries = 0;
  int switch_over_steps = 0;  // crash points after the journal was written
  for (int k = 1;; ++k) {
    fs::remove_all(c.dir);
    fs::copy(pristine, c.dir, fs::copy_options::recursive);
    testing::StopEnv env(PosixEnv());
    env.StopAfter(k);
    auto r = Merge(c.dir, c.ids[3], env);
    if (r.ok()) {
      ASSERT_FALSE(env.stopped());
      boundaries = k - 1;
      break;
    }
    ASSERT_TRUE(env.stopped()) << r.error().ToString();
    // Before the journal's rename nothing changed; from it on the journal
    // decides and the merge completes.
    const bool committed = env.Happened(EnvOp::kRename, IsJournal);
    const bool journal_removed = env.Happened(EnvOp::kUnlink, IsJournal);
    switch_over_steps += committed;
    EXPECT_EQ(JournalExists(c.dir), committed && !journal_removed) << "boundary " << k;
    // Alternate who recovers: a reader (restore) or the merge itself.
    if (k % 2 == 0) ExpectPointsFrom(c, tmp, committed ? 3 : 0);
    auto again = Merge(c.dir, c.ids[3]);
    ASSERT_TRUE(again.ok()) << again.error().ToString();
    EXPECT_EQ(again->merged, !committed) << "boundary " << k;
    EXPECT_FALSE(JournalExists(c.dir));
    ExpectPointsFrom(c, tmp, 3);
    for (const auto& name : Listing(c.dir)) EXPECT_NE(name[0], '.') << name;
  }
  // From the journal on: its rename and folder sync, 3 renames, a folder
  // sync, 9 removals, a folder sync, the journal's removal and a last
  // folder sync. Before it, the staging's flushes, links and syncs.
  EXPECT_EQ(switch_over_steps, 18);
  EXPECT_GT(boundaries, switch_over_steps) << boundaries;
}

TEST(MergeTest, JournalNamesOnlyChainFiles) {
  MergeJournal j;
  j.through = "0003-x";
  j.renames = {{MergeStagedName("0003-x.qcow2"), "0003-x.qcow2", 10}};
  j.remove = {"0000-x.json", "0000-x.qcow2"};
  auto back = DecodeMergeJournal(EncodeMergeJournal(j).value());
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->remove, j.remove);
  EXPECT_EQ(back->renames[0].size_bytes, 10u);

  for (const std::string& bad :
       {std::string(R"({"format":"barge-merge-journal","version":1,"through":"x","renames":[],"remove":["../etc/passwd"]})"),
        std::string(R"({"format":"barge-merge-journal","version":1,"through":"x","renames":[],"remove":[".lock"]})"),
        std::string(R"({"format":"barge-merge-journal","version":1,"through":"x","renames":[{"from":"a","to":"0001-x.json","size":1}],"remove":[]})"),
        std::string(R"({"format":"barge-merge-journal","version":1,"through":"x","renames":[{"from":".0001-x.json.merge-new","to":"/tmp/0001-x.json","size":1}],"remove":[]})"),
        std::string(R"({"format":1,"version":1,"through":"x","renames":[],"remove":[]})"),
        std::string(R"({"format":null,"version":1,"through":"x","renames":[],"remove":[]})"),
        std::string(R"({"format":["barge-merge-journal"],"version":1,"through":"x","renames":[],"remove":[]})"),
        std::string("not json")}) {
    EXPECT_FALSE(DecodeMergeJournal(bad).ok()) << bad;
  }
}

TEST(MergeTest, DamagedStagedFileStopsRecoveryWithoutLoss) {
  TempDir tmp;
  Chain c = MakeChain(tmp);
  // A crash right after the journal's rename.
  testing::StopEnv env(PosixEnv());
  env.StopAfter(1, [](EnvOp op, const std::string& path) { return op == EnvOp::kRename && IsJournal(path); });
  auto r = Merge(c.dir, "2", env);
  ASSERT_FALSE(r.ok());
  ASSERT_TRUE(env.stopped());
  ASSERT_TRUE(JournalExists(c.dir));
  std::set<std::string> listing = Listing(c.dir);
  // The staged image loses its tail: the journal cannot be completed, and
  // nothing is renamed or removed.
  std::string staged;
  for (const auto& name : listing) {
    if (name.ends_with(".qcow2.merge-new")) staged = c.dir + "/" + name;
  }
  ASSERT_FALSE(staged.empty());
  fs::resize_file(staged, fs::file_size(staged) - 512);
  auto chain = LoadChainFolder(PosixEnv(), c.dir);
  ASSERT_FALSE(chain.ok());
  EXPECT_EQ(chain.error().code(), ErrorCode::kCorruption) << chain.error().ToString();
  EXPECT_NE(chain.error().ToString().find("merge journal"), std::string::npos);
  EXPECT_EQ(Listing(c.dir), listing);
}

}  // namespace
}  // namespace barge::pipeline
