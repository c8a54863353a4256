// The status page's escaping, rendering and charts, and the alert rule it
// shows (orchestrate/report/status_html.h, status_report.h).
#include "orchestrate/report/status_html.h"

#include <gtest/gtest.h>

#include "orchestrate/policy/policy_metrics.h"

namespace barge::orchestrate {
namespace {

using std::chrono::seconds;

SysSeconds At(int64_t s) { return SysSeconds(seconds(s)); }

TEST(HtmlEscapeTest, MarkupQuotesAmpersandsAndBadBytes) {
  EXPECT_EQ(HtmlEscape("<script>alert(1)</script>"), "&lt;script&gt;alert(1)&lt;/script&gt;");
  EXPECT_EQ(HtmlEscape("a \"b\" 'c' & d"), "a &quot;b&quot; &#39;c&#39; &amp; d");
  EXPECT_EQ(HtmlEscape("&amp;"), "&amp;amp;");  // escaped again, never taken as a reference
  EXPECT_EQ(HtmlEscape("gr\xc3\xbc\xc3\x9f"), "gr\xc3\xbc\xc3\x9f");  // valid UTF-8 stays
  EXPECT_EQ(HtmlEscape("\xe2\x9c\x93 ok"), "\xe2\x9c\x93 ok");
  EXPECT_EQ(HtmlEscape("a\xff" "b"), "a&#xFFFD;b");                  // not UTF-8
  EXPECT_EQ(HtmlEscape("\xc0\xbc"), "&#xFFFD;&#xFFFD;");             // an overlong '<'
  EXPECT_EQ(HtmlEscape("\xed\xa0\x80"), "&#xFFFD;&#xFFFD;&#xFFFD;"); // a surrogate
  EXPECT_EQ(HtmlEscape("\xe2\x9c"), "&#xFFFD;&#xFFFD;");             // cut short
  EXPECT_EQ(HtmlEscape(std::string("a\0b\x1b", 4)), "a&#xFFFD;b&#xFFFD;");
  EXPECT_EQ(HtmlEscape("tab\tnew\nline"), "tab\tnew\nline");
}

TEST(AgeTextTest, LargestTwoUnits) {
  EXPECT_EQ(AgeText(At(100), At(100)), "0s");
  EXPECT_EQ(AgeText(At(100), At(145)), "45s");
  EXPECT_EQ(AgeText(At(0), At(3 * 3600 + 12 * 60 + 5)), "3h 12m");
  EXPECT_EQ(AgeText(At(0), At(2 * 86400 + 4 * 3600 + 7)), "2d 4h");
  EXPECT_EQ(AgeText(At(200), At(100)), "0s");  // in the future
}

// BargeBackupMissing of deploy/prometheus/barge-rules.yml, as the page
// shows it.
TEST(BackupMissingTest, AsTheShippedRule) {
  SourceMetrics m;
  m.known_since = At(1000);
  EXPECT_FALSE(BackupMissing(m, seconds(0), At(1000000)));  // threshold 0: off
  EXPECT_FALSE(BackupMissing(m, seconds(60), At(1060)));    // not more than the threshold yet
  EXPECT_TRUE(BackupMissing(m, seconds(60), At(1061)));     // never succeeded: from known_since
  m.stats.last_success = At(5000);
  EXPECT_FALSE(BackupMissing(m, seconds(60), At(5030)));
  EXPECT_TRUE(BackupMissing(m, seconds(60), At(5061)));
}

PolicyStatus HostileStatus() {
  PolicyStatus st;
  st.policy = "p";
  st.policy_file = "/etc/barge/p.yaml";
  st.generated_at = At(1'800'000'000);
  st.max_duration_without_backup = seconds(3600);
  st.next_due = At(1'800'003'600);
  SourceStatus good;
  good.name = "good";
  good.kind = "image";
  good.last_success = At(1'800'000'000 - 125);
  good.successful_runs = 2;
  good.points_kept = 2;
  good.chain_dirs = {"/t/p/<b>chain"};
  good.stored = {{At(1'799'990'000), 1 << 20}, {At(1'800'000'000 - 125), 3 << 20}};
  SourceStatus bad;
  bad.name = "<script>alert('x')</script>";
  bad.kind = "nbd";
  bad.location = "nbd://host/export";
  bad.last_failure = At(1'800'000'000 - 7200);
  bad.last_failure_reason = "cannot open <img src=x onerror=alert(1)>";
  bad.failed_runs = 3;
  bad.consecutive_failures = 3;
  bad.points_kept = 0;
  bad.backup_missing = true;
  st.sources = {good, bad};
  st.targets = {{"/t", true, 10 << 20, 20 << 20}};
  return st;
}

TEST(StatusPageRenderTest, FactsShownAndEveryNameEscaped) {
  const std::string page = RenderStatusPage(HostileStatus(), {});
  EXPECT_EQ(page.find("<script"), std::string::npos) << page;
  EXPECT_EQ(page.find("<img"), std::string::npos);
  EXPECT_EQ(page.find("<b>"), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(page.find("cannot open &lt;img src=x onerror=alert(1)&gt;"), std::string::npos);
  EXPECT_NE(page.find("(2m 5s ago)"), std::string::npos);   // the good source's age
  EXPECT_NE(page.find("(2h 0m ago)"), std::string::npos);   // the bad source's failure
  EXPECT_NE(page.find("BACKUP MISSING"), std::string::npos);
  EXPECT_NE(page.find("3 failed (3 in a row)"), std::string::npos);
  EXPECT_NE(page.find("2 source(s): 1 failing, 1 without a backup for too long"), std::string::npos);
  EXPECT_NE(page.find("href=\"/chain/0/0\""), std::string::npos);
  EXPECT_NE(page.find("<svg class=\"chart\""), std::string::npos);
  EXPECT_NE(page.find("3 MiB written by 2 kept run(s)"), std::string::npos) << page;
  EXPECT_NE(page.find("2027-01-15T09:00:00Z"), std::string::npos);  // next due
  EXPECT_EQ(page.find("<script"), std::string::npos);
}

TEST(StatusPageRenderTest, SourceWithoutPointsOrUncountedIsNotOk) {
  PolicyStatus st = HostileStatus();
  SourceStatus none = st.sources[0];
  none.name = "none";
  none.points_kept = 0;  // no failure, not yet missing, nothing kept
  SourceStatus moved = st.sources[0];
  moved.name = "moved";
  moved.points_kept.reset();
  moved.points_problem = "target /gone cannot be read";
  EXPECT_EQ(SourceState(st.sources[0]), "ok");
  EXPECT_EQ(SourceState(none), "unprotected");
  EXPECT_EQ(SourceState(moved), "unknown");
  EXPECT_EQ(SourceState(st.sources[1]), "backup_missing");
  st.sources = {none, moved};
  const std::string page = RenderStatusPage(st, {});
  EXPECT_EQ(page.find(">OK<"), std::string::npos) << page;
  EXPECT_NE(page.find("<span class=\"alert\">UNPROTECTED</span>"), std::string::npos) << page;
  EXPECT_NE(page.find("<span class=\"alert\">UNKNOWN</span>"), std::string::npos) << page;
  EXPECT_NE(page.find("unknown <span class=\"reason\">target /gone cannot be read"), std::string::npos) << page;
  EXPECT_NE(page.find("<span class=\"alert\" id=\"summary\">2 source(s): 0 failing, 0 without a backup for too "
                      "long, 2 unprotected or unknown</span>"),
            std::string::npos)
      << page;
}

TEST(StatusPageRenderTest, ReportLinksToItsOwnSections) {
  StatusPageOptions o;
  o.chain_links = false;
  o.chain_sections = {"<section id=\"chain-0-0\"></section>"};
  const std::string page = RenderStatusPage(HostileStatus(), o);
  EXPECT_NE(page.find("href=\"#chain-0-0\""), std::string::npos);
  EXPECT_NE(page.find("<section id=\"chain-0-0\">"), std::string::npos);
}

TEST(SvgBarChartTest, BarsScaledToTheLargest) {
  const std::string svg = SvgBarChart("stages <&>", {{"read", 100}, {"zstd", 50}}, "MiB/s");
  EXPECT_NE(svg.find("<title>stages &lt;&amp;&gt;</title>"), std::string::npos);
  EXPECT_NE(svg.find("width=\"380.0\""), std::string::npos) << svg;  // the largest: the whole width
  EXPECT_NE(svg.find("width=\"190.0\""), std::string::npos);
  EXPECT_NE(svg.find("100.0 MiB/s"), std::string::npos);
  EXPECT_EQ(svg.find("log scale"), std::string::npos);
}

TEST(SvgBarChartTest, ValuesOverOrdersOfMagnitudeGetALabelledLogScale) {
  // 10000 down to 2: linear, the smallest bar would be 0.08 wide.
  const std::string svg = SvgBarChart("stages", {{"read", 10000}, {"zstd", 100}, {"hash", 2}}, "MiB/s");
  EXPECT_NE(svg.find("<title>stages (log scale)</title>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">stages (log scale)</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("width=\"380.0\""), std::string::npos) << svg;  // the largest: the whole width
  // 5 decades drawn (4 spanned, and one for the smallest): 100 is two
  // decades below the top, 2 is log10(5000) below it.
  EXPECT_NE(svg.find("width=\"228.0\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("width=\"98.9\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("2.0 MiB/s"), std::string::npos);
}

}  // namespace
}  // namespace barge::orchestrate
