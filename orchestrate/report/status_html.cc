// The status page as HTML (orchestrate/report/status_html.h).
#include "orchestrate/report/status_html.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "formats/units.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {

namespace {

constexpr const char* kReplacement = "&#xFFFD;";

// Length of the valid UTF-8 sequence at text[i] (2..4), 0 when it is not one
// (overlong forms, surrogates and code points above U+10FFFF included).
size_t Utf8Length(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = b(i);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string TimeCell(const std::optional<SysSeconds>& t, SysSeconds now, const char* none) {
  if (!t) return std::string("<span class=\"none\">") + none + "</span>";
  return "<time datetime=\"" + FormatRfc3339(*t) + "\">" + FormatRfc3339(*t) + "</time> <span class=\"age\">(" +
         AgeText(*t, now) + " ago)</span>";
}

const char* kStyle =
    "body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}th{background:#f3f3f3}"
    ".ok{color:#176f2c;font-weight:bold}.alert{color:#b00020;font-weight:bold}.none{color:#888}"
    ".age{color:#555}.reason{font-family:monospace;white-space:pre-wrap;word-break:break-all;max-width:40em}"
    "td.name{max-width:24em;word-break:break-all}time{white-space:nowrap}";

std::string Head(const std::string& title) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + HtmlEscape(title) +
         "</title><style>" + kStyle + "</style></head><body>\n";
}

std::string SourceRow(const PolicyStatus& st, size_t index, const SourceStatus& s, const StatusPageOptions& o) {
  std::string h = "<tr class=\"source\" id=\"source-" + std::to_string(index) + "\">";
  h += "<td class=\"name\">" + HtmlEscape(s.name) + "<br><span class=\"none\">" + HtmlEscape(s.kind) + " " +
       HtmlEscape(s.location) + "</span></td>";
  const std::string_view state = SourceState(s);
  std::string shown = state == "backup_missing" ? "BACKUP MISSING" : std::string(state);
  std::transform(shown.begin(), shown.end(), shown.begin(), [](unsigned char c) { return std::toupper(c); });
  h += "<td class=\"state\"><span class=\"" + std::string(state == "ok" ? "ok" : "alert") + "\">" + shown +
       "</span></td>";
  h += "<td class=\"last-success\">" + TimeCell(s.last_success, st.generated_at, "never") + "</td>";
  h += "<td class=\"last-failure\">" + TimeCell(s.last_failure, st.generated_at, "none");
  if (s.last_failure) h += "<div class=\"reason\">" + HtmlEscape(s.last_failure_reason) + "</div>";
  h += "</td>";
  h += "<td class=\"runs\">" + std::to_string(s.successful_runs) + " ok, " + std::to_string(s.failed_runs) +
       " failed";
  if (s.consecutive_failures > 0) h += " (" + std::to_string(s.consecutive_failures) + " in a row)";
  h += "</td><td class=\"points\">";
  h += s.points_kept ? std::to_string(*s.points_kept)
                     : "unknown <span class=\"reason\">" + HtmlEscape(s.points_problem) + "</span>";
  for (size_t j = 0; j < s.chain_dirs.size(); ++j) {
    const std::string where = "/" + std::to_string(index) + "/" + std::to_string(j);
    const std::string href =
        o.chain_links ? "/chain" + where : "#chain-" + std::to_string(index) + "-" + std::to_string(j);
    h += "<br><a class=\"chain\" href=\"" + HtmlEscape(href) + "\">" + HtmlEscape(s.chain_dirs[j]) + "</a>";
  }
  h += "</td><td class=\"stored\">" + SvgStoredChart(s.stored) + "</td></tr>\n";
  return h;
}

}  // namespace

std::string HtmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&#39;"; break;
        default:
          if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7F) out += kReplacement;
          else out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const size_t n = Utf8Length(text, i);
    if (n == 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string SvgStoredChart(const std::vector<StoredSample>& samples) {
  if (samples.empty()) return "<span class=\"none\">no point stored</span>";
  constexpr double kW = 220, kH = 60, kPad = 4;
  const double t0 = static_cast<double>(samples.front().at.time_since_epoch().count());
  const double t1 = static_cast<double>(samples.back().at.time_since_epoch().count());
  const double top = static_cast<double>(std::max<uint64_t>(samples.back().bytes, 1));
  std::string pts, dots;
  for (const StoredSample& s : samples) {
    const double t = static_cast<double>(s.at.time_since_epoch().count());
    const double x = t1 > t0 ? kPad + (t - t0) / (t1 - t0) * (kW - 2 * kPad) : kW / 2;
    const double y = kH - kPad - static_cast<double>(s.bytes) / top * (kH - 2 * kPad);
    pts += Fmt("%.1f", x) + "," + Fmt("%.1f", y) + " ";
    dots += "<circle cx=\"" + Fmt("%.1f", x) + "\" cy=\"" + Fmt("%.1f", y) + "\" r=\"2.5\" fill=\"#2a6fb0\"/>";
  }
  std::string label = HtmlEscape(formats::HumanBytes(samples.back().bytes)) + " written by " +
                      std::to_string(samples.size()) + " kept run(s)";
  return "<svg class=\"chart\" role=\"img\" width=\"220\" height=\"60\" viewBox=\"0 0 220 60\"><title>" + label +
         "</title><rect width=\"220\" height=\"60\" fill=\"#f7f7f7\"/><polyline fill=\"none\" stroke=\"#2a6fb0\" "
         "stroke-width=\"2\" points=\"" + pts + "\"/>" + dots + "</svg><br><span class=\"stored-total\">" + label +
         "</span>";
}

std::string SvgBarChart(const std::string& title, const std::vector<std::pair<std::string, double>>& bars,
                        const std::string& unit) {
  constexpr double kLabelW = 130, kBarW = 380, kRow = 24, kTop = 30;
  double top = 0, least = 0;  // the largest value, the smallest above 0
  for (const auto& b : bars) {
    top = std::max(top, b.second);
    if (b.second > 0 && (least == 0 || b.second < least)) least = b.second;
  }
  if (top <= 0) top = 1;
  // Values over more than two orders of magnitude: a linear bar of the
  // smallest would be a sliver, so lengths are logarithmic, the largest
  // the whole width and each decade below it 1/decades less (the smallest
  // still a visible bar), and the title says so.
  const bool log_scale = least > 0 && top / least > 100;
  const double decades = log_scale ? std::ceil(std::log10(top / least)) + 1 : 1;
  const std::string heading = title + (log_scale ? " (log scale)" : "");
  const double height = kTop + kRow * static_cast<double>(bars.size()) + 10;
  const double width = kLabelW + kBarW + 120;
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Fmt("%.0f", width) + "\" height=\"" +
                    Fmt("%.0f", height) + "\" font-family=\"sans-serif\" font-size=\"12\"><title>" +
                    HtmlEscape(heading) + "</title><text x=\"4\" y=\"18\" font-size=\"14\" font-weight=\"bold\">" +
                    HtmlEscape(heading) + "</text>\n";
  double y = kTop;
  for (const auto& [label, value] : bars) {
    const double w = value <= 0     ? 0.0
                     : log_scale ? kBarW * (1 - std::log10(top / value) / decades)
                                 : value / top * kBarW;
    svg += "<text x=\"4\" y=\"" + Fmt("%.0f", y + 15) + "\">" + HtmlEscape(label) + "</text><rect x=\"" +
           Fmt("%.0f", kLabelW) + "\" y=\"" + Fmt("%.0f", y + 3) + "\" width=\"" + Fmt("%.1f", w) +
           "\" height=\"16\" fill=\"#2a6fb0\"/><text x=\"" + Fmt("%.1f", kLabelW + w + 6) + "\" y=\"" +
           Fmt("%.0f", y + 15) + "\">" + Fmt("%.1f", value) + " " + HtmlEscape(unit) + "</text>\n";
    y += kRow;
  }
  return svg + "</svg>\n";
}

std::string RenderChainSection(const std::string& source, const pipeline::ChainListing& l, const std::string& anchor) {
  std::string h = "<section class=\"chain\" id=\"" + HtmlEscape(anchor) + "\"><h2>Chain " + HtmlEscape(l.chain_dir) +
                  " <span class=\"none\">(source " + HtmlEscape(source) + ")</span></h2>\n";
  h += "<p class=\"count\">" + std::to_string(l.points.size()) + " point(s), " +
       HtmlEscape(formats::HumanBytes(l.image_bytes)) + " stored</p>\n";
  h += "<table class=\"points\"><tr><th>#</th><th>id</th><th>type</th><th>started</th><th>virtual size</th>"
       "<th>stored</th><th>written</th><th>last verification</th></tr>\n";
  for (const pipeline::PointView& p : l.points) {
    const formats::BackupManifest& m = p.manifest;
    std::string verification = "<span class=\"none\">never</span>";
    if (p.verification) {
      verification = std::string(p.verification->record.ok ? "<span class=\"ok\">ok</span> "
                                                            : "<span class=\"alert\">FAILED</span> ") +
                     HtmlEscape(p.verification->record.verified_at) + (p.verification->stale ? " (stale)" : "");
    }
    h += "<tr class=\"point\"><td>" + std::to_string(p.position) + "</td><td class=\"id\">" + HtmlEscape(m.id) +
         "</td><td>" + HtmlEscape(formats::BackupTypeName(m.type)) + "</td><td>" + HtmlEscape(m.started_at) +
         "</td><td>" + HtmlEscape(formats::HumanBytes(m.virtual_size)) + "</td><td>" +
         (p.image ? HtmlEscape(formats::HumanBytes(p.image->size_bytes)) : "<span class=\"alert\">missing</span>") +
         "</td><td>" + HtmlEscape(formats::HumanBytes(m.bytes_written)) + "</td><td>" + verification + "</td></tr>\n";
  }
  h += "</table>\n";
  for (const auto& w : l.warnings) h += "<p class=\"alert\">" + HtmlEscape(w.message) + "</p>\n";
  return h + "</section>\n";
}

Result<std::string> LoadChainSection(Env& env, const PolicyStatus& st, size_t source, size_t folder) {
  if (source >= st.sources.size() || folder >= st.sources[source].chain_dirs.size()) {
    return Error::NotFound("no chain folder " + std::to_string(source) + "/" + std::to_string(folder) +
                           " in policy " + st.policy);
  }
  const SourceStatus& s = st.sources[source];
  BARGE_ASSIGN_OR_RETURN(pipeline::ChainListing listing, pipeline::ListChain(env, s.chain_dirs[folder]));
  return RenderChainSection(s.name, listing, "chain-" + std::to_string(source) + "-" + std::to_string(folder));
}

std::string RenderStatusPage(const PolicyStatus& st, const StatusPageOptions& o) {
  std::string h = Head("barge: policy " + st.policy);
  h += "<h1>Policy " + HtmlEscape(st.policy) + "</h1>\n<p class=\"summary\">";
  // Sources without a point, or with points not counted, are named too.
  size_t missing = 0, failing = 0, other = 0;
  for (const SourceStatus& s : st.sources) {
    missing += s.backup_missing ? 1 : 0;
    failing += s.consecutive_failures > 0 ? 1 : 0;
    const std::string_view state = SourceState(s);
    other += state == "unprotected" || state == "unknown" ? 1 : 0;
  }
  h += "<span class=\"" + std::string(missing + failing + other ? "alert" : "ok") + "\" id=\"summary\">" +
       std::to_string(st.sources.size()) + " source(s): " + std::to_string(failing) + " failing, " +
       std::to_string(missing) + " without a backup for too long" +
       (other ? ", " + std::to_string(other) + " unprotected or unknown" : "") + "</span><br>";
  h += "as of <time datetime=\"" + FormatRfc3339(st.generated_at) + "\">" + FormatRfc3339(st.generated_at) +
       "</time>; file " + HtmlEscape(st.policy_file) + "; next scheduled run: " +
       (st.next_due ? "<time id=\"next-due\" datetime=\"" + FormatRfc3339(*st.next_due) + "\">" +
                          FormatRfc3339(*st.next_due) + "</time>"
                    : std::string("<span class=\"none\">none (no schedule)</span>")) +
       "; no-backup alert after " +
       (st.max_duration_without_backup.count() > 0 ? HtmlEscape(FormatDuration(st.max_duration_without_backup))
                                                    : std::string("off")) +
       "</p>\n";
  if (!o.daemon_line.empty()) h += "<p class=\"daemon\">" + HtmlEscape(o.daemon_line) + "</p>\n";
  h += "<table class=\"sources\"><tr><th>source</th><th>state</th><th>last success</th><th>last failure</th>"
       "<th>runs</th><th>points kept</th><th>bytes stored over time</th></tr>\n";
  for (size_t i = 0; i < st.sources.size(); ++i) h += SourceRow(st, i, st.sources[i], o);
  h += "</table>\n<h2>Targets</h2><table class=\"targets\"><tr><th>target</th><th>state</th><th>free</th>"
       "<th>size</th></tr>\n";
  for (const TargetStatus& t : st.targets) {
    h += "<tr><td>" + HtmlEscape(t.path) + "</td><td>" +
         (t.up ? "<span class=\"ok\">up</span>" : "<span class=\"alert\">unavailable</span>") + "</td><td>" +
         HtmlEscape(formats::HumanBytes(t.free_bytes)) + "</td><td>" + HtmlEscape(formats::HumanBytes(t.total_bytes)) +
         "</td></tr>\n";
  }
  h += "</table>\n";
  for (const std::string& section : o.chain_sections) h += section;
  return h + "</body></html>\n";
}

std::string RenderChainPage(const PolicyStatus& st, const std::string& section) {
  return Head("barge: policy " + st.policy + ": chain") + "<p><a href=\"/\">&larr; policy " + HtmlEscape(st.policy) +
         "</a></p>\n" + section + "</body></html>\n";
}

}  // namespace barge::orchestrate
