#include "orchestrate/policy/policy_text.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "blockio/nbd.h"
#include "formats/units.h"
#include "orchestrate/base/closest_match.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/policy/policy_shard.h"
#include "orchestrate/policy/runs_listing.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {
namespace {

using formats::HumanBytes;
using formats::HumanSeconds;

// How a source's incrementals find changes, as a clause after its kind.
std::string ChangedByText(const PolicySource& s) {
  if (s.changed_by == "bitmap") return ", incrementals from bitmap " + s.bitmap;
  if (s.changed_by == "bitmap+digests") {
    return ", incrementals from bitmap " + s.bitmap + " checked by SHA-256 digests (changed_by: bitmap+digests)";
  }
  if (s.changed_by == "digests") return ", incrementals by SHA-256 digests (changed_by: digests)";
  if (s.changed_by == "full") return ", every backup full (changed_by: full)";
  return "";
}

// The schedule and its next runs (" (HH:MM ZONE)" after each when the
// zone is not UTC), or that there is none.
void ScheduleText(const Policy& p, const std::vector<std::chrono::sys_seconds>& next, std::ostream& o) {
  if (!p.schedule) {
    o << "  no schedule: backups run when the reason changes or with barge run --force\n";
    return;
  }
  const std::string zone = p.schedule->zone().name();
  o << "  schedule: " << p.schedule->expression() << " (" << (zone.empty() ? "UTC" : zone) << ")\n"
    << "  next runs:\n";
  for (auto t : next) {
    o << "    " << FormatRfc3339(t);
    if (!p.schedule->zone().is_utc()) {
      auto local = p.schedule->zone().ToLocal(t);
      auto days = std::chrono::floor<std::chrono::days>(local);
      std::chrono::hh_mm_ss hms(local - days);
      char clock[16];
      std::snprintf(clock, sizeof clock, "%02d:%02d", static_cast<int>(hms.hours().count()),
                    static_cast<int>(hms.minutes().count()));
      o << " (" << clock << " " << zone << ")";
    }
    o << "\n";
  }
}

// The id of a retention key "FOLDER|ID" (a bare id is its own).
std::string KeyId(const std::string& key) {
  size_t bar = key.rfind('|');
  return bar == std::string::npos ? key : key.substr(bar + 1);
}

}  // namespace

std::string PolicyProblemsText(const std::string& file, const std::vector<PolicyProblem>& problems) {
  std::string out;
  for (const auto& p : problems) {
    out += file + ":" + (p.line ? std::to_string(p.line) + ":" + std::to_string(p.column) + ":" : "") + " " +
           p.message + "\n";
  }
  return out;
}

std::string PolicyCheckText(const std::string& file, const Policy& p, size_t warnings,
                            const std::vector<std::chrono::sys_seconds>& next_runs) {
  std::ostringstream o;
  o << "policy " << p.name << " (" << file << ") is valid"
    << (warnings == 0 ? "" : ", with " + std::to_string(warnings) + " warning(s) above") << "\n";
  for (const auto& s : p.sources) {
    o << "  source " << s.name << ": " << PolicySourceKindName(s.kind) << " " << RedactUri(s.location)
      << ChangedByText(s);
    if (!s.disk_id.empty()) o << ", disk id " << s.disk_id;
    if (s.kind == PolicySourceKind::kDomain) o << ", tracker " << (s.tracker.empty() ? p.name : s.tracker);
    if (!s.connect.empty()) o << ", on " << RedactLibvirtUri(s.connect);
    if (s.kind == PolicySourceKind::kDomain && !s.quiesce) o << ", not quiesced (quiesce: false)";
    o << "\n";
  }
  o << "  targets: ";
  for (size_t i = 0; i < p.targets.size(); ++i) o << (i ? ", " : "") << p.targets[i];
  if (p.free_space_multiple > 0) {
    o << " (free space >= " << p.free_space_multiple << "x a source's allocated bytes";
    bool buckets = false;
    for (const auto& t : p.targets) buckets = buckets || IsBucketTarget(t);
    o << (buckets ? "; not for a bucket: the free-space rule does not apply there" : "") << ")\n";
  } else {
    o << " (no free-space check: free_space_multiple is 0)\n";
  }
  for (const auto& off : p.offsites) {
    o << "  offsite of " << off.target << ": " << off.location << ", keeps " << off.retention_count
      << " point(s) per source there\n";
  }
  o << "  keeps " << p.retention_count << " point(s) per source, " << p.max_parallel << " source(s) at once"
    << (p.max_run_time.count() ? ", runs stopped after " + FormatDuration(p.max_run_time) : "")
    << (p.full_every ? ", a new chain every " + std::to_string(p.full_every) + " points" : "") << ", "
    << formats::CompressionSpec{p.compression, p.compression_level}.ToString() << "\n";
  o << "  alert: "
    << (p.max_duration_without_backup.count()
            ? "after " + FormatDuration(p.max_duration_without_backup) + " without a successful backup"
            : "off (max_duration_without_backup: 0)")
    << "\n";
  ScheduleText(p, next_runs, o);
  return o.str();
}

std::string UnknownSourceMessage(const Policy& p, const std::vector<std::string>& wanted) {
  for (const auto& w : wanted) {
    if (p.FindSource(w) != nullptr) continue;
    std::vector<std::string> names;
    std::string list;
    for (const auto& s : p.sources) {
      names.push_back(s.name);
      list += (list.empty() ? "" : ", ") + s.name;
    }
    std::string match = ClosestMatch(w, names);
    return "policy " + p.name + " has no source '" + w + "'" + (match.empty() ? "" : "; did you mean '" + match + "'?") +
           " (sources: " + list + ")";
  }
  return "";
}

PolicyShards ShardPolicySources(const Policy& p, uint32_t count) {
  PolicyShards out;
  out.per.resize(count);
  for (const auto& s : p.sources) {
    const uint32_t i = ShardOfSource(s.name, count);
    out.per[i].push_back(s.name);
    out.sources.emplace_back(s.name, i);
  }
  return out;
}

std::string ShardsText(const Policy& p, const PolicyShards& shards) {
  const auto& per = shards.per;
  std::ostringstream t;
  t << "policy " << p.name << " over " << per.size() << " shard(s) (rendezvous hashing of source names)\n";
  for (size_t i = 0; i < per.size(); ++i) {
    t << "  shard " << i << "/" << per.size() << ":";
    if (per[i].empty()) t << " (no source)";
    for (const auto& n : per[i]) t << " " << n;
    t << "\n";
  }
  return t.str();
}

std::string RunReportText(const Policy& policy, const RunReport& report) {
  std::ostringstream out;
  size_t width = 6;
  for (const auto& o : report.sources) width = std::max(width, o.source.size());
  for (const auto& o : report.sources) {
    out << "  " << o.source << std::string(width - o.source.size() + 2, ' ');
    if (!o.ran) {
      out << "not due   (" << o.due.why << ")\n";
      continue;
    }
    const RunRecord& r = o.record;
    if (r.result == "success") {
      out << "success   " << r.type << " -> " << r.target << ", read " << HumanBytes(r.bytes_read) << ", wrote "
          << HumanBytes(r.bytes_written) << " in " << HumanSeconds(r.duration_seconds) << " (" << r.trigger << ": "
          << o.due.why << "; " << r.type_reason << ")";
      if (!r.error.empty()) out << "; warning: " << r.error;
    } else {
      out << "FAILED    " << r.error;
    }
    if (!o.retention.empty()) out << "; retention: " << o.retention;
    if (!o.offsite.empty() && !o.offsite_failed) out << "; offsite: " << o.offsite;
    out << "\n";
  }
  const std::string shard = report.shard.sharded() ? " shard " + report.shard.ToString() : "";
  if (report.sources.empty() && report.shard.sharded()) {
    out << "policy " << policy.name << shard << ": no source falls to this shard\n";
  } else if (report.ran == 0) {
    out << "nothing due for policy " << policy.name << shard << "\n";
  } else {
    out << "policy " << policy.name << shard << ": " << report.ran - report.failed << " of " << report.ran
        << " backup(s) succeeded" << (report.failed ? ", " + std::to_string(report.failed) + " failed" : "")
        << (report.stopped ? " (" + report.stop_reason + ")" : "") << "\n";
  }
  return out.str();
}

std::string ForgetSourceText(const ForgetSourceReport& r, bool dry_run) {
  std::ostringstream t;
  std::map<std::string, std::string> anyway_why(r.plan.kept_anyway.begin(), r.plan.kept_anyway.end());
  t << r.source << ": keep " << r.plan.keep.size() << ", " << (dry_run ? "would remove " : "remove ")
    << r.plan.forget.size()
    << (r.plan.kept_anyway.empty() ? "" : ", kept anyway " + std::to_string(r.plan.kept_anyway.size())) << "\n";
  for (const auto& k : r.plan.keep) {
    t << "  keep " << KeyId(k) << ": ";
    if (auto rules = r.why_kept.find(k); rules != r.why_kept.end()) {
      for (size_t i = 0; i < rules->second.size(); ++i) t << (i ? ", " : "") << rules->second[i];
    } else if (auto w = anyway_why.find(k); w != anyway_why.end()) {
      t << "kept anyway, " << w->second;
    }
    t << "\n";
  }
  for (const auto& k : r.plan.forget) t << "  " << (dry_run ? "would remove " : "remove ") << KeyId(k) << "\n";
  for (const auto& act : r.plan.actions) {
    t << "  " << (dry_run ? "would " : "") << RetentionActionKindName(act.kind) << " " << act.chain_dir << ":";
    for (const auto& id : act.ids) t << " " << id;
    if (!act.through.empty()) t << " (into " << act.through << ")";
    t << "\n";
  }
  if (!r.error.empty()) t << "  FAILED: " << r.error << "\n";
  return t.str();
}

std::string RunsListText(const std::vector<std::pair<RunRecord, std::string>>& runs, const std::string& policy_name,
                         bool name_catalogs) {
  std::ostringstream t;
  if (runs.empty()) t << "no runs recorded" << (policy_name.empty() ? "" : " for policy " + policy_name) << "\n";
  for (const auto& [r, file] : runs) {
    t << r.started_at << "  " << r.policy << "/" << r.source << "  " << r.result << "  " << r.trigger;
    if (r.shard.sharded()) t << "  shard " << r.shard.ToString();
    if (!r.type.empty()) t << "  " << r.type;
    if (!r.target.empty()) t << "  " << r.target;
    if (r.result == "success") {
      t << "  read " << HumanBytes(r.bytes_read) << ", wrote " << HumanBytes(r.bytes_written) << " in "
        << HumanSeconds(r.duration_seconds);
    }
    if (std::string fate = PointFate(r); !fate.empty()) t << "  (" << fate << ")";
    t << "  [record " << r.id << (name_catalogs ? " of " + file : "") << "]";
    if (!r.error.empty()) t << "\n    " << r.error;
    t << "\n";
    for (size_t i = 0; i < r.points.size(); ++i) {
      t << "    point " << r.points[i].id << " in " << r.points[i].chain_dir << ": " << PartState(r, i) << "\n";
    }
  }
  return t.str();
}

}  // namespace barge::orchestrate
