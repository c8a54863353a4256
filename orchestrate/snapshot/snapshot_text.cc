#include "orchestrate/snapshot/snapshot_text.h"

#include <cstdio>

#include "formats/units.h"

namespace barge::orchestrate {
namespace {

using formats::HumanBytes;

// One table row: columns padded as printf's `fmt` says (any length).
template <typename... Args>
std::string Row(const char* fmt, Args... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string line(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::snprintf(line.data(), line.size() + 1, fmt, args...);
  return line;
}

}  // namespace

Result<SnapshotTarget> ResolveSnapshotTarget(const SnapshotTargetArgs& a, std::vector<std::string>& words) {
  SnapshotTarget t;
  std::vector<std::string> given;
  for (const auto& s : a.slots) {
    if (!s.empty()) given.push_back(s);
  }
  if (!a.domain.empty() || !a.disk.empty()) {
    if (a.domain.empty()) return Error::InvalidArgument("--disk needs --domain");
    if (a.disk.empty()) return Error::InvalidArgument("--domain needs --disk (the disk target, e.g. vda)");
    if (given.size() > a.names.size() - 1) {
      return Error::InvalidArgument("both an IMAGE and --domain given: name one of them");
    }
    t.domain = a.domain;
    t.disk = a.disk;
    t.libvirt_uri = a.connect;
    given.insert(given.begin(), "");
  } else {
    if (!a.connect.empty()) return Error::InvalidArgument("--connect needs --domain (an IMAGE is a local file)");
    if (given.empty()) return Error::InvalidArgument("name an IMAGE, or --domain D --disk vda");
    t.image = given[0];
  }
  for (size_t i = 1; i < a.names.size(); ++i) {
    if (i >= given.size()) return Error::InvalidArgument("missing " + a.names[i]);
    words.push_back(given[i]);
  }
  return t;
}

std::string ListedStateName(const std::map<std::string, StoredSnapshot>& states, const std::string& name) {
  auto it = states.find(name);
  return it == states.end() ? "created" : std::string(SnapshotStateName(it->second.state));
}

std::string SnapshotListText(const SnapshotListing& listing, const std::map<std::string, StoredSnapshot>& states) {
  const char* fmt = "%-4s %-20s %-20s %10s %10s %10s %10s %6s %s\n";
  std::string o = Row(fmt, "ID", "NAME", "CREATED", "VOL_SIZE", "REFERENCED", "USED", "WRITTEN", "RATIO", "STATE");
  for (const auto& e : listing.snapshots) {
    auto size = [&](uint64_t v) { return e.has_usage ? HumanBytes(v) : std::string("-"); };
    std::string name = e.info.name;
    if (auto it = states.find(e.info.name); it != states.end() && it->second.display_name != e.info.name) {
      name = it->second.display_name + " [" + e.info.name + "]";
    }
    const std::string ratio = e.has_usage ? Row("%.2fx", e.usage.compress_ratio) : "-";
    o += Row(fmt, e.info.id.c_str(), name.c_str(), formats::FormatRfc3339({static_cast<int64_t>(e.info.date_sec), 0}).c_str(),
             HumanBytes(e.info.virtual_size).c_str(), size(e.usage.referenced).c_str(), size(e.usage.used).c_str(),
             size(e.usage.written).c_str(), ratio.c_str(), ListedStateName(states, e.info.name).c_str());
  }
  if (listing.snapshots.empty()) o += "(no snapshots)\n";
  if (listing.has_usage) {
    o += "current state: referenced " + HumanBytes(listing.active.referenced) + ", only it holds " +
         HumanBytes(listing.active.used) + ", written since the last snapshot " + HumanBytes(listing.active.written) +
         "\n";
  }
  return o;
}

std::string ApplyText(const ApplyResult& r) {
  std::string o;
  for (const auto& a : r.actions) {
    o += "  " + std::string(ActionKindName(a.action.kind)) + " " + a.action.uuid + ": " +
         (a.ok ? a.action.reason : "FAILED: " + a.error) + "\n";
  }
  if (r.actions.empty()) o += "  nothing to do\n";
  for (const auto& s : r.snapshots) {
    o += Row("%-38s %-24s %s", s.stored.uuid.c_str(), s.stored.display_name.c_str(),
             std::string(SnapshotStateName(s.stored.state)).c_str());
    if (!s.stored.message.empty()) o += " (" + s.stored.message + ")";
    o += "\n";
  }
  return o;
}

std::optional<Error> ApplyFailure(const ApplyResult& r) {
  size_t failed = 0;
  std::string first;
  for (const auto& a : r.actions) {
    if (!a.ok && failed++ == 0) first = a.action.uuid + ": " + a.error;
  }
  if (failed == 0) return std::nullopt;
  return Error::IoError(std::to_string(failed) + " of " + std::to_string(r.actions.size()) +
                        " snapshot actions failed; first: " + first)
      .set_path(r.image);
}

}  // namespace barge::orchestrate
