// barge report: the status page of a policy from its records, for cron and
// systemd users (issue 42; docs/status_page.md). --html FILE writes the
// page serve shows at `/` (its chains' points inline), atomically, new
// pages private (0600), a page of ours already there keeping its mode; --json gives the same model as the result event.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "cli/common.h"
#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/report/status_html.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::cli {
namespace {

namespace orc = barge::orchestrate;

nlohmann::json TimeOrNull(const std::optional<orc::SysSeconds>& t) {
  return t ? nlohmann::json(orc::FormatRfc3339(*t)) : nlohmann::json(nullptr);
}

std::string StateOf(const orc::SourceStatus& s) { return std::string(orc::SourceState(s)); }

// The model as the result's fields (docs/json.md, "report").
nlohmann::json PolicyStatusJson(const orc::PolicyStatus& st) {
  using nlohmann::json;
  json sources = json::array();
  for (const orc::SourceStatus& s : st.sources) {
    json stored = json::array();
    for (const orc::StoredSample& x : s.stored) {
      stored.push_back({{"at", orc::FormatRfc3339(x.at)}, {"bytes", x.bytes}});
    }
    auto age = [&](const std::optional<orc::SysSeconds>& t) {
      // A record timed ahead of this clock (skew) is 0 seconds old, as the
      // text says.
      return t ? json(std::max<int64_t>(0, (st.generated_at - *t).count())) : json(nullptr);
    };
    sources.push_back({{"source", s.name},
                       {"kind", s.kind},
                       {"location", s.location},
                       {"state", StateOf(s)},
                       {"last_success_at", TimeOrNull(s.last_success)},
                       {"last_success_age_seconds", age(s.last_success)},
                       {"last_failure_at", TimeOrNull(s.last_failure)},
                       {"last_failure_reason", s.last_failure ? json(s.last_failure_reason) : json(nullptr)},
                       {"consecutive_failures", s.consecutive_failures},
                       {"successful_runs", s.successful_runs},
                       {"failed_runs", s.failed_runs},
                       {"known_since", orc::FormatRfc3339(s.known_since)},
                       {"points_kept", s.points_kept ? json(*s.points_kept) : json(nullptr)},
                       {"chain_dirs", s.chain_dirs},
                       {"backup_missing", s.backup_missing},
                       {"stored", stored}});
  }
  json targets = json::array();
  for (const orc::TargetStatus& t : st.targets) {
    targets.push_back({{"path", t.path}, {"up", t.up}, {"free_bytes", t.free_bytes}, {"size_bytes", t.total_bytes}});
  }
  return {{"policy", st.policy},
          {"policy_file", st.policy_file},
          {"generated_at", orc::FormatRfc3339(st.generated_at)},
          {"next_due_at", TimeOrNull(st.next_due)},
          {"max_duration_without_backup_seconds", st.max_duration_without_backup.count()},
          {"sources", sources},
          {"targets", targets}};
}

void PrintPolicyStatus(std::ostream& t, const orc::PolicyStatus& st) {
  t << "policy " << st.policy << " as of " << orc::FormatRfc3339(st.generated_at) << "; next scheduled run "
    << (st.next_due ? orc::FormatRfc3339(*st.next_due) : std::string("none")) << "\n";
  for (const orc::SourceStatus& s : st.sources) {
    t << "  " << s.name << ": " << StateOf(s) << "; last success "
      << (s.last_success ? orc::FormatRfc3339(*s.last_success) + " (" + orc::AgeText(*s.last_success, st.generated_at) +
                               " ago)"
                         : std::string("never"))
      << "; " << (s.points_kept ? std::to_string(*s.points_kept) : std::string("unknown")) << " point(s) kept";
    if (s.last_failure) t << "; last failure " << orc::FormatRfc3339(*s.last_failure) << ": " << s.last_failure_reason;
    t << "\n";
  }
}

struct ReportArgs {
  std::string policy, html, catalog;
};

int RunReport(const ReportArgs& a, Output& out) {
  Env& env = Env::Default();
  auto policy = orc::LoadPolicy(env, a.policy);
  if (!policy.ok()) return out.Fail(policy.error());
  auto catalog_path = orc::CatalogPathFromFlag(env, a.catalog);
  if (!catalog_path.ok()) return out.Fail(catalog_path.error());
  auto catalog = orc::PolicyCatalog::Open(env, *catalog_path);
  if (!catalog.ok()) return out.Fail(catalog.error());
  const orc::SysSeconds now = orc::NowSeconds();
  auto status = orc::CollectPolicyStatus(*policy, **catalog, env, now, now);
  if (!status.ok()) return out.Fail(status.error());
  const orc::PolicyStatus& st = *status;

  if (!a.html.empty()) {
    orc::StatusPageOptions o;
    o.chain_links = false;
    for (size_t i = 0; i < st.sources.size(); ++i) {
      for (size_t j = 0; j < st.sources[i].chain_dirs.size(); ++j) {
        auto section = orc::LoadChainSection(env, st, i, j);
        if (section.ok()) o.chain_sections.push_back(std::move(section).value());
        else out.Warning(section.error().ToString(), st.sources[i].chain_dirs[j]);
      }
    }
    // A new page is private; a page of ours already there keeps the mode
    // its owner gave it (a page published from cron stays readable).
    uint32_t mode = S_IRUSR | S_IWUSR;
    if (auto old = env.StatNoFollow(a.html); old.ok() && old->is_regular() && old->uid == ::geteuid()) {
      mode = old->mode & 0777;
    }
    if (Status s = env.WriteFileAtomic(a.html, orc::RenderStatusPage(st, o), true, mode); !s.ok()) {
      return out.Fail(s.error());
    }
  }
  nlohmann::json result = PolicyStatusJson(st);
  result["html_file"] = a.html.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.html);
  out.Result(result);
  PrintPolicyStatus(out.text(), st);
  if (!a.html.empty()) out.text() << "wrote " << a.html << "\n";
  return kExitOk;
}

}  // namespace

void RegisterReportCommand(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ReportArgs>();
  auto* cmd = AddCommand(app, "report",
                         "A policy's protection at a glance: last success and failure, points, alerts (--html FILE: "
                         "the status page)",
                         exit_code, [a](Output& out) { return RunReport(*a, out); });
  cmd->add_option("--policy", a->policy, "Policy file (YAML)")->required();
  cmd->add_option("--html", a->html, "Also write the status page there (mode 0600, replaced atomically)");
  cmd->add_option("--catalog", a->catalog, "Catalog database (run records)");
}

}  // namespace barge::cli
