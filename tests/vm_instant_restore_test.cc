// barge vm instant-restore against a real libvirtd and a TCG domain: the
// domain starts on an overlay over the verified export, the guest writes
// through the monitor while its disk moves to DISK, and DISK ends as the
// point plus those writes; a SIGKILL of barge mid-run and a rerun end the
// same way (docs/export.md, "Instant recovery").
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "tests/testing/cli_testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kDiskBytes = 32 * kMiB;

// A barge command in the background, its stdout (NDJSON) in a file.
class Background {
 public:
  Background(const std::string& command, const std::string& out) : out_(out) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string c = "exec " + command + " >" + ShellQuote(out) + " 2>" + ShellQuote(out + ".err");
      ::execl("/bin/sh", "sh", "-c", c.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // The first event named `name` with `key` == `value` ("" = any); null
  // when barge ends first or after `seconds`.
  json WaitEvent(const std::string& name, const std::string& phase, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      for (const json& e : Events()) {
        if (e.value("event", "") == name && (phase.empty() || e.value("phase", "") == phase)) return e;
      }
      if (Exited()) return nullptr;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return nullptr;
  }
  std::vector<json> Events() const {
    std::vector<json> events;
    const std::string text = fs::exists(out_) ? Slurp(out_) : "";
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
      events.push_back(json::parse(text.substr(start, nl - start), nullptr, false));
    }
    return events;
  }
  bool Exited() {
    if (pid_ <= 0) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
    pid_ = 0;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }
  // Waits for the end (up to `seconds`); the exit code, -1 on timeout.
  int Wait(double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!Exited()) {
      if (std::chrono::steady_clock::now() > end) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return exit_code_;
  }
  void Kill9() {
    ::kill(pid_, SIGKILL);
    Wait(30);
  }
  // SIGSTOP / SIGCONT: barge holds still (its nbdkit, a process of its own,
  // goes on serving) while the test makes the guest write, so the writes
  // land on the overlay before any pivot. Returns whether barge had not
  // printed `ready` yet when it stopped: then the pivot, and the count of
  // the overlay's bytes just before it, come after the test's writes (a
  // pivot not yet printed may already be done: "pivoted" is no sure sign).
  bool Pause() {
    ::kill(pid_, SIGSTOP);
    for (const json& e : Events()) {
      if (e.value("phase", "") == "ready" || e.value("phase", "") == "pivoted") return false;
    }
    return true;
  }
  void Resume() { ::kill(pid_, SIGCONT); }
  std::string Stderr() const { return fs::exists(out_ + ".err") ? Slurp(out_ + ".err") : ""; }
  pid_t pid() const { return pid_; }

 private:
  std::string out_;
  pid_t pid_ = 0;
  int exit_code_ = -1;
};

bool ProcessGone(int64_t pid) { return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

// The nbdkit child of process `parent` (the export barge started), 0 if none.
int64_t NbdkitChildOf(pid_t parent) {
  CommandResult r = Run("pgrep -P " + std::to_string(parent) + " -x nbdkit");
  return r.exit_code == 0 ? std::stoll(r.stdout_text) : 0;
}

// The phases a run printed, in order.
std::string Phases(const std::vector<json>& events) {
  std::string phases;
  for (const json& e : events) {
    if (e.value("event", "") == "phase") phases += " " + e.value("phase", "");
  }
  return phases;
}

class VmInstantRestoreTest : public VmTestBase {
 protected:
  void SetUp() override {
    VmTestBase::SetUp();
    if (HasFatalFailure()) return;
    BARGE_REQUIRE_TOOL("nbdkit");
    BARGE_REQUIRE_TOOL("qemu-img");
    // Data in [0, 12 MiB) and [20 MiB, 24 MiB), a hole between.
    source_ = dir_ / "source.raw";
    std::vector<std::byte> bytes(kDiskBytes);
    auto a = RandomBytes(12 * kMiB, 1), b = RandomBytes(4 * kMiB, 2);
    std::copy(a.begin(), a.end(), bytes.begin());
    std::copy(b.begin(), b.end(), bytes.begin() + 20 * kMiB);
    WriteFile(source_, bytes);
    RunOk(BargeBinary() + " backup --compress none --source " + ShellQuote(source_) + " --target " +
          ShellQuote(dir_ / "bk") + " --name vda");
    chain_ = dir_ / "bk/vda";
    // The domain's own disk, to be replaced: a blank qcow2.
    placeholder_ = dir_ / "old.qcow2";
    RunOk("qemu-img create -q -f qcow2 " + ShellQuote(placeholder_) + " " + std::to_string(kDiskBytes));
    disk_ = dir_ / "restored.raw";
  }

  std::string Command(const std::string& domain) {
    return Barge("vm instant-restore " + ShellQuote(chain_) + " --domain " + domain + " --to " + ShellQuote(disk_) +
                 " --json");
  }
  std::string CommandConnect(const std::string& domain) {
    return Command(domain) + " --connect qemu:///system";
  }
  std::string SourceOf(const std::string& domain) {
    return RunOk(std::string(kVirsh) + "domblklist " + domain + " --details");
  }
  // The source with the guest's writes applied, compared with DISK.
  void ExpectDiskIsPointPlusWrites() {
    const std::string expected = dir_ / "expected.raw";
    fs::copy_file(source_, expected, fs::copy_options::overwrite_existing);
    RunOk("qemu-io -f raw -c 'write -P 0x5a 0 64k' -c 'write -P 0x33 22M 128k' " + ShellQuote(expected));
    RunOk("cmp " + ShellQuote(disk_) + " " + ShellQuote(expected));
  }
  void ExpectCleanedUp(const json& result) {
    EXPECT_TRUE(ProcessGone(result.value("nbdkit_pid", int64_t{0}))) << result.dump();
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      EXPECT_EQ(e.path().filename().string().rfind(".barge-instant-", 0), std::string::npos) << e.path();
    }
  }

  // While the domain runs on them, the overlay (0600) and the export's
  // socket (0660) are QEMU's user's and group's alone (as libvirt runs the
  // domain's QEMU): another local user (nobody) neither reads the overlay
  // nor connects to the socket (the folder around them is traversable).
  // The run's scratch folder beside DISK (mkdtemp: .barge-instant-DOMAIN-XXXXXX).
  std::string ScratchOf(const std::string& domain) {
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      if (e.path().filename().string().rfind(".barge-instant-" + domain + "-", 0) == 0) return e.path().string();
    }
    ADD_FAILURE() << "no scratch folder for " << domain;
    return dir_ / (".barge-instant-" + domain + "-missing");
  }
  void ExpectOnlyQemuReaches(const std::string& domain, bool socket_too = true) {
    const std::string scratch = ScratchOf(domain);
    const std::string overlay = scratch + "/overlay.qcow2", socket = scratch + "/nbd.sock";
    std::string qemu_pid = Slurp("/run/libvirt/qemu/" + domain + ".pid");
    qemu_pid.erase(qemu_pid.find_last_not_of(" \n") + 1);
    struct stat qemu;
    ASSERT_EQ(::stat(("/proc/" + qemu_pid).c_str(), &qemu), 0) << "QEMU's pid " << qemu_pid;
    for (const auto& [path, mode] : {std::pair<std::string, unsigned>{overlay, 0600}, {socket, 0660}}) {
      if (path == socket && !socket_too) continue;
      struct stat st;
      ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path;
      EXPECT_EQ(st.st_mode & 07777, mode) << path;
      EXPECT_EQ(st.st_uid, qemu.st_uid) << path;
      EXPECT_EQ(st.st_gid, qemu.st_gid) << path;
    }
    EXPECT_EQ(::barge::testing::Run("runuser -u nobody -- test -x " + ShellQuote(scratch)).exit_code, 0);
    CommandResult read = ::barge::testing::Run("runuser -u nobody -- cat " + ShellQuote(overlay) + " >/dev/null");
    EXPECT_NE(read.exit_code, 0) << "nobody read the overlay: " << read.output;
    if (!socket_too) return;
    CommandResult connect = ::barge::testing::Run("runuser -u nobody -- nbdinfo --size " +
                                                  ShellQuote("nbd+unix:///?socket=" + socket));
    EXPECT_NE(connect.exit_code, 0) << "nobody read the backup point through the socket: " << connect.output;
  }

  // A byte in the point's first data cluster (guest offset 0) flipped
  // (again: flipped back); the layer file.
  std::string FlipAByteOfTheFirstCluster() {
    const std::vector<std::string> ids = PointIds(chain_);
    EXPECT_EQ(ids.size(), 1u);
    const std::string manifest = ManifestPath(chain_, ids[0]);
    const std::string image = manifest.substr(0, manifest.size() - 5) + ".qcow2";
    json map = json::parse(RunOk("qemu-img map --output=json -f qcow2 " + ShellQuote(image)));
    int64_t host = -1;
    for (const json& e : map) {
      if (e.at("start") == 0 && e.contains("offset")) host = e.at("offset");
    }
    EXPECT_GE(host, 0) << map.dump();
    if (host < 0) return "";
    auto bytes = ReadFile(image);
    bytes[host + 4096 * 3] ^= std::byte{0x5a};
    WriteFile(image, bytes);
    return image;
  }

  std::string source_, chain_, placeholder_, disk_;
};

TEST_F(VmInstantRestoreTest, StartsAtOnceKeepsGuestWritesAndEndsOnDisk) {
  TestDomain dom("instant", {{"vda", placeholder_, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  const auto t0 = std::chrono::steady_clock::now();
  Background run(CommandConnect(dom.name()), dir_ / "run.out");
  json started = run.WaitEvent("phase", "started", 120);
  ASSERT_FALSE(started.is_null()) << run.Stderr();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 30) << "the domain should run within seconds (loaded 2-core machine)";
  EXPECT_NE(RunOk(std::string(kVirsh) + "domstate " + dom.name()).find("running"), std::string::npos);
  // Guest writes while the data moves (on the overlay: barge held still).
  const bool before_pivot = run.Pause();
  if (before_pivot) ExpectOnlyQemuReaches(dom.name());
  dom.Write(0x5a, "0", "64k");
  dom.Write(0x33, "22M", "128k");
  run.Resume();
  ASSERT_EQ(run.Wait(300), 0) << run.Stderr();
  json result = run.Events().back();
  ASSERT_EQ(result.value("event", ""), "result") << result.dump();
  EXPECT_GT(result.value("verified_bytes", uint64_t{0}), 0u);
  if (before_pivot) {
    // The mirror moved the writes the overlay held (qemu-img map, whole clusters).
    EXPECT_GE(result.value("guest_written_bytes", uint64_t{0}), 192u * 1024) << result.dump();
  }
  std::cerr << "running after " << seconds << " s (barge: " << result.value("started_seconds", 0.0)
            << " s); guest bytes mirrored from the overlay: " << result.value("guest_written_bytes", uint64_t{0})
            << "\n";
  // Every line valid under docs/json.md.
  RunOk("python3 " + ShellQuote(std::string(BARGE_SOURCE_DIR) + "/tests/json_schema_test.py") +
        " --check 0 vm instant-restore < " + ShellQuote(dir_ / "run.out"));
  EXPECT_NE(SourceOf(dom.name()).find(disk_), std::string::npos) << "the domain runs on DISK";
  // The persistent definition names DISK too.
  EXPECT_NE(RunOk(std::string(kVirsh) + "dumpxml --inactive " + dom.name()).find(disk_), std::string::npos);
  ExpectCleanedUp(result);
  dom.Destroy();
  ExpectDiskIsPointPlusWrites();
}

TEST_F(VmInstantRestoreTest, KilledRunIsFinishedByTheSameCommand) {
  TestDomain dom("instantkill", {{"vda", placeholder_, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  bool before_pivot = false;
  {
    Background run(Command(dom.name()), dir_ / "run1.out");
    ASSERT_FALSE(run.WaitEvent("phase", "started", 120).is_null()) << run.Stderr();
    before_pivot = run.Pause();
    dom.Write(0x5a, "0", "64k");
    run.Kill9();
  }
  const std::string where = SourceOf(dom.name());
  const bool on_overlay = where.find(disk_) == std::string::npos;
  if (on_overlay) {
    // Killed before the pivot: the domain stays on the overlay.
    EXPECT_NE(where.find("overlay.qcow2"), std::string::npos) << where;
  }
  dom.Write(0x33, "22M", "128k");
  Background rerun(Command(dom.name()), dir_ / "run2.out");
  ASSERT_EQ(rerun.Wait(300), 0) << rerun.Stderr();
  json result = rerun.Events().back();
  ASSERT_EQ(result.value("event", ""), "result") << result.dump();
  EXPECT_TRUE(result.value("resumed", false));
  std::string phases;
  for (const json& e : rerun.Events()) {
    if (e.value("event", "") == "phase") phases += " " + e.value("phase", "");
  }
  std::cerr << "rerun's phases:" << phases << "\n";
  std::cerr << "killed " << (before_pivot ? "before" : "after") << " the pivot\n";
  if (on_overlay) {
    EXPECT_NE(phases.find("pivoted"), std::string::npos) << phases;
    // The first run's write (on the overlay) was mirrored onto DISK.
    EXPECT_GE(result.value("guest_written_bytes", uint64_t{0}), 64u * 1024) << result.dump();
  }
  EXPECT_NE(SourceOf(dom.name()).find(disk_), std::string::npos);
  ExpectCleanedUp(result);
  dom.Destroy();
  ExpectDiskIsPointPlusWrites();
}

TEST_F(VmInstantRestoreTest, RefusesExistingDiskAndRunningDomain) {
  TestDomain dom("instantno", {{"vda", placeholder_, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  RunOk("touch " + ShellQuote(disk_));
  CommandResult r = ::barge::testing::Run(Command(dom.name()));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
  fs::remove(disk_);
  // A remote hypervisor without the export's TLS certificates: refused
  // before anything changes (VmRemoteTlsInstantTest runs one with them).
  r = ::barge::testing::Run(Command(dom.name()) + " --connect qemu+ssh://root@192.0.2.1/system");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("InvalidArgument"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--tls-certificates"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(disk_));
  dom.StartPaused();
  r = ::barge::testing::Run(Command(dom.name()));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("shut it off"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(disk_));
}

// A damaged cluster of the point: the export fails its read (EIO), the
// copy cannot complete, and the domain stays on the overlay: DISK is never
// pivoted to with data missing.
// Issue 36 §6: a damaged cluster in the point. The run says at once which
// cluster (the layer file, the guest offset) and what to do, and keeps the
// export serving every good cluster while the domain runs (the damaged
// one reads EIO); a rerun says it again at once, from the record, without
// restoring up to it. It never pivots.
TEST_F(VmInstantRestoreTest, DamagedPointNeverPivots) {
  const std::string image = FlipAByteOfTheFirstCluster();
  ASSERT_FALSE(image.empty());
  TestDomain dom("instantbad", {{"vda", placeholder_, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  // The export's socket in the run's scratch folder (found once the run made it).
  auto uri_now = [&] { return "nbd+unix:///?socket=" + ScratchOf(dom.name()) + "/nbd.sock"; };
  // Reads through the export the domain runs on: the damaged cluster
  // fails with EIO, every other range reads (each cluster verified).
  auto expect_serving = [&](const std::string& when) {
    const std::string uri = uri_now();
    CommandResult bad = ::barge::testing::Run("qemu-io -r -f raw " + ShellQuote(uri) + " -c 'read 0 4k'");
    EXPECT_NE(bad.output.find("Input/output error"), std::string::npos) << when << ": " << bad.output;
    CommandResult good = ::barge::testing::Run("qemu-io -r -f raw " + ShellQuote(uri) +
                                               " -c 'read 64k 12M' -c 'read -P 0 12M 8M' -c 'read 20M 4M'");
    EXPECT_EQ(good.exit_code, 0) << when << ": " << good.output;
    EXPECT_EQ(good.output.find("error"), std::string::npos) << when << ": " << good.output;
    EXPECT_EQ(good.output.find("fail"), std::string::npos) << when << ": " << good.output;
  };
  auto expect_says_what = [&](const json& damaged) {
    const std::string m = damaged.value("message", "");
    EXPECT_NE(m.find(image), std::string::npos) << m;
    EXPECT_NE(m.find("guest offset 0x0"), std::string::npos) << m;
    EXPECT_NE(m.find("--abandon"), std::string::npos) << m;
    EXPECT_NE(m.find("barge verify"), std::string::npos) << m;
  };

  Background run(Command(dom.name()), dir_ / "run.out");
  json damaged = run.WaitEvent("phase", "damaged", 300);
  ASSERT_FALSE(damaged.is_null()) << run.Stderr();
  expect_says_what(damaged);
  // Still running, still serving, several times over.
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(run.Exited()) << run.Stderr();
    expect_serving("while the first run serves");
  }
  dom.Write(0x5a, "1M", "64k");  // the guest's writes go on
  ExpectOnlyQemuReaches(dom.name());
  // Stopped: it says the domain has no export now and the damage (exit 2).
  ::kill(run.pid(), SIGTERM);
  EXPECT_EQ(run.Wait(60), 2) << run.Stderr();
  EXPECT_NE(run.Stderr().find("rerun"), std::string::npos) << run.Stderr();
  // Giving up is refused while the domain runs.
  CommandResult refused = ::barge::testing::Run(Command(dom.name()) + " --abandon");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("shut it off"), std::string::npos) << refused.output;

  // The rerun says it at once (the recorded range checked first: no
  // restore progress before it) and serves again.
  Background rerun(Command(dom.name()), dir_ / "rerun.out");
  json again = rerun.WaitEvent("phase", "damaged", 120);
  ASSERT_FALSE(again.is_null()) << rerun.Stderr();
  expect_says_what(again);
  for (const json& e : rerun.Events()) EXPECT_NE(e.value("event", ""), "progress") << e.dump();
  EXPECT_EQ(Phases(rerun.Events()), " started damaged");
  expect_serving("while the rerun serves");
  // The domain shut off: the run ends, naming the damage and what to do.
  dom.Destroy();
  EXPECT_EQ(rerun.Wait(60), 2) << rerun.Stderr();
  EXPECT_NE(rerun.Stderr().find("Corruption"), std::string::npos) << rerun.Stderr();
  EXPECT_NE(rerun.Stderr().find("offset"), std::string::npos) << rerun.Stderr();
  EXPECT_NE(rerun.Stderr().find("--abandon"), std::string::npos) << rerun.Stderr();
  const std::string where = SourceOf(dom.name());
  EXPECT_NE(where.find("overlay.qcow2"), std::string::npos) << where;
  EXPECT_EQ(where.find(disk_), std::string::npos) << where;
  // The domain's definition was never pointed at DISK either.
  EXPECT_EQ(RunOk(std::string(kVirsh) + "dumpxml --inactive " + dom.name()).find(disk_), std::string::npos);
  // Given up: its own disk back, nothing left. A run killed during the
  // prefill leaves DISK half-restored under its temporary name; abandoning
  // removes it too.
  const fs::path half = fs::path(disk_).parent_path() / ("." + fs::path(disk_).filename().string() + ".barge-tmp");
  WriteFile(half.string(), std::vector<std::byte>(4096, std::byte{0x11}));
  CommandResult r = ::barge::testing::Run(Command(dom.name()) + " --abandon");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(half)) << half;
  EXPECT_NE(r.stdout_text.find("\"abandoned\":true"), std::string::npos) << r.stdout_text;
  EXPECT_NE(SourceOf(dom.name()).find(placeholder_), std::string::npos) << SourceOf(dom.name());
  EXPECT_FALSE(fs::exists(disk_));
  for (const auto& e : fs::directory_iterator(dir_.path())) {
    EXPECT_EQ(e.path().filename().string().rfind(".barge-instant-", 0), std::string::npos) << e.path();
  }
  r = ::barge::testing::Run(Command(dom.name()) + " --abandon");
  EXPECT_EQ(r.exit_code, 1) << r.output;  // nothing left to abandon
}

// A damaged point whose layer file is put back intact (a replica's copy)
// while the domain runs: the rerun finds the recorded range readable,
// restores and pivots; DISK is the point plus the guest's writes, the
// damaged range's included.
TEST_F(VmInstantRestoreTest, ARepairedLayerLetsTheRerunFinish) {
  ASSERT_FALSE(FlipAByteOfTheFirstCluster().empty());
  TestDomain dom("instantfix", {{"vda", placeholder_, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  Background run(Command(dom.name()), dir_ / "run1.out");
  ASSERT_FALSE(run.WaitEvent("phase", "damaged", 300).is_null()) << run.Stderr();
  dom.Write(0x5a, "0", "64k");
  dom.Write(0x33, "22M", "128k");
  ::kill(run.pid(), SIGTERM);
  EXPECT_EQ(run.Wait(60), 2) << run.Stderr();
  ASSERT_FALSE(FlipAByteOfTheFirstCluster().empty());  // intact again
  Background rerun(Command(dom.name()), dir_ / "run2.out");
  ASSERT_EQ(rerun.Wait(300), 0) << rerun.Stderr();
  EXPECT_EQ(Phases(rerun.Events()), " started verified ready pivoted");
  const json result = rerun.Events().back();
  ASSERT_EQ(result.value("event", ""), "result") << result.dump();
  EXPECT_NE(SourceOf(dom.name()).find(disk_), std::string::npos);
  ExpectCleanedUp(result);
  dom.Destroy();
  ExpectDiskIsPointPlusWrites();
}

// The export's nbdkit killed with SIGKILL while the data moves: the run
// starts the export again (or a rerun of the same command does), and DISK
// ends as the point plus the guest's writes.
TEST_F(VmInstantRestoreTest, ExportKilledMidMoveEndsComplete) {
  TestDomain dom("instantnbd", {{"vda", placeholder_, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  Background run(Command(dom.name()), dir_ / "run1.out");
  ASSERT_FALSE(run.WaitEvent("phase", "started", 120).is_null()) << run.Stderr();
  const int64_t nbdkit = NbdkitChildOf(run.pid());
  ASSERT_GT(nbdkit, 0) << "no nbdkit under barge " << run.pid();
  const bool before_pivot = run.Pause();
  ASSERT_EQ(::kill(static_cast<pid_t>(nbdkit), SIGKILL), 0);
  dom.Write(0x5a, "0", "64k");
  dom.Write(0x33, "22M", "128k");
  run.Resume();
  const int code = run.Wait(300);
  std::cerr << "nbdkit " << nbdkit << " killed" << (before_pivot ? " before the pivot" : " after the pivot")
            << "; the run exited " << code << " with phases:" << Phases(run.Events()) << "\n";
  json result = run.Events().empty() ? json() : run.Events().back();
  if (code != 0) {
    // Left on the overlay: the same command finishes it.
    EXPECT_NE(SourceOf(dom.name()).find("overlay.qcow2"), std::string::npos) << SourceOf(dom.name());
    Background rerun(Command(dom.name()), dir_ / "run2.out");
    ASSERT_EQ(rerun.Wait(300), 0) << rerun.Stderr();
    result = rerun.Events().back();
  }
  ASSERT_EQ(result.value("event", ""), "result") << result.dump();
  EXPECT_NE(SourceOf(dom.name()).find(disk_), std::string::npos);
  ExpectCleanedUp(result);
  EXPECT_TRUE(ProcessGone(nbdkit));
  dom.Destroy();
  ExpectDiskIsPointPlusWrites();
}

// Several disks: refused without --target; with it, only that disk moves.
TEST_F(VmInstantRestoreTest, SeveralDisksNeedTarget) {
  const std::string other = dir_ / "other.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(other) + " 8M");
  TestDomain dom("instanttwo", {{"vda", other, "qcow2"}, {"vdb", placeholder_, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  CommandResult r = ::barge::testing::Run(Command(dom.name()));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--target"), std::string::npos) << r.output;
  EXPECT_EQ(RunOk(std::string(kVirsh) + "domstate " + dom.name()).find("running"), std::string::npos);
  r = ::barge::testing::Run(Command(dom.name()) + " --target vdb");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string where = SourceOf(dom.name());
  EXPECT_NE(where.find("vdb"), std::string::npos);
  EXPECT_NE(where.find(disk_), std::string::npos) << where;
  EXPECT_NE(where.find(other), std::string::npos) << where;
  dom.Destroy();
  RunOk("cmp " + ShellQuote(disk_) + " " + ShellQuote(source_));
}

// libvirtd killed with SIGKILL while the data moves (QEMU keeps running):
// the run fails or completes, never pivots to a DISK that lacks data; once
// the daemon is back, the same command finishes, and DISK ends as the point
// plus the guest's writes. Kills the daemon every libvirt test uses:
// RUN_SERIAL (tests/CMakeLists.txt).
class VmInstantRestoreLibvirtdKillTest : public VmInstantRestoreTest {};

TEST_F(VmInstantRestoreLibvirtdKillTest, LibvirtdKilledMidMoveThenRerunCompletes) {
  TestDomain dom("instantlv", {{"vda", placeholder_, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  int code = -1;
  {
    Background run(Command(dom.name()), dir_ / "run1.out");
    ASSERT_FALSE(run.WaitEvent("phase", "started", 120).is_null()) << run.Stderr();
    LibvirtdLock lock;
    // barge held still while the daemon dies: its next call meets the
    // dead daemon whatever the machine's speed.
    const bool before_pivot = run.Pause();
    ASSERT_TRUE(KillLibvirtd(lock));
    run.Resume();
    code = run.Wait(300);
    if (before_pivot) {
      EXPECT_EQ(code, 1) << "killed before the pivot: the run must fail (rerun to continue)";
    }
    std::cerr << "libvirtd killed; the run exited " << code << " with phases:" << Phases(run.Events()) << "\n"
              << run.Stderr() << "\n";
    ::testing::AssertionResult up = EnsureLibvirtd(lock);
    ASSERT_TRUE(up);
    EXPECT_TRUE(code == 0 || code == 1) << "barge hung or died of a signal without libvirtd: " << code;
  }
  // QEMU ran on without the daemon; the restarted one knows it again.
  EXPECT_NE(RunOk(std::string(kVirsh) + "domstate " + dom.name()).find("running"), std::string::npos);
  const std::string where = SourceOf(dom.name());
  if (code != 0) {
    EXPECT_NE(where.find("overlay.qcow2"), std::string::npos) << where;
  }
  dom.Write(0x5a, "0", "64k");
  dom.Write(0x33, "22M", "128k");
  if (code != 0) {
    Background rerun(Command(dom.name()), dir_ / "run2.out");
    ASSERT_EQ(rerun.Wait(300), 0) << rerun.Stderr();
    json result = rerun.Events().back();
    ASSERT_EQ(result.value("event", ""), "result") << result.dump();
    EXPECT_TRUE(result.value("resumed", false));
    ExpectCleanedUp(result);
  }
  EXPECT_NE(SourceOf(dom.name()).find(disk_), std::string::npos);
  dom.Destroy();
  ExpectDiskIsPointPlusWrites();
}

}  // namespace
}  // namespace barge::testing
