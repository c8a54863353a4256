// VM backup, the job as a list of steps: resolve the domain and tracker,
// clear what earlier runs left, plan per disk (vm_backup_plan.cc), then the
// pull job (vm_backup_pull.cc) or the offline run (vm_backup_offline.cc),
// both of which copy, commit and clean up alike (vm_backup_commit.cc).
#include "orchestrate/vm/vm_backup.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "blockio/path.h"
#include "formats/manifest.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/libvirt/paused_start.h"
#include "orchestrate/vm/cbt.h"
#include "orchestrate/vm/tracker.h"
#include "orchestrate/vm/vm_backup_steps.h"
#include "orchestrate/vm/vm_dry_run.h"
#include "orchestrate/vm/vm_orphans.h"
#include "pipeline/nbd_endpoint.h"

namespace barge::orchestrate {
namespace {

using vm_steps::RunPlan;

// An exclusive, non-blocking lock on <catalog folder>/locks/<domain>.lock,
// held for the backup (released by the kernel if we die).
Result<std::unique_ptr<EnvLock>> LockDomain(Env& env, const std::string& catalog_path,
                                           const std::string& domain) {
  return TryLockFile(env, DomainLockPath(catalog_path, domain), DomainBusyMessage(domain));
}

// The target and the scratch root exist and are folders (neither is
// created: a missing one is an unmounted volume); both made absolute.
Status CheckFolders(Env& env, VmBackupRequest& req, bool remote) {
  BARGE_RETURN_IF_ERROR(vm_steps::CheckTarget(env, req.target));
  req.target = AbsolutePath(req.target);
  if (req.scratch_dir.empty()) req.scratch_dir = kDefaultScratchRoot;
  // A remote hypervisor's scratch root is a path on that host: nothing here
  // to look at; libvirt reports a missing one when the job starts.
  if (remote) {
    if (req.scratch_dir.front() != '/') {
      return Error::InvalidArgument("the scratch folder of a remote domain is a path on its host and must be "
                                    "absolute (--scratch-dir)")
          .set_path(req.scratch_dir);
    }
    return OkStatus();
  }
  // The scratch root too: libvirt creates the scratch files in it and QEMU
  // opens them, so it must be a folder they see (not created here either).
  if (req.scratch_dir.empty()) req.scratch_dir = kDefaultScratchRoot;
  auto scratch_st = env.Stat(req.scratch_dir);
  if (!scratch_st.ok()) {
    if (scratch_st.error().code() != ErrorCode::kNotFound) return std::move(scratch_st).error();
    return Error::NotFound("scratch folder does not exist (--scratch-dir)").set_path(req.scratch_dir);
  }
  if (!scratch_st->is_directory()) {
    return Error::InvalidArgument("scratch path is not a folder (--scratch-dir)").set_path(req.scratch_dir);
  }
  req.scratch_dir = AbsolutePath(req.scratch_dir);
  return OkStatus();
}

// What earlier runs left: a killed run's job, socket, scratch folder and
// checkpoint go first (a job that is not barge's, or whose owner lives, is
// an error); checkpoints whose bitmaps are gone cannot be deleted normally
// and would stay forever: barge's own lose their metadata, the others are
// named. Returns the warnings.
struct Leftovers {
  std::vector<std::string> warnings;
  std::vector<std::string> kept_checkpoints;  // OrphanRecovery's
};
Result<Leftovers> ClearLeftovers(Env& env, BackupCatalog& catalog, virDomainPtr dom, const std::string& domain,
                                 bool keep_resumable) {
  Leftovers out;
  BARGE_ASSIGN_OR_RETURN(OrphanRecovery recovered,
                         RecoverOrphanedBackupJob(env, catalog, dom, domain, keep_resumable));
  if (!recovered.warning.empty()) out.warnings.push_back(std::move(recovered.warning));
  out.kept_checkpoints = std::move(recovered.kept_checkpoints);
  if (auto stale = RemoveStaleCheckpoints(catalog, dom, domain); stale.ok()) {
    out.warnings.insert(out.warnings.end(), stale->begin(), stale->end());
  } else {
    out.warnings.push_back("checkpoints whose bitmaps are gone were not looked for: " + stale.error().message());
  }
  return out;
}

// The request's own checks, before anything is opened: domain and target
// given, the URI parsed, a remote export's TLS settings and certificates
// (missing, or a key others can read), target and scratch folders (made
// absolute in `req`). Returns the parsed URI.
Result<LibvirtUri> CheckRequest(Env& env, VmBackupRequest& req) {
  if (req.domain.empty() || req.target.empty()) {
    return Error::InvalidArgument("vm backup needs a domain and a target");
  }
  BARGE_ASSIGN_OR_RETURN(LibvirtUri uri, ParseLibvirtUri(ResolveLibvirtUri(req.libvirt_uri)));
  if (!uri.remote() && req.nbd.tls()) {
    return Error::InvalidArgument("--tls-certificates is for a remote domain's NBD export (--connect "
                                  "qemu+tls://HOST/system); a local domain's export is a unix socket");
  }
  if (vm_steps::ExportOverTls(uri, req)) {
    if (req.nbd.tls_certificates.empty()) {
      return Error::InvalidArgument(
          "a backup of a domain on " + uri.Redacted() +
          " reads its disks over NBD with TLS: give the client certificates with --tls-certificates DIR "
          "(ca-cert.pem, client-cert.pem, client-key.pem), or use a qemu+ssh:// URI to read through ssh");
    }
    if (!req.nbd.tls_psk_file.empty() || !req.nbd.tls_username.empty()) {
      return Error::InvalidArgument("libvirt's backup export uses x509 certificates (qemu.conf "
                                    "backup_tls_x509_cert_dir), not a PSK: give --tls-certificates");
    }
    if (auto checked = pipeline::NbdOptionsFor(env, vm_steps::NbdTcpUri(uri.host, 0), req.nbd); !checked.ok()) {
      return std::move(checked).error();
    }
  }
  BARGE_RETURN_IF_ERROR(CheckFolders(env, req, uri.remote()));
  return uri;
}

// The tracker the run continues (ResolveTracker); several and none named
// is refused (kInvalidArgument).
Result<std::optional<TrackerRecord>> RunTracker(BackupCatalog& catalog, const VmBackupRequest& req) {
  BARGE_ASSIGN_OR_RETURN(TrackerChoice choice, ResolveTracker(catalog, req.domain, req.tracker));
  if (!choice.ambiguous.empty()) return Error::InvalidArgument(choice.ambiguous);
  return std::move(choice.tracker);
}

// A shut-off remote domain: started paused for the run's pull job, shut
// off again when the run returns (after the job ended). Nothing runs in
// the guest to quiesce. Started before the leftovers are cleared: libvirt
// deletes a killed run's checkpoint (its bitmaps) only from a running
// domain. nullptr when the domain needs no start.
Result<std::unique_ptr<PausedStart>> StartIfRemoteAndOff(virDomainPtr dom, const LibvirtUri& uri,
                                                         VmBackupRequest& req) {
  if (!uri.remote() || DomainIsActive(dom)) return std::unique_ptr<PausedStart>();
  BARGE_ASSIGN_OR_RETURN(auto paused, PausedStart::Start(dom, req.domain, uri.Redacted(), "read them over NBD"));
  req.skip_quiesce = true;
  return paused;
}

}  // namespace

std::string MultipleTrackersMessage(const std::string& domain, const std::vector<TrackerRecord>& trackers) {
  std::string names;
  for (const TrackerRecord& t : trackers) names += (names.empty() ? "" : ", ") + t.name;
  return "domain '" + domain + "' has " + std::to_string(trackers.size()) + " trackers (" + names +
         "): name one with --tracker";
}

Result<TrackerChoice> ResolveTracker(BackupCatalog& catalog, const std::string& domain,
                                     const std::string& tracker_name) {
  TrackerChoice choice;
  if (!tracker_name.empty()) {
    BARGE_ASSIGN_OR_RETURN(choice.tracker, catalog.GetTracker(tracker_name));
    if (choice.tracker->domain != domain) {
      return Error::InvalidArgument("tracker '" + tracker_name + "' belongs to domain '" + choice.tracker->domain +
                                    "'");
    }
    return choice;
  }
  BARGE_ASSIGN_OR_RETURN(auto list, catalog.ListTrackers(domain));
  if (list.size() == 1) choice.tracker = list[0];
  if (list.size() > 1) choice.ambiguous = MultipleTrackersMessage(domain, list);
  return choice;
}

Result<VmBackupResult> RunVmBackup(Env& env, const VmBackupRequest& req_in) {
  VmBackupRequest req = req_in;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string started = formats::NowRfc3339();
  // Resolve: the request, the catalog and the domain's lock, the domain,
  // the tracker.
  BARGE_ASSIGN_OR_RETURN(LibvirtUri uri, CheckRequest(env, req));
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env, req.catalog_path));
  BARGE_ASSIGN_OR_RETURN(auto lock, LockDomain(env, req.catalog_path, req.domain));
  BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(auto dom, LookupDomain(conn.get(), req.domain));
  BARGE_ASSIGN_OR_RETURN(std::optional<TrackerRecord> tracker, RunTracker(*catalog, req));
  // (`paused` outlives the run's job: the domain is shut off after it.)
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<PausedStart> paused, StartIfRemoteAndOff(dom.get(), uri, req));
  // A shut-off domain without CBT is refused before its leftovers are
  // touched: libvirt could delete their metadata only, leaving bitmaps in
  // its disks. A killed run's checkpoint is kept for a resume where the
  // run can ask what changed since it: a pull job (an active domain), or
  // the bitmap in a shut-off domain's CBT overlays.
  if (!DomainIsActive(dom.get())) {
    BARGE_ASSIGN_OR_RETURN(auto cbt, CbtDisksOf(*catalog, req.domain));
    if (!cbt) return vm_steps::NotRunningWithoutCbt(req.domain);
  }
  BARGE_ASSIGN_OR_RETURN(Leftovers leftovers, ClearLeftovers(env, *catalog, dom.get(), req.domain, req.resume));
  if (paused) leftovers.warnings.insert(leftovers.warnings.begin(), paused->Warning("this backup"));

  // Plan, then run it: pull or offline.
  vm_steps::PlanInputs in{req.domain, req.disks, req.force_full, req.target, req.resume,
                          std::move(leftovers.kept_checkpoints), ""};
  const TrackerRecord* t = tracker ? &*tracker : nullptr;
  BARGE_ASSIGN_OR_RETURN(RunPlan plan, vm_steps::PlanVmRun(env, *catalog, dom.get(), t, in));
  const vm_steps::RunContext ctx{env, req, *catalog, dom.get(), t, started, t0};
  auto res = plan.mode == "offline" ? vm_steps::RunOfflineBackup(ctx, std::move(plan))
                                    : vm_steps::RunPullBackup(ctx, uri, std::move(plan));
  if (res.ok()) res->warnings.insert(res->warnings.begin(), leftovers.warnings.begin(), leftovers.warnings.end());
  return res;
}

Result<VmBackupForecast> DryRunVmBackup(Env& env, const VmBackupRequest& req) {
  BARGE_ASSIGN_OR_RETURN(VmDryRun run, DryRunVmBackupRun(env, req));
  return std::move(run.forecast);
}

Result<VmDryRun> DryRunVmBackupRun(Env& env, const VmBackupRequest& req_in) {
  VmBackupRequest req = req_in;
  VmDryRun refused;
  auto uri = CheckRequest(env, req);
  if (!uri.ok()) {
    refused.forecast.refusal = uri.error().ToString();
    refused.refused = uri.error();
    return refused;
  }
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env, req.catalog_path));
  BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(auto dom, LookupDomain(conn.get(), req.domain));
  auto tracker = RunTracker(*catalog, req);
  if (!tracker.ok()) {
    refused.forecast.mode = DomainIsActive(dom.get()) ? "pull" : "offline";
    refused.forecast.refusal = tracker.error().ToString();
    refused.refused = tracker.error();
    return refused;
  }
  return ForecastVmBackupRun(env, *catalog, dom.get(), req, *tracker ? &**tracker : nullptr);
}

}  // namespace barge::orchestrate
