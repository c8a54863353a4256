// What a process killed outright (SIGKILL, power loss) leaves in the
// temporary folder: names that carry its PID. One sweep for every kind of
// such leftover (an export's run folder, an ssh forward's folder). And
// what someone planted under a name barge writes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"

namespace barge {

// $TMPDIR when set and not empty, else /tmp.
std::string TemporaryRoot();

// The names in `root` made of `prefix`, the decimal PID of a process that
// no longer exists, then the end or a character that is not a digit
// ("barge-ssh-" matches "barge-ssh-4242-0a1b"); never the calling
// process's own, never a live process's (a reused PID keeps its
// leftovers until that process is gone too). An unreadable `root` has
// none.
std::vector<std::string> DeadProcessLeftovers(Env& env, const std::string& root, std::string_view prefix);

// Removes each of DeadProcessLeftovers(root, prefix) that this process's
// user owns: a folder with everything in it, or a file; never through a
// symbolic link, and never another user's entry (a name someone planted
// in a shared folder such as /tmp stays where it is). What cannot be
// removed is left to the next sweep.
void RemoveDeadProcessLeftovers(Env& env, const std::string& root, std::string_view prefix);

// Removes what is at `path` unless it is a regular file or nothing: a
// symbolic link, FIFO or other entry planted under a name barge writes (a
// lock file, a temporary). unlink(2) removes a link, never its target.
// Returns true when something was removed; the unlink's error.
Result<bool> RemovePlanted(Env& env, const std::string& path);

}  // namespace barge
