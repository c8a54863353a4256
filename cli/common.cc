// Shared CLI helpers.
#include "cli/common.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <iostream>

#include "blockio/file.h"

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
                                                      const formats::OpenOptions& options) {
  formats::SourceOpener opener = [](const std::string& p) { return OpenFileSource(p); };
  formats::OpenOptions o = options;
  if (!o.allow_any_path && !o.allowed_dirs.empty()) {
    // Extra folders add to, not replace, the image's own folder.
    std::error_code ec;
    auto dir = std::filesystem::absolute(path, ec).parent_path();
    o.allowed_dirs.push_back(dir.string());
  }
  return formats::OpenImage(path, opener, o);
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
