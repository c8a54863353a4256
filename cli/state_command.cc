// barge state migrate: move a VM's persistent state folder to a new volume
// (journaled copy, verify, switch, remove the old), re-entrant after a crash.
#include <cstdlib>
#include <iostream>

#include "cli/common.h"
#include "orchestrate/state_migrate.h"

namespace barge::cli {
namespace {

struct MigrateArgs {
  std::string from, to;
  bool as_json = false;
};

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}

int RunMigrate(const MigrateArgs& a) {
  orchestrate::StateMigrateOptions o;
  // Test hooks (see tests/state_migrate_*_test.cc): stop as if killed.
  o.stop_after_step = EnvInt("BARGE_TEST_MIGRATE_STOP_AFTER_STEP");
  o.stop_after_files = EnvInt("BARGE_TEST_MIGRATE_STOP_AFTER_FILES");
  auto r = orchestrate::MigrateState(a.from, a.to, o);
  if (!r.ok()) return ReportError("state migrate", r.error());
  if (a.as_json) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : r->files) {
      files.push_back({{"path", f.path}, {"kind", f.kind}, {"bytes", f.bytes}, {"sha512", f.sha512}});
    }
    PrintJson({{"event", "result"},
               {"from", a.from},
               {"to", a.to},
               {"outcome", r->outcome},
               {"recovery", r->recovery},
               {"files", files}});
    return kExitOk;
  }
  if (!r->recovery.empty()) std::cout << "recovered an earlier run: " << r->recovery << "\n";
  std::cout << r->outcome << ": " << a.from << " -> " << a.to;
  if (!r->files.empty()) std::cout << " (" << r->files.size() << " entries copied and verified)";
  std::cout << "\n";
  return kExitOk;
}

}  // namespace

void RegisterStateCommands(CLI::App& app, int& exit_code) {
  auto* state = app.add_subcommand("state", "A VM's persistent state folder (TPM, EFI, CBT overlays)");
  state->require_subcommand(1);
  auto args = std::make_shared<MigrateArgs>();
  auto* cmd = state->add_subcommand(
      "migrate", "Move the folder to a new volume: copy, verify, switch, remove the old (journaled)");
  cmd->add_option("--from", args->from, "Current state folder")->required();
  cmd->add_option("--to", args->to, "New folder (absent or empty; holds the journal)")->required();
  cmd->add_flag("--json", args->as_json, "Result as JSON");
  cmd->callback([args, &exit_code]() { exit_code = RunMigrate(*args); });
}

}  // namespace barge::cli
