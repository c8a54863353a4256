#include "blockio/leftovers.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace barge {

std::string TemporaryRoot() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
}

std::vector<std::string> DeadProcessLeftovers(Env& env, const std::string& root, std::string_view prefix) {
  std::vector<std::string> dead;
  auto names = env.ListDir(root);
  if (!names.ok()) return dead;
  for (const std::string& name : *names) {
    if (!std::string_view(name).starts_with(prefix)) continue;
    size_t end = prefix.size();
    while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
    const size_t digits = end - prefix.size();
    if (digits == 0 || digits > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name.substr(prefix.size(), digits)));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    dead.push_back(name);
  }
  return dead;
}

void RemoveDeadProcessLeftovers(Env& env, const std::string& root, std::string_view prefix) {
  for (const std::string& name : DeadProcessLeftovers(env, root, prefix)) {
    const std::string path = root + "/" + name;
    auto st = env.StatNoFollow(path);
    if (!st.ok() || st->uid != ::geteuid()) continue;
    if (!st->is_directory() && !st->is_regular()) continue;
    IgnoreError(env.RemoveTree(path), "a leftover of a dead process: the next sweep tries again");
  }
}

Result<bool> RemovePlanted(Env& env, const std::string& path) {
  auto st = env.StatNoFollow(path);
  if (!st.ok() || st->is_regular()) return false;
  Status removed = env.Unlink(path);
  if (!removed.ok()) {
    if (removed.error().code() == ErrorCode::kNotFound) return false;
    return removed.error();
  }
  return true;
}

}  // namespace barge
