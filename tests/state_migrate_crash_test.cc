// barge state migrate: a state folder with TPM/EFI files and a CBT overlay
// (bitmap cbt0 over a raw disk on another volume) is moved with a crash
// injected after each journal step (and in the middle of the copy) by the
// Env the migration runs on (in this process; a crash = every call fails
// from then on, tests/testing/env_wrappers.h); a re-run of the real CLI
// ends consistent, the bytes are identical, and the CBT chain continues: an
// incremental backup from the moved overlay is incremental and restores
// equal to the disk.
#include <gtest/gtest.h>

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "blockio/env.h"
#include "orchestrate/state/state_migrate.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/env_wrappers.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Barge;
using testing::RunOk;
using testing::ShellQuote;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

std::string Sha512(const fs::path& p) { return RunOk("sha512sum " + ShellQuote(p.string())).substr(0, 128); }

// Relative path -> SHA-512 of every regular file under `dir`.
std::map<std::string, std::string> Snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    auto rel = e.path().lexically_relative(dir).string();
    if (rel == ".barge-state.json" || rel == ".barge-migrate.journal") continue;
    if (e.is_regular_file()) out[rel] = Sha512(e.path());
  }
  return out;
}

// `barge bitmap dump --json` of a bitmap, less the image's name (the same
// bitmap is compared before and after the image moved).
json BitmapDump(const std::string& image, const std::string& bitmap) {
  json d = testing::RunResult(Barge() + " bitmap dump --json --allow-any-path " + image + " " + bitmap);
  d.erase("image");
  return d;
}

struct Scenario {
  TempDir dir;
  fs::path vol, old_dir, new_dir, backups;
  std::map<std::string, std::string> before;
  json bitmap_before;

  Scenario() {
    vol = dir.path() / "vol";
    old_dir = dir.path() / "pvc-old/state";
    new_dir = dir.path() / "pvc-new/state";
    backups = dir.path() / "backups";
    fs::create_directories(vol);
    fs::create_directories(old_dir / "tpm2");
    fs::create_directories(old_dir / "efi");
    fs::create_directories(dir.path() / "pvc-new");
    testing::WriteFile((vol / "disk.raw").string(), testing::RandomBytes(8 * kMiB, 7));
    testing::WriteFile((old_dir / "tpm2/tpm2-00.permall").string(), testing::RandomBytes(10000, 8));
    fs::permissions(old_dir / "tpm2/tpm2-00.permall", fs::perms::owner_read | fs::perms::owner_write);
    auto vars = testing::RandomBytes(128 << 10, 9);
    std::fill(vars.begin() + 4096, vars.end(), std::byte{0});
    testing::WriteFile((old_dir / "efi/VARS.fd").string(), vars);
    std::string overlay = ShellQuote((old_dir / "disk.qcow2").string());
    RunOk(Barge() + " overlay create --data-file " + ShellQuote((vol / "disk.raw").string()) + " " + overlay +
          " --bitmap cbt0");
    RunOk(Barge() + " backup --allow-any-path --source " + overlay + " --target " +
          ShellQuote(backups.string()) + " --name vda");
    // Guest writes after the full backup, tracked by cbt0.
    RunOk("qemu-io -f qcow2 -c 'write -P 0xa1 0 1M' -c 'write -P 0xb2 5M 192K' " + overlay);
    before = Snapshot(old_dir);
    bitmap_before = BitmapDump(overlay, "cbt0");
  }

  std::string Migrate(const std::string& env = "") {
    return env + " " + Barge() + " state migrate --json --no-libvirt --from " + ShellQuote(old_dir.string()) + " --to " +
           ShellQuote(new_dir.string());
  }

  bool Complete(const fs::path& d) const { return fs::exists(d) && Snapshot(d) == before; }

  // After a finished migration: the old folder is gone, the new one is
  // identical and current, and the CBT chain continues.
  void CheckFinished() {
    EXPECT_FALSE(fs::exists(old_dir));
    EXPECT_EQ(Snapshot(new_dir), before);
    EXPECT_TRUE(fs::exists(new_dir / ".barge-state.json"));
    EXPECT_EQ(fs::status(new_dir / "tpm2/tpm2-00.permall").permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
    std::string overlay = ShellQuote((new_dir / "disk.qcow2").string());
    RunOk("qemu-img check -q " + overlay);
    json info = json::parse(RunOk("qemu-img info --output=json " + overlay));
    EXPECT_EQ(info["format-specific"]["data"]["data-file"], (vol / "disk.raw").string());
    EXPECT_EQ(BitmapDump(overlay, "cbt0"), bitmap_before);
    json b = testing::RunResult(Barge() + " backup --json --allow-any-path --source " + overlay + " --target " +
                                ShellQuote(backups.string()) + " --name vda --incremental --dirty-bitmap cbt0");
    EXPECT_EQ(b["type"], "incremental") << b.dump();
    EXPECT_EQ(b["dirty_bytes"], (1 << 20) + (192 << 10)) << b.dump();
    // The new point records where the disk came from, so the chain is
    // still one disk; another file (not moved) is still refused.
    json m = json::parse(RunOk("cat " + ShellQuote((backups / "vda").string()) + "/0001-*.json"));
    EXPECT_EQ(m["disk_identity"]["location"], (new_dir / "disk.qcow2").string()) << m.dump();
    EXPECT_EQ(m["disk_identity"]["moved_from"], (old_dir / "disk.qcow2").string()) << m.dump();
    RunOk(Barge() + " verify --all " + ShellQuote((backups / "vda").string()));
    std::string restored = (dir.path() / "restored.raw").string();
    RunOk(Barge() + " restore " + ShellQuote((backups / "vda").string()) + " --to " + ShellQuote(restored));
    RunOk("cmp " + ShellQuote(restored) + " " + ShellQuote((vol / "disk.raw").string()));
  }
};

TEST(StateMigrateCrashTest, CleanMigration) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  Scenario s;
  json r = testing::RunResult(s.Migrate());
  EXPECT_EQ(r["outcome"], "migrated");
  EXPECT_EQ(r["recovery"], "");
  s.CheckFinished();
  // A second run finds the journal done and changes nothing.
  r = testing::RunResult(s.Migrate());
  EXPECT_EQ(r["outcome"], "already-migrated");
}

struct CrashPoint {
  const char* name;
  // The process dies right after the n-th flush of the journal (step n is
  // durable), or with `files`, of a copied file.
  uint64_t after = 0;
  bool files = false;
  bool new_is_current;  // the crash came after the commit point
};

std::string CrashPointName(const ::testing::TestParamInfo<CrashPoint>& info) { return info.param.name; }
// gtest prints a parameter into the test's listing (and ctest's name): its
// name, not its bytes (a pointer among them, a new name every build).
void PrintTo(const CrashPoint& p, std::ostream* os) { *os << p.name; }

class StateMigrateCrashAt : public ::testing::TestWithParam<CrashPoint> {};

TEST_P(StateMigrateCrashAt, RerunIsConsistent) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  Scenario s;
  const CrashPoint& p = GetParam();
  testing::StopEnv env(PosixEnv());
  env.StopAfter(p.after, [&](EnvOp op, const std::string& path) {
    if (op != EnvOp::kSync) return false;
    const bool journal = path.ends_with(orchestrate::kMigrateJournalName);
    return p.files ? !journal && path.starts_with(s.new_dir.string() + "/") : journal;
  });
  auto crashed = orchestrate::MigrateState(env, s.old_dir.string(), s.new_dir.string());
  ASSERT_FALSE(crashed.ok());
  ASSERT_TRUE(env.stopped()) << crashed.error().ToString();
  // Never both lost: before the commit point the old copy is intact; after
  // it the new one is complete (the old may be partly removed).
  if (GetParam().new_is_current) {
    EXPECT_TRUE(s.Complete(s.new_dir));
    EXPECT_TRUE(fs::exists(s.new_dir / ".barge-state.json"));
  } else {
    EXPECT_TRUE(s.Complete(s.old_dir));
    EXPECT_FALSE(fs::exists(s.new_dir / ".barge-state.json"));
  }
  json r = testing::RunResult(s.Migrate());
  EXPECT_EQ(r["outcome"], "migrated");
  EXPECT_EQ(r["recovery"], GetParam().new_is_current ? "finished" : "rolled back");
  s.CheckFinished();
}

INSTANTIATE_TEST_SUITE_P(
    Steps, StateMigrateCrashAt,
    ::testing::Values(CrashPoint{"AfterBegin", 1, false, false},
                      CrashPoint{"AfterTwoFiles", 2, true, false},
                      CrashPoint{"AfterCopied", 2, false, false},
                      CrashPoint{"AfterVerified", 3, false, false},
                      CrashPoint{"AfterCurrent", 4, false, true},
                      CrashPoint{"AfterOldRemoved", 5, false, true}),
    CrashPointName);

TEST(StateMigrateCrashTest, FailureRemovesNewCopyAndKeepsOld) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  Scenario s;
  // A target that holds something else is refused before anything happens.
  fs::create_directories(s.new_dir);
  testing::WriteFile((s.new_dir / "stray").string(), testing::RandomBytes(10, 1));
  auto r = testing::Run(s.Migrate());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(s.Complete(s.old_dir));
  fs::remove_all(s.new_dir);
  // A failure during the copy (the new volume is full) removes the new
  // copy; the old stays current and complete.
  fs::path small = s.dir.path() / "pvc-small";
  fs::create_directories(small);
  if (::geteuid() != 0 || ::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{small.string()};
  r = testing::Run(Barge() + " state migrate --no-libvirt --from " + ShellQuote(s.old_dir.string()) + " --to " +
          ShellQuote((small / "state").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("stays current"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NoSpace"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(small / "state"));
  EXPECT_TRUE(s.Complete(s.old_dir));
}

}  // namespace
}  // namespace barge
