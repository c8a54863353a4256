// The power-loss, injected-error and kill campaigns over a scenario.
#include "tests/reliability/campaigns.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>

#include "blockio/fault_env.h"
#include "blockio/path.h"

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
          CheckNoTemporaries(ws.work(), f, "after success");
        } else {
          std::string bad = JudgeError(o, err, s.UserPaths(ws));
          if (!bad.empty()) f.Add(Finding::kBadError, bad);
          s.Check(ws, Phase::kFailed, f);
          CheckNoTemporaries(ws.work(), f, "after the error");
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

}  // namespace barge::reliability
