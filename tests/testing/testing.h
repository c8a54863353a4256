// Helpers for barge's tests: temporary folders, running commands and the
// real tools (qemu-img, qemu-nbd, nbdkit) with skip-or-fail when missing.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "blockio/source.h"

namespace barge::testing {

// A fresh folder under $TMPDIR (or /var/tmp), removed with its contents.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;        // the exit status, or 128 + the signal that ended it
  std::string output;        // stdout and stderr together, about in the order they came
  std::string stdout_text;   // stdout alone (a --json run's NDJSON events)
  std::string stderr_text;   // stderr alone
};

// Runs `command` with /bin/sh (stdin /dev/null), capturing stdout and
// stderr, each alone and both together.
CommandResult Run(const std::string& command);

// Runs and fails the test (ADD_FAILURE) with the output when the exit code
// differs from `expected_exit`. Returns the output (stdout and stderr).
std::string RunOk(const std::string& command, int expected_exit = 0);

// The path of the built barge binary.
std::string BargeBinary();
// The source tree and the quiesce tests' guest kit folder, fixed when the
// build is configured. They are compiled into testing.cc alone, not passed
// on every test's command line: a test object then holds no path of its
// checkout, and ccache shares it between checkouts (CI's clone, worktrees).
const char* SourceDir();
const char* GuestKitDir();

// True if `tool` is on PATH.
bool HaveTool(const std::string& tool);

// Skips the test when a tool is missing, unless BARGE_REQUIRE_TOOLS=1 (CI),
// where a missing tool is a failure.
#define BARGE_REQUIRE_TOOL(tool)                                              \
  do {                                                                        \
    if (!::barge::testing::HaveTool(tool)) {                                  \
      if (::barge::testing::ToolsRequired()) {                                \
        FAIL() << "required tool missing: " << (tool);                       \
      }                                                                       \
      GTEST_SKIP() << "tool missing: " << (tool);                             \
    }                                                                         \
  } while (0)
bool ToolsRequired();

// Stops a child this process forked: SIGTERM, up to `grace` for it to
// exit, then SIGKILL; reaped either way. Nothing for pid <= 0.
void StopChild(int pid, std::chrono::milliseconds grace);

// A server process (qemu-nbd, nbdkit) listening on a Unix socket, started
// through /bin/sh and stopped (SIGTERM, then SIGKILL) in the destructor.
class SocketServer {
 public:
  // `command` must listen on `socket` and stay in the foreground.
  SocketServer(const std::string& command, const std::string& socket);
  ~SocketServer();
  SocketServer(const SocketServer&) = delete;
  SocketServer& operator=(const SocketServer&) = delete;

  // Polls up to 10 s for the socket to listen; false if it never does or
  // the server exits first.
  bool WaitReady();
  std::string uri() const { return "nbd+unix:///?socket=" + socket_; }

 private:
  std::string socket_;
  int pid_ = -1;
};

// Which events a --json stream may carry: the four of every command
// (progress, warning, reconnect, result, error), or, for the long-running `barge
// serve` only, those and its two documented daemon events, "ready" and
// "run" (docs/json.md, "serve's daemon events"), each naming "serve".
enum class Stream { kCommand, kServe };

// A --json run's stdout read strictly as NDJSON (docs/json.md): every line
// one JSON object with a string "event" (progress, warning, reconnect, result, error;
// with kServe also ready and run) and a non-empty string "command"; no
// blank line, no other text; the last line ends with a newline. Anything
// else is a test failure (ADD_FAILURE quoting the line). Returns the
// objects that parsed, in order.
std::vector<nlohmann::json> Events(const std::string& stdout_text, Stream stream = Stream::kCommand);

// The one "result" event of `stdout_text` (Events). A failure unless there
// is exactly one, and only progress, warning and reconnect events (and, with kServe,
// ready and run) before it (an error may follow it: a failed run's report,
// e.g. replicate's per copy). An empty object when there is none.
nlohmann::json ResultOf(const std::string& stdout_text, Stream stream = Stream::kCommand);

// The one "error" event of `stdout_text` (Events), which must be the last
// line and carry code, message and exit_code. An empty object when there
// is none (a failure).
nlohmann::json ErrorOf(const std::string& stdout_text, Stream stream = Stream::kCommand);

// Runs a --json command (the flag is the caller's), fails the test unless
// it exits `expected_exit`, and returns ResultOf its stdout (exit 0: no
// error event either).
nlohmann::json RunResult(const std::string& command, int expected_exit = 0);

// Runs a --json command expected to fail with `expected_exit`: fails the
// test unless it does and its stdout ends with an error event whose
// exit_code is that code. Returns the error event.
nlohmann::json RunError(const std::string& command, int expected_exit);

// Deterministic pseudo-random bytes (splitmix64 from `seed`).
std::vector<std::byte> RandomBytes(size_t n, uint64_t seed);

// Writes/reads a whole file.
void WriteFile(const std::string& path, const std::vector<std::byte>& data);
std::vector<std::byte> ReadFile(const std::string& path);

// Single-quotes `s` for /bin/sh.
std::string ShellQuote(const std::string& s);

// A source that passes everything on to `target` and logs, in call order,
// its reads (ReadAt, and ReadMany's requests) and read-ahead hints
// (WillNeed, kept, not passed on). For tests of who reads and hints what.
// Thread-safe.
class CallLog final : public BlockSource {
 public:
  struct Call {
    bool hint = false;  // WillNeed; else a read
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  explicit CallLog(BlockSource& target) : target_(target) {}  // target must outlive
  explicit CallLog(std::unique_ptr<BlockSource> owned) : owned_(std::move(owned)), target_(*owned_) {}

  const std::string& name() const override { return target_.name(); }
  uint64_t size_bytes() const override { return target_.size_bytes(); }
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override;
  Status ReadMany(std::span<ReadRequest> requests) override;
  void WillNeed(uint64_t offset, uint64_t length) override { Log({true, offset, length}); }
  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override { return target_.Extents(offset, length); }

  std::vector<Call> calls() const;
  // The hints as [begin, end) ranges, in call order.
  std::vector<std::pair<uint64_t, uint64_t>> hints() const;

 private:
  void Log(Call call);
  std::unique_ptr<BlockSource> owned_;
  BlockSource& target_;
  mutable std::mutex mu_;
  std::vector<Call> calls_;  // guarded by mu_
};

}  // namespace barge::testing

// The spellings the tests use.
#define BARGE_SOURCE_DIR (::barge::testing::SourceDir())
#define BARGE_GUEST_KIT_DIR (::barge::testing::GuestKitDir())
