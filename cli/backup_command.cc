// barge backup: a full or incremental backup of one disk into DIR/<name>/.
#include <sys/resource.h>

#include <iostream>
#include <map>
#include <optional>

#include "blockio/bucket_env.h"
#include "blockio/s3_client.h"
#include "cli/bucket_routing.h"
#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/group_flag.h"
#include "cli/hook_flags.h"
#include "cli/http_flags.h"
#include "cli/nbd_flags.h"
#include "cli/owner_flag.h"
#include "cli/progress.h"
#include "orchestrate/catalog/image_base.h"
#include "orchestrate/vm/hooked_backup.h"
#include "orchestrate/policy/policy_runner.h"
#include "pipeline/backup.h"
#include "pipeline/backup_text.h"
#include "pipeline/change_source.h"
#include "pipeline/disk_identity.h"
#include "pipeline/object_lock.h"

namespace barge::cli {
namespace {

using nlohmann::json;

struct BackupArgs {
  std::string source, source_format, target, name;
  std::string disk_id;  // --disk-id
  ImageFlags flags;
  CopyFlags copy;
  bool incremental = false;
  bool allow_resize = false;
  bool no_resume = false;
  bool no_clean_check = false;
  std::string dirty_bitmap, dirty_extents, checkpoint, base;
  std::string catalog;  // --base image:NAME: the image catalog
  std::string changed_by;  // "", "bitmap", "digests", "bitmap+digests"
  NbdFlags nbd;
  HttpFlags http;
  std::string snapshot;
  std::string group;  // --group
  HookFlags hooks;
  int object_lock_days = 0;         // --object-lock-days: 0 none
  std::string object_lock_mode = "compliance";  // --object-lock-mode
};

// The retention --object-lock-days/--object-lock-mode ask for (nullopt:
// none): until now + DAYS, one date for every object of the point.
// kInvalidArgument (a usage error) for a target outside a bucket.
Result<std::optional<S3Retention>> ObjectLockFlags(const BackupArgs& a) {
  if (a.object_lock_days == 0) return std::optional<S3Retention>();
  if (!IsS3Url(a.target)) {
    return Error::InvalidArgument("--object-lock-days needs an s3:// --target (S3 Object Lock); got " + a.target);
  }
  S3Retention r;
  r.mode = a.object_lock_mode == "governance" ? S3LockMode::kGovernance : S3LockMode::kCompliance;
  r.until_unix = static_cast<int64_t>(::time(nullptr)) + int64_t{a.object_lock_days} * 86400;
  return std::optional<S3Retention>(r);
}

// Every object the backup publishes in the target's bucket carries
// `retention`: refused here, before any data moves, when the bucket has no
// Object Lock (kInvalidArgument naming the bucket).
Status StartObjectLock(const std::string& target, const S3Retention& retention) {
  BARGE_ASSIGN_OR_RETURN(BucketEnv * bucket, BucketEnvFor(Env::Default(), target));
  if (bucket == nullptr) return Error::Internal("no bucket store for " + target).set_path(target);
  return bucket->SetRetention(target, retention);
}

// The process's peak resident set so far (0 if unknown): the memory bound
// made visible (--memory caps the pipeline, not the process).
uint64_t PeakRssBytes() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // ru_maxrss is in KiB on Linux
}

// The run's result event (docs/json.md, "backup").
// The objects whose unfinished uploads the run's sweep aborted (a
// temporary ".NAME.barge-tmp" of a bucket's chain folder is NAME's upload).
std::vector<std::string> StaleUploads(const pipeline::BackupResult& r) {
  std::vector<std::string> objects;
  constexpr std::string_view kSuffix = ".barge-tmp";
  for (const std::string& name : r.stale) {
    if (!IsTempName(name)) continue;
    objects.push_back(r.chain_dir + "/" + name.substr(1, name.size() - 1 - kSuffix.size()));
  }
  return objects;
}

json BackupJson(const BackupArgs& a, const pipeline::BackupResult& r, const std::optional<orchestrate::ImageBase>& image_base,
                const std::vector<orchestrate::HookRun>& runs) {
  const auto& m = r.manifest;
  json j = {{"id", m.id},
             {"type", formats::BackupTypeName(m.type)},
             {"reason", m.reason},
             {"disk", m.disk},
             {"image", r.image_path},
             {"manifest", r.manifest_path},
             {"digest_table", r.digests_path},
              {"parent", m.parent ? json(m.parent->id) : json(nullptr)},
             {"base", m.base ? json(m.base->chain + "@" + m.base->id) : json(nullptr)},
             {"virtual_size", m.virtual_size},
             {"dirty_bytes", m.dirty_bytes},
             {"bytes_read", r.bytes_read},
             {"bytes_written", r.image_bytes},
             {"image_digest", "xxh3-128:" + m.image_digest.ToHex()},
             {"started_at", m.started_at},
             {"finished_at", m.finished_at},
             {"duration_seconds", r.seconds},
             {"peak_rss_bytes", PeakRssBytes()}};
  if (!a.snapshot.empty()) j["snapshot"] = a.snapshot;
  if (image_base) {
    j["base_image"] = {{"name", a.base.substr(orchestrate::kImageBasePrefix.size())},
                       {"sha512", image_base->sha512},
                       {"chain", image_base->chain_dir},
                       {"point", image_base->point},
                       {"imported", image_base->imported},
                       {"copy", image_base->copy}};
  }
  if (!m.changed_by.empty()) {
    j["changed_by"] = m.changed_by;
    j["digest_changed_clusters"] = r.digest_changed_clusters;
  }
  if (m.missed_clusters) j["missed_clusters"] = *m.missed_clusters;
  if (!r.strong_digests_path.empty()) j["strong_digest_table"] = r.strong_digests_path;
  if (r.strong_computed) j["strong_computed_bytes"] = r.strong_computed_bytes;
  if (r.clean_sample.clusters > 0) {
    j["clean_check"] = {{"clusters", r.clean_sample.clusters},
                        {"bytes_read", r.clean_sample.bytes_read},
                        {"differing", r.clean_sample.differing}};
  }
  if (!r.replaced.empty()) j["replaced"] = true;
  if (!runs.empty()) j["hooks"] = HookRunsJson(runs);
  if (IsS3Url(r.chain_dir) && !r.stale.empty()) j["stale_uploads"] = StaleUploads(r);
  if (r.resume) {
    j["resume"] = {{"resumed", r.resume->resumed},
                   {"staged_bytes", r.resume->staged_bytes},
                   {"problem", r.resume->problem}};
  }
  return j;
}

int RunBackupCommand(BackupArgs& a, Output& out) {
  pipeline::BackupRequest req;
  formats::CompressionSpec compression;
  if (Status s = a.copy.Apply(req.copy, compression, &out); !s.ok()) return out.Usage(s.error().message());
  auto hooks = a.hooks.ToSpec();
  if (!hooks.ok()) return out.Usage(hooks.error().message());
  if (Status s = pipeline::ApplyChangeSource({a.incremental, a.changed_by, a.dirty_bitmap, a.dirty_extents,
                                               a.copy.cluster_size_given()},
                                              req);
      !s.ok()) {
    return out.Usage(s.error().message());
  }
  req.compression = compression.type;
  req.compression_level = compression.level;
  req.source.location = a.source;
  req.source.format = a.source_format;
  req.source.allow_any_path = a.flags.allow_any_path;
  req.source.allow_dirs = a.flags.allow_dirs;
  req.source.nbd = a.nbd.access;
  auto http = a.http.OptionsFor(out, a.source);
  if (!http.ok()) return out.Usage(http.error().message());
  req.source.http = std::move(http).value();
  req.source.snapshot = a.snapshot;
  req.target_dir = a.target;
  req.disk_name = a.name;
  if (!a.disk_id.empty()) req.disk_identity = pipeline::NamedIdentity(a.disk_id, 0);  // the size: RunBackup's
  auto access = GroupFlagAccess(a.group);
  if (!access.ok()) return out.Usage(access.error().message());
  req.access = *access;
  req.checkpoint = a.checkpoint;
  req.allow_resize = a.allow_resize;
  req.base = a.base;
  // A chain in a bucket is not resumed yet: a killed run's upload is
  // aborted by the next run's sweep (docs/s3.md).
  req.resume = !a.no_resume && !IsS3Url(a.target);
  // Said before the copy starts, so a long resumed run shows it at once.
  req.on_resume = [&out](const pipeline::ResumeNote& note) {
    out.text() << pipeline::ResumeNoteText(note);
    out.text().flush();
  };
  // A change the bitmap (or extents file) did not record: the point is
  // still complete (the cluster is written), but the record drifted.
  req.on_missed = [&out, &a, &req](const Range& r) {
    out.Notice("bitmap_missed",
               "missed change: " + pipeline::ChangeRecordText(req) + " did not record bytes " +
                   std::to_string(r.offset) + "+" + std::to_string(r.length) +
                   " that changed since the chain's latest backup (written anyway)",
               {{"source", RedactNbdUri(a.source)},
                {"record", pipeline::ChangeRecordField(req)},
                {"offset", r.offset},
                {"length", r.length}});
  };
  req.check_clean = !a.no_clean_check;
  req.on_computing_strong = [&out](const std::string& id) {
    out.text() << "the chain's latest backup " << id
               << " has no strong digest table: computing it by reading that point once\n";
    out.text().flush();
  };
  // A disk whose state folder `barge state migrate` moved keeps its chain.
  req.previous_location = orchestrate::FollowStateMigrations(Env::Default());
  WarnIfMisnamed(out, a.source, a.source_format);

  // --base image:NAME: the catalog image's base point, found or backed up
  // from a ready copy first (orchestrate/catalog/image_base.h).
  std::optional<orchestrate::ImageBase> image_base;
  auto image = orchestrate::ImageBaseName(a.base);
  if (!image.ok()) return out.Usage(image.error().message());
  if (*image) {
    auto prepared = orchestrate::UseImageBase(Env::Default(), a.catalog, **image, req);
    if (!prepared.ok()) return out.Fail(prepared.error());
    image_base = std::move(prepared).value();
    if (image_base->imported) {
      out.text() << "catalog image " << **image << ": backed up from " << image_base->copy << " as "
                 << image_base->chain_dir << "@" << image_base->point << " (the base)\n";
      out.text().flush();
    }
  }

  auto object_lock = ObjectLockFlags(a);
  if (!object_lock.ok()) return out.Usage(object_lock.error().message());
  if (*object_lock) {
    if (Status s = StartObjectLock(a.target, **object_lock); !s.ok()) return out.Fail(s.error());
  }

  ProgressReporter progress(out, "backup");
  req.copy.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  orchestrate::HookedResult hooked;
  auto result = orchestrate::RunBackupWithHooks(Env::Default(), req, *hooks, hooked);
  progress.Done();
  for (const auto& w : hooked.warnings) out.Warning(w, RedactNbdUri(a.source));
  if (!result.ok()) return out.Fail(result.error());
  if (!result->other_disk.empty()) {
    out.Warning(result->other_disk + ": this full starts the chain over with another disk (restoring a time before it "
                "gives the earlier disk); back different disks up under different --name",
                result->chain_dir);
  }
  // A killed run's upload that could not be resumed was aborted by the
  // sweep: said, as the issue asks, so that lost work is never silent.
  if (IsS3Url(result->chain_dir)) {
    for (const std::string& object : StaleUploads(*result)) {
      out.Notice("stale_upload", "aborted a killed run's unfinished upload of " + object + " (not resumable)",
                 {{"object", object}});
    }
  }
  json result_json = BackupJson(a, *result, image_base, hooked.runs);
  if (*object_lock) {
    // The points this one depends on stay at least as long (a chain is
    // never half-deletable): extended now that the point exists.
    Status extended = pipeline::ExtendDependencies(Env::Default(), result->chain_dir, result->manifest, **object_lock);
    if (!extended.ok()) {
      return out.Fail(Error(extended.error())
                          .Wrap("point " + result->manifest.id +
                                " is committed and locked, but the points it depends on are not all locked as long"));
    }
    result_json["object_lock"] = {{"mode", std::string(S3LockModeName((*object_lock)->mode))},
                                  {"until", S3IsoTime((*object_lock)->until_unix)}};
  }
  out.Result(result_json);
  const std::string catalog_image = image_base ? a.base.substr(orchestrate::kImageBasePrefix.size()) : "";
  out.text() << pipeline::BackupResultText(*result, {RedactNbdUri(a.source), a.snapshot, catalog_image, a.dirty_bitmap})
             << HookRunsText(hooked.runs);
  return kExitOk;
}

}  // namespace

void RegisterBackupCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BackupArgs>();
  auto* cmd = AddCommand(app, "backup", "Back up a disk (full, or incremental from a dirty bitmap, an extents file or digests)",
                         exit_code, [args](Output& out) { return RunBackupCommand(*args, out); });
  AddAllowOtherOwnerFlag(cmd);
  cmd->add_option("--source", args->source, "Disk to read: image file, block device, nbd:// URI or http(s):// URL")
      ->required();
  cmd->add_option("--source-format", args->source_format,
                  "raw or qcow2 (a file is detected when omitted; raw is never probed)")
      ->check(CLI::IsMember({"raw", "qcow2"}));
  cmd->add_option("--target", args->target, "Backup folder; the chain goes to TARGET/<name>/")->required();
  cmd->add_option("--name", args->name, "Disk (chain) name; default: the source's base name")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v.empty() || v == "." || v == ".." || v.find('/') != std::string::npos) {
              return "a chain name is one folder name: not empty, '.', '..' or with a '/' (got '" + v + "')";
            }
            return "";
          },
          "NAME"));
  cmd->add_option("--disk-id", args->disk_id,
                  "Name the disk (e.g. its serial or UUID): the chain records this id instead of the source's "
                  "URI or path, so the disk read through another URI or port (a restarted qemu-nbd, a port "
                  "pool) still extends its chain; a later incremental needs the same id")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            Status ok = pipeline::CheckDiskId(v);
            return ok.ok() ? "" : ok.error().message() + " (got '" + v + "')";
          },
          "ID"));
  cmd->add_flag("--incremental", args->incremental, "Only what changed since the chain's latest backup");
  AddGroupFlag(cmd, args->group, "the chain (a chain made with a group stays the group's)");
  cmd->add_option("--dirty-bitmap", args->dirty_bitmap,
                  "Changed blocks: a persistent bitmap of a qcow2 source, or the NBD export's "
                  "qemu:dirty-bitmap:NAME");
  cmd->add_option("--dirty-extents", args->dirty_extents, "Changed blocks: an extents file (JSON)");
  cmd->add_option("--changed-by", args->changed_by,
                  "How an incremental finds changes: bitmap (--dirty-bitmap/--dirty-extents, the default), "
                  "digests (read the source and compare each cluster's SHA-256 with the chain's; no bitmap "
                  "needed; on a full: keep the SHA-256 table for the next one) or bitmap+digests (the bitmap's "
                  "changes, and report and write every change it missed)")
      ->check(CLI::IsMember({"bitmap", "digests", "bitmap+digests"}));
  cmd->add_option("--base", args->base,
                  "Start the chain as an increment over another chain's point (a golden image): CHAIN[@POINT], "
                  "CHAIN a chain name in --target or a chain folder's path; or image:NAME, an image of the image "
                  "catalog (kept as chain NAME of --target, backed up from a ready copy once); stores only the "
                  "clusters that differ")
      ->type_name("CHAIN[@POINT]|image:NAME");
  cmd->add_option("--catalog", args->catalog,
                  "The image catalog for --base image:NAME (default $BARGE_CATALOG, else ~/.local/state/barge)");
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint name to record in the manifest");
  cmd->add_flag("--allow-resize", args->allow_resize,
                "A full backup of a disk whose size changed since the chain's latest point (else refused: "
                "another disk under the same --name?)");
  cmd->add_flag("--no-resume", args->no_resume,
                "Do not resume what an interrupted run of this backup staged: sweep it and start over (and "
                "keep nothing for a later run if this one fails)");
  cmd->add_flag("--no-clean-check", args->no_clean_check,
                "An incremental from --dirty-bitmap/--dirty-extents trusts the record without reading a sample "
                "of the clusters it calls unchanged (by default up to 64 are compared with the chain; any "
                "that differ mean another disk's file under this path, and a full is taken)");
  args->nbd.AddTo(cmd, "an nbd:// or nbds:// source");
  args->http.AddTo(cmd);
  AddEncryptionFlags(cmd, &args->target);
  args->flags.allow_any_path = false;
  cmd->add_flag("--allow-any-path", args->flags.allow_any_path,
                "Allow a qcow2 source's backing/data files outside its folder");
  cmd->add_option("--allow-dir", args->flags.allow_dirs,
                  "Also allow a qcow2 source's backing and data files under this folder (repeatable)");
  cmd->add_option("-l,--snapshot", args->snapshot,
                  "Read a qcow2 source at this internal snapshot (id or name): a consistent point of a running VM");
  cmd->add_option("--object-lock-days", args->object_lock_days,
                  "S3 Object Lock: every object of the point (image, digest tables, manifest) is retained N days "
                  "(cannot be deleted or overwritten until then), and the points it depends on at least as "
                  "long; the s3:// target's bucket must have Object Lock enabled")
      ->check(CLI::Range(1, 36500));
  cmd->add_option("--object-lock-mode", args->object_lock_mode,
                  "With --object-lock-days: compliance (nobody can shorten or remove it, the default) or "
                  "governance (users with s3:BypassGovernanceRetention can)")
      ->check(CLI::IsMember({"compliance", "governance"}))
      ->capture_default_str();
  args->hooks.AddTo(cmd);
  args->copy.AddTo(cmd, DefaultCompression(), kAllCopyFlags | kNbdFlags);
}

}  // namespace barge::cli
