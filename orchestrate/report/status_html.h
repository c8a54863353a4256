// The status page as HTML (issue 42; docs/status_page.md): server-rendered,
// no JavaScript, charts as inline SVG. Every text that comes from a file,
// a record or a name goes through HtmlEscape, the one escaping function.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "orchestrate/report/status_report.h"
#include "pipeline/chain_summary.h"

namespace barge::orchestrate {

// `text` safe as HTML element content and as a quoted attribute value: & < >
// " ' as character references; bytes that are not valid UTF-8, and control
// characters other than tab and newline, as U+FFFD.
std::string HtmlEscape(std::string_view text);

// One chain folder's points as `barge list` shows them (id, type, time,
// sizes, last verification): an HTML <section> whose id is `anchor`.
std::string RenderChainSection(const std::string& source, const pipeline::ChainListing& listing,
                               const std::string& anchor);

// RenderChainSection of chain folder `folder` of source `source` (indices
// into `status`), loaded with pipeline::ListChain through `env`; anchor
// "chain-SOURCE-FOLDER". kNotFound when either index is out of range: only
// folders the model found are ever read.
Result<std::string> LoadChainSection(Env& env, const PolicyStatus& status, size_t source, size_t folder);

struct StatusPageOptions {
  // Serve: a chain folder links to "/chain/<source index>/<folder index>";
  // "": the chain sections are in `chain_sections` below (report --html)
  // and link to their anchors "#chain-I-J".
  bool chain_links = true;
  std::vector<std::string> chain_sections;  // appended after the sources, in order
  // Serve: the daemon's own status line ("" in a report).
  std::string daemon_line;
};

// The whole page, a complete HTML document.
std::string RenderStatusPage(const PolicyStatus& status, const StatusPageOptions& options);

// A chain page of serve: the document around RenderChainSection.
std::string RenderChainPage(const PolicyStatus& status, const std::string& section);

// A horizontal bar chart as inline SVG: one bar per (label, value), the
// value printed with `unit` after it. `bench --svg` draws its stages so.
// Lengths are linear in the value, or logarithmic, the title then ending
// in "(log scale)", when the values span more than a factor of 100.
std::string SvgBarChart(const std::string& title, const std::vector<std::pair<std::string, double>>& bars,
                        const std::string& unit);

// The "bytes stored over time" line chart of one source as inline SVG
// ("" when there is no sample).
std::string SvgStoredChart(const std::vector<StoredSample>& samples);

}  // namespace barge::orchestrate
