// Verification records: <id>.verified beside a point's manifest.
#include "pipeline/verification_record.h"

#include <algorithm>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "blockio/env.h"
#include "formats/json_fields.h"
#include "formats/units.h"
#include "pipeline/chain_files.h"
#include "pipeline/file_access.h"

namespace barge::pipeline {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "barge-verification";
constexpr int kVersion = 1;
constexpr uint64_t kMaxRecordBytes = 1 << 20;

Error Bad(const std::string& what) { return Error::Corruption("verification record: " + what); }

}  // namespace

std::string VerificationFileName(std::string_view id) { return std::string(id) + ".verified"; }

Result<std::string> EncodeVerificationRecord(const VerificationRecord& r) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["format_version"] = kVersion;
  j["id"] = r.id;
  j["result"] = r.ok ? "ok" : "failed";
  j["error"] = r.error;
  j["verified_at"] = r.verified_at;
  j["duration_seconds"] = r.duration_seconds;
  j["clusters_checked"] = r.clusters_checked;
  j["image"] = r.image;
  j["image_bytes"] = r.image_bytes;
  j["image_digest"] = {{"algorithm", std::string(formats::ImageDigestAlgorithmName(r.image_digest_algorithm))},
                       {"value", r.image_digest.ToHex()}};
  if (r.layers_mtime_ns > 0) j["layers_mtime_ns"] = r.layers_mtime_ns;
  BARGE_ASSIGN_OR_RETURN(std::string text, formats::DumpJson(j, 2, "verification record of " + r.id));
  return text + "\n";
}

Result<VerificationRecord> DecodeVerificationRecord(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Bad("not a JSON object");
  auto str = [&](const char* key) -> Result<std::string> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return Bad("'" + std::string(key) + "' is missing or not a string");
    return it->get<std::string>();
  };
  auto uint = [&](const char* key) -> Result<uint64_t> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) {
      return Bad("'" + std::string(key) + "' is missing or not a whole number");
    }
    return it->get<uint64_t>();
  };
  BARGE_ASSIGN_OR_RETURN(std::string format, str("format"));
  if (format != kFormat) return Bad("format is '" + format + "', not " + kFormat);
  BARGE_ASSIGN_OR_RETURN(uint64_t version, uint("format_version"));
  if (version != kVersion) return Bad("unsupported format_version " + std::to_string(version));
  VerificationRecord r;
  BARGE_ASSIGN_OR_RETURN(r.id, str("id"));
  BARGE_ASSIGN_OR_RETURN(std::string result, str("result"));
  if (result != "ok" && result != "failed") return Bad("result is '" + result + "', not ok or failed");
  r.ok = result == "ok";
  BARGE_ASSIGN_OR_RETURN(r.error, str("error"));
  BARGE_ASSIGN_OR_RETURN(r.verified_at, str("verified_at"));
  if (auto t = formats::ParseRfc3339(r.verified_at); !t.ok()) return Bad("verified_at: " + t.error().message());
  auto d = j.find("duration_seconds");
  if (d == j.end() || !d->is_number() || d->get<double>() < 0) {
    return Bad("'duration_seconds' is missing or not a number of seconds");
  }
  r.duration_seconds = d->get<double>();
  BARGE_ASSIGN_OR_RETURN(r.clusters_checked, uint("clusters_checked"));
  BARGE_ASSIGN_OR_RETURN(r.image, str("image"));
  BARGE_ASSIGN_OR_RETURN(r.image_bytes, uint("image_bytes"));
  auto digest = j.find("image_digest");
  if (digest == j.end() || !digest->is_object() || !digest->contains("value") ||
      !(*digest)["value"].is_string() ||
      !formats::ImageDigestAlgorithmFromName(formats::JsonString(*digest, "algorithm"))) {
    return Bad("'image_digest' is missing or not an xxh3-128-cluster-fold or xxh3-128-zero-run-fold digest");
  }
  auto value = formats::Digest128::FromHex((*digest)["value"].get<std::string>());
  if (!value.ok()) return Bad("image_digest: " + value.error().message());
  r.image_digest = *value;
  r.image_digest_algorithm = *formats::ImageDigestAlgorithmFromName(formats::JsonString(*digest, "algorithm"));
  if (auto t = j.find("layers_mtime_ns"); t != j.end()) {
    if (!t->is_number_unsigned()) return Bad("'layers_mtime_ns' is not a whole number");
    const uint64_t ns = t->get<uint64_t>();
    if (ns > static_cast<uint64_t>(INT64_MAX)) return Bad("'layers_mtime_ns' is out of range");
    r.layers_mtime_ns = static_cast<int64_t>(ns);
  }
  return r;
}

int64_t NewestLayerMtime(Env& env, const ChainFolder& chain, size_t index) {
  auto layers = chain.LayersOf(index);
  if (!layers.ok()) return 0;
  int64_t newest = 0;
  for (size_t l : *layers) {
    auto st = env.Stat(chain.PathOf(chain.points[l].manifest.image));
    if (!st.ok()) return 0;
    newest = std::max(newest, st->mtime_ns);
  }
  return newest;
}

Status WriteVerificationRecord(Env& env, const ChainFolder& chain, size_t index, const VerificationRecord& record) {
  const std::string path = chain.PathOf(VerificationFileName(chain.points[index].manifest.id));
  BARGE_ASSIGN_OR_RETURN(std::string text, EncodeVerificationRecord(record));
  // verify only reads: a record is not written into a folder another user
  // controls (CheckFolderOwner), its temporary never through a planted link.
  BARGE_RETURN_IF_ERROR(CheckFolderOwner(env, chain.dir));
  return WriteFileLikeFolder(env, path, text);
}

Result<std::optional<LastVerification>> ReadLastVerification(Env& env, const ChainFolder& chain, size_t index,
                                                             const FileStat& image, int64_t newest_layer_mtime_ns) {
  const formats::BackupManifest& m = chain.points[index].manifest;
  const std::string path = chain.PathOf(VerificationFileName(m.id));
  auto text = ReadChainFile(env, path, kMaxRecordBytes);
  if (!text.ok()) {
    if (text.error().code() == ErrorCode::kNotFound) return std::optional<LastVerification>();
    return text.error();
  }
  auto record = DecodeVerificationRecord(*text);
  if (!record.ok()) return Error(record.error()).set_path(path);
  // Bytes overwritten in place keep the size: a layer modified since the
  // check (its time differs from the one recorded) holds bytes it never
  // saw. A record without that time: the image modified after the record
  // was written.
  bool modified = false;
  if (record->layers_mtime_ns > 0) {
    modified = newest_layer_mtime_ns != record->layers_mtime_ns;
  } else {
    BARGE_ASSIGN_OR_RETURN(FileStat written, env.Stat(path));
    modified = image.mtime_ns > written.mtime_ns;
  }
  LastVerification last;
  last.stale = record->id != m.id || record->image != m.image || record->image_bytes != image.size_bytes ||
               record->image_digest != m.image_digest ||
               record->image_digest_algorithm != m.image_digest_algorithm || modified;
  last.record = std::move(record).value();
  return std::optional<LastVerification>(std::move(last));
}

}  // namespace barge::pipeline
