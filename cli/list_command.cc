// barge list (every point of a chain folder, like `restic snapshots` or
// `qemu-img info --backing-chain`) and barge catalog list (what the backup
// catalog records: trackers, checkpoints, backup runs).
#include <algorithm>
#include <map>
#include <optional>

#include "blockio/env.h"
#include "cli/catalog_json.h"
#include "cli/common.h"
#include "orchestrate/catalog/catalog_listing.h"
#include "pipeline/chain_summary.h"

namespace barge::cli {
namespace {

using nlohmann::json;
namespace orc = barge::orchestrate;

// Columns padded to their widest cell, two spaces apart; the last column is
// not padded (free text such as a reason goes there).
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out, const std::string& indent = "") const {
    std::vector<size_t> widths;
    for (const auto& row : rows_) {
      if (widths.size() < row.size()) widths.resize(row.size(), 0);
      for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
    }
    for (const auto& row : rows_) {
      std::string line = indent;
      for (size_t i = 0; i < row.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out << line << "\n";
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// A manifest time as RFC 3339 UTC (as written, if it does not parse).
std::string Rfc3339(const std::string& text) {
  auto t = formats::ParseRfc3339(text);
  return t.ok() ? formats::FormatRfc3339(*t) : text;
}

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

std::string VerificationText(const std::optional<pipeline::LastVerification>& v) {
  if (!v) return "never";
  std::string s = (v->record.ok ? "ok " : "FAILED ") + v->record.verified_at;
  if (v->stale) s += " (stale: image changed since)";
  return s;
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

  std::ostream& t = out.text();
  if (l.points.empty() && !l.below.empty()) {
    t << l.chain_dir << ": a backup target, " << l.below.size()
      << (l.below.size() == 1 ? " chain folder" : " chain folders") << " below it (barge list FOLDER for its points):\n";
    Table table({"FOLDER", "POINTS", "LATEST", "TAKEN", "STORED"});
    for (const pipeline::FoundChainFolder& f : l.below) {
      if (!f.summary.ok()) {
        table.Add({f.relative, "?", "CANNOT BE LOADED (see the warning)"});
        continue;
      }
      const pipeline::ChainSummary& c = *f.summary;
      table.Add({f.relative, std::to_string(c.points), c.latest, Rfc3339(c.latest_started_at),
                 HumanBytes(c.image_bytes)});
    }
    table.Print(t, "  ");
    return kExitOk;
  }
  if (l.points.empty()) {
    t << l.chain_dir << ": no backups\n";
    return kExitOk;
  }
  t << l.chain_dir << ": " << l.points.size() << (l.points.size() == 1 ? " point" : " points") << " in "
    << l.chain_order.size() << (l.chain_order.size() == 1 ? " chain" : " chains") << ", " << HumanBytes(l.image_bytes)
    << " stored for a " << HumanBytes(l.virtual_size) << " disk\n";
  // One table per chain (a forced full starts a new one), then the points
  // whose links are broken.
  std::vector<std::string> groups = l.chain_order;
  if (std::any_of(l.points.begin(), l.points.end(), [](const pipeline::PointView& p) { return p.chain.empty(); })) {
    groups.push_back("");
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    t << "\n";
    if (groups[g].empty()) {
      t << "broken (a parent is missing or does not match):\n";
    } else {
      t << "chain " << g + 1 << " (full " << groups[g] << "):\n";
    }
    Table table({"POS", "ID", "TYPE", "TAKEN", "SIZE", "STORED", "COMPRESSION", "PARENT", "VERIFIED", "REASON"});
    for (const pipeline::PointView& p : l.points) {
      if (p.chain != groups[g]) continue;
      const formats::BackupManifest& m = p.manifest;
      // The parent's position, or its id when no point of the folder has it.
      std::string parent = p.parent_position ? std::to_string(*p.parent_position)
                           : m.parent           ? m.parent->id
                           : m.base             ? "base " + m.base->chain + "@" + m.base->id
                                                : "-";
      std::string reason = m.reason;
      if (!p.dependents.empty()) {
        reason = "base of " + std::to_string(p.dependents.size()) + (p.dependents.size() == 1 ? " chain" : " chains") +
                 "; " + reason;
      }
      table.Add({std::to_string(p.position), m.id, std::string(formats::BackupTypeName(m.type)),
                 Rfc3339(m.started_at), HumanBytes(m.virtual_size),
                 p.image ? HumanBytes(p.image->size_bytes) : "MISSING", m.compression, parent,
                 VerificationText(p.verification), reason});
    }
    table.Print(t, "  ");
  }
  return kExitOk;
}

// "trackers (2):" above a table, or "trackers: none".
void Heading(std::ostream& t, const char* what, size_t count) {
  t << "\n" << what << (count == 0 ? ": none\n" : " (" + std::to_string(count) + "):\n");
}

json CheckpointJson(const orc::CheckpointRecord& c) {
  return {{"name", c.name}, {"tracker", c.tracker}, {"domain", c.domain}, {"created_at", c.created_at},
          {"disks", c.disks}};
}

int RunCatalogList(const std::string& catalog_flag, const std::string& domain, Output& out) {
  auto listing = orc::ReadCatalogListing(Env::Default(), catalog_flag, domain);
  if (!listing.ok()) return out.Fail(listing.error());
  const std::string& path = listing->path;
  const auto* trackers = &listing->trackers;
  const auto* checkpoints = &listing->checkpoints;
  const auto* backups = &listing->backups;

  json tj = json::array(), cj = json::array(), bj = json::array();
  for (const auto& tr : *trackers) tj.push_back(TrackerJson(tr));
  for (const auto& c : *checkpoints) cj.push_back(CheckpointJson(c));
  for (const auto& b : *backups) bj.push_back(RecordJson(b));
  out.Result({{"catalog", path}, {"trackers", tj}, {"checkpoints", cj}, {"backups", bj}});

  std::ostream& t = out.text();
  t << "catalog " << path << (domain.empty() ? "" : " (domain " + domain + ")") << "\n";
  Heading(t, "trackers", trackers->size());
  if (!trackers->empty()) {
    Table table({"NAME", "DOMAIN", "CREATED", "LATEST CHECKPOINT", "DISKS", "NEXT BACKUP"});
    for (const auto& tr : *trackers) {
      std::string disks;
      for (const auto& [d, size] : tr.disks) disks += (disks.empty() ? "" : ", ") + d + " " + HumanBytes(size);
      std::string next = tr.needs_full ? "full (" + tr.needs_full_reason + ")"
                         : tr.latest_checkpoint.empty() ? "full (no checkpoint yet)"
                                                        : "incremental";
      table.Add({tr.name, tr.domain, tr.created_at,
                 tr.latest_checkpoint.empty() ? "-" : tr.latest_checkpoint + " (" + tr.checkpoint_created_at + ")",
                 disks.empty() ? "-" : disks, next});
    }
    table.Print(t, "  ");
  }
  Heading(t, "checkpoints", checkpoints->size());
  if (!checkpoints->empty()) {
    Table table({"NAME", "TRACKER", "DOMAIN", "CREATED", "DISKS"});
    for (const auto& c : *checkpoints) {
      std::string disks;
      for (const auto& d : c.disks) disks += (disks.empty() ? "" : ", ") + d;
      table.Add({c.name, c.tracker, c.domain, c.created_at, disks});
    }
    table.Print(t, "  ");
  }
  Heading(t, "backups", backups->size());
  if (!backups->empty()) {
    Table table({"ID", "DOMAIN", "TRACKER", "TYPE", "STARTED", "DURATION", "READ", "WRITTEN", "RESULT"});
    for (const auto& b : *backups) {
      uint64_t read = 0, written = 0;
      for (const auto& d : b.disks) {
        read += d.bytes_read;
        written += d.bytes_written;
      }
      std::string result = b.result + (b.error.empty() ? "" : ": " + b.error);
      table.Add({std::to_string(b.id), b.domain, b.tracker.empty() ? "-" : b.tracker, b.type.empty() ? "-" : b.type,
                 b.started_at, b.result == "running" ? "-" : HumanSeconds(b.duration_seconds), HumanBytes(read),
                 HumanBytes(written), result});
    }
    table.Print(t, "  ");
  }
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
