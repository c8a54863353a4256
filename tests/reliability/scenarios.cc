// The commands of the reliability campaign: backup (full, incremental from
// a qcow2 bitmap and from an extents file), merge, restore, convert,
// replicate, image add/sync/cleanup, state migrate, overlay create, the
// offline bitmap rotation, the offline snapshot edits (create, delete,
// rename, rollback) and a policy run.
#include "tests/reliability/scenarios.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "blockio/path.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_bitmap_edit.h"
#include "formats/qcow2_writer.h"
#include "orchestrate/catalog/image_catalog.h"
#include "orchestrate/policy/policy_catalog.h"
#include "orchestrate/state/state_migrate.h"
#include "pipeline/backup.h"
#include "pipeline/base_refs.h"
#include "pipeline/endpoints.h"
#include "pipeline/merge_journal.h"
#include "pipeline/replicate.h"
#include "pipeline/restore.h"
#include "pipeline/staged_file.h"
#include "tests/testing/testing.h"

namespace barge::reliability {

namespace fs = std::filesystem;
using testing::RunOk;
using testing::ShellQuote;

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// ---- data ----

// A disk of `size` bytes: per 64 KiB block, random data, compressible text
// or zeros, chosen by `seed`.
std::vector<std::byte> MakeDiskBytes(uint64_t size, uint64_t seed) {
  std::vector<std::byte> bytes(size);
  std::mt19937_64 rng(seed * 7919 + 1);
  for (uint64_t off = 0; off < size; off += 64 * kKiB) {
    uint64_t n = std::min<uint64_t>(64 * kKiB, size - off);
    switch (rng() % 4) {
      case 0:
      case 1:
        for (uint64_t i = 0; i < n; i += 8) {
          uint64_t v = rng();
          std::memcpy(bytes.data() + off + i, &v, std::min<uint64_t>(8, n - i));
        }
        break;
      case 2:
        for (uint64_t i = 0; i < n; ++i) bytes[off + i] = std::byte("compressible text "[(off + i) % 18]);
        break;
      default:
        break;  // zeros
    }
  }
  return bytes;
}

// Overwrites `count` ranges (cluster aligned, 4 KiB to 256 KiB, some made
// zero) with new data; returns them.
RangeList Mutate(std::vector<std::byte>& bytes, uint64_t seed, int count) {
  std::mt19937_64 rng(seed * 104729 + 3);
  RangeList changed;
  for (int k = 0; k < count; ++k) {
    uint64_t len = (1 + rng() % 64) * 4 * kKiB;
    uint64_t off = (rng() % (bytes.size() / (64 * kKiB))) * 64 * kKiB;
    len = std::min<uint64_t>(len, bytes.size() - off);
    bool zero = rng() % 5 == 0;
    for (uint64_t i = 0; i < len; i += 8) {
      uint64_t v = zero ? 0 : rng();
      std::memcpy(bytes.data() + off + i, &v, std::min<uint64_t>(8, len - i));
    }
    changed.push_back({off, len});
  }
  return changed;
}

void WriteBytes(const std::string& path, const std::vector<std::byte>& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  testing::WriteFile(path, bytes);
}

void WriteText(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

void WriteExtents(const std::string& path, const RangeList& ranges, uint64_t size) {
  nlohmann::json extents = nlohmann::json::array();
  for (const Range& r : ranges) extents.push_back({{"offset", r.offset}, {"length", r.length}});
  nlohmann::json j = {{"format", "barge-extents"}, {"version", 1}, {"virtual_size", size}, {"extents", extents}};
  WriteText(path, j.dump());
}

std::string Q(const std::string& s) { return ShellQuote(s); }

// A backup taken in this process (the tree's setup, not under test).
std::string TakeBackup(const std::string& source, const std::string& format, const std::string& target,
                       std::optional<RangeList> dirty = std::nullopt,
                       pipeline::ChangedBy changed_by = pipeline::ChangedBy::kRecord) {
  pipeline::BackupRequest req;
  req.changed_by = changed_by;
  req.source.location = source;
  req.source.format = format;
  req.target_dir = target;
  req.disk_name = "vm";
  req.copy.threads = 2;
  req.copy.memory_bytes = 8 * kMiB;
  if (dirty) {
    req.incremental = true;
    req.dirty_ranges = dirty;
  }
  auto r = pipeline::RunBackup(PosixEnv(), req);
  if (!r.ok()) {
    ADD_FAILURE() << "setup backup: " << r.error().ToString();
    return "";
  }
  return r->manifest.id;
}

std::vector<std::string> Common() { return {"--threads", "2", "--memory", "8M"}; }

std::vector<std::string> Cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool ErrorSays(const Outcome& o, const std::string& code, const std::string& text) {
  return !o.error.is_null() && o.error.value("code", "") == code &&
         o.error.value("message", "").find(text) != std::string::npos;
}

// ---- backup ----

class BackupScenario final : public Scenario {
 public:
  enum Kind { kFull, kIncrementalBitmap, kIncrementalExtents, kIncrementalDigests };
  explicit BackupScenario(Kind kind) : kind_(kind) {}

  std::string name() const override {
    return kind_ == kFull                ? "backup-full"
           : kind_ == kIncrementalBitmap ? "backup-inc-bitmap"
           : kind_ == kIncrementalDigests ? "backup-inc-digests"
                                          : "backup-inc-extents";
  }
  std::string command() const override {
    return kind_ == kFull ? "barge backup --source SRC.raw --target T --name vm"
           : kind_ == kIncrementalBitmap
               ? "barge backup --source SRC.qcow2 --incremental --dirty-bitmap b0 --target T --name vm"
           : kind_ == kIncrementalDigests
               ? "barge backup --source SRC.raw --incremental --changed-by digests --target T --name vm"
               : "barge backup --source SRC.raw --incremental --dirty-extents CHANGES.json --target T --name vm";
  }

  void Build(Workspace& ws) override {
    std::vector<std::byte> disk = MakeDiskBytes(ws.disk_bytes, ws.seed);
    WriteBytes(ws.golden("0.raw"), disk);
    std::string raw = ws.work("src.raw");
    WriteBytes(raw, disk);
    if (kind_ == kIncrementalBitmap) {
      RunOk("qemu-img convert -f raw -O qcow2 " + Q(raw) + " " + Q(ws.work("src.qcow2")));
      RunOk("qemu-img bitmap --add " + Q(ws.work("src.qcow2")) + " b0");
      fs::remove(raw);
      id0_ = TakeBackup(ws.work("src.qcow2"), "qcow2", ws.work("T"));
      // Guest writes through qemu (tracked by b0): data, zeroes, a discard.
      uint64_t s = ws.disk_bytes;
      std::mt19937_64 rng(ws.seed);
      std::string cmd = "qemu-io -f qcow2";
      for (int k = 0; k < 6; ++k) {
        uint64_t off = (rng() % (s / (64 * kKiB))) * 64 * kKiB;
        uint64_t len = std::min<uint64_t>((1 + rng() % 8) * 16 * kKiB, s - off);
        cmd += " -c " + Q("write -P " + std::to_string(1 + rng() % 250) + " " + std::to_string(off) + " " +
                          std::to_string(len));
      }
      cmd += " -c " + Q("write -z " + std::to_string(s / 2) + " 128k");
      cmd += " -c " + Q("discard " + std::to_string(s / 4) + " 64k");
      RunOk(cmd + " " + Q(ws.work("src.qcow2")) + " >/dev/null");
      RunOk("qemu-img convert -f qcow2 -O raw " + Q(ws.work("src.qcow2")) + " " + Q(ws.golden("new.raw")));
      source_ = ws.work("src.qcow2");
    } else {
      // A digest chain's full keeps its SHA-256 table (the incremental
      // compares with it).
      id0_ = TakeBackup(raw, "raw", ws.work("T"), std::nullopt,
                        kind_ == kIncrementalDigests ? pipeline::ChangedBy::kDigests : pipeline::ChangedBy::kRecord);
      RangeList changed = Mutate(disk, ws.seed, 8);
      WriteBytes(raw, disk);
      WriteBytes(ws.golden("new.raw"), disk);
      if (kind_ == kIncrementalExtents) WriteExtents(ws.work("changes.json"), changed, ws.disk_bytes);
      source_ = raw;
    }
    source_digest_ = FileDigest(source_);
  }

  std::vector<std::string> Args(const Workspace& ws) const {
    std::vector<std::string> a = {"backup", "--source", source_, "--target", ws.work("T"), "--name", "vm"};
    if (kind_ == kIncrementalBitmap) a = Cat(a, {"--source-format", "qcow2", "--incremental", "--dirty-bitmap", "b0"});
    if (kind_ == kIncrementalExtents) a = Cat(a, {"--incremental", "--dirty-extents", ws.work("changes.json")});
    if (kind_ == kIncrementalDigests) a = Cat(a, {"--incremental", "--changed-by", "digests"});
    return Cat(a, Common());
  }
  Outcome Run(Workspace& ws, Runner& runner) override { return runner.Barge(Args(ws)); }

  void Check(Workspace& ws, Phase phase, Findings& f) override {
    ChainExpectation e;
    e.golden[id0_] = ws.golden("0.raw");
    e.new_golden = ws.golden("new.raw");
    e.required = {id0_};
    CheckChainFolder(ws, ws.work("T/vm"), e, f);
    if (FileDigest(source_) != source_digest_) f.Add(Finding::kDamaged, "the source changed: " + source_);
    if (phase != Phase::kFailed && ChainIds(ws.work("T/vm")).size() < 2) {
      f.Add(phase == Phase::kDone ? Finding::kLost : Finding::kNotRecovered,
            "the new backup point is missing");
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    std::vector<std::string> p = {ws.work("T"), source_};
    if (kind_ == kIncrementalExtents) p.push_back(ws.work("changes.json"));
    return p;
  }

 private:
  Kind kind_;
  std::string id0_, source_, source_digest_;
};

// ---- backup over a shared base ----

// A clone's first backup as an increment over the golden chain's point
// (`--base`): killed, failed or powered off at any step, nothing half
// written is taken for a point, the golden chain is untouched, and a
// reference left in the golden folder by a run that never committed
// protects nothing (forget and merge would not be blocked by it forever).
class BackupBaseScenario final : public Scenario {
 public:
  std::string name() const override { return "backup-base"; }
  std::string command() const override { return "barge backup --source CLONE.raw --target T --name vm --base golden"; }

  void Build(Workspace& ws) override {
    std::vector<std::byte> disk = MakeDiskBytes(ws.disk_bytes, ws.seed);
    WriteBytes(ws.golden("golden.raw"), disk);
    WriteBytes(ws.work("golden.raw"), disk);
    pipeline::BackupRequest req;
    req.source.location = ws.work("golden.raw");
    req.source.format = "raw";
    req.target_dir = ws.work("T");
    req.disk_name = "golden";
    req.copy.threads = 2;
    req.copy.memory_bytes = 8 * kMiB;
    auto r = pipeline::RunBackup(PosixEnv(), req);
    if (!r.ok()) {
      ADD_FAILURE() << "setup backup: " << r.error().ToString();
      return;
    }
    base_id_ = r->manifest.id;
    Mutate(disk, ws.seed, 12);
    WriteBytes(ws.work("clone.raw"), disk);
    WriteBytes(ws.golden("clone.raw"), disk);
    clone_digest_ = FileDigest(ws.work("clone.raw"));
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Barge(Cat({"backup", "--source", ws.work("clone.raw"), "--source-format", "raw", "--target",
                             ws.work("T"), "--name", "vm", "--base", "golden"},
                            Common()));
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    ChainExpectation e;
    e.golden[base_id_] = ws.golden("golden.raw");
    e.required = {base_id_};
    CheckChainFolder(ws, ws.work("T/golden"), e, f);
    if (FileDigest(ws.work("clone.raw")) != clone_digest_) f.Add(Finding::kDamaged, "the source changed");
    const std::vector<std::string> ids = fs::exists(ws.work("T/vm")) ? ChainIds(ws.work("T/vm")) : std::vector<std::string>{};
    // (The recovery re-runs the backup: a second chain over the base.)
    if (phase != Phase::kFailed && ids.empty()) {
      f.Add(phase == Phase::kDone ? Finding::kLost : Finding::kNotRecovered, "the clone's point is missing");
    }
    // A point under a final name reads as the clone, through its base (in
    // place: the base is found by its relative path).
    for (const std::string& id : ids) {
      std::string problem = GetOracles().CheckQcow2(ws.work("T/vm/" + id + ".qcow2"));
      if (!problem.empty()) f.Add(Finding::kDamaged, "image " + id + ": " + problem);
      pipeline::RestoreRequest rr;
      rr.chain_dir = ws.work("T/vm");
      rr.at = id;
      rr.destination = ws.scratch("restored.raw");
      rr.force = true;
      rr.sync = false;
      rr.copy.threads = 2;
      rr.copy.memory_bytes = 8 * kMiB;
      fs::remove(rr.destination);
      auto restored = pipeline::RunRestore(PosixEnv(), rr);
      if (!restored.ok()) {
        f.Add(Finding::kDamaged, "point " + id + " does not restore: " + restored.error().ToString());
      } else if (FileDigest(rr.destination) != clone_digest_) {
        f.Add(Finding::kDamaged, "point " + id + " restores to other bytes than the clone's");
      }
      fs::remove(rr.destination);
    }
    // The base is protected exactly when a clone point stands on it.
    auto live = pipeline::LiveDependents(PosixEnv(), ws.work("T/golden"), /*sweep=*/false);
    if (!live.ok()) {
      f.Add(Finding::kDamaged, "base references unreadable: " + live.error().ToString());
    } else if (live->count(base_id_) != (ids.empty() ? 0u : 1u)) {
      f.Add(ids.empty() ? Finding::kNotRecovered : Finding::kLost,
            ids.empty() ? "a reference without a committed clone still protects the base"
                        : "the clone's point stands on a base that does not know it");
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    return {ws.work("T"), ws.work("clone.raw")};
  }

 private:
  std::string base_id_, clone_digest_;
};

// ---- merge ----

class MergeScenario final : public Scenario {
 public:
  std::string name() const override { return "merge"; }
  std::string command() const override { return "barge merge T/vm --through <3rd point>"; }

  void Build(Workspace& ws) override {
    std::vector<std::byte> disk = MakeDiskBytes(ws.disk_bytes, ws.seed);
    std::string raw = ws.work("src.raw");
    for (int p = 0; p < 4; ++p) {
      std::optional<RangeList> dirty;
      if (p > 0) dirty = Mutate(disk, ws.seed + p, 6);
      WriteBytes(raw, disk);
      ids_.push_back(TakeBackup(raw, "raw", ws.work("T"), dirty));
      WriteBytes(ws.golden(ids_.back() + ".raw"), disk);
    }
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Barge(Cat({"merge", ws.work("T/vm"), "--through", ids_[2]}, Common()));
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    ChainExpectation e;
    for (const auto& id : ids_) e.golden[id] = ws.golden(id + ".raw");
    e.required = {ids_.begin(), ids_.end()};
    e.may_vanish = {ids_[0], ids_[1]};
    e.merge_through = ids_[2];
    CheckChainFolder(ws, ws.work("T/vm"), e, f);
    if (phase != Phase::kFailed) {
      std::vector<std::string> now = ChainIds(ws.work("T/vm"));
      if (now != std::vector<std::string>{ids_[2], ids_[3]}) {
        std::string s;
        for (const auto& id : now) s += id + " ";
        f.Add(Finding::kNotRecovered, "after the merge the chain holds " + s);
      }
      auto journal = pipeline::MergeJournalExists(PosixEnv(), ws.work("T/vm"));
      if (!journal.ok() || *journal) {
        f.Add(Finding::kNotRecovered, "merge journal left");
      }
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override { return {ws.work("T/vm")}; }

 private:
  std::vector<std::string> ids_;
};

// ---- restore and convert ----

// A command that writes one output file from inputs it must not change.
class OutputScenario : public Scenario {
 public:
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    if (TreeDigest(ws.work("in")) != inputs_digest_) f.Add(Finding::kDamaged, "the inputs changed");
    if (!old_golden_.empty()) {
      // Replacing an existing file: it holds the old or the new contents.
      Findings as_old, as_new;
      CheckOutputFile(output(ws), old_golden_, qcow2_, true, Finding::kLost, as_old);
      CheckOutputFile(output(ws), ws.golden("want.raw"), qcow2_, true, Finding::kLost, as_new);
      if (!as_old.empty() && !as_new.empty()) {
        f.Add(Finding::kLost, "the output is neither the old file nor the new one: " + as_new.ToString());
      }
      if (phase != Phase::kFailed && !as_new.empty()) {
        f.Add(Finding::kNotRecovered, "output not replaced: " + as_new.ToString());
      }
      return;
    }
    CheckOutputFile(output(ws), ws.golden("want.raw"), qcow2_, phase != Phase::kFailed,
                    phase == Phase::kFailed ? Finding::kDamaged : Finding::kNotRecovered, f);
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    return {ws.work("in"), output(ws), ws.work("out")};
  }
  bool ExistsIsDone() const override { return old_golden_.empty(); }

 protected:
  std::string output(const Workspace& ws) const { return ws.work(out_rel_); }
  // A chain of 3 points under in/T/vm; golden p0..p2.
  void BuildChain(Workspace& ws) {
    std::vector<std::byte> disk = MakeDiskBytes(ws.disk_bytes, ws.seed);
    std::string raw = ws.work("in/src.raw");
    for (int p = 0; p < 3; ++p) {
      std::optional<RangeList> dirty;
      if (p > 0) dirty = Mutate(disk, ws.seed + p, 6);
      WriteBytes(raw, disk);
      ids_.push_back(TakeBackup(raw, "raw", ws.work("in/T"), dirty));
      WriteBytes(ws.golden("p" + std::to_string(p) + ".raw"), disk);
    }
    fs::create_directories(ws.work("out"));
  }
  void Finish(Workspace& ws) { inputs_digest_ = TreeDigest(ws.work("in")); }

  std::vector<std::string> ids_;
  std::string out_rel_;
  bool qcow2_ = false;
  std::string old_golden_;  // the output exists before (replaced with --force)
  std::string inputs_digest_;
};

class RestoreScenario final : public OutputScenario {
 public:
  enum Kind { kRaw, kQcow2, kForce };
  explicit RestoreScenario(Kind kind) : kind_(kind) {}
  std::string name() const override {
    return kind_ == kRaw ? "restore-raw" : kind_ == kQcow2 ? "restore-qcow2" : "restore-force";
  }
  std::string command() const override {
    return kind_ == kRaw     ? "barge restore T/vm --at <2nd point> --to OUT.raw"
           : kind_ == kQcow2 ? "barge restore T/vm --at <2nd point> --to OUT.qcow2 -O qcow2"
                             : "barge restore T/vm --at <2nd point> --to EXISTING.raw --force";
  }
  void Build(Workspace& ws) override {
    BuildChain(ws);
    fs::copy_file(ws.golden("p1.raw"), ws.golden("want.raw"));
    qcow2_ = kind_ == kQcow2;
    out_rel_ = qcow2_ ? "out/disk.qcow2" : "out/disk.raw";
    if (kind_ == kForce) {
      fs::copy_file(ws.golden("p0.raw"), output(ws));
      old_golden_ = ws.golden("p0.raw");
    }
    Finish(ws);
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    std::vector<std::string> a = {"restore", ws.work("in/T/vm"), "--at", ids_[1], "--to", output(ws)};
    if (qcow2_) a = Cat(a, {"-O", "qcow2"});
    if (kind_ == kForce) a.push_back("--force");
    return runner.Barge(Cat(a, Common()));
  }

 private:
  Kind kind_;
};

class ConvertScenario final : public OutputScenario {
 public:
  explicit ConvertScenario(bool to_qcow2) { qcow2_ = to_qcow2; }
  std::string name() const override { return qcow2_ ? "convert-qcow2" : "convert-raw"; }
  std::string command() const override {
    return qcow2_ ? "barge convert SRC.raw OUT.qcow2 -O qcow2 --compress zstd"
                  : "barge convert CHAIN-TOP.qcow2 OUT.raw (a 3-layer backing chain)";
  }
  void Build(Workspace& ws) override {
    BuildChain(ws);
    if (qcow2_) {
      fs::copy_file(ws.golden("p2.raw"), ws.golden("want.raw"));
      source_ = ws.work("in/src.raw");
      out_rel_ = "out/disk.qcow2";
    } else {
      fs::copy_file(ws.golden("p2.raw"), ws.golden("want.raw"));
      source_ = ws.work("in/T/vm/" + ids_[2] + ".qcow2");
      out_rel_ = "out/disk.raw";
    }
    Finish(ws);
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    std::vector<std::string> a = {"convert", source_, output(ws)};
    if (qcow2_) a = Cat(a, {"-O", "qcow2", "--compress", "zstd"});
    return runner.Barge(Cat(a, Common()));
  }

 private:
  std::string source_;
};

// ---- replicate ----

// Checks a replica: a file under its name holds the source's guest view;
// a record beside it describes it.
void CheckReplica(const std::string& path, const std::string& golden, bool must_be_ready, Phase phase,
                  Findings& f) {
  std::error_code ec;
  bool exists = fs::exists(path, ec);
  auto record = pipeline::ReadReplicaRecord(PosixEnv(), path);
  if (exists) CheckOutputFile(path, golden, true, true, Finding::kDamaged, f);
  if (record.ok()) {
    if (exists && !pipeline::FileMatchesRecord(PosixEnv(), path, *record)) {
      // A stale record: harmless only while the file is not taken as ready.
      if (phase != Phase::kFailed) f.Add(Finding::kNotRecovered, "record does not match its file: " + path);
    }
  } else if (record.error().code() != ErrorCode::kNotFound) {
    f.Add(Finding::kDamaged, "record of " + path + ": " + record.error().ToString());
  }
  if (must_be_ready) {
    if (!exists) f.Add(Finding::kNotRecovered, "copy missing: " + path);
    else if (!record.ok()) f.Add(Finding::kNotRecovered, "copy without its checksum record: " + path);
  }
}

// A qcow2 source with a persistent bitmap (carried to qcow2 copies).
void BuildImageSource(Workspace& ws, const std::string& path) {
  std::vector<std::byte> disk = MakeDiskBytes(ws.disk_bytes, ws.seed + 100);
  WriteBytes(ws.golden("src.raw"), disk);
  RunOk("qemu-img convert -f raw -O qcow2 " + Q(ws.golden("src.raw")) + " " + Q(path));
  RunOk("qemu-img bitmap --add " + Q(path) + " cbt0");
}

class ReplicateScenario final : public Scenario {
 public:
  std::string name() const override { return "replicate"; }
  std::string command() const override {
    return "barge replicate SRC.qcow2 --to D1/base.qcow2 --to D2/base.qcow2 --verify";
  }
  void Build(Workspace& ws) override {
    BuildImageSource(ws, ws.work("src.qcow2"));
    fs::create_directories(ws.work("d1"));
    fs::create_directories(ws.work("d2"));
    source_digest_ = FileDigest(ws.work("src.qcow2"));
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Barge(Cat({"replicate", ws.work("src.qcow2"), "--to", ws.work("d1/base.qcow2"), "--to",
                             ws.work("d2/base.qcow2"), "--verify"},
                            Common()));
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    if (FileDigest(ws.work("src.qcow2")) != source_digest_) f.Add(Finding::kDamaged, "the source changed");
    for (const char* d : {"d1/base.qcow2", "d2/base.qcow2"}) {
      CheckReplica(ws.work(d), ws.golden("src.raw"), phase != Phase::kFailed, phase, f);
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    return {ws.work("src.qcow2"), ws.work("d1"), ws.work("d2")};
  }

 private:
  std::string source_digest_;
};

// ---- the image catalog ----

class CatalogScenario : public Scenario {
 public:
  bool NeedsProcessGone() const override { return true; }

 protected:
  std::string Catalog(const Workspace& ws) const { return ws.work("cat/images.db"); }
  // Catalog rows of `image`: a ready copy has its file and a matching
  // record, and reads as the source. `removing`: copies a cleanup is
  // removing, whose row may outlive the file until the next cleanup (a
  // ready row whose file is gone is never a sender: Sync checks the file).
  void CheckRows(Workspace& ws, Phase phase, Findings& f, const std::set<std::string>& removing = {}) {
    auto cat = orchestrate::ImageCatalog::Open(PosixEnv(), Catalog(ws));
    if (!cat.ok()) {
      f.Add(Finding::kDamaged, "catalog: " + cat.error().ToString());
      return;
    }
    auto copies = (*cat)->Copies("base");
    if (!copies.ok()) {
      f.Add(Finding::kDamaged, "catalog: " + copies.error().ToString());
      return;
    }
    for (const auto& c : *copies) {
      std::error_code ec;
      if (phase == Phase::kFailed && removing.count(BaseName(DirName(c.path))) && !fs::exists(c.path, ec)) {
        continue;
      }
      if (phase == Phase::kFailed && removing.count(BaseName(DirName(c.path))) &&
          !pipeline::ReadReplicaRecord(PosixEnv(), c.path).ok()) {
        // A cleanup removes the record first: a copy without one is never
        // a sender (Sync checks the record), and the next cleanup finishes.
        continue;
      }
      if (c.state == "ready") {
        Findings g;
        CheckReplica(c.path, ws.golden("src.raw"), true, phase, g);
        for (const auto& [kind, what] : g.items()) {
          f.Add(kind == Finding::kNotRecovered ? Finding::kLost : kind, "catalog says ready: " + what);
        }
      } else if (phase != Phase::kFailed && (c.state == "pending" || c.state == "in-progress")) {
        f.Add(Finding::kNotRecovered, "copy " + c.path + " still " + c.state);
      }
    }
  }
  std::string StateOf(Workspace& ws, const std::string& disk) {
    auto cat = orchestrate::ImageCatalog::Open(PosixEnv(), Catalog(ws));
    if (!cat.ok()) return "error";
    auto copies = (*cat)->Copies("base");
    if (!copies.ok()) return "error";
    std::string key = CanonicalPath(PosixEnv(), disk);
    for (const auto& c : *copies) {
      if (c.disk == key || c.disk == disk) return c.state;
    }
    return "none";
  }
  // Adds `base` from src.qcow2 to `disk` (setup, in this process).
  void Add(Workspace& ws, const std::string& disk) {
    auto cat = orchestrate::ImageCatalog::Open(PosixEnv(), Catalog(ws));
    ASSERT_TRUE(cat.ok()) << cat.error().ToString();
    pipeline::ReplicateOptions o;
    o.copy.threads = 2;
    auto r = (*cat)->Add("base", ws.work("src.qcow2"), "", disk, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    ASSERT_EQ(r->state, "ready") << r->message;
  }
  void Sync(Workspace& ws, const std::vector<std::string>& disks) {
    auto cat = orchestrate::ImageCatalog::Open(PosixEnv(), Catalog(ws));
    ASSERT_TRUE(cat.ok()) << cat.error().ToString();
    orchestrate::SyncOptions o;
    o.replicate.copy.threads = 2;
    auto r = (*cat)->Sync("base", disks, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
  }
};

class ImageAddScenario final : public CatalogScenario {
 public:
  std::string name() const override { return "image-add"; }
  std::string command() const override { return "barge image add base --source SRC.qcow2 --disk D1 --verify"; }
  void Build(Workspace& ws) override {
    BuildImageSource(ws, ws.work("src.qcow2"));
    fs::create_directories(ws.work("d1"));
    fs::create_directories(ws.work("cat"));
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Barge({"image", "add", "base", "--source", ws.work("src.qcow2"), "--disk", ws.work("d1"),
                         "--verify", "--catalog", Catalog(ws)});
  }
  void Recover(Workspace& ws, Runner& runner, Findings& f) override {
    Outcome o = Run(ws, runner);
    if (o.exit_code == 0) return;
    // An add that got as far as the catalog's image row: the image exists.
    if (ErrorSays(o, "InvalidArgument", "exists") && StateOf(ws, ws.work("d1")) == "ready") return;
    f.Add(Finding::kNotRecovered, "re-run: " + o.Describe());
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    CheckRows(ws, phase, f);
    if (phase != Phase::kFailed && StateOf(ws, ws.work("d1")) != "ready") {
      f.Add(Finding::kNotRecovered, "d1 is " + StateOf(ws, ws.work("d1")));
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    // The catalog's folder too: its locks/ go there (docs/replication.md).
    return {ws.work("src.qcow2"), ws.work("d1"), Catalog(ws), ws.work("cat")};
  }
};

class ImageSyncScenario final : public CatalogScenario {
 public:
  std::string name() const override { return "image-sync"; }
  std::string command() const override { return "barge image sync base --disks D2,D3 --verify"; }
  void Build(Workspace& ws) override {
    BuildImageSource(ws, ws.work("src.qcow2"));
    for (const char* d : {"d1", "d2", "d3", "cat"}) fs::create_directories(ws.work(d));
    Add(ws, ws.work("d1"));
    d1_digest_ = TreeDigest(ws.work("d1"));
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Barge({"image", "sync", "base", "--disks", ws.work("d2") + "," + ws.work("d3"), "--verify",
                         "--catalog", Catalog(ws)});
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    CheckRows(ws, phase, f);
    if (TreeDigest(ws.work("d1")) != d1_digest_) {
      f.Add(Finding::kLost, "the sending copy changed: " + TreeDiff(ws.work("d1"), ws.templ("d1")));
    }
    if (phase != Phase::kFailed) {
      for (const char* d : {"d2", "d3"}) {
        if (StateOf(ws, ws.work(d)) != "ready") f.Add(Finding::kNotRecovered, std::string(d) + " is " + StateOf(ws, ws.work(d)));
      }
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    return {ws.work("d1"), ws.work("d2"), ws.work("d3"), Catalog(ws)};
  }

 private:
  std::string d1_digest_;
};

class ImageCleanupScenario final : public CatalogScenario {
 public:
  std::string name() const override { return "image-cleanup"; }
  std::string command() const override { return "barge image cleanup --unused-for 0 (D1's copy in use, D2's and D3's not)"; }
  void Build(Workspace& ws) override {
    BuildImageSource(ws, ws.work("src.qcow2"));
    for (const char* d : {"d1", "d2", "d3", "cat"}) fs::create_directories(ws.work(d));
    Add(ws, ws.work("d1"));
    Sync(ws, {ws.work("d2"), ws.work("d3")});
    // A VM disk on d1 uses its copy as backing file: that copy stays.
    RunOk("qemu-img create -f qcow2 -b base.qcow2 -F qcow2 " + Q(ws.work("d1/vm.qcow2")) + " >/dev/null");
    d1_digest_ = TreeDigest(ws.work("d1"));
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Barge({"image", "cleanup", "--unused-for", "0", "--catalog", Catalog(ws)});
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    CheckRows(ws, phase, f, {"d2", "d3"});
    if (TreeDigest(ws.work("d1")) != d1_digest_) {
      f.Add(Finding::kLost, "the copy in use changed or went: " + TreeDiff(ws.work("d1"), ws.templ("d1")));
    }
    for (const char* d : {"d2/base", "d3/base"}) {
      std::error_code ec;
      if (fs::exists(ws.work(d), ec)) {
        CheckOutputFile(ws.work(d), ws.golden("src.raw"), true, true, Finding::kDamaged, f);
        if (phase != Phase::kFailed) f.Add(Finding::kNotRecovered, std::string("not removed: ") + d);
      }
      if (phase != Phase::kFailed && fs::exists(pipeline::ReplicaRecordPath(ws.work(d)), ec)) {
        f.Add(Finding::kNotRecovered, std::string("record not removed: ") + d);
      }
    }
    if (phase != Phase::kFailed) {
      for (const char* d : {"d2", "d3"}) {
        std::string s = StateOf(ws, ws.work(d));
        if (s == "ready") f.Add(Finding::kNotRecovered, std::string(d) + " still ready in the catalog");
      }
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    return {ws.work("d1"), ws.work("d2"), ws.work("d3"), Catalog(ws)};
  }

 private:
  std::string d1_digest_;
};

// ---- state migrate ----

// The folder's contents as migrated state: names, kinds, link texts, bytes;
// barge's journal and marker left out.
std::string StateDigest(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return "";
  std::string copy = dir + ".digest-copy";
  RemoveTree(copy);
  CopyTree(dir, copy);
  fs::remove(copy + "/" + orchestrate::kMigrateJournalName, ec);
  fs::remove(copy + "/" + orchestrate::kStateMarkerName, ec);
  std::string d = Temporaries(copy).empty() ? TreeDigest(copy) : "with temporaries";
  RemoveTree(copy);
  return d;
}

class StateMigrateScenario final : public Scenario {
 public:
  std::string name() const override { return "state-migrate"; }
  std::string command() const override { return "barge state migrate --from OLD/vm --to NEW/vm"; }
  void Build(Workspace& ws) override {
    std::string from = ws.work("old/vm");
    WriteBytes(from + "/tpm/tpm2-00.permall", MakeDiskBytes(40 * kKiB, ws.seed + 1));
    WriteBytes(from + "/nvram/VARS.fd", MakeDiskBytes(512 * kKiB, ws.seed + 2));
    WriteText(from + "/domain.xml", "<domain><name>vm</name></domain>\n");
    fs::create_symlink("tpm/tpm2-00.permall", from + "/tpm-current");
    // A CBT overlay over a raw disk outside the folder, with a bitmap.
    WriteBytes(ws.work("disks/disk.raw"), MakeDiskBytes(ws.disk_bytes, ws.seed + 3));
    fs::create_directories(from + "/cbt");
    RunOk("qemu-img create -f qcow2 -o data_file=" + ws.work("disks/disk.raw") + ",data_file_raw=on " +
          Q(from + "/cbt/disk.qcow2") + " " + std::to_string(ws.disk_bytes) + " >/dev/null");
    RunOk("qemu-img bitmap --add " + Q(from + "/cbt/disk.qcow2") + " cbt0");
    fs::create_directories(ws.work("new"));
    want_ = StateDigest(from);
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Barge({"state", "migrate", "--from", ws.work("old/vm"), "--to", ws.work("new/vm")});
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    std::string from = ws.work("old/vm"), to = ws.work("new/vm");
    std::string old_state = StateDigest(from), new_state = StateDigest(to);
    std::error_code ec;
    bool to_current = fs::exists(to + "/" + orchestrate::kStateMarkerName, ec);
    if (old_state != want_ && new_state != want_) f.Add(Finding::kLost, "neither copy holds the state");
    if (to_current && new_state != want_) f.Add(Finding::kLost, "the new copy is marked current but incomplete");
    if (!fs::exists(from, ec) && new_state != want_) f.Add(Finding::kLost, "the old copy is gone, the new one incomplete");
    if (phase != Phase::kFailed) {
      if (new_state != want_ || !to_current) f.Add(Finding::kNotRecovered, "the new copy is not complete and current");
      if (fs::exists(from, ec)) f.Add(Finding::kNotRecovered, "the old copy is still there");
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    // The folders holding them too: a migration syncs them (the rename of
    // the new copy into new/, the removal of the old one from old/).
    return {ws.work("old/vm"), ws.work("new/vm"), ws.work("new"), ws.work("old")};
  }

 private:
  std::string want_;
};

// ---- overlay create and bitmap edits ----

struct BitmapState {
  std::string error;
  std::map<std::string, formats::BitmapInfo> bitmaps;
};

BitmapState ReadBitmaps(const std::string& path) {
  BitmapState s;
  formats::OpenOptions o;
  o.open_data_file = false;
  o.open_backing = false;
  auto image = pipeline::OpenImageFile(PosixEnv(), path, o);
  if (!image.ok()) {
    s.error = image.error().ToString();
    return s;
  }
  for (const auto& b : (*image)->info().bitmaps) s.bitmaps[b.name] = b;
  return s;
}

Result<RangeList> DirtyOf(const std::string& path, const std::string& bitmap) {
  formats::OpenOptions o;
  o.open_data_file = false;
  o.open_backing = false;
  BARGE_ASSIGN_OR_RETURN(auto image, pipeline::OpenImageFile(PosixEnv(), path, o));
  return formats::ReadBitmapDirtyRanges(*image, bitmap);
}

class OverlayCreateScenario final : public Scenario {
 public:
  std::string name() const override { return "overlay-create"; }
  std::string command() const override { return "barge overlay create --data-file DISK.raw OV.qcow2 --bitmap cbt0"; }
  void Build(Workspace& ws) override {
    WriteBytes(ws.work("disk.raw"), MakeDiskBytes(ws.disk_bytes, ws.seed));
    fs::copy_file(ws.work("disk.raw"), ws.golden("disk.raw"));
    fs::create_directories(ws.work("ov"));
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Barge({"overlay", "create", "--data-file", ws.work("disk.raw"), ws.work("ov/disk.qcow2"),
                         "--bitmap", "cbt0"});
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    std::string ov = ws.work("ov/disk.qcow2");
    if (FileDigest(ws.work("disk.raw")) != FileDigest(ws.golden("disk.raw"))) f.Add(Finding::kLost, "the raw disk changed");
    std::error_code ec;
    if (!fs::exists(ov, ec)) {
      if (phase != Phase::kFailed) f.Add(Finding::kNotRecovered, "overlay missing");
      return;
    }
    std::string problem = GetOracles().CheckQcow2(ov);
    if (!problem.empty()) f.Add(Finding::kDamaged, "overlay: " + problem);
    BitmapState b = ReadBitmaps(ov);
    if (!b.error.empty() || b.bitmaps.size() != 1 || !b.bitmaps.count("cbt0")) {
      f.Add(Finding::kDamaged, "overlay bitmaps wrong " + b.error);
    }
    CheckOutputFile(ov, ws.golden("disk.raw"), true, true, Finding::kDamaged, f);
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    return {ws.work("ov/disk.qcow2"), ws.work("ov"), ws.work("disk.raw")};
  }
  bool ExistsIsDone() const override { return true; }
};

// Offline rotation of a CBT bitmap (what `vm backup` does to an overlay
// after an offline backup): keep0 stays, cp1 goes, cp2 comes, in place.
class BitmapRotateScenario final : public Scenario {
 public:
  std::string name() const override { return "bitmap-rotate"; }
  std::string command() const override {
    return "formats::EditBitmaps through the Env (vm backup's offline rotation: remove cp1, add cp2; keep0 kept)";
  }
  bool library_only() const override { return true; }
  void Build(Workspace& ws) override {
    std::string raw = ws.work("disk.raw"), ov = ws.work("disk.qcow2");
    WriteBytes(raw, MakeDiskBytes(ws.disk_bytes, ws.seed));
    RunOk("qemu-img create -f qcow2 -o data_file=" + raw + ",data_file_raw=on " + Q(ov) + " " +
          std::to_string(ws.disk_bytes) + " >/dev/null");
    RunOk("qemu-img bitmap --add -g 65536 " + Q(ov) + " keep0");
    RunOk("qemu-img bitmap --add -g 65536 " + Q(ov) + " cp1");
    std::mt19937_64 rng(ws.seed);
    std::string cmd = "qemu-io -f qcow2";
    for (int k = 0; k < 6; ++k) {
      uint64_t off = (rng() % (ws.disk_bytes / (64 * kKiB))) * 64 * kKiB;
      cmd += " -c " + Q("write -P " + std::to_string(1 + rng() % 250) + " " + std::to_string(off) + " 64k");
    }
    RunOk(cmd + " " + Q(ov) + " >/dev/null");
    raw_digest_ = FileDigest(raw);
    auto k = DirtyOf(ov, "keep0");
    auto c = DirtyOf(ov, "cp1");
    ASSERT_TRUE(k.ok() && c.ok());
    keep0_ = *k;
    cp1_ = *c;
    ASSERT_FALSE(keep0_.empty());
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Child({"bitmap-rotate", ws.work("disk.qcow2"), "cp1", "cp2"});
  }
  void Recover(Workspace& ws, Runner& runner, Findings& f) override {
    BitmapState b = ReadBitmaps(ws.work("disk.qcow2"));
    if (b.error.empty() && b.bitmaps.count("cp2") && !b.bitmaps.count("cp1")) return;  // done
    if (b.error.empty() && b.bitmaps.count("cp2")) {
      // cp1 half removed and cp2 there cannot happen: rotations write the new set at once.
      f.Add(Finding::kNotRecovered, "cp1 and cp2 both present");
      return;
    }
    Outcome o = Run(ws, runner);
    if (o.exit_code != 0) f.Add(Finding::kNotRecovered, "re-run: " + o.Describe());
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    std::string ov = ws.work("disk.qcow2");
    if (FileDigest(ws.work("disk.raw")) != raw_digest_) f.Add(Finding::kLost, "the raw disk changed");
    // Documented: a crash may leak clusters (qcow2.md §4.1), never more;
    // the rotation that recovers does not reclaim them (qemu-img check -r
    // leaks does). A run that completed leaks nothing.
    std::string problem = GetOracles().CheckQcow2(ov, /*leaks_ok=*/phase != Phase::kDone);
    if (!problem.empty()) f.Add(Finding::kDamaged, "overlay: " + problem);
    BitmapState b = ReadBitmaps(ov);
    if (!b.error.empty()) {
      f.Add(Finding::kDamaged, "overlay: " + b.error);
      return;
    }
    auto keep = b.bitmaps.find("keep0");
    if (keep == b.bitmaps.end() || keep->second.in_use) {
      f.Add(Finding::kLost, "keep0 lost or marked in use");
    } else {
      auto dirty = DirtyOf(ov, "keep0");
      if (!dirty.ok() || *dirty != keep0_) f.Add(Finding::kLost, "keep0's dirty set changed");
    }
    bool old_set = b.bitmaps.count("cp1") && !b.bitmaps.count("cp2");
    bool new_set = b.bitmaps.count("cp2") && !b.bitmaps.count("cp1");
    if (b.bitmaps.size() != 2 || (!old_set && !new_set)) f.Add(Finding::kDamaged, "unexpected bitmap set");
    if (old_set && !b.bitmaps["cp1"].in_use) {
      auto dirty = DirtyOf(ov, "cp1");
      if (!dirty.ok() || *dirty != cp1_) f.Add(Finding::kLost, "cp1's dirty set changed");
    }
    if (new_set) {
      auto dirty = DirtyOf(ov, "cp2");
      if (!dirty.ok() || !dirty->empty() || !b.bitmaps["cp2"].enabled || b.bitmaps["cp2"].in_use) {
        f.Add(Finding::kDamaged, "cp2 is not a new, empty, enabled bitmap");
      }
    }
    if (phase != Phase::kFailed && !new_set) f.Add(Finding::kNotRecovered, "not rotated");
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override { return {ws.work("disk.qcow2")}; }

 private:
  std::string raw_digest_;
  RangeList keep0_, cp1_;
};

// ---- snapshots ----

// An image file's internal snapshots as barge's reader lists them, and what
// each reads (memoized per file content: most crash points leave one of a
// few files).
struct SnapshotFacts {
  std::string problem;  // the image does not open or check
  std::vector<std::pair<std::string, std::string>> list;  // (id, name), table order
  std::map<std::string, std::string> reads;  // name -> golden tag it reads as, or the problem
  std::string active;                         // golden tag of the active state, or the problem
};

// Offline `barge snapshot create|delete|rename|rollback` on a qcow2 with two
// snapshots (s1, s2) and data written after each (docs/snapshots.md: each
// edit is one transaction committed by a single header write; after a crash
// the image is the old one or the new one, qemu-img check clean).
class SnapshotScenario final : public Scenario {
 public:
  enum Kind { kCreate, kDelete, kRename, kRollback };
  explicit SnapshotScenario(Kind kind) : kind_(kind) {}

  std::string name() const override {
    return kind_ == kCreate   ? "snapshot-create"
           : kind_ == kDelete ? "snapshot-delete"
           : kind_ == kRename ? "snapshot-rename"
                              : "snapshot-rollback";
  }
  std::string command() const override {
    return kind_ == kCreate   ? "barge snapshot create IMG.qcow2 --name s3 (2 snapshots there)"
           : kind_ == kDelete ? "barge snapshot delete IMG.qcow2 s1"
           : kind_ == kRename ? "barge snapshot rename IMG.qcow2 s2 s2-renamed"
                              : "barge snapshot rollback IMG.qcow2 s1 (s2 kept)";
  }
  uint64_t kill_disk_bytes() const override { return 16 << 20; }

  void Build(Workspace& ws) override {
    std::string img = ws.work("disk.qcow2");
    WriteBytes(ws.golden("A.raw"), MakeDiskBytes(ws.disk_bytes, ws.seed));
    RunOk("qemu-img convert -f raw -O qcow2 " + Q(ws.golden("A.raw")) + " " + Q(img));
    RunOk("qemu-img snapshot -c s1 " + Q(img));
    Write(ws, img, ws.seed + 1);
    RunOk("qemu-img convert -f qcow2 -O raw " + Q(img) + " " + Q(ws.golden("B.raw")));
    RunOk("qemu-img snapshot -c s2 " + Q(img));
    Write(ws, img, ws.seed + 2);
    RunOk("qemu-img convert -f qcow2 -O raw " + Q(img) + " " + Q(ws.golden("C.raw")));
    for (const char* g : {"A", "B", "C"}) goldens_[g] = ReadAll(ws.golden(std::string(g) + ".raw"));
    old_list_ = {{"1", "s1"}, {"2", "s2"}};
    old_reads_ = {{"s1", "A"}, {"s2", "B"}};
    switch (kind_) {
      case kCreate:
        new_list_ = {{"1", "s1"}, {"2", "s2"}, {"3", "s3"}};
        new_reads_ = {{"s1", "A"}, {"s2", "B"}, {"s3", "C"}};
        break;
      case kDelete:
        new_list_ = {{"2", "s2"}};
        new_reads_ = {{"s2", "B"}};
        break;
      case kRename:
        new_list_ = {{"1", "s1"}, {"2", "s2-renamed"}};
        new_reads_ = {{"s1", "A"}, {"s2-renamed", "B"}};
        break;
      case kRollback:
        new_list_ = old_list_;
        new_reads_ = old_reads_;
        break;
    }
    SnapshotFacts facts = Facts(ws);
    ASSERT_TRUE(facts.problem.empty()) << facts.problem;
    ASSERT_EQ(facts.list, old_list_);
  }

  std::vector<std::string> Args(const Workspace& ws) const {
    std::string img = ws.work("disk.qcow2");
    switch (kind_) {
      case kCreate: return {"snapshot", "create", img, "--name", "s3"};
      case kDelete: return {"snapshot", "delete", img, "s1"};
      case kRename: return {"snapshot", "rename", img, "s2", "s2-renamed"};
      case kRollback: break;
    }
    return {"snapshot", "rollback", img, "s1"};
  }
  Outcome Run(Workspace& ws, Runner& runner) override { return runner.Barge(Args(ws)); }

  void Recover(Workspace& ws, Runner& runner, Findings& f) override {
    // Done already (the new list): the re-run would be refused (a taken
    // name, no such snapshot). A rollback is always run again.
    if (kind_ != kRollback) {
      SnapshotFacts facts = Facts(ws);
      if (facts.problem.empty() && facts.list == new_list_) return;
    }
    Outcome o = Run(ws, runner);
    if (o.exit_code != 0) f.Add(Finding::kNotRecovered, "re-run: " + o.Describe());
  }

  void Check(Workspace& ws, Phase phase, Findings& f) override {
    SnapshotFacts facts = Facts(ws);
    if (!facts.problem.empty()) {
      f.Add(Finding::kDamaged, "image: " + facts.problem);
      return;
    }
    bool is_old = facts.list == old_list_, is_new = facts.list == new_list_;
    if (!is_old && !is_new) {
      std::string s;
      for (const auto& [id, n] : facts.list) s += id + ":" + n + " ";
      f.Add(Finding::kDamaged, "the snapshot list is neither the old nor the new one: " + s);
      return;
    }
    if (phase != Phase::kFailed && !is_new) f.Add(Finding::kNotRecovered, "the snapshot list is still the old one");
    // Every snapshot listed reads as it did (barge's reader and qemu's).
    const auto& want = is_new ? new_reads_ : old_reads_;
    for (const auto& [n, tag] : want) {
      auto it = facts.reads.find(n);
      std::string got = it == facts.reads.end() ? "not read" : it->second;
      if (got != tag) f.Add(Finding::kLost, "snapshot " + n + " reads " + got + ", not " + tag);
    }
    // The active state: unchanged, or (rollback) s1's once committed.
    if (kind_ == kRollback) {
      if (facts.active != "A" && facts.active != "C") f.Add(Finding::kLost, "active state reads " + facts.active);
      if (phase != Phase::kFailed && facts.active != "A") {
        f.Add(Finding::kNotRecovered, "not rolled back: the active state reads " + facts.active);
      }
    } else if (facts.active != "C") {
      f.Add(Finding::kLost, "active state reads " + facts.active + ", not C");
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override { return {ws.work("disk.qcow2")}; }

 private:
  // Guest writes through qemu-io (a few 64 KiB ranges and a zeroed one).
  static void Write(Workspace& ws, const std::string& img, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::string cmd = "qemu-io -f qcow2";
    for (int k = 0; k < 6; ++k) {
      uint64_t off = (rng() % (ws.disk_bytes / (64 * kKiB))) * 64 * kKiB;
      cmd += " -c " + Q("write -P " + std::to_string(1 + rng() % 250) + " " + std::to_string(off) + " 64k");
    }
    cmd += " -c " + Q("write -z " + std::to_string((rng() % (ws.disk_bytes / (64 * kKiB))) * 64 * kKiB) + " 64k");
    RunOk(cmd + " " + Q(img) + " >/dev/null");
  }

  std::string Tag(const Result<std::vector<std::byte>>& bytes) const {
    if (!bytes.ok()) return bytes.error().ToString();
    for (const auto& [tag, g] : goldens_) {
      if (CompareBytes(*bytes, g).empty()) return tag;
    }
    return "other bytes";
  }

  SnapshotFacts Facts(Workspace& ws) {
    std::string img = ws.work("disk.qcow2");
    std::string key = FileDigest(img);
    if (auto it = facts_.find(key); it != facts_.end()) return it->second;
    SnapshotFacts facts;
    facts.problem = GetOracles().CheckQcow2(img);
    formats::OpenOptions o;
    o.open_backing = false;
    auto image = pipeline::OpenImageFile(PosixEnv(), img, o);
    if (facts.problem.empty() && !image.ok()) facts.problem = image.error().ToString();
    if (facts.problem.empty()) {
      for (const auto& s : (*image)->info().snapshots) facts.list.emplace_back(s.id, s.name);
      facts.active = Tag(ReadImage(img));
      std::string raw = ws.scratch("snapshot.raw");
      for (const auto& [id, n] : facts.list) {
        o.snapshot = n;
        auto at = pipeline::OpenImageFile(PosixEnv(), img, o);
        std::string tag;
        if (!at.ok()) {
          tag = at.error().ToString();
        } else {
          std::vector<std::byte> bytes((*at)->size_bytes());
          Status s = (*at)->ReadAt(0, bytes);
          tag = s.ok() ? Tag(bytes) : s.error().ToString();
        }
        // qemu's reader must agree (qemu-img convert -l).
        std::string cmd = "qemu-img convert -f qcow2 -O raw -l " + Q("snapshot.name=" + n) + " " + Q(img) + " " +
                          Q(raw) + " 2>&1";
        std::string qemu_tag = testing::Run(cmd).exit_code == 0 ? Tag(ReadAll(raw)) : "qemu-img convert -l failed";
        std::error_code ec;
        fs::remove(raw, ec);
        if (qemu_tag != tag) tag = "barge reads " + tag + ", qemu-img " + qemu_tag;
        facts.reads[n] = tag;
      }
    }
    facts_[key] = facts;
    return facts;
  }

  Kind kind_;
  std::map<std::string, std::vector<std::byte>> goldens_;
  std::vector<std::pair<std::string, std::string>> old_list_, new_list_;
  std::map<std::string, std::string> old_reads_, new_reads_;
  std::map<std::string, SnapshotFacts> facts_;
};

// ---- policy run ----

// `barge run --policy P --force`: one image source (qcow2 with bitmap
// cbt0) whose chain already holds a full and an incremental, retention 2:
// an incremental backup and the bitmap's clear, then (the new point
// verified) the full folded into the incremental. Checks: every point present
// verifies and restores its data; every record that says success with its
// points present has them; no record stays 'running' after the re-run; the
// source's data unchanged and its image checks (leaks allowed: a failed or
// interrupted bitmap clear, docs/formats/qcow2.md §4.1).
class PolicyRunScenario final : public Scenario {
 public:
  std::string name() const override { return "policy-run"; }
  std::string command() const override {
    return "barge run --policy P --force (image source with bitmap, retention_count 2 over full+incremental)";
  }
  uint64_t kill_disk_bytes() const override { return 16 << 20; }
  void Build(Workspace& ws) override {
    std::string src = ws.work("src.qcow2");
    WriteBytes(ws.golden("g0.raw"), MakeDiskBytes(ws.disk_bytes, ws.seed));
    RunOk("qemu-img convert -f raw -O qcow2 " + Q(ws.golden("g0.raw")) + " " + Q(src));
    RunOk("qemu-img bitmap --add " + Q(src) + " cbt0");
    fs::create_directories(ws.work("T"));
    fs::create_directories(ws.work("cat"));
    WriteText(ws.work("policy.yaml"), "name: pol\n"
                                      "sources:\n"
                                      "  - image: " + src + "\n"
                                      "    bitmap: cbt0\n"
                                      "targets: [" + ws.work("T") + "]\n"
                                      "retention_count: 2\n"
                                      "free_space_multiple: 0\n");
    InProcessRunner runner(ws.capture());
    for (int p = 0; p < 2; ++p) {
      Outcome o = Run(ws, runner);
      ASSERT_EQ(o.exit_code, 0) << o.Describe();
      GuestWrites(ws, src, ws.seed + 1 + p);
      RunOk("qemu-img convert -f qcow2 -O raw " + Q(src) + " " + Q(ws.golden(p == 0 ? "g1.raw" : "g2.raw")));
    }
    // The guest wrote after each run: the first point holds g0, the
    // second g1, anything new g2.
    ids_ = ChainIds(Chain(ws));
    ASSERT_EQ(ids_.size(), 2u);
  }
  Outcome Run(Workspace& ws, Runner& runner) override {
    return runner.Barge(Cat({"run", "--policy", ws.work("policy.yaml"), "--force", "--catalog", Catalog(ws)}, Common()));
  }
  void Check(Workspace& ws, Phase phase, Findings& f) override {
    ChainExpectation e;
    e.golden[ids_[0]] = ws.golden("g0.raw");
    e.golden[ids_[1]] = ws.golden("g1.raw");
    e.new_golden = ws.golden("g2.raw");
    if (phase != Phase::kRecovered) {
      // This run's retention may fold the full into the incremental; the
      // re-run's retention may fold more (by design).
      e.required = {ids_[0], ids_[1]};
      e.may_vanish = {ids_[0]};
      e.merge_through = ids_[1];
    }
    CheckChainFolder(ws, Chain(ws), e, f);
    std::vector<std::string> now = ChainIds(Chain(ws));
    if (phase != Phase::kFailed && (now.empty() || now.back() == ids_[0] || now.back() == ids_[1])) {
      f.Add(phase == Phase::kDone ? Finding::kLost : Finding::kNotRecovered, "no new point in the chain");
    }
    // The source: its data as it was, its image sound.
    auto guest = ReadImage(ws.work("src.qcow2"));
    if (!guest.ok() || !CompareBytes(*guest, ReadAll(ws.golden("g2.raw"))).empty()) {
      f.Add(Finding::kDamaged, "the source's data changed");
    }
    // A bitmap clear that fails (or is cut short) leaks clusters and the
    // run still succeeds, with a warning on its record (docs/policies.md).
    std::string problem = GetOracles().CheckQcow2(ws.work("src.qcow2"), /*leaks_ok=*/true);
    if (!problem.empty()) f.Add(Finding::kDamaged, "source: " + problem);
    // The records.
    auto cat = orchestrate::PolicyCatalog::Open(PosixEnv(), Catalog(ws));
    if (!cat.ok()) {
      f.Add(Finding::kDamaged, "catalog: " + cat.error().ToString());
      return;
    }
    orchestrate::RunFilter filter;
    filter.policy = "pol";
    auto runs = (*cat)->ListRuns(filter);
    if (!runs.ok()) {
      f.Add(Finding::kDamaged, "catalog: " + runs.error().ToString());
      return;
    }
    for (const auto& r : *runs) {
      if (r.result == "success" && r.point_state == "present") {
        for (const auto& part : r.points) {
          std::vector<std::string> ids = ChainIds(part.chain_dir);
          // Before the next run, the record of the full backup a committed
          // retention merge folded may still say present (a power loss
          // after the merge's switch-over; the next run marks it). The
          // merge comes after the new point, so the run may have reported
          // success (its retention failed) as well as failed.
          bool folded = phase != Phase::kRecovered && part.id == ids_[0] &&
                        std::find(ids.begin(), ids.end(), ids_[1]) != ids.end();
          if (!folded && std::find(ids.begin(), ids.end(), part.id) == ids.end()) {
            f.Add(Finding::kLost, "record " + std::to_string(r.id) + " says success, its point " + part.id + " is gone");
          }
        }
      }
      if (phase == Phase::kRecovered && r.result == "running") {
        f.Add(Finding::kNotRecovered, "record " + std::to_string(r.id) + " still running after the next run");
      }
    }
    if (phase == Phase::kRecovered && (runs->empty() || runs->front().result != "success")) {
      f.Add(Finding::kNotRecovered, "the re-run's record is not a success");
    }
  }
  std::vector<std::string> UserPaths(const Workspace& ws) const override {
    return {ws.work("T"), ws.work("src.qcow2"), Catalog(ws), ws.work("policy.yaml")};
  }

 private:
  std::string Catalog(const Workspace& ws) const { return ws.work("cat/catalog.db"); }
  std::string Chain(const Workspace& ws) const { return ws.work("T/pol/src"); }
  static void GuestWrites(Workspace& ws, const std::string& img, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::string cmd = "qemu-io -f qcow2";
    for (int k = 0; k < 5; ++k) {
      uint64_t off = (rng() % (ws.disk_bytes / (64 * kKiB))) * 64 * kKiB;
      cmd += " -c " + Q("write -P " + std::to_string(1 + rng() % 250) + " " + std::to_string(off) + " 64k");
    }
    RunOk(cmd + " " + Q(img) + " >/dev/null");
  }
  std::vector<std::string> ids_;
};

}  // namespace

// ---- Scenario ----

void ExpectSuccess(const Outcome& o, const std::string& what, Findings& f) {
  if (o.exit_code != 0) f.Add(Finding::kNotRecovered, what + ": " + o.Describe());
}

void Scenario::Recover(Workspace& ws, Runner& runner, Findings& f) {
  Outcome o = Run(ws, runner);
  if (o.exit_code == 0) return;
  if (ExistsIsDone() && !o.error.is_null() && o.error.value("code", "") == "InvalidArgument" &&
      o.error.value("message", "").find("exists") != std::string::npos) {
    return;  // the output is there: Check judges it
  }
  f.Add(Finding::kNotRecovered, "re-run: " + o.Describe());
}

std::vector<std::unique_ptr<Scenario>> AllScenarios() {
  std::vector<std::unique_ptr<Scenario>> all;
  all.push_back(std::make_unique<BackupScenario>(BackupScenario::kFull));
  all.push_back(std::make_unique<BackupScenario>(BackupScenario::kIncrementalBitmap));
  all.push_back(std::make_unique<BackupScenario>(BackupScenario::kIncrementalExtents));
  all.push_back(std::make_unique<BackupScenario>(BackupScenario::kIncrementalDigests));
  all.push_back(std::make_unique<BackupBaseScenario>());
  all.push_back(std::make_unique<MergeScenario>());
  all.push_back(std::make_unique<RestoreScenario>(RestoreScenario::kRaw));
  all.push_back(std::make_unique<RestoreScenario>(RestoreScenario::kQcow2));
  all.push_back(std::make_unique<RestoreScenario>(RestoreScenario::kForce));
  all.push_back(std::make_unique<ConvertScenario>(false));
  all.push_back(std::make_unique<ConvertScenario>(true));
  all.push_back(std::make_unique<ReplicateScenario>());
  all.push_back(std::make_unique<ImageAddScenario>());
  all.push_back(std::make_unique<ImageSyncScenario>());
  all.push_back(std::make_unique<ImageCleanupScenario>());
  all.push_back(std::make_unique<StateMigrateScenario>());
  all.push_back(std::make_unique<OverlayCreateScenario>());
  all.push_back(std::make_unique<BitmapRotateScenario>());
  all.push_back(std::make_unique<SnapshotScenario>(SnapshotScenario::kCreate));
  all.push_back(std::make_unique<SnapshotScenario>(SnapshotScenario::kDelete));
  all.push_back(std::make_unique<SnapshotScenario>(SnapshotScenario::kRename));
  all.push_back(std::make_unique<SnapshotScenario>(SnapshotScenario::kRollback));
  all.push_back(std::make_unique<PolicyRunScenario>());
  return all;
}

std::vector<std::string> ScenarioNames() {
  std::vector<std::string> names;
  for (const auto& s : AllScenarios()) names.push_back(s->name());
  return names;
}

std::unique_ptr<Scenario> MakeScenario(const std::string& name) {
  for (auto& s : AllScenarios()) {
    if (s->name() == name) return std::move(s);
  }
  return nullptr;
}

// ---- child modes ----

int ChildMain(const std::vector<std::string>& args) {
  if (args.size() == 4 && args[0] == "bitmap-rotate") {
    Env& env = Env::Default();
    Status s = formats::RotateBitmap(
        args[1], pipeline::EnvSourceOpener(env),
        [&env](const std::string& p) { return env.OpenSink(p, SinkMode::kExisting); }, args[2], args[3]);
    if (!s.ok()) {
      nlohmann::json j = {{"event", "error"},
                          {"code", ErrorCodeName(s.error().code())},
                          {"message", s.error().message()},
                          {"file", s.error().path()}};
      std::printf("%s\n", j.dump().c_str());
      std::fprintf(stderr, "bitmap-rotate: %s\n", s.error().ToString().c_str());
      return 1;
    }
    std::printf("{\"event\":\"result\"}\n");
    return 0;
  }
  std::fprintf(stderr, "unknown child mode\n");
  return 64;
}

}  // namespace barge::reliability
