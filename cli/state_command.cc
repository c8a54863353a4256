// barge state migrate: move a VM's persistent state folder to a new volume
// (journaled copy, verify, switch, remove the old), re-entrant after a crash.
#include <iostream>

#include "cli/common.h"
#include "orchestrate/state/state_migrate.h"

namespace barge::cli {
namespace {

struct MigrateArgs {
  std::string from, to;
  std::string catalog;
  bool no_libvirt = false;
};

int RunMigrate(const MigrateArgs& a, Output& out) {
  // Libvirt's domains and the catalog follow the folder (a running or paused
  // domain using it is refused before anything is touched).
  orchestrate::MigrateOptions o;
  o.use_libvirt = !a.no_libvirt;
  o.catalog_flag = a.catalog;
  auto r = orchestrate::MigrateState(Env::Default(), a.from, a.to, o);
  if (!r.ok()) return out.Fail(r.error());
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : r->files) {
    files.push_back({{"path", f.path}, {"kind", f.kind}, {"size_bytes", f.bytes}, {"sha512", f.sha512}});
  }
  out.Result({{"from", a.from}, {"to", a.to}, {"outcome", r->outcome}, {"recovery", r->recovery}, {"files", files}});
  if (!r->recovery.empty()) out.text() << "recovered an earlier run: " << r->recovery << "\n";
  out.text() << r->outcome << ": " << a.from << " -> " << a.to;
  if (!r->files.empty()) out.text() << " (" << r->files.size() << " entries copied and verified)";
  out.text() << "\n";
  return kExitOk;
}

}  // namespace

void RegisterStateCommands(CLI::App& app, int& exit_code) {
  auto* state = AddGroup(app, "state", "A VM's persistent state folder (TPM, EFI, CBT overlays)");
  auto args = std::make_shared<MigrateArgs>();
  auto* cmd = AddCommand(
      *state, "migrate", "Move the folder to a new volume: copy, verify, switch, remove the old (journaled)",
      exit_code, [args](Output& out) { return RunMigrate(*args, out); });
  cmd->add_option("--from", args->from, "Current state folder")->required();
  cmd->add_option("--to", args->to, "New folder (absent or empty; holds the journal)")->required();
  cmd->add_option("--catalog", args->catalog, "Catalog whose CBT records name the folder (its files are repointed)");
  cmd->add_flag("--no-libvirt", args->no_libvirt,
                "Leave libvirt (BARGE_LIBVIRT_URI, else qemu:///system) and the catalog alone: no check for a "
                "running domain, no domain XML or catalog switched to the new folder");
}

}  // namespace barge::cli
