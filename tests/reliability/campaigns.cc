// The power-loss, injected-error and kill campaigns over a scenario.
#include "tests/reliability/campaigns.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>

#include "blockio/fault_env.h"
#include "blockio/path.h"
#include "pipeline/replicate.h"

namespace barge::reliability {

namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Counts one run's findings into the figure.
void Tally(Figure& fig, const Findings& f, const std::string& where) {
  ++fig.tried;
  if (f.empty()) return;
  if (f.LostOrDamaged()) {
    ++fig.lost_or_damaged;
  } else {
    ++fig.other;
  }
  if (fig.failures.size() < 8) fig.failures.push_back(where + ": " + f.ToString());
}

// The recovery step and the checks after it.
void RecoverAndCheck(Scenario& s, Workspace& ws, Runner& runner, bool process_gone, Findings& f) {
  f.set_stage("recovery");
  {
    ProcessGoneEnv gone(PosixEnv());
    std::optional<ScopedDefaultEnv> scoped;
    if (process_gone) scoped.emplace(gone);
    s.Recover(ws, runner, f);
  }
  f.set_stage("after recovery");
  s.Check(ws, Phase::kRecovered, f);
  CheckNoTemporaries(ws.work(), f, "after recovery");
}

std::string ErrnoName(int err) {
  switch (err) {
    case EIO: return "EIO";
    case ENOSPC: return "ENOSPC";
    case EDQUOT: return "EDQUOT";
    case EROFS: return "EROFS";
  }
  return std::to_string(err);
}

// The errnos tried at each kind of call (issue 13: EIO and ENOSPC
// everywhere; EDQUOT where a call allocates, EROFS where it changes the
// filesystem).
std::vector<int> ErrnosFor(EnvOp op) {
  std::vector<int> errs = {EIO, ENOSPC};
  if (GetSizing().quick()) return errs;
  switch (op) {
    case EnvOp::kWrite:
    case EnvOp::kRename:
    case EnvOp::kLink:
    case EnvOp::kOpen:
    case EnvOp::kMkdir:
      errs.push_back(EDQUOT);
      errs.push_back(EROFS);
      break;
    case EnvOp::kSync:
      errs.push_back(EDQUOT);
      break;
    case EnvOp::kUnlink:
      errs.push_back(EROFS);
      break;
    default:
      break;
  }
  return errs;
}

std::vector<EnvOp> KindsTried() {
  std::vector<EnvOp> kinds = {EnvOp::kWrite, EnvOp::kSync,   EnvOp::kRename,
                              EnvOp::kLink,  EnvOp::kUnlink, EnvOp::kSyncDir};
  if (!GetSizing().quick()) {
    kinds.push_back(EnvOp::kOpen);
    kinds.push_back(EnvOp::kMkdir);
  }
  return kinds;
}

// The call sites tried among `count`: all, or at most max_sites spread
// evenly (first and last included).
std::vector<uint64_t> Sites(uint64_t count) {
  std::vector<uint64_t> out;
  uint64_t max = GetSizing().max_sites();
  if (max == 0 || count <= max) {
    for (uint64_t n = 1; n <= count; ++n) out.push_back(n);
    return out;
  }
  for (uint64_t k = 0; k < max; ++k) out.push_back(1 + k * (count - 1) / (max - 1));
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool IsInternalName(const std::string& path) {
  std::string base = BaseName(path);
  return IsTempName(base) || (base.starts_with(".") && base.ends_with(".merge-new")) ||
         base == ".merge-journal.json" || path.find("/stash/") != std::string::npos;
}

}  // namespace

std::string JudgeError(const Outcome& o, int err, const std::vector<std::string>& user_paths) {
  if (o.exit_code == 0) return "exit 0";
  // The command's error, and a replicate's per-destination errors.
  std::vector<nlohmann::json> errors;
  if (!o.error.is_null()) errors.push_back(o.error);
  if (o.result.is_object() && o.result.contains("destinations")) {
    for (const auto& d : o.result["destinations"]) {
      if (d.contains("error")) errors.push_back(d["error"]);
    }
  }
  // A policy run's per-source failures: "Code: FILE: message" strings
  // (the command's own error only counts the failed sources).
  if (o.result.is_object() && o.result.contains("sources")) {
    for (const auto& src : o.result["sources"]) {
      if (src.value("result", "") != "failed" || !src.contains("error") || !src["error"].is_string()) continue;
      std::string text = src["error"].get<std::string>();
      size_t colon = text.find(": ");
      if (colon == std::string::npos) continue;
      std::string rest = text.substr(colon + 2);
      size_t end = rest.find(": ");
      errors.push_back({{"code", text.substr(0, colon)},
                        {"file", rest.starts_with("/") && end != std::string::npos ? rest.substr(0, end) : ""},
                        {"message", text}});
    }
  }
  if (errors.empty()) return "no error event (stderr: " + o.errors.substr(0, 200) + ")";
  std::string want = (err == ENOSPC || err == EDQUOT) ? "NoSpace" : "IoError";
  bool code_ok = false, named = false;
  std::string why;
  for (const auto& e : errors) {
    std::string code = e.value("code", "");
    std::string file = e.value("file", "");
    std::string message = e.value("message", "");
    code_ok |= code == want;
    if (IsInternalName(file)) {
      why = "names an internal file: " + file;
      continue;
    }
    for (const auto& p : user_paths) {
      if ((!file.empty() && IsInsidePath(file, p)) || message.find(p) != std::string::npos) named = true;
    }
  }
  if (!why.empty()) return why;
  if (!code_ok) return "code is not " + want + ": " + errors.front().dump();
  if (!named) return "names none of the user's files: " + errors.front().dump();
  int want_exit = 1;
  if (o.exit_code != want_exit) return "exit " + std::to_string(o.exit_code);
  return "";
}

Figure PowerLossCampaign(Scenario& s, uint64_t seed) {
  auto start = std::chrono::steady_clock::now();
  Figure fig;
  fig.campaign = "power-loss";
  fig.command = s.name();
  Workspace ws(s.name());
  ws.seed = seed;
  s.Build(ws);
  ws.SaveTemplate();
  FaultEnv env(PosixEnv(), ws.stash());
  InProcessRunner runner(ws.capture());
  Outcome last;
  uint64_t boundaries = 0;
  auto setup = [&]() -> Status {
    ws.ResetWork();
    return OkStatus();
  };
  auto op = [&](Env&) -> Status {
    last = s.Run(ws, runner);
    return last.exit_code == 0 ? OkStatus() : Status(Error::IoError(last.Describe()));
  };
  auto check = [&](const CrashPoint& p) {
    boundaries = p.boundaries;
    Findings f;
    f.set_stage("before recovery");
    if (!p.crashed && last.exit_code != 0) {
      f.Add(Finding::kNotRecovered, "the clean run failed: " + last.Describe());
    }
    // What the command reported done must have survived the power loss.
    s.Check(ws, last.exit_code == 0 ? Phase::kDone : Phase::kFailed, f);
    RecoverAndCheck(s, ws, runner, s.NeedsProcessGone(), f);
    Tally(fig, f,
          p.crashed ? "crash after boundary " + std::to_string(p.after_boundaries) + "/" +
                          std::to_string(p.boundaries)
                    : "power lost after the command returned");
  };
  auto runs = ForEachCrashPoint(env, setup, op, check);
  if (!runs.ok()) {
    ADD_FAILURE() << s.name() << ": " << runs.error().ToString();
    fig.failures.push_back("campaign: " + runs.error().ToString());
    ++fig.lost_or_damaged;
  }
  fig.seconds = Since(start);
  fig.extra = {{"boundaries", boundaries}, {"seed", seed}};
  return fig;
}

Figure InjectedErrorCampaign(Scenario& s, uint64_t seed) {
  auto start = std::chrono::steady_clock::now();
  Figure fig;
  fig.campaign = "errors";
  fig.command = s.name();
  Workspace ws(s.name());
  ws.seed = seed;
  s.Build(ws);
  ws.SaveTemplate();
  FaultEnv env(PosixEnv(), ws.stash());
  InProcessRunner runner(ws.capture());
  // A clean run counts the sites of each kind.
  ws.ResetWork();
  env.MarkDurable();
  env.ResetCounters();
  Outcome clean;
  {
    ScopedDefaultEnv scoped(env);
    clean = s.Run(ws, runner);
  }
  if (clean.exit_code != 0) {
    ADD_FAILURE() << s.name() << ": clean run failed: " << clean.Describe();
    return fig;
  }
  std::map<EnvOp, uint64_t> counts;
  nlohmann::json sites = nlohmann::json::object();
  for (EnvOp op : KindsTried()) {
    counts[op] = env.calls(op);
    sites[std::string(EnvOpName(op))] = counts[op];
  }
  env.MarkDurable();
  for (EnvOp op : KindsTried()) {
    for (int err : ErrnosFor(op)) {
      for (uint64_t n : Sites(counts[op])) {
        ws.ResetWork();
        env.MarkDurable();
        env.ResetCounters();
        env.ClearFaults();
        env.FailCall(op, n, err);
        Outcome o;
        {
          ScopedDefaultEnv scoped(env);
          o = s.Run(ws, runner);
        }
        bool fired = env.calls(op) >= n;
        // A temporary whose own removal failed stays (a sweep's to remove).
        std::set<std::string> undeletable;
        for (const auto& inj : env.injections()) {
          if (inj.op == EnvOp::kUnlink) undeletable.insert(inj.path);
        }
        env.ClearFaults();
        env.MarkDurable();
        if (!fired) {
          ++fig.not_reached;
          continue;
        }
        Findings f;
        f.set_stage("before recovery");
        std::string where = std::string(EnvOpName(op)) + " #" + std::to_string(n) + " " + ErrnoName(err);
        if (o.exit_code == 0) {
          // The failure was one the command may ignore: then it did all.
          s.Check(ws, Phase::kDone, f);
          CheckNoTemporaries(ws.work(), f, "after success", undeletable);
        } else {
          std::string bad = JudgeError(o, err, s.UserPaths(ws));
          if (!bad.empty()) f.Add(Finding::kBadError, bad);
          s.Check(ws, Phase::kFailed, f);
          CheckNoTemporaries(ws.work(), f, "after the error", undeletable);
          RecoverAndCheck(s, ws, runner, /*process_gone=*/false, f);
        }
        Tally(fig, f, where);
      }
    }
  }
  fig.seconds = Since(start);
  fig.extra = {{"sites", sites}, {"seed", seed}};
  return fig;
}

Figure KillCampaign(Scenario& s, uint64_t seed) {
  auto start = std::chrono::steady_clock::now();
  Figure fig;
  fig.campaign = "kill";
  fig.command = s.name();
  Workspace ws(s.name() + "-kill");
  ws.seed = seed;
  ws.disk_bytes = s.kill_disk_bytes();
  s.Build(ws);
  ws.SaveTemplate();
  ProcessRunner runner(ws.capture());
  // The command's duration on this machine, from a clean run.
  ws.ResetWork();
  Outcome clean = s.Run(ws, runner);
  if (clean.exit_code != 0) {
    ADD_FAILURE() << s.name() << ": clean run failed: " << clean.Describe();
    return fig;
  }
  auto duration = runner.last_duration();
  std::mt19937_64 rng(seed * 1000003 + std::hash<std::string>()(s.name()));
  uint64_t killed = 0;
  for (int k = 0; k < GetSizing().kills(); ++k) {
    ws.ResetWork();
    auto delay = std::chrono::microseconds(rng() % std::max<int64_t>(1, duration.count()));
    runner.KillAfter(delay);
    Outcome o = s.Run(ws, runner);
    runner.KillAfter(std::nullopt);
    killed += o.killed;
    Findings f;
    f.set_stage("before recovery");
    s.Check(ws, o.exit_code == 0 ? Phase::kDone : Phase::kFailed, f);
    if (!o.killed && o.exit_code != 0) f.Add(Finding::kBadError, "failed without a kill: " + o.Describe());
    RecoverAndCheck(s, ws, runner, false, f);
    Tally(fig, f, "kill at " + std::to_string(delay.count()) + " us");
  }
  fig.seconds = Since(start);
  fig.extra = {{"clean_run_us", duration.count()}, {"killed_before_exit", killed}, {"seed", seed}};
  return fig;
}


// ---- a real full filesystem ----

namespace {

// A tmpfs mounted over a folder for the life of the object.
class TmpfsMount {
 public:
  TmpfsMount(const std::string& dir, uint64_t size_bytes) : dir_(dir) {
    std::string opts = "size=" + std::to_string(size_bytes) + ",mode=0755";
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
      error_ = "mount -t tmpfs -o " + opts + " " + dir + ": " + std::strerror(errno);
    }
  }
  ~TmpfsMount() {
    if (error_.empty()) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  const std::string& error() const { return error_; }

 private:
  std::string dir_;
  std::string error_;
};

// Bytes the files below `dir` occupy (allocated blocks).
uint64_t UsedBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st{};
    if (::lstat(it->path().c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512 + 4096;
  }
  return total;
}

// Fills the filesystem of `path` (a file it creates) until ENOSPC, then
// gives back `leave_bytes`. Returns the bytes written.
uint64_t Fill(const std::string& path, uint64_t leave_bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return 0;
  std::vector<char> chunk(64 * 1024, 'f');
  uint64_t written = 0;
  for (;;) {
    ssize_t n = ::write(fd, chunk.data(), chunk.size());
    if (n <= 0) break;
    written += static_cast<uint64_t>(n);
  }
  uint64_t keep = written > leave_bytes ? written - leave_bytes : 0;
  if (::ftruncate(fd, static_cast<off_t>(keep)) != 0) keep = written;
  ::close(fd);
  return keep;
}

// Runs the filler when the command opens its first temporary for writing
// (its free-space estimate, if any, is behind it by then).
class FillingEnv final : public EnvWrapper {
 public:
  FillingEnv(Env& target, std::string filler, uint64_t leave_bytes)
      : EnvWrapper(target), filler_(std::move(filler)), leave_bytes_(leave_bytes) {}
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options) override {
    std::string base = BaseName(path);
    if (!filled_ && (IsTempName(base) || base.ends_with(".merge-new") || base.ends_with("-journal.json"))) {
      filled_ = true;
      filled_bytes_ = Fill(filler_, leave_bytes_);
    }
    return EnvWrapper::OpenSink(path, mode, options);
  }
  bool filled() const { return filled_; }
  uint64_t filled_bytes() const { return filled_bytes_; }

 private:
  std::string filler_;
  uint64_t leave_bytes_;
  bool filled_ = false;
  uint64_t filled_bytes_ = 0;
};

}  // namespace

Figure FullFilesystemCampaign(Scenario& s, uint64_t seed, std::string* skipped) {
  auto start = std::chrono::steady_clock::now();
  Figure fig;
  fig.campaign = "full-fs";
  fig.command = s.name();
  Workspace ws(s.name() + "-fullfs");
  ws.seed = seed;
  s.Build(ws);
  ws.SaveTemplate();
  // Room for the tree and the command's output, so that any estimate
  // passes; the filler takes it when the first temporary opens.
  uint64_t size = UsedBytes(ws.templ()) + 3 * ws.disk_bytes + (4 << 20);
  RemoveTree(ws.work());
  std::filesystem::create_directories(ws.work());
  TmpfsMount mount(ws.work(), size);
  if (!mount.error().empty()) {
    *skipped = mount.error();
    return fig;
  }
  InProcessRunner runner(ws.capture());
  nlohmann::json rounds = nlohmann::json::array();
  // Free space left to the command after the fill: nothing, a few
  // clusters, a little more (writes fail at different places).
  for (uint64_t leave : GetSizing().fill_leave_bytes()) {
    ws.ResetWork();
    std::string filler = ws.work("zz-filler");
    FillingEnv env(PosixEnv(), filler, leave);
    Outcome o;
    {
      ScopedDefaultEnv scoped(env);
      o = s.Run(ws, runner);
    }
    Findings f;
    f.set_stage("full");
    std::string where = "left " + std::to_string(leave >> 10) + " KiB";
    if (!env.filled()) {
      // Removals and in-place edits (image cleanup, bitmap rotation) make
      // no new file: nothing to fill against.
      *skipped = "the command writes no new file";
      RemoveTree(filler);
      return fig;
    }
    if (o.exit_code == 0) {
      // It fit in what was left.
      s.Check(ws, Phase::kDone, f);
      CheckNoTemporaries(ws.work(), f, "after success");
    } else {
      std::string bad = JudgeError(o, ENOSPC, s.UserPaths(ws));
      if (!bad.empty()) f.Add(Finding::kBadError, bad);
      s.Check(ws, Phase::kFailed, f);
      CheckNoTemporaries(ws.work(), f, "after the error");
    }
    rounds.push_back({{"leave_kib", leave >> 10}, {"filled_bytes", env.filled_bytes()},
                      {"exit", o.exit_code}, {"code", o.error.is_null() ? "" : o.error.value("code", "")}});
    // The user frees space and runs it again. The failed command's process
    // has ended by then: catalog rows it could not finish on the full disk
    // (still in progress, owned by it) are a gone process's.
    RemoveTree(filler);
    RecoverAndCheck(s, ws, runner, s.NeedsProcessGone(), f);
    Tally(fig, f, where);
  }
  fig.seconds = Since(start);
  fig.extra = {{"tmpfs_bytes", size}, {"rounds", rounds}, {"seed", seed}};
  return fig;
}

// ---- two catalog writers at once ----

Figure ConcurrentCatalogCampaign(uint64_t seed) {
  auto start = std::chrono::steady_clock::now();
  Figure fig;
  fig.campaign = "concurrency";
  fig.command = "image add+sync";
  std::unique_ptr<Scenario> s = MakeScenario("image-sync");
  Workspace ws("catalog-2proc");
  ws.seed = seed;
  ws.disk_bytes = 16 << 20;
  s->Build(ws);
  ws.SaveTemplate();
  InProcessRunner in_process(ws.capture());
  // A: `image add other` onto d4; B: `image sync base` onto d2 and d3 (a
  // second sync of the same image would be refused Busy, by design).
  const std::string catalog = ws.work("cat/images.db");
  auto args = [&](const char* which) {
    if (std::string(which) == "add") {
      return std::vector<std::string>{"image", "add", "other", "--source", ws.work("src.qcow2"), "--disk",
                                      ws.work("d4"), "--verify", "--catalog", catalog};
    }
    return std::vector<std::string>{"image", "sync", "base", "--disks", ws.work("d2") + "," + ws.work("d3"),
                                    "--verify", "--catalog", catalog};
  };
  // The add's own checks: re-run (done when it says the image exists), then
  // other's copy on d4 is ready and reads as the source.
  auto recover_add = [&](Findings& f) {
    Outcome o = in_process.Barge(args("add"));
    bool exists = !o.error.is_null() && o.error.value("code", "") == "InvalidArgument" &&
                  o.error.value("message", "").find("exists") != std::string::npos;
    if (o.exit_code != 0 && !exists) f.Add(Finding::kNotRecovered, "image add re-run: " + o.Describe());
  };
  auto check_add = [&](Phase phase, Findings& f) {
    std::string copy = ws.work("d4/other.qcow2");
    std::error_code ec;
    if (std::filesystem::exists(copy, ec)) {
      auto record = pipeline::ReadReplicaRecord(PosixEnv(), copy);
      if (record.ok() && pipeline::FileMatchesRecord(PosixEnv(), copy, *record)) {
        CheckOutputFile(copy, ws.golden("src.raw"), true, true, Finding::kDamaged, f);
      } else if (phase != Phase::kFailed) {
        f.Add(Finding::kNotRecovered, "other's copy on d4 has no matching record");
      }
    } else if (phase != Phase::kFailed) {
      f.Add(Finding::kNotRecovered, "other's copy on d4 missing");
    }
  };
  // A clean pair gives the duration.
  ws.ResetWork();
  std::filesystem::create_directories(ws.work("d4"));
  ws.SaveTemplate();
  ws.ResetWork();
  Started a0 = StartBarge(ws.capture(), "-a", args("add"));
  Started b0 = StartBarge(ws.capture(), "-b", args("sync"));
  Outcome oa = WaitFor(a0), ob = WaitFor(b0);
  auto duration = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - a0.start);
  {
    Findings f;
    f.set_stage("both run");
    ExpectSuccess(oa, "image add other", f);
    ExpectSuccess(ob, "image sync base", f);
    s->Check(ws, Phase::kRecovered, f);
    check_add(Phase::kRecovered, f);
    Tally(fig, f, "no kill");
  }
  std::mt19937_64 rng(seed * 7777 + 11);
  uint64_t killed = 0;
  for (int k = 0; k < GetSizing().kills(); ++k) {
    ws.ResetWork();
    auto delay = std::chrono::microseconds(rng() % std::max<int64_t>(1, duration.count()));
    bool kill_a = k % 2 == 0;
    Started a = StartBarge(ws.capture(), "-a", args("add"));
    Started b = StartBarge(ws.capture(), "-b", args("sync"));
    Outcome ra = WaitFor(a, kill_a ? std::optional(delay) : std::nullopt);
    Outcome rb = WaitFor(b, kill_a ? std::nullopt : std::optional(delay));
    const Outcome& victim = kill_a ? ra : rb;
    const Outcome& survivor = kill_a ? rb : ra;
    killed += victim.killed;
    Findings f;
    f.set_stage("before recovery");
    // The other process is not disturbed by its neighbour's death.
    ExpectSuccess(survivor, "the process not killed", f);
    if (!victim.killed && victim.exit_code != 0) f.Add(Finding::kBadError, "failed without a kill: " + victim.Describe());
    s->Check(ws, Phase::kFailed, f);
    check_add(Phase::kFailed, f);
    f.set_stage("recovery");
    recover_add(f);
    RecoverAndCheck(*s, ws, in_process, false, f);
    check_add(Phase::kRecovered, f);
    Tally(fig, f, std::string(kill_a ? "kill the add" : "kill the sync") + " at " + std::to_string(delay.count()) + " us");
  }
  fig.seconds = Since(start);
  fig.extra = {{"clean_pair_us", duration.count()}, {"killed_before_exit", killed}, {"seed", seed}};
  return fig;
}

}  // namespace barge::reliability
