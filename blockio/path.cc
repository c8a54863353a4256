// Lexical path helpers (no filesystem access; getcwd for AbsolutePath).
// An "s3://BUCKET/KEY" location (a chain in a bucket, blockio/bucket_env.h)
// is absolute, its root "s3://BUCKET" (as "/" is a local path's), and
// keeps its "//".
#include "blockio/path.h"

#include <unistd.h>

#include <algorithm>
#include <vector>

namespace barge {

namespace {

std::string_view TrimTrailingSlashes(std::string_view p) {
  while (p.size() > 1 && p.back() == '/') p.remove_suffix(1);
  return p;
}

// The length of "s3://BUCKET" when `path` is an s3:// location (its root,
// as "/" is a local path's), else 0. Such paths are never relative and
// keep their "//".
size_t UrlRootLength(std::string_view path) {
  if (path.size() < 5 || (path[0] != 's' && path[0] != 'S') || path.substr(1, 4) != "3://") return 0;
  size_t slash = path.find('/', 5);
  return slash == std::string_view::npos ? path.size() : slash;
}

}  // namespace

std::string DirName(std::string_view path) {
  std::string_view p = TrimTrailingSlashes(path);
  if (size_t root = UrlRootLength(p); root > 0) {
    auto slash = p.find_last_of('/');
    return std::string(slash < root ? p.substr(0, root) : TrimTrailingSlashes(p.substr(0, std::max(slash, root))));
  }
  auto slash = p.find_last_of('/');
  if (slash == std::string_view::npos) return ".";
  std::string_view dir = TrimTrailingSlashes(p.substr(0, slash));
  return dir.empty() ? "/" : std::string(dir);
}

std::string BaseName(std::string_view path) {
  std::string_view p = TrimTrailingSlashes(path);
  if (p == "/") return "/";
  auto slash = p.find_last_of('/');
  return std::string(slash == std::string_view::npos ? p : p.substr(slash + 1));
}

std::string Extension(std::string_view path) {
  std::string base = BaseName(path);
  auto dot = base.find_last_of('.');
  if (dot == std::string::npos || dot == 0 || base == "..") return "";
  return base.substr(dot);
}

std::string JoinPath(std::string_view dir, std::string_view name) {
  if (dir.empty() || IsAbsolutePath(name)) return std::string(name);
  if (name.empty()) return std::string(dir);
  std::string out(dir);
  if (out.back() != '/') out += '/';
  out += name;
  return out;
}

bool IsAbsolutePath(std::string_view path) { return (!path.empty() && path[0] == '/') || UrlRootLength(path) > 0; }

std::string LexicallyNormal(std::string_view path) {
  if (path.empty()) return "";
  if (size_t root = UrlRootLength(path); root > 0) {
    std::string rest = LexicallyNormal("/" + std::string(path.substr(root)));
    return std::string(path.substr(0, root)) + (rest == "/" ? "" : rest);
  }
  const bool absolute = IsAbsolutePath(path);
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    std::string_view part = path.substr(i, j - i);
    i = j + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty() && parts.back() != "..") {
        parts.pop_back();
        continue;
      }
      if (absolute) continue;  // "/.." is "/"
    }
    parts.push_back(part);
  }
  std::string out = absolute ? "/" : "";
  for (size_t k = 0; k < parts.size(); ++k) {
    if (k > 0) out += '/';
    out += parts[k];
  }
  return out.empty() ? "." : out;
}

std::string AbsolutePath(std::string_view path) {
  if (IsAbsolutePath(path)) return LexicallyNormal(path);
  std::string cwd(4096, '\0');
  if (::getcwd(cwd.data(), cwd.size()) == nullptr) return LexicallyNormal(path);
  cwd.resize(cwd.find('\0'));
  return LexicallyNormal(JoinPath(cwd, path));
}

bool IsInsidePath(std::string_view path, std::string_view dir) {
  std::string p = LexicallyNormal(path), d = LexicallyNormal(dir);
  if (d == "/") return IsAbsolutePath(p);
  if (p == d) return true;
  return p.size() > d.size() && p.compare(0, d.size(), d) == 0 && p[d.size()] == '/';
}

}  // namespace barge
