// barge merge: fold a chain's full backup and increments up to a point into
// a new full backup of that point (retention), crash-safe.
#include <iostream>

#include "cli/bucket_routing.h"
#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/group_flag.h"
#include "cli/http_flags.h"
#include "cli/owner_flag.h"
#include "cli/progress.h"
#include "pipeline/chain.h"
#include "pipeline/merge.h"

namespace barge::cli {
namespace {

struct MergeArgs {
  std::string chain, through;
  CopyFlags copy;
  bool dry_run = false;
  std::string group;  // --group
};

int RunMergeCommand(MergeArgs& a, Output& out) {
  pipeline::MergeRequest req;
  // Cluster size and compression are the chain's: only the knobs are flags.
  formats::CompressionSpec unused;
  if (Status s = a.copy.Apply(req.copy, unused); !s.ok()) return out.Usage(s.error().message());
  if (auto at = pipeline::ParsePointSelector(a.through); !at.ok()) {
    return out.Usage("--through: " + at.error().message());
  }
  req.chain_dir = a.chain;
  req.through = a.through;
  req.dry_run = a.dry_run;
  auto access = GroupFlagAccess(a.group);
  if (!access.ok()) return out.Usage(access.error().message());
  req.access = *access;
  ProgressReporter progress(out, "merge");
  req.copy.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  auto r = pipeline::RunMerge(Env::Default(), req);
  progress.Done();
  if (!r.ok()) return out.Fail(r.error());
  {
    out.Result({{"id", r->manifest.id},
               {"started_at", TimeJson(r->manifest.started_at)},
               {"merged", r->merged},
               {"dry_run", r->dry_run},
               {"folded", r->folded_ids},
               {"removed", r->removed_files},
               {"bytes_read", r->bytes_read},
               {"image_bytes", r->image_bytes},
               {"image_digest", "xxh3-128:" + r->manifest.image_digest.ToHex()},
               {"duration_seconds", r->seconds}});
  }
  if (r->dry_run && r->folded_ids.size() > 1) {
    out.text() << "would merge " << r->folded_ids.size() << " layers (" << r->folded_ids.front() << ".."
               << r->folded_ids.back() << ") into full backup " << r->manifest.id << " (taken "
               << r->manifest.started_at << "; dry run: nothing changed)\n";
    for (const auto& f : r->removed_files) out.text() << "  would remove " << f << "\n";
    return kExitOk;
  }
  if (!r->merged) {
    out.text() << r->manifest.id << " already is a full backup: nothing to merge\n";
    return kExitOk;
  }
  out.text() << "merged " << r->folded_ids.size() << " layers (" << r->folded_ids.front() << ".."
             << r->folded_ids.back() << ") into full backup " << r->manifest.id << " (taken "
             << r->manifest.started_at << ", now the oldest point of its chain): "
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
  AddAllowOtherOwnerFlag(cmd);
  cmd->add_option("chain", args->chain, "The disk's chain folder (TARGET/<name>/)")->required();
  cmd->add_option("--through", args->through,
                  "The point that becomes the full: latest, a position (0 = the oldest point), a backup id, "
                  "or an RFC 3339 time (the newest point taken at or before it)")
      ->required();
  cmd->add_flag("--dry-run", args->dry_run, "Say which points would be folded and which files removed; change nothing");
  AddGroupFlag(cmd, args->group, "the chain from now on (its files too)");
  args->copy.AddTo(cmd, "none", kResourceFlags, "a merge keeps the chain's cluster size and compression");
  AddEncryptionFlags(cmd, nullptr);
  AddBucketFlags(cmd);
}

}  // namespace barge::cli
