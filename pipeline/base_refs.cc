// Chains over a base: the base chain's reference files, and the marker of
// a chain made from a catalog image.
#include "pipeline/base_refs.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "blockio/path.h"
#include "formats/json_fields.h"
#include "formats/manifest.h"
#include "pipeline/chain.h"
#include "pipeline/chain_files.h"
#include "pipeline/file_access.h"
#include "pipeline/small_file.h"

namespace barge::pipeline {

namespace {

using nlohmann::json;

constexpr std::string_view kRefFormat = "barge-base-ref";
constexpr std::string_view kMarkerFormat = "barge-catalog-image";
constexpr uint64_t kRefMaxBytes = 64 << 10;

// A chain id as barge makes them: hex digits only (it names the file).
bool IsChainId(std::string_view id) {
  return !id.empty() && id.size() <= 64 &&
         std::all_of(id.begin(), id.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

bool IsPlainId(std::string_view id) {
  return !id.empty() && id.find('/') == std::string_view::npos && id.front() != '.';
}

std::string RefPath(const std::string& base_dir, const std::string& chain_id) {
  return JoinPath(JoinPath(base_dir, kBaseRefsDir), chain_id + ".json");
}

}  // namespace

std::string EncodeBaseRef(const BaseRef& ref) {
  json j = {{"format", kRefFormat},
            {"version", 1},
            {"dependent", ref.dependent},
            {"chain_id", ref.chain_id},
            {"base_id", ref.base_id}};
  return j.dump(2) + "\n";
}

Result<BaseRef> DecodeBaseRef(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Error::Corruption("base reference: not a JSON object");
  auto str = [&j](const char* key) -> std::optional<std::string> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  auto format = str("format");
  if (!format || *format != kRefFormat) return Error::Corruption("base reference: not a barge base reference");
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != 1) {
    return Error::Corruption("base reference: version must be 1");
  }
  BaseRef ref;
  auto dependent = str("dependent");
  auto chain_id = str("chain_id");
  auto base_id = str("base_id");
  if (!dependent || !formats::IsBaseChainPath(*dependent)) {
    return Error::Corruption("base reference: dependent must be a relative folder path of '..' and plain names");
  }
  if (!chain_id || !IsChainId(*chain_id)) return Error::Corruption("base reference: chain_id must be hex digits");
  if (!base_id || !IsPlainId(*base_id)) return Error::Corruption("base reference: base_id must be a backup id");
  ref.dependent = *dependent;
  ref.chain_id = *chain_id;
  ref.base_id = *base_id;
  return ref;
}

Result<std::string> EncodeCatalogImageMarker(const CatalogImageMarker& marker) {
  json j = {{"format", kMarkerFormat},
            {"version", 1},
            {"image", marker.image},
            {"sha512", marker.sha512},
            {"point", marker.point},
            {"copy", marker.copy}};
  BARGE_ASSIGN_OR_RETURN(std::string text, formats::DumpJson(j, 2, "the catalog image marker"));
  return text + "\n";
}

Result<CatalogImageMarker> DecodeCatalogImageMarker(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Error::Corruption("catalog image marker: not a JSON object");
  if (formats::JsonString(j, "format") != kMarkerFormat) {
    return Error::Corruption("catalog image marker: not a barge catalog image marker");
  }
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != 1) {
    return Error::Corruption("catalog image marker: version must be 1");
  }
  CatalogImageMarker m;
  m.image = formats::JsonString(j, "image");
  m.sha512 = formats::JsonString(j, "sha512");
  m.point = formats::JsonString(j, "point");
  m.copy = formats::JsonString(j, "copy");
  if (m.image.empty()) return Error::Corruption("catalog image marker: image must be a name");
  if (m.sha512.size() != 128 || !std::all_of(m.sha512.begin(), m.sha512.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
      })) {
    return Error::Corruption("catalog image marker: sha512 must be 128 lowercase hex digits");
  }
  if (!IsPlainId(m.point)) return Error::Corruption("catalog image marker: point must be a backup id");
  return m;
}

std::string RelativeFolderPath(const std::string& from, const std::string& to) {
  auto split = [](const std::string& p) {
    std::vector<std::string> parts;
    std::string norm = LexicallyNormal(AbsolutePath(p));
    size_t start = 0;
    while (start < norm.size()) {
      size_t end = norm.find('/', start);
      if (end == std::string::npos) end = norm.size();
      if (end > start) parts.push_back(norm.substr(start, end - start));
      start = end + 1;
    }
    return parts;
  };
  std::vector<std::string> a = split(from), b = split(to);
  size_t common = 0;
  while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
  std::string out;
  for (size_t i = common; i < a.size(); ++i) out += out.empty() ? ".." : "/..";
  for (size_t i = common; i < b.size(); ++i) out += (out.empty() ? "" : "/") + b[i];
  return out.empty() ? "." : out;
}

Status WriteBaseRef(Env& env, const std::string& base_dir, const BaseRef& ref) {
  if (!formats::IsUtf8(ref.dependent) || !formats::IsBaseChainPath(ref.dependent)) {
    return Error::InvalidArgument("the chain's folder, relative to its base's (" + ref.dependent +
                                  "), is not a UTF-8 path of plain names that a reference (JSON) can record")
        .set_path(base_dir);
  }
  const std::string refs_dir = JoinPath(base_dir, kBaseRefsDir);
  if (!env.Exists(refs_dir)) {
    // As private (or shared) as the base chain's folder.
    BARGE_ASSIGN_OR_RETURN(FileAccess access, FolderAccess(env, base_dir));
    BARGE_RETURN_IF_ERROR(CreateFolders(env, refs_dir, access));
    BARGE_RETURN_IF_ERROR(env.SyncDir(base_dir));  // the new folder's entry, durable
  }
  return WriteFileLikeFolder(env, RefPath(base_dir, ref.chain_id), EncodeBaseRef(ref));
}

Status RemoveBaseRef(Env& env, const std::string& base_dir, const std::string& chain_id) {
  if (!IsChainId(chain_id)) return OkStatus();
  return env.UnlinkIfExists(RefPath(base_dir, chain_id));
}

Result<std::map<std::string, std::vector<std::string>>> LiveDependents(Env& env, const std::string& base_dir,
                                                                      bool sweep) {
  std::map<std::string, std::vector<std::string>> out;
  const std::string refs_dir = JoinPath(base_dir, kBaseRefsDir);
  auto names = env.ListDir(refs_dir);
  if (!names.ok()) {
    if (names.error().code() == ErrorCode::kNotFound) return out;
    return names.error();
  }
  if (sweep) {
    IgnoreError(SweepStaleTemporaries(env, refs_dir), "the next job sweeps it");
  }
  const std::string self = LexicallyNormal(AbsolutePath(base_dir));
  std::sort(names->begin(), names->end());
  for (const std::string& name : *names) {
    if (name.empty() || name[0] == '.' || !name.ends_with(".json")) continue;  // temporaries
    const std::string path = JoinPath(refs_dir, name);
    auto text = ReadChainFile(env, path, kRefMaxBytes);
    if (!text.ok()) continue;  // vanished meanwhile
    auto ref = DecodeBaseRef(*text);
    if (!ref.ok() || ref->chain_id + ".json" != name) {
      // Not ours to interpret: never protects anything, never removed.
      continue;
    }
    const std::string dependent = LexicallyNormal(JoinPath(self, ref->dependent));
    bool live = false;
    auto files = env.ListDir(dependent);
    if (!files.ok()) {
      live = files.error().code() != ErrorCode::kNotFound;  // unreadable: keep protecting
    } else {
      for (const std::string& f : *files) {
        if (f.empty() || f[0] == '.' || !f.ends_with(".json")) continue;
        auto mtext = ReadChainFile(env, JoinPath(dependent, f));
        if (!mtext.ok()) continue;
        auto m = formats::DecodeManifest(*mtext);
        if (!m.ok() || !m->base || m->chain_id != ref->chain_id || m->base->id != ref->base_id) continue;
        if (LexicallyNormal(JoinPath(dependent, m->base->chain)) == self) {
          live = true;
          break;
        }
      }
    }
    if (live) {
      out[ref->base_id].push_back(dependent);
    } else if (sweep) {
      IgnoreError(env.UnlinkIfExists(path), "a stale reference left now is swept by the next job");
    }
  }
  return out;
}

}  // namespace barge::pipeline
