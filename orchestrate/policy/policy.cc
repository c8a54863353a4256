// Policy files: YAML (yaml-cpp) to a validated Policy. yaml-cpp reports
// errors by exceptions; they are caught here and nowhere else.
#include "orchestrate/policy/policy.h"

#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/libvirt/nbd_ports.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "blockio/s3_client.h"
#include "orchestrate/schedule/time_text.h"
#include "pipeline/backup.h"
#include "pipeline/disk_identity.h"
#include "pipeline/file_access.h"

namespace barge::orchestrate {

namespace {

constexpr const char* kPolicyKeys[] = {
    "name",        "sources",     "reason",      "schedule",  "max_duration_without_backup",
    "retention_count", "targets", "free_space_multiple", "max_run_time", "max_parallel",
    "full_every",  "compression", "pre_hook",    "post_hook", "target_group",
};
constexpr const char* kSourceKeys[] = {"name",    "image", "bitmap",           "changed_by",    "domain",
                                       "tracker", "connect", "nbd", "tls_certificates", "nbd_port_range",
                                       "quiesce", "disk_id"};
constexpr const char* kHookKeys[] = {"command", "timeout"};
constexpr const char* kTargetKeys[] = {"path", "offsite"};
constexpr const char* kOffsiteKeys[] = {"to", "retention_count"};

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

template <size_t N>
std::string Suggest(std::string_view key, const char* const (&known)[N]) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const char* k : known) {
    std::string_view kv(k);
    size_t d = EditDistance(key, kv);
    bool prefix = key.size() >= 4 && (kv.starts_with(key) || key.starts_with(kv));
    if (prefix) d = std::min<size_t>(d, 1);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  if (best_d <= std::max<size_t>(2, key.size() / 3)) return " (did you mean '" + best + "'?)";
  std::string all;
  for (const char* k : known) all += std::string(all.empty() ? "" : ", ") + k;
  return " (known keys: " + all + ")";
}

bool ValidName(std::string_view s) {
  if (s.empty() || s.size() > 128 || s == "." || s == "..") return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') return false;
  }
  return true;
}

// Collects every problem with its place in the file.
class Checker {
 public:
  explicit Checker(std::string_view file) : file_(file) {}

  void Fail(const YAML::Mark& mark, const std::string& message) {
    if (mark.is_null()) {
      errors_.push_back(file_ + ": " + message);
    } else {
      errors_.push_back(file_ + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1) +
                        ": " + message);
    }
  }
  bool ok() const { return errors_.empty(); }
  Error ToError() const {
    std::string m;
    for (const auto& e : errors_) m += (m.empty() ? "" : "\n") + e;
    return Error::InvalidArgument(m);
  }

  // The scalar text of `node`; a problem (and nullopt) otherwise. A null
  // value is "" when `null_ok`.
  std::optional<std::string> Scalar(const YAML::Node& node, std::string_view key, bool null_ok = false) {
    if (node.IsNull() && null_ok) return std::string();
    if (!node.IsScalar()) {
      Fail(node.Mark(), "'" + std::string(key) + "' must be a single value");
      return std::nullopt;
    }
    return node.Scalar();
  }
  std::optional<uint64_t> Unsigned(const YAML::Node& node, std::string_view key, uint64_t min, uint64_t max) {
    auto s = Scalar(node, key);
    if (!s) return std::nullopt;
    bool digits = !s->empty() && s->size() <= 12 &&
                  std::all_of(s->begin(), s->end(), [](char c) { return c >= '0' && c <= '9'; });
    uint64_t v = digits ? std::strtoull(s->c_str(), nullptr, 10) : 0;
    if (!digits || v < min || v > max) {
      Fail(node.Mark(), "'" + std::string(key) + "' must be a whole number from " + std::to_string(min) + " to " +
                            std::to_string(max) + ", not '" + *s + "'");
      return std::nullopt;
    }
    return v;
  }
  std::optional<std::chrono::seconds> Duration(const YAML::Node& node, std::string_view key) {
    auto s = Scalar(node, key);
    if (!s) return std::nullopt;
    auto d = ParseDuration(*s);
    if (!d.ok()) {
      Fail(node.Mark(), "'" + std::string(key) + "': " + d.error().message());
      return std::nullopt;
    }
    return *d;
  }
  // Checks the keys of a map: known ones only, each once.
  template <size_t N>
  void Keys(const YAML::Node& map, const char* const (&known)[N], std::string_view what) {
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (!it->first.IsScalar()) {
        Fail(it->first.Mark(), "keys of " + std::string(what) + " must be plain words");
        continue;
      }
      const std::string& k = it->first.Scalar();
      if (!seen.insert(k).second) Fail(it->first.Mark(), "duplicate key '" + k + "'");
      if (std::find_if(std::begin(known), std::end(known), [&](const char* x) { return k == x; }) ==
          std::end(known)) {
        Fail(it->first.Mark(), "unknown key '" + k + "' in " + std::string(what) + Suggest(k, known));
      }
    }
  }

 private:
  std::string file_;
  std::vector<std::string> errors_;
};

std::optional<PolicyHook> ParseHook(Checker& c, const YAML::Node& node, std::string_view key) {
  PolicyHook h;
  if (node.IsScalar()) {
    h.command = node.Scalar();
  } else if (node.IsMap()) {
    c.Keys(node, kHookKeys, std::string(key));
    if (node["command"]) {
      if (auto s = c.Scalar(node["command"], "command")) h.command = *s;
    } else {
      c.Fail(node.Mark(), "'" + std::string(key) + "' needs a 'command'");
      return std::nullopt;
    }
    if (node["timeout"]) {
      if (auto d = c.Duration(node["timeout"], "timeout")) {
        if (d->count() == 0) c.Fail(node["timeout"].Mark(), "'timeout' must be more than 0");
        h.timeout = *d;
      }
    }
  } else {
    c.Fail(node.Mark(), "'" + std::string(key) + "' must be a command or a map with 'command' and 'timeout'");
    return std::nullopt;
  }
  if (h.command.empty()) {
    c.Fail(node.Mark(), "'" + std::string(key) + "' has an empty command");
    return std::nullopt;
  }
  return h;
}

std::optional<PolicySource> ParseSource(Checker& c, const YAML::Node& node) {
  if (!node.IsMap()) {
    c.Fail(node.Mark(), "each source must be a map with one of 'image', 'domain' or 'nbd'");
    return std::nullopt;
  }
  c.Keys(node, kSourceKeys, "a source");
  PolicySource s;
  s.line = node.Mark().line + 1;
  int kinds = 0;
  for (auto [key, kind] : {std::pair{"image", PolicySourceKind::kImage}, std::pair{"domain", PolicySourceKind::kDomain},
                           std::pair{"nbd", PolicySourceKind::kNbd}}) {
    if (!node[key]) continue;
    ++kinds;
    s.kind = kind;
    if (auto v = c.Scalar(node[key], key)) s.location = *v;
    if (s.location.empty()) c.Fail(node[key].Mark(), "'" + std::string(key) + "' is empty");
  }
  if (kinds != 1) {
    c.Fail(node.Mark(), kinds == 0 ? "a source needs one of 'image', 'domain' or 'nbd'"
                                   : "a source has exactly one of 'image', 'domain' or 'nbd'");
    return std::nullopt;
  }
  if (node["bitmap"]) {
    if (s.kind != PolicySourceKind::kImage) c.Fail(node["bitmap"].Mark(), "'bitmap' belongs to 'image' sources");
    if (auto v = c.Scalar(node["bitmap"], "bitmap")) s.bitmap = *v;
    if (s.bitmap.empty()) c.Fail(node["bitmap"].Mark(), "'bitmap' is empty");
  }
  if (node["changed_by"]) {
    if (auto v = c.Scalar(node["changed_by"], "changed_by")) s.changed_by = *v;
    const std::string& v = s.changed_by;
    if (s.kind == PolicySourceKind::kDomain) {
      c.Fail(node["changed_by"].Mark(), "'changed_by' belongs to 'image' and 'nbd' sources (a domain's tracker decides)");
    } else if (v != "bitmap" && v != "digests" && v != "bitmap+digests" && v != "full") {
      c.Fail(node["changed_by"].Mark(), "'changed_by' is one of bitmap, digests, bitmap+digests, full");
    } else if ((v == "bitmap" || v == "bitmap+digests") && s.bitmap.empty()) {
      c.Fail(node["changed_by"].Mark(), "'changed_by: " + v + "' needs a 'bitmap'");
    } else if (v == "digests" && !s.bitmap.empty()) {
      c.Fail(node["changed_by"].Mark(), "'changed_by: digests' reads no bitmap: drop 'bitmap' or use bitmap+digests");
    }
  } else if (s.kind == PolicySourceKind::kImage) {
    s.changed_by = s.bitmap.empty() ? "digests" : "bitmap";
  } else if (s.kind == PolicySourceKind::kNbd) {
    s.changed_by = "full";
  }
  if (node["disk_id"]) {
    if (s.kind == PolicySourceKind::kDomain) {
      c.Fail(node["disk_id"].Mark(), "'disk_id' belongs to 'image' and 'nbd' sources (a domain's disks are its own)");
    }
    if (auto v = c.Scalar(node["disk_id"], "disk_id")) s.disk_id = *v;
    if (Status ok = pipeline::CheckDiskId(s.disk_id); !ok.ok()) {
      c.Fail(node["disk_id"].Mark(), "'disk_id': " + ok.error().message());
    }
  }
  if (node["tracker"]) {
    if (s.kind != PolicySourceKind::kDomain) c.Fail(node["tracker"].Mark(), "'tracker' belongs to 'domain' sources");
    if (auto v = c.Scalar(node["tracker"], "tracker")) s.tracker = *v;
    if (!ValidName(s.tracker)) c.Fail(node["tracker"].Mark(), "tracker names are [A-Za-z0-9_.-]+");
  }
  if (node["connect"]) {
    if (s.kind != PolicySourceKind::kDomain) c.Fail(node["connect"].Mark(), "'connect' belongs to 'domain' sources");
    if (auto v = c.Scalar(node["connect"], "connect")) s.connect = *v;
    if (auto uri = ParseLibvirtUri(s.connect); !uri.ok()) {
      c.Fail(node["connect"].Mark(), "'connect' is " + uri.error().message());
    }
  }
  if (node["tls_certificates"]) {
    if (s.kind != PolicySourceKind::kDomain) {
      c.Fail(node["tls_certificates"].Mark(), "'tls_certificates' belongs to 'domain' sources");
    }
    if (auto v = c.Scalar(node["tls_certificates"], "tls_certificates")) s.tls_certificates = *v;
    if (s.tls_certificates.empty() || s.tls_certificates.front() != '/') {
      c.Fail(node["tls_certificates"].Mark(), "'tls_certificates' must be an absolute folder");
    }
  }
  if (node["nbd_port_range"]) {
    if (s.kind != PolicySourceKind::kDomain) {
      c.Fail(node["nbd_port_range"].Mark(), "'nbd_port_range' belongs to 'domain' sources");
    }
    if (auto v = c.Scalar(node["nbd_port_range"], "nbd_port_range")) s.nbd_port_range = *v;
    if (auto r = ParsePortRange(s.nbd_port_range); !r.ok()) {
      c.Fail(node["nbd_port_range"].Mark(), "'nbd_port_range' is a " + r.error().message());
    }
  }
  if (node["quiesce"]) {
    if (s.kind != PolicySourceKind::kDomain) c.Fail(node["quiesce"].Mark(), "'quiesce' belongs to 'domain' sources");
    if (auto v = c.Scalar(node["quiesce"], "quiesce")) {
      if (*v == "true") {
        s.quiesce = true;
      } else if (*v == "false") {
        s.quiesce = false;
      } else {
        c.Fail(node["quiesce"].Mark(), "'quiesce' is true or false, not '" + *v + "'");
      }
    }
  }
  if (s.kind == PolicySourceKind::kImage && !s.location.empty() && s.location.front() != '/') {
    c.Fail(node["image"].Mark(), "'image' must be an absolute path, not '" + s.location + "'");
  }
  if (s.kind == PolicySourceKind::kNbd && !s.location.starts_with("nbd")) {
    c.Fail(node["nbd"].Mark(), "'nbd' must be an NBD URI (nbd://, nbds://, nbd+unix://...), not '" + s.location + "'");
  }
  if (node["name"]) {
    if (auto v = c.Scalar(node["name"], "name")) s.name = *v;
    if (!ValidName(s.name)) c.Fail(node["name"].Mark(), "source names are [A-Za-z0-9_.-]+, not '" + s.name + "'");
  } else if (s.kind == PolicySourceKind::kDomain) {
    s.name = s.location;
  } else if (!s.location.empty()) {
    s.name = pipeline::DefaultDiskName(s.location);
  }
  return s;
}

void ParseSchedule(Checker& c, const YAML::Node& node, Env& env, Policy& p) {
  auto text = c.Scalar(node, "schedule", true);
  if (!text || text->empty()) return;
  std::string_view expr = *text;
  std::string zone_name;
  for (std::string_view prefix : {"CRON_TZ=", "TZ="}) {
    if (expr.starts_with(prefix)) {
      expr.remove_prefix(prefix.size());
      size_t end = expr.find_first_of(" \t");
      zone_name = std::string(expr.substr(0, end));
      expr = end == std::string_view::npos ? std::string_view() : expr.substr(end);
      // The expression is shown as written after the zone: no leading blank.
      while (!expr.empty() && (expr.front() == ' ' || expr.front() == '\t')) expr.remove_prefix(1);
      break;
    }
  }
  auto zone = TimeZone::Load(env, zone_name);
  if (!zone.ok()) {
    c.Fail(node.Mark(), "'schedule': " + zone.error().message());
    return;
  }
  auto s = CronSchedule::Parse(expr, *zone);
  if (!s.ok()) {
    c.Fail(node.Mark(), "'schedule': " + s.error().message());
    return;
  }
  p.schedule = std::move(s).value();
}

// A target or offsite location: an absolute folder (trailing slashes
// dropped) or s3://BUCKET/PREFIX; nullopt after failing `node`.
std::optional<std::string> ParseLocation(Checker& c, const YAML::Node& node, std::string_view key) {
  auto v = c.Scalar(node, key);
  if (!v) return std::nullopt;
  std::string t = *v;
  while (t.size() > 1 && t.back() == '/') t.pop_back();
  if (IsS3Url(t)) {
    auto loc = ParseS3Url(t);
    if (!loc.ok()) {
      c.Fail(node.Mark(), "'" + std::string(key) + "': " + loc.error().message());
      return std::nullopt;
    }
    return t;
  }
  if (t.empty() || t.front() != '/') {
    c.Fail(node.Mark(), std::string(key) + " must be absolute folders or s3://BUCKET/PREFIX, not '" + *v + "'");
    return std::nullopt;
  }
  return t;
}

// `offsite:` of `target`: a location, or {to: LOCATION, retention_count: N}.
void ParseOffsite(Checker& c, const YAML::Node& node, const std::string& target, Policy& p) {
  PolicyOffsite o{target, "", p.retention_count};
  std::optional<std::string> to;
  if (node.IsMap()) {
    c.Keys(node, kOffsiteKeys, "offsite");
    if (!node["to"]) {
      c.Fail(node.Mark(), "'offsite' needs 'to' (a folder or s3://BUCKET/PREFIX)");
      return;
    }
    to = ParseLocation(c, node["to"], "offsite");
    if (auto n = node["retention_count"]) {
      if (auto v = c.Unsigned(n, "retention_count", 1, 100000)) o.retention_count = static_cast<uint32_t>(*v);
    }
  } else {
    to = ParseLocation(c, node, "offsite");
  }
  if (!to) return;
  if (*to == target) {
    c.Fail(node.Mark(), "offsite '" + *to + "' is its own target: an offsite copy goes elsewhere");
    return;
  }
  for (const auto& other : p.offsites) {
    if (other.location == *to) {
      c.Fail(node.Mark(), "offsite '" + *to + "' is named twice");
      return;
    }
  }
  o.location = *to;
  p.offsites.push_back(std::move(o));
}

// `targets:`: each a location, or {path: LOCATION, offsite: ...}.
void ParseTargets(Checker& c, const YAML::Node& n, Policy& p) {
  if (!n.IsSequence() || n.size() == 0) {
    c.Fail(n.Mark(), "'targets' must be a non-empty list of folders");
    return;
  }
  for (const auto& item : n) {
    const bool map = item.IsMap();
    if (map) {
      c.Keys(item, kTargetKeys, "a target");
      if (!item["path"]) {
        c.Fail(item.Mark(), "a target needs 'path' (a folder or s3://BUCKET/PREFIX)");
        continue;
      }
    }
    auto t = ParseLocation(c, map ? item["path"] : item, "targets");
    if (!t) continue;
    if (std::find(p.targets.begin(), p.targets.end(), *t) != p.targets.end()) {
      c.Fail(item.Mark(), "target '" + *t + "' is listed twice");
      continue;
    }
    p.targets.push_back(*t);
    if (map && item["offsite"]) ParseOffsite(c, item["offsite"], *t, p);
  }
  for (const auto& o : p.offsites) {
    if (std::find(p.targets.begin(), p.targets.end(), o.location) != p.targets.end()) {
      c.Fail(n.Mark(), "offsite '" + o.location + "' is a target of the policy: an offsite copy goes elsewhere");
    }
  }
}

Result<Policy> ParseChecked(const YAML::Node& root, Checker& c, Env& env) {
  Policy p;
  if (!root.IsMap()) {
    c.Fail(root.Mark(), "a policy must be a map of fields (name, sources, targets, ...)");
    return c.ToError();
  }
  c.Keys(root, kPolicyKeys, "the policy");
  for (const char* required : {"name", "sources", "targets"}) {
    if (!root[required]) c.Fail(YAML::Mark::null_mark(), "missing required field '" + std::string(required) + "'");
  }
  if (auto n = root["name"]) {
    if (auto v = c.Scalar(n, "name")) p.name = *v;
    if (!ValidName(p.name)) c.Fail(n.Mark(), "policy names are [A-Za-z0-9_.-]+, not '" + p.name + "'");
  }
  if (auto n = root["sources"]) {
    if (!n.IsSequence() || n.size() == 0) {
      c.Fail(n.Mark(), "'sources' must be a non-empty list");
    } else {
      std::set<std::string> names;
      for (const auto& item : n) {
        auto s = ParseSource(c, item);
        if (!s) continue;
        if (!s->name.empty() && !names.insert(s->name).second) {
          c.Fail(item.Mark(), "two sources are named '" + s->name + "': give one a 'name'");
        }
        p.sources.push_back(std::move(*s));
      }
    }
  }
  if (auto n = root["reason"]) {
    if (auto v = c.Scalar(n, "reason", true)) p.reason = *v;
  }
  if (auto n = root["schedule"]) ParseSchedule(c, n, env, p);
  if (auto n = root["max_duration_without_backup"]) {
    if (auto d = c.Duration(n, "max_duration_without_backup")) p.max_duration_without_backup = *d;
  }
  if (auto n = root["retention_count"]) {
    if (auto v = c.Unsigned(n, "retention_count", 1, 100000)) p.retention_count = static_cast<uint32_t>(*v);
  }
  if (auto n = root["targets"]) ParseTargets(c, n, p);
  if (auto n = root["target_group"]) {
    if (auto v = c.Scalar(n, "target_group")) {
      if (auto gid = pipeline::LookupGroup(*v); !gid.ok()) {
        c.Fail(n.Mark(), "'target_group': " + gid.error().message());
      } else {
        p.target_group = *v;
      }
    }
  }
  if (auto n = root["free_space_multiple"]) {
    if (auto v = c.Scalar(n, "free_space_multiple")) {
      char* end = nullptr;
      double d = std::strtod(v->c_str(), &end);
      if (v->empty() || *end != '\0' || !std::isfinite(d) || d < 0 || d > 1000) {
        c.Fail(n.Mark(), "'free_space_multiple' must be a number from 0 to 1000, not '" + *v + "'");
      } else {
        p.free_space_multiple = d;
      }
    }
  }
  if (auto n = root["max_run_time"]) {
    if (auto d = c.Duration(n, "max_run_time")) p.max_run_time = *d;
  }
  if (auto n = root["max_parallel"]) {
    if (auto v = c.Unsigned(n, "max_parallel", 1, 64)) p.max_parallel = static_cast<uint32_t>(*v);
  }
  if (auto n = root["full_every"]) {
    if (auto v = c.Unsigned(n, "full_every", 0, 100000)) p.full_every = static_cast<uint32_t>(*v);
  }
  if (auto n = root["compression"]) {
    if (auto v = c.Scalar(n, "compression")) {
      auto cs = formats::ParseCompressionSpec(*v);
      if (!cs.ok()) {
        c.Fail(n.Mark(), "'compression': " + cs.error().message());
      } else {
        p.compression = cs->type;
        p.compression_level = cs->level;
      }
    }
  }
  if (auto n = root["pre_hook"]) p.pre_hook = ParseHook(c, n, "pre_hook");
  if (auto n = root["post_hook"]) p.post_hook = ParseHook(c, n, "post_hook");
  if (!c.ok()) return c.ToError();
  return p;
}

}  // namespace

std::string_view PolicySourceKindName(PolicySourceKind kind) {
  switch (kind) {
    case PolicySourceKind::kImage: return "image";
    case PolicySourceKind::kDomain: return "domain";
    case PolicySourceKind::kNbd: return "nbd";
  }
  return "?";
}

const PolicySource* Policy::FindSource(std::string_view source_name) const {
  for (const auto& s : sources) {
    if (s.name == source_name) return &s;
  }
  return nullptr;
}

const PolicyOffsite* Policy::OffsiteOf(std::string_view target) const {
  for (const auto& o : offsites) {
    if (o.target == target) return &o;
  }
  return nullptr;
}

bool IsBucketTarget(std::string_view location) { return IsS3Url(location); }

std::vector<std::string> PolicyLocations(const Policy& policy) {
  std::vector<std::string> out = policy.targets;
  for (const auto& o : policy.offsites) out.push_back(o.location);
  return out;
}

Result<Policy> ParsePolicy(Env& env, std::string_view yaml, std::string_view file_name) {
  Checker c(file_name);
  try {
    YAML::Node root = YAML::Load(std::string(yaml));
    return ParseChecked(root, c, env);
  } catch (const YAML::Exception& e) {
    c.Fail(e.mark, "YAML: " + e.msg);
    return c.ToError();
  } catch (const std::exception& e) {
    return Error::InvalidArgument(std::string(file_name) + ": " + e.what());
  }
}

Result<Policy> LoadPolicy(Env& env, const std::string& path) {
  auto text = env.ReadFile(path, 1 << 20);
  if (!text.ok()) return std::move(text).error().Wrap("policy");
  BARGE_ASSIGN_OR_RETURN(Policy policy, ParsePolicy(env, *text, path));
  policy.file = CanonicalPath(env, path);
  return policy;
}

std::vector<std::chrono::sys_seconds> NextRunTimes(const Policy& policy, std::chrono::sys_seconds after,
                                                   size_t count) {
  if (!policy.schedule) return {};
  return policy.schedule->NextN(after, count);
}

}  // namespace barge::orchestrate
