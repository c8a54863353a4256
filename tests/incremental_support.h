// Helpers of the incremental-backup integration tests: a qcow2 source disk
// changed with qemu-io and tracked by a persistent bitmap, qemu-nbd exports,
// and the barge CLI driven through the shell.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge::incremental_testing {

using testing::Barge;
using testing::PointIds;
using testing::Q;
using testing::RunOk;
using testing::RunResult;
using testing::ShellQuote;

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;

// One guest change, as qemu-io makes it.
struct Op {
  enum Kind { kWrite, kZero, kDiscard } kind;
  uint64_t offset, length;
  int pattern = 0;
  std::string QemuIo() const {
    std::string range = std::to_string(offset) + " " + std::to_string(length);
    switch (kind) {
      case kWrite: return "write -P " + std::to_string(pattern) + " " + range;
      case kZero: return "write -z " + range;
      case kDiscard: return "discard " + range;
    }
    return "";
  }
};

inline void ApplyOps(const std::string& image, const std::vector<Op>& ops) {
  std::string cmd = "qemu-io -f qcow2";
  for (const Op& op : ops) cmd += " -c " + Q(op.QemuIo());
  RunOk(cmd + " " + Q(image) + " >/dev/null");
}

// docs/formats/extents.md, from the ranges the ops touched.
inline void WriteExtentsFile(const std::string& path, const std::vector<Op>& ops, uint64_t size) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const Op& op : ops) ranges.emplace_back(op.offset, op.length);
  testing::WriteExtentsFile(path, ranges, size);
}

// A qemu-nbd export of one image for the life of the object.
class NbdExport {
 public:
  // `args` are qemu-nbd options before the image (e.g. "-r -f qcow2 -B cbt0").
  NbdExport(const std::string& dir, const std::string& args, const std::string& image)
      : socket_(dir + "/nbd.sock"), pid_file_(dir + "/nbd.pid") {
    std::filesystem::remove(socket_);
    RunOk("qemu-nbd --fork --pid-file=" + Q(pid_file_) + " --socket=" + Q(socket_) + " " + args +
          " " + Q(image));
  }
  ~NbdExport() { Stop(); }
  NbdExport(const NbdExport&) = delete;
  NbdExport& operator=(const NbdExport&) = delete;

  std::string uri() const { return "nbd+unix:///?socket=" + socket_; }

  // Stops the server and waits until it has let go of the image.
  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    auto pid = testing::Run("cat " + Q(pid_file_)).output;
    pid.erase(std::remove(pid.begin(), pid.end(), '\n'), pid.end());
    if (pid.empty()) return;
    testing::Run("kill " + pid);
    for (int i = 0; i < 500 && std::filesystem::exists("/proc/" + pid); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  std::string socket_, pid_file_;
  bool stopped_ = false;
};

// A qemu filename for a layer opened on its own (its backing file ignored).
inline std::string LayerAlone(const std::string& path) {
  return "json:{\"driver\":\"qcow2\",\"backing\":null,\"file\":{\"driver\":\"file\",\"filename\":\"" +
         path + "\"}}";
}

inline bool SameFile(const std::string& a, const std::string& b) {
  return testing::Run("cmp -s " + Q(a) + " " + Q(b)).exit_code == 0;
}

}  // namespace barge::incremental_testing
