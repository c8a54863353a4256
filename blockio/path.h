// Path names as text: the lexical operations every layer needs (folder and
// base name, joining, normalizing, "is inside"), without touching the
// filesystem. What needs the filesystem (resolving links) goes through an
// Env (blockio/env.h, CanonicalPath).
#pragma once

#include <string>
#include <string_view>

namespace barge {

// The folder part, as dirname(1): "a/b" -> "a", "a/b/" -> "a", "/b" -> "/",
// "b" -> ".", "" -> ".".
std::string DirName(std::string_view path);
// The last component, as basename(1): "a/b" -> "b", "a/b/" -> "b",
// "/" -> "/", "" -> "".
std::string BaseName(std::string_view path);
// The extension of the base name with its dot: "x.qcow2" -> ".qcow2",
// "a.b/c" -> "", ".lock" -> "" (a hidden name is not an extension).
std::string Extension(std::string_view path);
// `name` under `dir`: "a" + "b" -> "a/b"; an absolute `name` or an empty
// `dir` gives `name`.
std::string JoinPath(std::string_view dir, std::string_view name);
bool IsAbsolutePath(std::string_view path);
// Removes "." components, repeated and trailing slashes, and each ".."
// with the component before it ("/.." is "/"; a relative path keeps its
// leading ".."s). "" stays "".
std::string LexicallyNormal(std::string_view path);
// LexicallyNormal of `path` taken from the working directory when
// relative (the folder is not required to exist).
std::string AbsolutePath(std::string_view path);
// True when `path` is `dir` or lies under it, comparing whole components
// of their LexicallyNormal forms ("/a/bc" is not inside "/a/b").
bool IsInsidePath(std::string_view path, std::string_view dir);

}  // namespace barge
