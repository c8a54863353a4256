// barge merge: fold a chain's full backup and increments up to a point into
// a new full backup of that point (retention), crash-safe.
#include <iostream>

#include "cli/common.h"
#include "cli/progress.h"
#include "pipeline/merge.h"

namespace barge::cli {
namespace {

struct MergeArgs {
  std::string chain, through, memory = "256M";
  int threads = 0;
  bool as_json = false;
};

int RunMergeCommand(MergeArgs& a) {
  pipeline::MergeRequest req;
  // Cluster size and compression are the chain's: only the knobs are flags.
  auto memory = ParseSize(a.memory);
  if (!memory.ok()) return ReportError(memory.error());
  req.copy.memory_bytes = *memory;
  req.copy.threads = a.threads;
  req.chain_dir = a.chain;
  req.through = a.through;
  ProgressReporter progress(ChooseProgressMode(a.as_json), "merge");
  req.copy.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  auto r = pipeline::RunMerge(req);
  progress.Done();
  if (!r.ok()) return ReportError(r.error());
  if (a.as_json) {
    PrintJson({{"event", "result"},
               {"id", r->manifest.id},
               {"merged", r->merged},
               {"folded", r->folded_ids},
               {"removed", r->removed_files},
               {"bytes_read", r->bytes_read},
               {"image_bytes", r->image_bytes},
               {"image_digest", r->manifest.image_digest.ToHex()},
               {"duration_seconds", r->seconds}});
    return kExitOk;
  }
  if (!r->merged) {
    std::cout << r->manifest.id << " already is a full backup: nothing to merge\n";
    return kExitOk;
  }
  std::cout << "merged " << r->folded_ids.size() << " layers (" << r->folded_ids.front() << ".."
            << r->folded_ids.back() << ") into full backup " << r->manifest.id << ": "
            << HumanBytes(r->image_bytes) << ", every cluster verified, image digest "
            << r->manifest.image_digest.ToHex() << " in " << r->seconds << " s\n";
  for (const auto& f : r->removed_files) std::cout << "  removed " << f << "\n";
  return kExitOk;
}

}  // namespace

void RegisterMergeCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<MergeArgs>();
  auto* cmd = app.add_subcommand(
      "merge", "Fold the full backup and increments up to a point into a new full (retention)");
  cmd->add_option("chain", args->chain, "The disk's chain folder (TARGET/<name>/)")->required();
  cmd->add_option("--through", args->through,
                  "The point that becomes the full: a backup id, a position, a time or latest")
      ->required();
  cmd->add_option("--memory", args->memory, "Memory for buffers in flight")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Worker threads (0 = all cores)")->capture_default_str();
  cmd->add_flag("--json", args->as_json, "Progress and result as JSON");
  cmd->callback([args, &exit_code]() { exit_code = RunMergeCommand(*args); });
}

}  // namespace barge::cli
