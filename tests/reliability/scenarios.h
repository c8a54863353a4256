// The commands the reliability campaign runs, each with the tree it starts
// from, how it is run and recovered, and what must hold afterwards.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tests/reliability/harness.h"

namespace barge::reliability {

// When a check runs.
enum class Phase : uint8_t {
  kDone,       // the command reported success (and the power may have gone after)
  kFailed,     // the command failed, crashed or was killed: before any recovery
  kRecovered,  // after the recovery step
};

class Scenario {
 public:
  virtual ~Scenario() = default;
  // Short name ("backup-full") and the command line it runs (for figures).
  virtual std::string name() const = 0;
  virtual std::string command() const = 0;

  // Builds the tree the command starts from in ws.work(), and the golden
  // contents, once (may run qemu-img/qemu-io; the Env is the real one).
  virtual void Build(Workspace& ws) = 0;
  // Runs the command once on Env::Default() (in-process) or as a process.
  virtual Outcome Run(Workspace& ws, Runner& runner) = 0;
  // The recovery step a user (or the next job) takes: by default, the same
  // command again, which must then succeed.
  virtual void Recover(Workspace& ws, Runner& runner, Findings& f);
  // What must hold in `phase`.
  virtual void Check(Workspace& ws, Phase phase, Findings& f) = 0;
  // Paths an error may name: the user's files and folders (an error must
  // name one of them or a file below them, never a temporary).
  virtual std::vector<std::string> UserPaths(const Workspace& ws) const = 0;
  // The recovery after a simulated power loss needs the crashed process
  // to look gone (catalog rows with an owner).
  virtual bool NeedsProcessGone() const { return false; }
  // The recovery's command: "exists" answers are judged by Check.
  virtual bool ExistsIsDone() const { return false; }
  // Data size for the kill campaign (a longer run gives kills room).
  virtual uint64_t kill_disk_bytes() const { return 48 << 20; }
  // Runs as a process only through the reliability binary's child mode.
  virtual bool library_only() const { return false; }
};

// Every scenario, in report order.
std::vector<std::unique_ptr<Scenario>> AllScenarios();
std::unique_ptr<Scenario> MakeScenario(const std::string& name);
std::vector<std::string> ScenarioNames();

// Common checks of an outcome that must be a success.
void ExpectSuccess(const Outcome& o, const std::string& what, Findings& f);

}  // namespace barge::reliability
