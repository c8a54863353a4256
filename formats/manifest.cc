// Manifest JSON encoding and validating decoder.
#include "formats/manifest.h"

#include <ctime>

#include <nlohmann/json.hpp>

#include "formats/json_fields.h"

namespace barge::formats {

using nlohmann::json;

std::string_view BackupTypeName(BackupType type) {
  return type == BackupType::kFull ? "full" : "incremental";
}

Result<std::string> EncodeManifest(const BackupManifest& m) {
  json j;
  j["format"] = "barge-backup-manifest";
  j["format_version"] = m.format_version;
  j["id"] = m.id;
  j["disk"] = m.disk;
  j["type"] = BackupTypeName(m.type);
  j["reason"] = m.reason;
  j["source"] = {{"name", m.source}, {"format", m.source_format}};
  j["virtual_size"] = m.virtual_size;
  j["cluster_size"] = m.cluster_size;
  j["compression"] = m.compression;
  j["image"] = m.image;
  j["digest_table"] = m.digest_table;
  if (!m.strong_digest_table.empty()) j["strong_digest_table"] = m.strong_digest_table;
  if (m.parent) {
    j["parent"] = {{"id", m.parent->id},
                   {"image", m.parent->image},
                   {"image_digest", m.parent->image_digest.ToHex()}};
  } else {
    j["parent"] = nullptr;
  }
  if (m.base) {
    j["base"] = {{"chain", m.base->chain},
                 {"id", m.base->id},
                 {"image", m.base->image},
                 {"image_digest", m.base->image_digest.ToHex()}};
    if (!m.base->chain_id.empty()) j["base"]["chain_id"] = m.base->chain_id;
  }
  j["checkpoint"] = m.checkpoint;
  j["dirty"] = {{"source", m.dirty_source}, {"bytes", m.dirty_bytes}};
  if (!m.changed_by.empty()) j["dirty"]["changed_by"] = m.changed_by;
  if (m.missed_clusters) j["dirty"]["missed_clusters"] = *m.missed_clusters;
  j["started_at"] = m.started_at;
  j["finished_at"] = m.finished_at;
  if (m.duration_seconds) j["duration_seconds"] = *m.duration_seconds;
  j["tool"] = {{"name", "barge"}, {"version", m.tool_version}};
  j["counts"] = {{"bytes_read", m.bytes_read},
                 {"bytes_written", m.bytes_written},
                 {"data_clusters", m.data_clusters},
                 {"compressed_clusters", m.compressed_clusters},
                 {"zero_clusters", m.zero_clusters}};
  j["image_digest"] = {{"algorithm", std::string(ImageDigestAlgorithmName(m.image_digest_algorithm))},
                       {"value", m.image_digest.ToHex()}};
  if (m.disk_identity) {
    const DiskIdentity& d = *m.disk_identity;
    j["disk_identity"] = {{"kind", d.kind}, {"location", d.location}, {"virtual_size", d.virtual_size}};
    if (!d.target.empty()) j["disk_identity"]["target"] = d.target;
    if (!d.source.empty()) j["disk_identity"]["source"] = d.source;
    if (!d.moved_from.empty()) j["disk_identity"]["moved_from"] = d.moved_from;
  }
  if (!m.chain_id.empty()) j["chain_id"] = m.chain_id;
  BARGE_ASSIGN_OR_RETURN(std::string text, DumpJson(j, 2, "manifest " + m.id + ".json"));
  return text + "\n";
}

namespace {

// Typed field access that reports instead of throwing.
class Reader {
 public:
  explicit Reader(const json& j) : j_(j) {}
  Status error() const { return err_ ? Status(*err_) : OkStatus(); }

  std::string Str(const json& obj, const char* key, bool required = true) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      if (required) Fail(std::string("missing field '") + key + "'");
      return {};
    }
    if (!it->is_string()) {
      Fail(std::string("field '") + key + "' is not a string");
      return {};
    }
    return it->get<std::string>();
  }
  uint64_t U64(const json& obj, const char* key, bool required = true) {
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) Fail(std::string("missing field '") + key + "'");
      return 0;
    }
    if (!it->is_number_unsigned()) {
      Fail(std::string("field '") + key + "' is not a non-negative integer");
      return 0;
    }
    return it->get<uint64_t>();
  }
  const json& Obj(const json& obj, const char* key) {
    static const json kEmpty = json::object();
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_object()) {
      Fail(std::string("missing object '") + key + "'");
      return kEmpty;
    }
    return *it;
  }
  Digest128 Hex(const std::string& hex, const char* what) {
    auto d = Digest128::FromHex(hex);
    if (!d.ok()) {
      Fail(std::string(what) + ": " + d.error().message());
      return {};
    }
    return *d;
  }
  std::string FileName(const std::string& name, const char* what, bool required = true) {
    if (name.empty() && !required) return name;
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      Fail(std::string(what) + " must be a plain file name in the chain folder");
    }
    return name;
  }
  // A file name of point `id` of the kind `ext` names: exactly id + ext.
  // A manifest that names another point's file (its image as a digest
  // table, say) would have verify read it and forget or merge delete it.
  void OwnName(const std::string& name, const std::string& id, const char* ext, const char* what) {
    if (err_ || name.empty()) return;
    if (name != id + ext) {
      Fail(std::string(what) + " '" + name + "' is not the file of point " + id + " (expected " + id + ext + ")");
    }
  }
  void Fail(std::string message) {
    if (!err_) err_ = Error::Corruption("manifest: " + std::move(message));
  }
  const json& root() const { return j_; }

 private:
  const json& j_;
  std::optional<Error> err_;
};

}  // namespace

bool IsBaseChainPath(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.back() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || (part != ".." && part.front() == '.')) return false;
    start = end + 1;
  }
  return true;
}

Result<BackupManifest> DecodeManifest(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Error::Corruption("manifest: not a JSON object");
  }
  Reader r(j);
  BackupManifest m;
  if (r.Str(j, "format") != "barge-backup-manifest") r.Fail("not a barge backup manifest");
  BARGE_RETURN_IF_ERROR(r.error());
  m.format_version = static_cast<uint32_t>(r.U64(j, "format_version"));
  BARGE_RETURN_IF_ERROR(r.error());
  if (m.format_version != kManifestFormatVersion) {
    return Error::NotSupported("manifest: format version " + std::to_string(m.format_version) +
                               " is not supported (this barge reads version " +
                               std::to_string(kManifestFormatVersion) + ")");
  }
  m.id = r.Str(j, "id");
  m.disk = r.Str(j, "disk");
  std::string type = r.Str(j, "type");
  if (type == "full") m.type = BackupType::kFull;
  else if (type == "incremental") m.type = BackupType::kIncremental;
  else r.Fail("type must be full or incremental");
  m.reason = r.Str(j, "reason", false);
  const json& source = r.Obj(j, "source");
  m.source = r.Str(source, "name", false);
  m.source_format = r.Str(source, "format", false);
  m.virtual_size = r.U64(j, "virtual_size");
  m.cluster_size = static_cast<uint32_t>(r.U64(j, "cluster_size"));
  if (m.cluster_size < 512 || m.cluster_size > (2u << 20) ||
      (m.cluster_size & (m.cluster_size - 1)) != 0) {
    r.Fail("cluster_size must be a power of two from 512 to 2 MiB");
  }
  m.compression = r.Str(j, "compression", false);
  m.image = r.FileName(r.Str(j, "image"), "image");
  m.digest_table = r.FileName(r.Str(j, "digest_table"), "digest_table");
  if (j.contains("strong_digest_table")) {
    m.strong_digest_table = r.FileName(r.Str(j, "strong_digest_table"), "strong_digest_table");
  }
  r.OwnName(m.image, m.id, ".qcow2", "image");
  r.OwnName(m.digest_table, m.id, ".digests", "digest_table");
  r.OwnName(m.strong_digest_table, m.id, ".sha256", "strong_digest_table");
  if (auto it = j.find("parent"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      r.Fail("parent must be an object or null");
    } else {
      ManifestParent p;
      p.id = r.Str(*it, "id");
      p.image = r.FileName(r.Str(*it, "image"), "parent image");
      p.image_digest = r.Hex(r.Str(*it, "image_digest"), "parent image_digest");
      r.OwnName(p.image, p.id, ".qcow2", "parent image");
      m.parent = p;
    }
  }
  if (m.type == BackupType::kIncremental && !m.parent) r.Fail("an incremental needs a parent");
  if (auto it = j.find("base"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      r.Fail("base must be an object or null");
    } else {
      ManifestBase b;
      b.chain = r.Str(*it, "chain");
      if (!IsBaseChainPath(b.chain)) r.Fail("base chain must be a relative folder path of '..' and plain names");
      b.id = r.Str(*it, "id");
      b.image = r.FileName(r.Str(*it, "image"), "base image");
      b.image_digest = r.Hex(r.Str(*it, "image_digest"), "base image_digest");
      r.OwnName(b.image, b.id, ".qcow2", "base image");
      b.chain_id = r.Str(*it, "chain_id", false);
      m.base = b;
    }
    if (m.parent) r.Fail("only a chain's first point (no parent) has a base");
  }
  m.checkpoint = r.Str(j, "checkpoint", false);
  if (auto it = j.find("dirty"); it != j.end() && it->is_object()) {
    m.dirty_source = r.Str(*it, "source", false);
    m.dirty_bytes = r.U64(*it, "bytes", false);
    m.changed_by = r.Str(*it, "changed_by", false);
    if (it->contains("missed_clusters")) m.missed_clusters = r.U64(*it, "missed_clusters");
  }
  m.started_at = r.Str(j, "started_at", false);
  m.finished_at = r.Str(j, "finished_at", false);
  if (auto it = j.find("duration_seconds"); it != j.end()) {
    if (!it->is_number() || it->get<double>() < 0) r.Fail("duration_seconds must be a number of seconds >= 0");
    else m.duration_seconds = it->get<double>();
  }
  if (auto it = j.find("tool"); it != j.end() && it->is_object()) {
    m.tool_version = r.Str(*it, "version", false);
  }
  if (auto it = j.find("counts"); it != j.end() && it->is_object()) {
    m.bytes_read = r.U64(*it, "bytes_read", false);
    m.bytes_written = r.U64(*it, "bytes_written", false);
    m.data_clusters = r.U64(*it, "data_clusters", false);
    m.compressed_clusters = r.U64(*it, "compressed_clusters", false);
    m.zero_clusters = r.U64(*it, "zero_clusters", false);
  }
  const json& digest = r.Obj(j, "image_digest");
  if (auto algorithm = ImageDigestAlgorithmFromName(r.Str(digest, "algorithm"))) {
    m.image_digest_algorithm = *algorithm;
  } else {
    r.Fail("unknown image digest algorithm");
  }
  m.image_digest = r.Hex(r.Str(digest, "value"), "image_digest");
  // Optional (older manifests lack them); present, they must be well formed:
  // a chain's disk check relies on them.
  if (auto it = j.find("disk_identity"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      r.Fail("disk_identity must be an object");
    } else {
      DiskIdentity d;
      d.kind = r.Str(*it, "kind");
      d.location = r.Str(*it, "location");
      d.target = r.Str(*it, "target", false);
      d.moved_from = r.Str(*it, "moved_from", false);
      d.virtual_size = r.U64(*it, "virtual_size");
      d.source = r.Str(*it, "source", false);
      if (d.kind.empty() || d.location.empty()) r.Fail("disk_identity needs a kind and a location");
      if (d.kind == "domain" && d.target.empty()) r.Fail("disk_identity of a domain needs the disk's target");
      m.disk_identity = std::move(d);
    }
  }
  m.chain_id = r.Str(j, "chain_id", false);
  BARGE_RETURN_IF_ERROR(r.error());
  return m;
}

std::string NowRfc3339() {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string CompactTimestamp(std::string_view rfc3339) {
  std::string out;
  for (char c : rfc3339) {
    if (c != '-' && c != ':') out += c;
  }
  return out;
}

}  // namespace barge::formats
