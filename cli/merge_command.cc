// barge merge: fold a chain's full backup and increments up to a point into
// a new full backup of that point (retention), crash-safe.
#include <iostream>

#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/progress.h"
#include "pipeline/merge.h"

namespace barge::cli {
namespace {

struct MergeArgs {
  std::string chain, through, memory = "256M";
  int threads = 0;
};

int RunMergeCommand(MergeArgs& a, Output& out) {
  pipeline::MergeRequest req;
  // Cluster size and compression are the chain's: only the knobs are flags.
  if (Status s = ApplyResourceFlags(a.memory, a.threads, req.copy); !s.ok()) {
    return out.Usage(s.error().message());
  }
  req.chain_dir = a.chain;
  req.through = a.through;
  ProgressReporter progress(out, "merge");
  req.copy.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  auto r = pipeline::RunMerge(req);
  progress.Done();
  if (!r.ok()) return out.Fail(r.error());
  {
    out.Result({{"id", r->manifest.id},
               {"merged", r->merged},
               {"folded", r->folded_ids},
               {"removed", r->removed_files},
               {"bytes_read", r->bytes_read},
               {"image_bytes", r->image_bytes},
               {"image_digest", "xxh3-128:" + r->manifest.image_digest.ToHex()},
               {"duration_seconds", r->seconds}});
  }
  if (!r->merged) {
    out.text() << r->manifest.id << " already is a full backup: nothing to merge\n";
    return kExitOk;
  }
  out.text() << "merged " << r->folded_ids.size() << " layers (" << r->folded_ids.front() << ".."
             << r->folded_ids.back() << ") into full backup " << r->manifest.id << ": "
             << HumanBytes(r->image_bytes) << ", every cluster verified, image digest xxh3-128:"
             << r->manifest.image_digest.ToHex() << " in " << HumanSeconds(r->seconds) << "\n";
  for (const auto& f : r->removed_files) out.text() << "  removed " << f << "\n";
  return kExitOk;
}

}  // namespace

void RegisterMergeCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<MergeArgs>();
  auto* cmd = AddCommand(
      app, "merge", "Fold the full backup and increments up to a point into a new full (retention)",
      exit_code, [args](Output& out) { return RunMergeCommand(*args, out); });
  cmd->add_option("chain", args->chain, "The disk's chain folder (TARGET/<name>/)")->required();
  cmd->add_option("--through", args->through,
                  "The point that becomes the full: a backup id, a position, a time or latest")
      ->required();
  cmd->add_option("--memory", args->memory, "Memory for buffers in flight")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Worker threads (0 = all cores)")->capture_default_str();
}

}  // namespace barge::cli
