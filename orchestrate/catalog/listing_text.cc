#include "orchestrate/catalog/listing_text.h"

#include <algorithm>
#include <sstream>

#include "formats/units.h"

namespace barge::orchestrate {
namespace {

using formats::HumanBytes;

// A manifest time as RFC 3339 UTC (as written, if it does not parse).
std::string Rfc3339(const std::string& text) {
  auto t = formats::ParseRfc3339(text);
  return t.ok() ? formats::FormatRfc3339(*t) : text;
}

// "trackers (2):" above a table, or "trackers: none".
void Heading(std::ostream& t, const char* what, size_t count) {
  t << "\n" << what << (count == 0 ? ": none\n" : " (" + std::to_string(count) + "):\n");
}

// The chain folders below a target, a row each.
void BelowText(const pipeline::ChainListing& l, std::ostream& t) {
  t << l.chain_dir << ": a backup target, " << l.below.size()
    << (l.below.size() == 1 ? " chain folder" : " chain folders") << " below it (barge list FOLDER for its points):\n";
  TextTable table({"FOLDER", "POINTS", "LATEST", "TAKEN", "STORED"});
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
}

// The points of chain `full` ("" = the broken ones) as a table.
void ChainTable(const pipeline::ChainListing& l, const std::string& full, std::ostream& t) {
  TextTable table({"POS", "ID", "TYPE", "TAKEN", "SIZE", "STORED", "COMPRESSION", "PARENT", "VERIFIED", "REASON"});
  for (const pipeline::PointView& p : l.points) {
    if (p.chain != full) continue;
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
    table.Add({std::to_string(p.position), m.id, std::string(formats::BackupTypeName(m.type)), Rfc3339(m.started_at),
               HumanBytes(m.virtual_size), p.image ? HumanBytes(p.image->size_bytes) : "MISSING", m.compression,
               parent, VerificationText(p.verification), reason});
  }
  table.Print(t, "  ");
}

}  // namespace

void TextTable::Print(std::ostream& out, const std::string& indent) const {
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

std::string VerificationText(const std::optional<pipeline::LastVerification>& v) {
  if (!v) return "never";
  std::string s = (v->record.ok ? "ok " : "FAILED ") + v->record.verified_at;
  if (v->stale) s += " (stale: image changed since)";
  return s;
}

std::string ChainListingText(const pipeline::ChainListing& l) {
  std::ostringstream t;
  if (l.points.empty() && !l.below.empty()) {
    BelowText(l, t);
    return t.str();
  }
  if (l.points.empty()) return l.chain_dir + ": no backups\n";
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
    ChainTable(l, groups[g], t);
  }
  return t.str();
}

std::string CatalogListingText(const CatalogListing& listing, const std::string& domain) {
  std::ostringstream t;
  t << "catalog " << listing.path << (domain.empty() ? "" : " (domain " + domain + ")") << "\n";
  Heading(t, "trackers", listing.trackers.size());
  if (!listing.trackers.empty()) {
    TextTable table({"NAME", "DOMAIN", "CREATED", "LATEST CHECKPOINT", "DISKS", "NEXT BACKUP"});
    for (const auto& tr : listing.trackers) {
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
  Heading(t, "checkpoints", listing.checkpoints.size());
  if (!listing.checkpoints.empty()) {
    TextTable table({"NAME", "TRACKER", "DOMAIN", "CREATED", "DISKS"});
    for (const auto& c : listing.checkpoints) {
      std::string disks;
      for (const auto& d : c.disks) disks += (disks.empty() ? "" : ", ") + d;
      table.Add({c.name, c.tracker, c.domain, c.created_at, disks});
    }
    table.Print(t, "  ");
  }
  Heading(t, "backups", listing.backups.size());
  if (!listing.backups.empty()) {
    TextTable table({"ID", "DOMAIN", "TRACKER", "TYPE", "STARTED", "DURATION", "READ", "WRITTEN", "RESULT"});
    for (const auto& b : listing.backups) {
      uint64_t read = 0, written = 0;
      for (const auto& d : b.disks) {
        read += d.bytes_read;
        written += d.bytes_written;
      }
      std::string result = b.result + (b.error.empty() ? "" : ": " + b.error);
      table.Add({std::to_string(b.id), b.domain, b.tracker.empty() ? "-" : b.tracker, b.type.empty() ? "-" : b.type,
                 b.started_at, b.result == "running" ? "-" : formats::HumanSeconds(b.duration_seconds),
                 HumanBytes(read), HumanBytes(written), result});
    }
    table.Print(t, "  ");
  }
  return t.str();
}

}  // namespace barge::orchestrate
