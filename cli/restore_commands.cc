// barge restore and barge verify.
#include "cli/bucket_routing.h"
#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/group_flag.h"
#include "cli/http_flags.h"
#include "cli/nbd_flags.h"
#include "cli/owner_flag.h"
#include "cli/progress.h"
#include "pipeline/chain.h"
#include "pipeline/restore.h"
#include "pipeline/restore_text.h"

namespace barge::cli {
namespace {

using nlohmann::json;

struct RestoreArgs {
  std::string chain, at = "latest", to, output_format = "raw";
  CopyFlags copy;
  NbdFlags nbd;
  bool force = false;
  bool no_sync = false;
  std::string group;  // --group
};

int RunRestoreCommand(RestoreArgs& a, Output& out) {
  pipeline::RestoreRequest req;
  formats::CompressionSpec compression;
  if (Status s = a.copy.Apply(req.copy, compression, &out); !s.ok()) return out.Usage(s.error().message());
  if (compression.type != formats::Compression::kNone && a.output_format != "qcow2") {
    return out.Usage("--compress needs -O qcow2");
  }
  if (auto at = pipeline::ParsePointSelector(a.at); !at.ok()) return out.Usage("--at: " + at.error().message());
  req.chain_dir = a.chain;
  req.at = a.at;
  req.destination = a.to;
  req.destination_nbd = a.nbd.access;
  req.output_format = a.output_format;
  req.force = a.force;
  auto access = GroupFlagAccess(a.group);
  if (!access.ok()) return out.Usage(access.error().message());
  if (*access) req.access = *access;
  req.sync = !a.no_sync;
  req.compression = compression.type;
  req.compression_level = compression.level;
  req.on_point = [&](size_t position, const formats::BackupManifest& m) {
    out.text() << pipeline::RestoringText(position, m, RedactNbdUri(a.to));
    out.text().flush();
  };
  ProgressReporter progress(out, "restore");
  req.copy.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  auto r = pipeline::RunRestore(Env::Default(), req);
  progress.Done();
  if (!r.ok()) return out.Fail(r.error());
  out.Result({{"id", r->manifest.id},
              {"position", r->position},
              {"started_at", TimeJson(r->manifest.started_at)},
              {"destination", RedactNbdUri(a.to)},
              {"format", a.output_format},
              {"layers", r->layers},
              {"virtual_size", r->manifest.virtual_size},
              {"bytes_read", r->bytes_read},
              {"bytes_written", r->bytes_written},
              {"image_digest", "xxh3-128:" + r->image_digest.ToHex()},
              {"verified", true},
              {"duration_seconds", r->seconds}});
  out.text() << pipeline::RestoreResultText(*r, RedactNbdUri(a.to));
  return kExitOk;
}

struct VerifyArgs {
  std::string path, at, against, against_format;
  bool all = false;
  CopyFlags copy;
  NbdFlags nbd;
};

int RunVerifyCommand(VerifyArgs& a, Output& out) {
  pipeline::VerifyRequest req;
  formats::CompressionSpec unused;
  if (Status s = a.copy.Apply(req.copy, unused, &out); !s.ok()) return out.Usage(s.error().message());
  if (auto at = pipeline::ParsePointSelector(a.at); !at.ok()) return out.Usage("--at: " + at.error().message());
  if (a.all && !a.at.empty()) return out.Usage("--at and --all exclude each other");
  if (!a.against_format.empty() && a.against.empty()) return out.Usage("--against-format needs --against");
  req.path = a.path;
  req.at = a.at;
  req.all_points = a.all;
  req.against.location = a.against;
  req.against.format = a.against_format;
  req.against.nbd = a.nbd.access;
  ProgressReporter progress(out, "verify");
  req.copy.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  auto r = pipeline::RunVerify(Env::Default(), req);
  progress.Done();
  if (!r.ok()) return out.Fail(r.error());
  const pipeline::VerifyReport& report = *r;
  for (const auto& w : report.warnings) out.Warning(w);
  using State = pipeline::VerifyOutcome::State;
  // With --all, a failed point does not hide the others: every point's
  // outcome is reported. Otherwise a failure is the command's error.
  if (pipeline::VerifyFailsBeforeResult(report, a.all)) {
    // A source that differs from a point that verified is a mismatch (2),
    // though no damage to the backup (the error is no Corruption).
    if (report.source_differs) return out.Fail(*report.failure, kExitCorruption);
    return out.Fail(*report.failure);
  }
  json points = json::array();
  json verified = json::array();
  for (const auto& o : report.points) {
    json p = {{"id", o.id}, {"position", o.position}, {"started_at", TimeJson(o.started_at)}};
    switch (o.state) {
      case State::kPassed:
        p["result"] = "passed";
        verified.push_back(o.id);
        break;
      case State::kFailed:
        p["result"] = "failed";
        p["error"] = o.error;
        break;
      case State::kSkipped:
        p["result"] = "skipped";
        p["failed_layer"] = o.failed_layer;
        break;
    }
    points.push_back(std::move(p));
  }
  // The bases the points stand on (`backup --base`), verified as points of
  // their own chains.
  json bases = json::array();
  for (const auto& b : report.bases) {
    json j = {{"chain", b.chain_dir}, {"id", b.id}, {"result", b.passed ? "passed" : "failed"}};
    if (!b.passed) j["error"] = b.error;
    bases.push_back(std::move(j));
  }
  out.Result({{"ok", report.ok()},
              {"verified", verified},
              {"points", points},
              {"bases", bases},
              {"clusters_checked", report.clusters_checked},
              {"bytes_read", report.bytes_read},
              {"against_source", report.ok() && report.against_checked},
              {"duration_seconds", report.seconds}});
  out.text() << pipeline::VerifyReportText(report);
  if (report.failure) return out.Fail(*report.failure);
  return kExitOk;
}

}  // namespace

void RegisterRestoreCommands(CLI::App& app, int& exit_code) {
  {
    auto args = std::make_shared<RestoreArgs>();
    auto* cmd = AddCommand(app, "restore", "Restore (flatten) any point of a backup chain, verified",
                           exit_code, [args](Output& out) { return RunRestoreCommand(*args, out); });
    cmd->add_option("chain", args->chain,
                    "The disk's chain folder (TARGET/<name>/), or a point's manifest (.json) or image (.qcow2)")
        ->required();
    cmd->add_option("--at", args->at,
                    "latest; a position (0 = the oldest point: the full, or after a merge the merged "
                    "full); a backup id; or an RFC 3339 time (the newest point taken at or before it)")
        ->capture_default_str();
    cmd->add_option("--to", args->to, "Destination: new file, block device or nbd:// URI")->required();
    cmd->add_option("-O,--output-format", args->output_format, "raw or qcow2")
        ->check(CLI::IsMember({"raw", "qcow2"}))
        ->capture_default_str();
    cmd->add_flag("--force", args->force, "Overwrite a destination that holds data");
    AddGroupFlag(cmd, args->group, "a destination file made anew (a file replaced keeps its mode)");
    cmd->add_flag("--no-sync", args->no_sync,
                  "Do not fsync the output at the end (faster; a crash may lose it, as with qemu-img convert)");
    args->copy.AddTo(cmd, "none", kCompressFlag | kResourceFlags | kNbdFlags,
                     "a restore keeps the chain's cluster size");
    args->nbd.AddTo(cmd, "an nbd:// or nbds:// --to");
    AddEncryptionFlags(cmd, nullptr);
    AddBucketFlags(cmd);
  }
  {
    auto args = std::make_shared<VerifyArgs>();
    auto* cmd = AddCommand(
        app, "verify", "Verify a backup: structure, every cluster digest, the image digest (exit 2 on mismatch)",
        exit_code, [args](Output& out) { return RunVerifyCommand(*args, out); });
    AddAllowOtherOwnerFlag(cmd);
    cmd->add_option("path", args->path, "Chain folder, manifest (.json) or backup image (.qcow2)")
        ->required();
    cmd->add_option("--at", args->at,
                    "With a chain folder: which point (default latest): a position, an id or an RFC 3339 time, "
                    "as restore --at");
    cmd->add_flag("--all", args->all,
                  "Verify every point of the chain folder; one that fails does not stop the others (those that "
                  "read through it are skipped), and each point's outcome is reported");
    cmd->add_option("--against", args->against, "Also compare with this source (file, device, nbd:// URI)");
    cmd->add_option("--against-format", args->against_format, "raw or qcow2")
        ->check(CLI::IsMember({"raw", "qcow2"}));
    args->copy.AddTo(cmd, "none", kResourceFlags | kNbdFlags, "verify only reads");
    args->nbd.AddTo(cmd, "an nbd:// or nbds:// --against");
    AddEncryptionFlags(cmd, nullptr);
    AddBucketFlags(cmd);
  }
}

}  // namespace barge::cli
