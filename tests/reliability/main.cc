// The reliability binary: gtest, or a child mode (`--child NAME ARGS...`)
// that the kill campaign runs as a real process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include <string>
#include <vector>

#include "blockio/env.h"
#include "orchestrate/base/file_lock.h"
#include "tests/reliability/harness.h"

int main(int argc, char** argv) {
  std::string self(4096, '\0');
  ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size());
  self.resize(n > 0 ? static_cast<size_t>(n) : 0);
  barge::reliability::SetSelfBinary(self);
  if (argc >= 2 && std::string(argv[1]) == "--child") {
    return barge::reliability::ChildMain(std::vector<std::string>(argv + 2, argv + argc));
  }
  // This process's identity is read once, from the real /proc: a recovery
  // that plays "the crashed process is gone" hides it later.
  barge::orchestrate::ProcessOwner::Self(barge::PosixEnv());
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  std::string table = barge::reliability::SummaryTable();
  std::printf("\n%s", table.c_str());
  return rc;
}
