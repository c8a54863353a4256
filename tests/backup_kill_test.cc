// A `barge backup` killed with SIGKILL mid-run leaves no manifest, image or
// digest table that looks finished, and the next run cleans up and succeeds.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "tests/testing/testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using ::barge::testing::RunOk;
using ::barge::testing::ShellQuote;
using ::barge::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

// Starts `argv` with stdout and stderr on /dev/null; returns its pid.
pid_t Spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

TEST(BackupKillTest, KilledRunLeavesNothingFinishedAndRerunSucceeds) {
  TempDir dir;
  std::string disk = dir / "big.raw";
  testing::WriteFile(disk, testing::RandomBytes(128 * kMiB, 31));
  std::string target = dir / "b";
  std::string chain = target + "/big";

  // zstd's slowest level on one thread keeps the run going for seconds on
  // any machine (at the default level a fast machine finished 256 MiB
  // within the 0.2 s below, and the kill came too late).
  pid_t pid = Spawn({testing::BargeBinary(), "backup", "--source", disk, "--target", target, "--threads",
                     "1", "--memory", "8M", "--compress", "zstd:19"});
  ASSERT_GT(pid, 0);
  // Kill 0.2 s into writing the image (a fixed delay from the start is
  // flaky: a loaded or sanitizer build may not have opened it yet).
  std::string temp_image;
  for (int i = 0; i < 1000 && temp_image.empty(); ++i) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(chain, ec)) {
      std::string name = e.path().filename().string();
      if (name.ends_with(".qcow2.barge-tmp") && e.file_size(ec) > 0) temp_image = name;
    }
    if (temp_image.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(temp_image.empty()) << "the image was never started";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the backup finished before the kill; the test needs a slower run";

  bool saw_temporary = false;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(chain, ec)) {
    std::string name = e.path().filename().string();
    if (name == ".lock") continue;
    // Only hidden temporaries (and the resume journal, docs/formats/resume.md)
    // may remain: nothing a reader would take as a backup.
    EXPECT_TRUE(name.starts_with(".") && (name.ends_with(".barge-tmp") || name == ".backup.barge-resume")) << name;
    saw_temporary = true;
  }
  EXPECT_TRUE(saw_temporary) << "killed while writing " << temp_image;
  RunOk(ShellQuote(testing::BargeBinary()) + " verify " + ShellQuote(chain), 1);  // no backup yet: not found

  // The re-run (another compression: it cannot resume) removes the
  // temporaries and the journal and succeeds; the result verifies.
  RunOk(ShellQuote(testing::BargeBinary()) + " backup --source " + ShellQuote(disk) + " --target " +
        ShellQuote(target));
  int files = 0;
  for (const auto& e : fs::directory_iterator(chain, ec)) {
    std::string name = e.path().filename().string();
    if (name == ".lock") continue;
    EXPECT_FALSE(name.ends_with(".barge-tmp")) << name;
    EXPECT_EQ(name.rfind("0000-", 0), 0u) << name;
    ++files;
  }
  EXPECT_EQ(files, 3);
  RunOk(ShellQuote(testing::BargeBinary()) + " verify " + ShellQuote(chain) + " --against " +
        ShellQuote(disk));
}

}  // namespace
}  // namespace barge
