// Pure decisions of policy runs (orchestrate/policy/policy_decisions.h).
#include "orchestrate/policy/policy_decisions.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>

#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {

std::string_view TriggerName(Trigger trigger) {
  switch (trigger) {
    case Trigger::kReason: return "reason";
    case Trigger::kSchedule: return "schedule";
    case Trigger::kManual: return "manual";
  }
  return "?";
}

std::string_view RetentionActionKindName(RetentionActionKind kind) {
  switch (kind) {
    case RetentionActionKind::kRemoveChain: return "remove-chain";
    case RetentionActionKind::kRemoveNewest: return "remove-newest";
    case RetentionActionKind::kMergeThrough: return "merge";
  }
  return "?";
}

DueDecision DecideDue(const Policy& policy, const SourceState& state, SysSeconds now, bool run_in_progress,
                      std::chrono::seconds retry_after) {
  DueDecision d;
  if (policy.schedule) {
    auto next = policy.schedule->Next(now);
    if (next.ok()) d.next = *next;
  }
  if (state.last_failed && state.last_attempt) d.retry = *state.last_attempt + retry_after;
  if (run_in_progress) {
    d.why = "a run of policy " + policy.name + " is in progress";
    return d;
  }
  const std::string last_reason = state.last_reason.value_or("");
  if (policy.reason != last_reason) {
    d.due = true;
    d.trigger = Trigger::kReason;
    d.why = "reason changed from '" + last_reason + "' to '" + policy.reason + "'";
    return d;
  }
  // A failed last attempt is retried (after retry_after) unless a slot
  // makes the source due anyway.
  auto retry = [&](DueDecision& d) {
    if (!state.last_failed || !state.last_attempt || now < *state.last_attempt + retry_after) return false;
    d.due = true;
    d.trigger = policy.schedule ? Trigger::kSchedule : Trigger::kReason;
    d.coalesced_slots = 0;
    d.why = "retry: the last backup (" + FormatRfc3339(*state.last_attempt) + ") failed";
    return true;
  };
  if (!policy.schedule) {
    if (retry(d)) return d;
    d.why = "no schedule and the reason is unchanged";
    return d;
  }
  if (!state.last_attempt) {
    d.due = true;
    d.coalesced_slots = 1;
    d.slot = now;
    d.why = "never backed up";
    return d;
  }
  SysSeconds after = *state.last_attempt;
  // Count the slots passed since the last attempt (bounded: a schedule
  // every minute missed for years needs no exact count).
  while (d.coalesced_slots < 10000) {
    auto slot = policy.schedule->Next(after);
    if (!slot.ok() || *slot > now) break;
    d.slot = *slot;
    ++d.coalesced_slots;
    after = *slot;
  }
  if (d.coalesced_slots == 0) {
    if (retry(d)) return d;
    d.why = d.next ? "next slot " + FormatRfc3339(*d.next) : "no slot ahead";
    return d;
  }
  d.due = true;
  d.why = "slot " + FormatRfc3339(*d.slot);
  if (d.coalesced_slots > 1) {
    d.why += " (" + std::string(d.coalesced_slots >= 10000 ? "10000+" : std::to_string(d.coalesced_slots)) +
             " slots since the last run, coalesced)";
  }
  return d;
}

TypeDecision DecideBackupType(const Policy& policy, const PolicySource& source,
                              const std::optional<ChainSummary>& chain, bool incremental_ok,
                              std::string_view not_ok_reason) {
  const bool can = source.kind == PolicySourceKind::kDomain ||
                   (source.kind != PolicySourceKind::kDomain && !source.changed_by.empty() &&
                    source.changed_by != "full");
  if (!can) {
    return {false, source.kind == PolicySourceKind::kNbd ? "NBD sources are full unless changed_by: digests"
                                                         : "changed_by full: every backup is full"};
  }
  if (!chain || chain->points == 0) return {false, "first backup of the source"};
  if (!incremental_ok) {
    return {false, not_ok_reason.empty() ? "change tracking not usable" : std::string(not_ok_reason)};
  }
  if (policy.full_every > 0 && chain->points >= policy.full_every) {
    return {false, "full_every " + std::to_string(policy.full_every) + " reached"};
  }
  return {true, "incremental in the chain on " + chain->target};
}

Result<Placement> PlaceBackup(const std::vector<TargetState>& targets, uint64_t allocated_bytes,
                              double free_space_multiple, const TypeDecision& type,
                              const std::optional<ChainSummary>& chain, const PickFn& pick) {
  const double needed = free_space_multiple * static_cast<double>(allocated_bytes);
  auto qualifies = [&](const TargetState& t) {
    return t.free_bytes.has_value() && static_cast<double>(*t.free_bytes) >= needed;
  };
  std::string chain_note;
  if (type.incremental && chain) {
    for (const auto& t : targets) {
      if (t.path != chain->target) continue;
      if (qualifies(t)) return Placement{t.path, true, type.reason};
      chain_note = "the chain's target " + t.path + " lacks space; ";
    }
    if (chain_note.empty()) chain_note = "the chain's target " + chain->target + " is no longer a policy target; ";
  }
  std::vector<size_t> best;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!qualifies(targets[i])) continue;
    if (!best.empty() && targets[i].successful_backups > targets[best[0]].successful_backups) continue;
    if (!best.empty() && targets[i].successful_backups < targets[best[0]].successful_backups) best.clear();
    best.push_back(i);
  }
  if (best.empty()) {
    if (std::none_of(targets.begin(), targets.end(), [](const TargetState& t) { return t.free_bytes.has_value(); }) &&
        !targets.empty()) {
      std::string m = "no target can be used";
      for (const auto& t : targets) m += "; " + t.path + ": " + t.error;
      return Error(targets.front().error_code, m);
    }
    char need[64];
    std::snprintf(need, sizeof need, "%.0f", needed);
    std::string m = "no target qualifies: each needs " + std::string(need) + " bytes free (" +
                    std::to_string(allocated_bytes) + " allocated x free_space_multiple " +
                    std::to_string(free_space_multiple).substr(0, 6) + ")";
    for (const auto& t : targets) {
      m += "; " + t.path + ": " + (t.free_bytes ? std::to_string(*t.free_bytes) + " bytes free" : t.error);
    }
    return Error::NoSpace(m);
  }
  size_t chosen = best[best.size() == 1 ? 0 : std::min(pick(best.size()), best.size() - 1)];
  const TargetState& t = targets[chosen];
  std::string reason = chain_note + (type.incremental ? "new chain" : type.reason) + " on the target with the fewest backups (" +
                       std::to_string(t.successful_backups) + ")";
  if (best.size() > 1) reason += ", chosen among " + std::to_string(best.size()) + " tied";
  return Placement{t.path, false, reason};
}

namespace {

// Points newest first; points of the same second keep their reverse scan
// order (a folder lists a chain's points oldest first).
std::vector<const RestorePoint*> NewestFirst(const std::vector<RestorePoint>& points) {
  std::vector<const RestorePoint*> sorted;
  for (auto it = points.rbegin(); it != points.rend(); ++it) sorted.push_back(&*it);
  std::stable_sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->time > b->time; });
  return sorted;
}

}  // namespace

std::set<std::string> KeepNewest(const std::vector<RestorePoint>& points, size_t count) {
  std::vector<const RestorePoint*> sorted = NewestFirst(points);
  std::set<std::string> keep;
  for (size_t i = 0; i < sorted.size() && i < count; ++i) keep.insert(sorted[i]->key);
  return keep;
}

Status CheckForgetPolicy(const ForgetPolicy& policy) {
  if (!policy.empty()) return OkStatus();
  return Error::InvalidArgument(
      "forget needs at least one keep rule (--keep-last, --keep-hourly, --keep-daily, --keep-weekly, "
      "--keep-monthly, --keep-yearly above 0, or --keep-within)");
}

Result<ForgetSelection> SelectForgetWhy(const std::vector<RestorePoint>& points, const ForgetPolicy& policy) {
  BARGE_RETURN_IF_ERROR(CheckForgetPolicy(policy));
  using namespace std::chrono;
  std::vector<const RestorePoint*> sorted = NewestFirst(points);
  // Each bucket rule: the period a time falls in, as a number (to compare)
  // and as the text the report shows.
  struct Period {
    int64_t value;
    std::string label;
  };
  auto hour_of = [](SysSeconds t) {
    const auto day = floor<days>(t);
    const int64_t h = floor<hours>(t - day).count();
    return Period{floor<hours>(t).time_since_epoch().count(),
                  FormatRfc3339(t).substr(0, 10) + "T" + (h < 10 ? "0" : "") + std::to_string(h)};
  };
  auto day_of = [](SysSeconds t) {
    return Period{floor<days>(t).time_since_epoch().count(), FormatRfc3339(t).substr(0, 10)};
  };
  auto week_of = [](SysSeconds t) {
    // ISO weeks start on Monday; day 0 (1970-01-01) was a Thursday, so
    // week w runs from day 7w-3 to 7w+3 and its Thursday (day 7w) names
    // its ISO year.
    int64_t d = floor<days>(t).time_since_epoch().count() + 3;
    int64_t w = d >= 0 ? d / 7 : -((-d + 6) / 7);
    const sys_days thursday{days{7 * w}};
    const year_month_day ymd{thursday};
    const int64_t doy = (thursday - sys_days{ymd.year() / January / 1}).count();
    char label[32];
    std::snprintf(label, sizeof label, "%04d-W%02d", static_cast<int>(ymd.year()), static_cast<int>(doy / 7 + 1));
    return Period{w, label};
  };
  auto month_of = [](SysSeconds t) {
    year_month_day ymd{floor<days>(t)};
    return Period{static_cast<int64_t>(static_cast<int>(ymd.year())) * 12 + static_cast<unsigned>(ymd.month()),
                  FormatRfc3339(t).substr(0, 7)};
  };
  auto year_of = [](SysSeconds t) {
    year_month_day ymd{floor<days>(t)};
    return Period{static_cast<int>(ymd.year()), FormatRfc3339(t).substr(0, 4)};
  };
  struct Bucket {
    const char* name;
    uint32_t left;
    std::function<Period(SysSeconds)> of;
    std::optional<int64_t> last;
  };
  std::vector<Bucket> buckets = {{"hourly", policy.keep_hourly, hour_of, {}},
                                 {"daily", policy.keep_daily, day_of, {}},
                                 {"weekly", policy.keep_weekly, week_of, {}},
                                 {"monthly", policy.keep_monthly, month_of, {}},
                                 {"yearly", policy.keep_yearly, year_of, {}}};
  ForgetSelection keep;
  uint32_t last_left = policy.keep_last;
  const std::string last_label = "last " + std::to_string(policy.keep_last);
  for (const RestorePoint* p : sorted) {
    if (last_left > 0) {
      keep[p->key].push_back(last_label);
      --last_left;
    }
    // A rule counts a period once, at its newest point.
    for (auto& b : buckets) {
      if (b.left == 0) continue;
      Period v = b.of(p->time);
      if (b.last && *b.last == v.value) continue;
      b.last = v.value;
      --b.left;
      keep[p->key].push_back(std::string(b.name) + " " + v.label);
    }
    if (policy.keep_within.count() > 0 && p->time > sorted.front()->time - policy.keep_within) {
      keep[p->key].push_back("within " + FormatDuration(policy.keep_within));
    }
  }
  return keep;
}

std::set<std::string> KeysOf(const ForgetSelection& selection) {
  std::set<std::string> keys;
  for (const auto& [key, rules] : selection) keys.insert(key);
  return keys;
}

RetentionPlan PlanRetention(const std::vector<RestorePoint>& points, const std::vector<ChainView>& chains,
                            const std::set<std::string>& keep_in) {
  RetentionPlan plan;
  // (chain_dir, id) -> restore point key.
  std::map<std::pair<std::string, std::string>, std::string> key_of;
  for (const auto& p : points) {
    for (const auto& part : p.parts) key_of[{part.chain_dir, part.id}] = p.key;
  }
  std::set<std::string> keep;
  for (const auto& p : points) {
    if (keep_in.count(p.key)) keep.insert(p.key);
  }
  // A base of other chains stays, whatever the rules say.
  std::map<std::string, std::string> anyway;
  for (const auto& c : chains) {
    for (const auto& [id, why] : c.pinned) {
      auto it = key_of.find({c.chain_dir, id});
      if (it == key_of.end() || keep.count(it->second)) continue;
      keep.insert(it->second);
      anyway[it->second] = why + " in " + c.chain_dir + " (a base is never removed or merged away)";
    }
  }
  auto kept = [&](const ChainView& c, size_t i) {
    auto it = key_of.find({c.chain_dir, c.ids[i]});
    // A point no restore point names (e.g. a folder scanned without a
    // record) is kept: retention removes only what it was asked to.
    return it == key_of.end() || keep.count(it->second) > 0;
  };
  // Points between kept points stay; a domain point stays whole. Repeat
  // until nothing changes (each round only adds to `keep`).
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& c : chains) {
      std::optional<size_t> first, last;
      for (size_t i = 0; i < c.ids.size(); ++i) {
        if (!kept(c, i)) continue;
        if (!first) first = i;
        last = i;
      }
      if (!first) continue;
      for (size_t i = *first + 1; i < *last; ++i) {
        if (kept(c, i)) continue;
        const std::string& key = key_of.at({c.chain_dir, c.ids[i]});
        keep.insert(key);
        anyway[key] = "needed by " + c.ids[*last] + " in " + c.chain_dir +
                      " (points in the middle of a chain cannot be removed)";
        changed = true;
      }
    }
  }
  for (const auto& c : chains) {
    std::optional<size_t> first, last;
    for (size_t i = 0; i < c.ids.size(); ++i) {
      if (!kept(c, i)) continue;
      if (!first) first = i;
      last = i;
    }
    if (!first) {
      if (!c.ids.empty()) plan.actions.push_back({RetentionActionKind::kRemoveChain, c.chain_dir, c.ids, ""});
      continue;
    }
    if (*last + 1 < c.ids.size()) {
      plan.actions.push_back({RetentionActionKind::kRemoveNewest, c.chain_dir,
                              std::vector<std::string>(c.ids.begin() + *last + 1, c.ids.end()), ""});
    }
    if (*first > 0) {
      plan.actions.push_back({RetentionActionKind::kMergeThrough, c.chain_dir,
                              std::vector<std::string>(c.ids.begin(), c.ids.begin() + *first), c.ids[*first]});
    }
  }
  std::vector<const RestorePoint*> sorted = NewestFirst(points);
  for (const RestorePoint* p : sorted) {
    (keep.count(p->key) ? plan.keep : plan.forget).push_back(p->key);
  }
  for (const auto& [key, why] : anyway) plan.kept_anyway.emplace_back(key, why);
  return plan;
}

std::vector<std::string> PlanTouchedFiles(const RetentionPlan& plan) {
  std::vector<std::string> files;
  for (const auto& a : plan.actions) {
    std::vector<std::string> ids = a.ids;
    if (a.kind == RetentionActionKind::kMergeThrough) ids.push_back(a.through);
    for (const auto& id : ids) {
      for (const char* ext : kPointFileExtensions) files.push_back(a.chain_dir + "/" + id + ext);
    }
  }
  return files;
}

}  // namespace barge::orchestrate
