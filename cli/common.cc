// Shared CLI helpers.
#include "cli/common.h"

#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <iostream>

#include "blockio/env.h"
#include "blockio/nbd.h"
#include "pipeline/endpoints.h"

namespace barge::cli {

void ImageFlags::AddTo(CLI::App* app, const std::string& format_flag) {
  app->add_option(format_flag, format, "Image format (raw or qcow2); detected when omitted")
      ->check(CLI::IsMember({"raw", "qcow2"}));
  app->add_flag("--allow-any-path", allow_any_path,
                "Allow backing and data files outside the image's folder");
  app->add_option("--allow-dir", allow_dirs,
                  "Also allow backing and data files under this folder (repeatable)");
}

Result<formats::OpenOptions> ImageFlags::ToOpenOptions() const {
  formats::OpenOptions o;
  if (!format.empty()) {
    BARGE_ASSIGN_OR_RETURN(o.format, formats::ParseImageFormat(format));
  }
  o.allow_any_path = allow_any_path;
  o.allowed_dirs = allow_dirs;
  return o;
}

Result<std::unique_ptr<formats::Image>> OpenImageFile(const std::string& path,
                                                      const formats::OpenOptions& options,
                                                      const HttpOptions& http) {
  if (IsHttpUrl(path)) {
    pipeline::SourceSpec spec;
    spec.location = path;
    spec.http = http;
    spec.snapshot = options.snapshot;
    if (options.format) spec.format = std::string(formats::ImageFormatName(*options.format));
    BARGE_ASSIGN_OR_RETURN(pipeline::OpenedSource opened, pipeline::OpenSource(Env::Default(), spec));
    return std::move(opened.image);
  }
  if (IsNbdUri(path)) {
    if (options.format == formats::ImageFormat::kQcow2) {
      return Error::NotSupported("an NBD export is read as served (raw); qcow2 over NBD is not read").set_path(path);
    }
    pipeline::SourceSpec spec;
    spec.location = path;
    spec.snapshot = options.snapshot;  // refused: an NBD export has no internal snapshots
    BARGE_ASSIGN_OR_RETURN(pipeline::OpenedSource opened, pipeline::OpenSource(Env::Default(), spec));
    return std::move(opened.image);
  }
  formats::OpenOptions o = options;
  pipeline::ApplyFolderRule(o, path, o.allow_any_path, o.allowed_dirs);
  return pipeline::OpenImageFile(Env::Default(), path, o);
}

void WarnIfMisnamed(Output& out, const std::string& path, const std::string& format_flag) {
  if (!format_flag.empty() || IsNbdUri(path) || IsHttpUrl(path)) return;
  std::string lower = path;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!lower.ends_with(".qcow2")) return;
  auto file = Env::Default().OpenSource(path);
  if (!file.ok()) return;
  auto probed = formats::ProbeFormatName(**file);
  if (!probed.ok() || *probed == "qcow2") return;
  out.Warning("named .qcow2 but " +
                  (*probed == "raw" ? std::string("holds no qcow2 header") : "is a " + *probed + " image") +
                  ": read as a raw disk (is it the file you meant? give the format, e.g. -f raw, to silence this)",
              path);
}

nlohmann::json TimeJson(const std::string& text) {
  auto t = formats::ParseRfc3339(text);
  return t.ok() ? nlohmann::json(formats::FormatRfc3339(*t)) : nlohmann::json(nullptr);
}

std::string Format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

}  // namespace barge::cli
