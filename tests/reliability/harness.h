// The reliability campaign's harness (issue 13): a workspace per command,
// ways to run a command (in-process through cli::Main, or as a real
// process that can be killed), the checks every campaign applies after a
// crash, an injected error or a kill, and the figures it reports.
// docs/reliability.md describes the campaign and its figures.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::reliability {

// ---- sizing ----

// BARGE_RELIABILITY_LEVEL: "quick" (CI, the default), "default" or "long";
// BARGE_RELIABILITY_SEED: the seed of every random choice (kill delays,
// data, which error sites a quick run samples).
struct Sizing {
  std::string level = "quick";
  uint64_t seed = 1;
  bool quick() const { return level == "quick"; }
  bool long_run() const { return level == "long"; }
  // How many variants of each command's data (seeds) the power-loss and
  // error campaigns run.
  int variants() const { return long_run() ? 3 : 1; }
  // At most this many sites per (kind, errno) in the error campaign; every
  // site when 0.
  uint64_t max_sites() const { return quick() ? 3 : 0; }
  // Kills per command.
  int kills() const { return kills_override >= 0 ? kills_override : quick() ? 2 : long_run() ? 40 : 12; }
  // BARGE_RELIABILITY_KILLS, when set.
  int kills_override = -1;
  // Free space left by the full-filesystem campaign's filler, per round.
  std::vector<uint64_t> fill_leave_bytes() const {
    if (quick()) return {192 << 10};
    return {0, 192 << 10, 1 << 20};
  }
};
const Sizing& GetSizing();

// ---- findings ----

enum class Finding : uint8_t {
  kLost,          // a point or file that was done before is gone or differs
  kDamaged,       // a file under a final name fails to parse or check
  kNotRecovered,  // the recovery step failed, or left the work undone
  kLeftover,      // temporaries left after recovery or after a failed command
  kBadError,      // exit 0 on failure, wrong code, or an error not naming the user's file
};
std::string_view FindingName(Finding f);

class Findings {
 public:
  void Add(Finding f, std::string what);
  // Prefixes later findings ("before recovery", "after recovery").
  void set_stage(std::string stage) { stage_ = std::move(stage); }
  bool empty() const { return items_.empty(); }
  // Lost or damaged anything (kLost, kDamaged, kNotRecovered).
  bool LostOrDamaged() const;
  std::string ToString() const;
  const std::vector<std::pair<Finding, std::string>>& items() const { return items_; }

 private:
  std::vector<std::pair<Finding, std::string>> items_;
  std::string stage_;
};

// ---- a command's outcome ----

struct Outcome {
  int exit_code = -1;
  bool killed = false;     // a process killed by the campaign before it exited
  std::string output;      // stdout
  std::string errors;      // stderr
  nlohmann::json error;    // the "error" event (--json), or null
  nlohmann::json result;   // the "result" event, or null
  std::string Describe() const;
};

// How a campaign runs a command: in this process (cli::Main on
// Env::Default(), or a library call), or as a real process.
class Runner {
 public:
  virtual ~Runner() = default;
  // `barge ARGS... --json`.
  virtual Outcome Barge(const std::vector<std::string>& args) = 0;
  // A helper mode of the reliability binary (main.cc: `--child NAME ARGS`)
  // for operations without a command (bitmap edits, catalog writers).
  virtual Outcome Child(const std::vector<std::string>& args) = 0;
};

// Runs in this process: cli::Main with stdout and stderr captured.
class InProcessRunner final : public Runner {
 public:
  explicit InProcessRunner(std::string capture_dir) : capture_dir_(std::move(capture_dir)) {}
  Outcome Barge(const std::vector<std::string>& args) override;
  Outcome Child(const std::vector<std::string>& args) override;

 private:
  Outcome Capture(const std::function<int()>& body);
  std::string capture_dir_;
};

// Runs the built barge binary (or this binary's child mode) as a process;
// with KillAfter, sends SIGKILL that long after the start.
class ProcessRunner final : public Runner {
 public:
  explicit ProcessRunner(std::string capture_dir) : capture_dir_(std::move(capture_dir)) {}
  void KillAfter(std::optional<std::chrono::microseconds> delay) { kill_after_ = delay; }
  Outcome Barge(const std::vector<std::string>& args) override;
  Outcome Child(const std::vector<std::string>& args) override;
  // Wall time of the last run.
  std::chrono::microseconds last_duration() const { return last_duration_; }

 private:
  Outcome Spawn(const std::vector<std::string>& argv);
  std::string capture_dir_;
  std::optional<std::chrono::microseconds> kill_after_;
  std::chrono::microseconds last_duration_{0};
};

// A process started without waiting (two at once, for the catalogs).
struct Started {
  int pid = -1;
  std::string out_path, err_path;
  std::chrono::steady_clock::time_point start;
  std::string spawn_error;
};
// Starts `barge ARGS... --json`, its output captured under `capture_dir`
// with `tag` in the names.
Started StartBarge(const std::string& capture_dir, const std::string& tag, const std::vector<std::string>& args);
// Waits for it; with `kill_after`, sends SIGKILL that long after its
// start unless it ended before.
Outcome WaitFor(const Started& p, std::optional<std::chrono::microseconds> kill_after = std::nullopt);

// The child modes of the reliability binary; returns the exit code.
int ChildMain(const std::vector<std::string>& args);
// The path of this binary (for ProcessRunner::Child).
void SetSelfBinary(std::string path);

// ---- the workspace of one command ----

// root/work: the tree under test (its paths are the same in every run);
// root/template: the tree before the command, copied to work before each
// run; root/golden: expected contents; root/scratch: copies for checks;
// root/stash: the FaultEnv's.
class Workspace {
 public:
  explicit Workspace(std::string name);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  const std::string& root() const { return root_; }
  std::string work(const std::string& rel = "") const { return Join(root_ + "/work", rel); }
  std::string golden(const std::string& rel = "") const { return Join(root_ + "/golden", rel); }
  std::string scratch(const std::string& rel = "") const { return Join(root_ + "/scratch", rel); }
  std::string templ(const std::string& rel = "") const { return Join(root_ + "/template", rel); }
  std::string stash() const { return root_ + "/stash"; }
  std::string capture() const { return root_ + "/capture"; }

  // work -> template (after Build).
  void SaveTemplate();
  // template -> work (before each run); also empties scratch.
  void ResetWork();
  void ClearScratch();

  uint64_t seed = 1;           // the variant's data seed
  uint64_t disk_bytes = 4 << 20;

 private:
  static std::string Join(const std::string& a, const std::string& b) { return b.empty() ? a : a + "/" + b; }
  std::string root_;
};

// ---- checks ----

// Memoized oracles: qemu-img check and barge's own checker per distinct
// file content, and verified chain states per distinct folder content.
class Oracles {
 public:
  // The qcow2 at `path` passes barge's checker and `qemu-img check` (its
  // backing file not opened); leaks pass when `leaks_ok`. "" or the problem.
  std::string CheckQcow2(const std::string& path, bool leaks_ok = false);
  // Whether a check of `key` already passed.
  bool Passed(const std::string& key) const { return passed_.count(key) > 0; }
  void MarkPassed(const std::string& key) { passed_.insert(key); }
  uint64_t qemu_checks() const { return qemu_checks_; }

 private:
  std::map<std::string, std::string> qcow2_;  // content digest -> problem
  std::set<std::string> passed_;
  uint64_t qemu_checks_ = 0;
};
Oracles& GetOracles();

// xxh3-128 hex of a file's bytes ("" when missing).
std::string FileDigest(const std::string& path);
// xxh3-128 hex of a folder: names, kinds, link texts and file bytes, every
// entry but `.lock` files (recursively).
std::string TreeDigest(const std::string& dir);
// How folder `dir` differs from `before` (names and bytes; "" when alike;
// `.lock` files ignored).
std::string TreeDiff(const std::string& dir, const std::string& before);
// Regular files below `dir` (relative paths), recursively.
std::vector<std::string> ListTree(const std::string& dir);
// Temporaries below `dir`: ".*.barge-tmp", ".*.merge-new".
std::vector<std::string> Temporaries(const std::string& dir);
void CopyTree(const std::string& from, const std::string& to);
void RemoveTree(const std::string& path);
std::vector<std::byte> ReadAll(const std::string& path);
// The guest view of an image file (raw, or a qcow2 with its chain) as
// barge's reader gives it; an error as the string of the result.
Result<std::vector<std::byte>> ReadImage(const std::string& path, bool allow_any_path = true);
// "" when `a` and `b` hold the same bytes, else where they differ.
std::string CompareBytes(const std::vector<std::byte>& a, const std::vector<std::byte>& b);

// A chain folder's invariants. `golden`: point id -> expected guest
// contents (a raw file), for every point whose contents are known (points
// done before, and the new point a command makes; `new_golden` is used for
// points not listed). `required`: ids that must be there. Checks: every
// manifest parses, every digest table loads, every image passes
// CheckQcow2, every point present verifies (pipeline verify) and restores
// byte-identically (on a scratch copy, so that a merge journal completed
// by loading the folder does not touch the tree under test).
struct ChainExpectation {
  std::map<std::string, std::string> golden;
  std::string new_golden;
  std::set<std::string> required;
  // Points that may be gone (folded by a merge): only if `through` is now a
  // full backup.
  std::set<std::string> may_vanish;
  std::string merge_through;
};
void CheckChainFolder(Workspace& ws, const std::string& dir, const ChainExpectation& expect, Findings& f);
// The manifests' ids in a chain folder, sorted.
std::vector<std::string> ChainIds(const std::string& dir);

// An output file that must be absent or complete: raw bytes equal to
// `golden`, or a qcow2 (`qcow2`) that checks clean and reads as `golden`.
// `must_exist`: absence is a finding too.
void CheckOutputFile(const std::string& path, const std::string& golden, bool qcow2, bool must_exist,
                     Finding kind, Findings& f);

// No temporaries left below `dir`, but those in `undeletable` (absolute
// paths whose removal was the injected failure: they cannot go, and the
// next run's sweep must remove them).
void CheckNoTemporaries(const std::string& dir, Findings& f, const std::string& when,
                        const std::set<std::string>& undeletable = {});

// ---- figures ----

struct Figure {
  std::string campaign;   // "power-loss", "errors", "kill", "full-fs", "concurrency"
  std::string command;    // "backup (full)"
  uint64_t tried = 0;     // crash points, injected errors or kills tried
  uint64_t lost_or_damaged = 0;
  uint64_t other = 0;     // leftovers and error-message findings
  uint64_t not_reached = 0;  // injected errors whose call never came
  double seconds = 0;
  std::vector<std::string> failures;  // the first few, described
  nlohmann::json extra;
};
// Appends the figure to $BARGE_RELIABILITY_REPORT (one JSON line) and
// prints it.
void Report(const Figure& figure);
// The figures reported so far, summed per command and campaign, as a
// table (printed when the binary ends).
std::string SummaryTable();

// The Env a recovery runs on after a simulated power loss: the crashed
// run's process is gone (reading /proc/<this pid>/stat fails as for a
// dead process), as it would be after a reboot.
class ProcessGoneEnv final : public EnvWrapper {
 public:
  explicit ProcessGoneEnv(Env& target);
  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path,
                                                  const FileOptions& options) override;

 private:
  std::string self_stat_;
};

}  // namespace barge::reliability
