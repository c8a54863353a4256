// Shared CLI helpers.
#include "cli/common.h"

#include <cmath>
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

int ReportError(const Error& error, int exit_code) {
  std::cerr << "barge: " << error.ToString() << "\n";
  return exit_code;
}

int ReportError(const std::string& context, const Error& error, int exit_code) {
  std::cerr << "barge: " << context << ": " << error.ToString() << "\n";
  return exit_code;
}

void PrintJson(const nlohmann::json& j) { std::cout << j.dump(2) << "\n"; }

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.3g %s", v, kUnits[u]);
  return buf;
}

Result<uint64_t> ParseSize(const std::string& text) {
  if (text.empty()) return Error::InvalidArgument("empty size");
  size_t pos = 0;
  uint64_t value = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    uint64_t digit = text[pos] - '0';
    if (value > (UINT64_MAX - digit) / 10) return Error::InvalidArgument("size too large: " + text);
    value = value * 10 + digit;
    ++pos;
  }
  if (pos == 0) return Error::InvalidArgument("not a size: '" + text + "'");
  std::string unit = text.substr(pos);
  int shift = 0;
  if (unit.empty() || unit == "b" || unit == "B") shift = 0;
  else if (unit == "k" || unit == "K" || unit == "KiB") shift = 10;
  else if (unit == "m" || unit == "M" || unit == "MiB") shift = 20;
  else if (unit == "g" || unit == "G" || unit == "GiB") shift = 30;
  else if (unit == "t" || unit == "T" || unit == "TiB") shift = 40;
  else return Error::InvalidArgument("unknown size unit in '" + text + "' (use K, M, G, T)");
  if (shift && value > (UINT64_MAX >> shift)) return Error::InvalidArgument("size too large: " + text);
  return value << shift;
}

}  // namespace barge::cli
