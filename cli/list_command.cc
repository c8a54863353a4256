// barge list (every point of a chain folder, like `restic snapshots` or
// `qemu-img info --backing-chain`) and barge catalog list (what the backup
// catalog records: trackers, checkpoints, backup runs).
#include <optional>

#include "blockio/env.h"
#include "cli/catalog_json.h"
#include "cli/bucket_routing.h"
#include "cli/common.h"
#include "cli/http_flags.h"
#include "orchestrate/catalog/catalog_listing.h"
#include "orchestrate/catalog/listing_text.h"
#include "pipeline/chain_summary.h"

namespace barge::cli {
namespace {

using nlohmann::json;
namespace orc = barge::orchestrate;

json VerificationJson(const std::optional<pipeline::LastVerification>& v) {
  if (!v) return nullptr;
  json j = {{"result", v->record.ok ? "ok" : "failed"},
            {"verified_at", TimeJson(v->record.verified_at)},
            {"duration_seconds", v->record.duration_seconds},
            {"clusters_checked", v->record.clusters_checked},
            {"stale", v->stale}};
  if (!v->record.ok) j["error"] = v->record.error;
  return j;
}

json PointJson(const pipeline::PointView& p) {
  const formats::BackupManifest& m = p.manifest;
  json j = {{"position", p.position},
            {"id", m.id},
            {"type", formats::BackupTypeName(m.type)},
            {"reason", m.reason},
            {"chain", p.chain.empty() ? json(nullptr) : json(p.chain)},
            {"parent", m.parent ? json(m.parent->id) : json(nullptr)},
            {"started_at", TimeJson(m.started_at)},
            {"finished_at", TimeJson(m.finished_at)},
            {"virtual_size", m.virtual_size},
            {"cluster_size", m.cluster_size},
            {"compression", m.compression},
            {"image", m.image},
            {"image_bytes", p.image ? json(p.image->size_bytes) : json(nullptr)},
            {"allocated_bytes", p.image ? json(p.image->allocated_bytes) : json(nullptr)},
            {"bytes_written", m.bytes_written},
            {"bytes_read", m.bytes_read},
            {"dirty_bytes", m.dirty_bytes},
            {"dirty_source", m.dirty_source},
            {"checkpoint", m.checkpoint},
            {"source", m.source},
            {"image_digest", "xxh3-128:" + m.image_digest.ToHex()},
            {"last_verification", VerificationJson(p.verification)}};
  if (p.duration_seconds) j["duration_seconds"] = *p.duration_seconds;
  if (!p.broken.empty()) j["broken"] = p.broken;
  j["base"] = m.base ? json({{"chain", m.base->chain}, {"id", m.base->id}}) : json(nullptr);
  j["base_of"] = p.dependents;
  return j;
}

int RunList(const std::string& path, Output& out) {
  auto listing = pipeline::ListChain(Env::Default(), path);
  if (!listing.ok()) return out.Fail(listing.error());
  const pipeline::ChainListing& l = *listing;
  for (const auto& w : l.warnings) out.Warning(w.message, w.path);

  json chains = json::array();
  for (const std::string& full : l.chain_order) {
    json ids = json::array();
    for (const pipeline::PointView& p : l.points) {
      if (p.chain == full) ids.push_back(p.manifest.id);
    }
    chains.push_back({{"full", full}, {"points", ids}, {"latest", ids.back()}});
  }
  json arr = json::array();
  for (const pipeline::PointView& p : l.points) arr.push_back(PointJson(p));
  json folders = json::array();
  for (const pipeline::FoundChainFolder& f : l.below) {
    if (!f.summary.ok()) continue;  // warned about above, and a row of the text
    folders.push_back({{"path", f.path},
                       {"points", f.summary->points},
                       {"latest", f.summary->latest},
                       {"latest_started_at", TimeJson(f.summary->latest_started_at)},
                       {"image_bytes", f.summary->image_bytes}});
  }
  out.Result({{"chain_dir", l.chain_dir},
              {"points", arr},
              {"chains", chains},
              {"image_bytes", l.image_bytes},
              {"virtual_size", l.virtual_size},
              {"chain_folders", folders}});

  out.text() << orc::ChainListingText(l);
  return kExitOk;
}

json CheckpointJson(const orc::CheckpointRecord& c) {
  return {{"name", c.name}, {"tracker", c.tracker}, {"domain", c.domain}, {"created_at", c.created_at},
          {"disks", c.disks}};
}

int RunCatalogList(const std::string& catalog_flag, const std::string& domain, Output& out) {
  auto listing = orc::ReadCatalogListing(Env::Default(), catalog_flag, domain);
  if (!listing.ok()) return out.Fail(listing.error());
  json tj = json::array(), cj = json::array(), bj = json::array();
  for (const auto& tr : listing->trackers) tj.push_back(TrackerJson(tr));
  for (const auto& c : listing->checkpoints) cj.push_back(CheckpointJson(c));
  for (const auto& b : listing->backups) bj.push_back(RecordJson(b));
  out.Result({{"catalog", listing->path}, {"trackers", tj}, {"checkpoints", cj}, {"backups", bj}});
  out.text() << orc::CatalogListingText(*listing, domain);
  return kExitOk;
}

}  // namespace

void RegisterListCommands(CLI::App& app, int& exit_code) {
  {
    auto path = std::make_shared<std::string>();
    auto* cmd = AddCommand(app, "list",
                           "List the points of a chain folder: id, type, time, sizes, parent, last verification",
                           exit_code, [path](Output& out) { return RunList(*path, out); });
    cmd->add_option("chain", *path, "The disk's chain folder (TARGET/<name>/), one of its manifests or images, or a "
                    "target (lists the chain folders below it)")
        ->required();
    AddEncryptionFlags(cmd, nullptr);
    AddBucketFlags(cmd);
  }
  {
    struct Args {
      std::string catalog, domain;
    };
    auto args = std::make_shared<Args>();
    CLI::App* catalog = app.get_subcommand("catalog");  // made by RegisterVmCommands
    auto* cmd = AddCommand(*catalog, "list", "Show the catalog's trackers, checkpoints and backup records", exit_code,
                           [args](Output& out) { return RunCatalogList(args->catalog, args->domain, out); });
    cmd->add_option("--catalog", args->catalog, "Catalog database (default: $BARGE_CATALOG, else "
                                                "$XDG_STATE_HOME/barge/catalog.db)");
    cmd->add_option("--domain", args->domain, "Only this domain's");
  }
}

}  // namespace barge::cli
