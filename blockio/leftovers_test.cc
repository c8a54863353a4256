// The sweep of a killed process's leftovers picks only names of processes
// that are gone.
#include "blockio/leftovers.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/testing.h"

namespace barge {
namespace {

using testing::TempDir;

pid_t DeadPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;  // reaped: no process has this PID now (until one reuses it)
}

TEST(LeftoversTest, OnlyNamesOfProcessesThatAreGone) {
  TempDir dir;
  const std::string dead = std::to_string(DeadPid());
  const std::string self = std::to_string(::getpid());
  const std::vector<std::string> names = {".x-" + dead + ".pid", ".x-" + self + ".pid", ".x-1.pid", ".x-.pid",
                                          ".x-abc", ".y-" + dead + ".pid", ".x-" + dead + "-7", ".x-1234567890123"};
  for (const std::string& name : names) {
    std::ofstream(dir / name) << "";
  }
  auto found = DeadProcessLeftovers(PosixEnv(), dir.path().string(), ".x-");
  std::sort(found.begin(), found.end());
  std::vector<std::string> want = {".x-" + dead + "-7", ".x-" + dead + ".pid"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(found, want);
}

TEST(LeftoversTest, UnreadableFolderHasNone) {
  EXPECT_TRUE(DeadProcessLeftovers(PosixEnv(), "/nonexistent-barge-folder", ".x-").empty());
}

}  // namespace
}  // namespace barge
