// A local attacker's shared temporary folder: a folder like /tmp (01777)
// that barge is pointed at with TMPDIR, where user nobody has planted, for
// the next PIDs, the names barge once used there. Tests run as root.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testing/cli_testing.h"

namespace barge::testing {

class HostileTmp {
 public:
  static constexpr uid_t kNobody = 65534;
  static constexpr const char* kVictimText = "root's file, never to be changed\n";

  // `tmp` becomes traversable (0711); tmp/shared is the shared folder,
  // tmp/victim a root-owned file (0600) the planted links point at.
  // TMPDIR names the shared folder until destruction.
  explicit HostileTmp(const TempDir& tmp) : shared_(tmp / "shared"), victim_(tmp / "victim") {
    std::filesystem::permissions(tmp.path(), std::filesystem::perms(0711));
    std::filesystem::create_directory(shared_);
    std::filesystem::permissions(shared_, std::filesystem::perms(01777));
    WriteText(victim_, kVictimText);
    std::filesystem::permissions(victim_, std::filesystem::perms(0600));
    if (const char* old = std::getenv("TMPDIR")) old_tmpdir_ = old, had_tmpdir_ = true;
    ::setenv("TMPDIR", shared_.c_str(), 1);
  }
  ~HostileTmp() {
    if (had_tmpdir_) {
      ::setenv("TMPDIR", old_tmpdir_.c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
  }
  HostileTmp(const HostileTmp&) = delete;
  HostileTmp& operator=(const HostileTmp&) = delete;

  const std::string& shared() const { return shared_; }
  const std::string& victim() const { return victim_; }
  std::string VictimText() const { return Slurp(victim_); }

  // For each of the next `count` PIDs, `folders(pid)` and `links(pid)`
  // (paths relative to the shared folder; each link points at the victim)
  // are made as user nobody, by a child that drops to that user and makes
  // them without starting another process (each process started would use
  // up a PID). Returns how many entries were made.
  int PlantForNextPids(int count, const std::function<std::vector<std::string>(int)>& folders,
                       const std::function<std::vector<std::string>(int)>& links) {
    int last = 0;
    std::ifstream("/proc/sys/kernel/ns_last_pid") >> last;
    // Every path is built before fork: the child only makes system calls.
    std::vector<std::string> dirs, names;
    for (int pid = last + 1; pid <= last + count; ++pid) {
      for (const std::string& d : folders(pid)) dirs.push_back(shared_ + "/" + d);
      for (const std::string& l : links(pid)) names.push_back(shared_ + "/" + l);
    }
    const pid_t child = ::fork();
    if (child == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(2);
      int made = 0;
      for (const std::string& d : dirs) made += ::mkdir(d.c_str(), 0777) == 0;
      for (const std::string& l : names) made += ::symlink(victim_.c_str(), l.c_str()) == 0;
      ::_exit(made == static_cast<int>(dirs.size() + names.size()) ? 0 : 1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "nobody could not plant everything";
    planted_.insert(planted_.end(), dirs.begin(), dirs.end());
    planted_.insert(planted_.end(), names.begin(), names.end());
    return static_cast<int>(dirs.size() + names.size());
  }

  // The entries of the shared folder that are not nobody's (barge's own,
  // or what it wrote through a planted name), but for `except`.
  std::vector<std::string> NotNobodys(const std::string& except = "") const {
    std::vector<std::string> found;
    for (const auto& e : std::filesystem::directory_iterator(shared_)) {
      struct stat st;
      if (::lstat(e.path().c_str(), &st) == 0 && st.st_uid != kNobody && e.path().string() != except) {
        found.push_back(e.path().string());
      }
    }
    return found;
  }

  // Every planted entry is still there, still nobody's (barge removed or
  // took over none of them).
  void ExpectPlantedUntouched() const {
    for (const std::string& p : planted_) {
      struct stat st;
      ASSERT_EQ(::lstat(p.c_str(), &st), 0) << p << " was removed";
      EXPECT_EQ(st.st_uid, kNobody) << p;
    }
  }

 private:
  std::string shared_, victim_;
  std::string old_tmpdir_;
  bool had_tmpdir_ = false;
  std::vector<std::string> planted_;
};

}  // namespace barge::testing
