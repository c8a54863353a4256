// A helper program barge runs and stops by PID (nbdkit for export, nbdfuse
// and debugfs for files): posix_spawn in a process group of its own, its
// output to files or barge's stderr, no shell.
#pragma once

#include <spawn.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "blockio/error.h"

namespace barge::pipeline {

// Spawn attributes for a helper program: every signal unblocked, the ones
// barge handles back at their defaults, and a process group of its own (a
// terminal's Ctrl-C reaches barge, which stops the child itself). The
// caller destroys it (posix_spawnattr_destroy).
void InitChildSpawnAttr(posix_spawnattr_t* attr);

struct SpawnOptions {
  // Files the child's stdout and stderr go to (made or truncated); "":
  // stdout goes to barge's stderr (barge's stdout carries its own output
  // only), stderr to barge's stderr.
  std::string stdout_path;
  std::string stderr_path;
};

// One child process. One thread at a time. The destructor stops a child
// still running (Stop).
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() { Stop(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts args[0] (looked up in PATH) with args. kNotFound naming the
  // program when it is not installed (`package` says which Debian package
  // has it); errno errors of posix_spawn.
  Status Spawn(const std::vector<std::string>& args, const SpawnOptions& options, const std::string& package);
  int64_t pid() const { return pid_; }
  // True once the child ended (its wait status in `status`); never blocks.
  bool Exited(int* status);
  // Blocks until it ends; its wait status.
  int Wait();
  // SIGTERM, then SIGKILL after `grace`; reaps it. Nothing when it ended.
  void Stop(std::chrono::milliseconds grace = std::chrono::seconds(10));

 private:
  int64_t pid_ = 0;
  int status_ = 0;
};

// "exited with status 1", "was killed by signal 9".
std::string DescribeWaitStatus(int status);
// The exit status of a wait status; -1 when it was killed by a signal.
int ExitStatusOf(int status);

}  // namespace barge::pipeline
