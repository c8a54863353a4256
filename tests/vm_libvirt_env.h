// Test environment for libvirt integration tests: virtlogd + libvirtd started
// once for all test processes (under a machine-wide lock) and ready only once
// QEMU is probed, and throwaway domains (no OS, 64 MiB, pc, TCG, virtio
// disks) started paused, with guest writes through the QEMU monitor's qemu-io
// on the disk backend. A domain may also boot a kernel directly
// (DomainExtras; the quiesce test's guest). Every test domain is named
// "barge-test-<pid>-..." and removed by its owner's destructor, or by the
// sweep of the next test process once its owner is gone.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "blockio/env.h"
#include "orchestrate/vm/vm_backup.h"
#include "tests/testing/testing.h"

namespace barge::testing {

// The VM backup's fault seam for tests: fails the run once, at one point.
class FailVmBackupOnce final : public orchestrate::VmBackupFaults {
 public:
  explicit FailVmBackupOnce(Point point) : point_(point) {}
  Status At(Point point) override {
    if (point != point_ || fired_) return OkStatus();
    fired_ = true;
    switch (point) {
      case Point::kAfterFreeze: return Error::IoError("injected fault after freezing the guest");
      case Point::kThaw: return Error::IoError("injected thaw failure");
      case Point::kAfterRead: return Error::IoError("injected fault after reading every disk");
    }
    return OkStatus();
  }
  bool fired() const { return fired_; }

 private:
  Point point_;
  bool fired_ = false;
};

// virsh for test bodies, once EnsureLibvirtd has succeeded (warm daemon).
inline constexpr const char* kVirsh = "timeout 60 virsh -q -c qemu:///system ";

// How long a test waits for the lock, the daemons' start and the first probe
// of QEMU together: seconds on an idle machine, far longer on two cores busy
// with parallel tests.
inline constexpr double kLibvirtdReadySeconds = 420;

// The machine-wide lock over starting and stopping the test daemons: ctest
// runs tests in parallel processes, and exactly one of them may start
// libvirtd (or stop it, VmLibvirtdRestartTest) while the others wait. An
// flock on a file under /run/lock, taken with O_CLOEXEC so that a daemon
// started under it does not inherit it. One per process at a time.
class LibvirtdLock {
 public:
  // Waits up to `timeout_seconds` for the lock; held() tells whether it came.
  explicit LibvirtdLock(double timeout_seconds = kLibvirtdReadySeconds);
  ~LibvirtdLock();
  LibvirtdLock(const LibvirtdLock&) = delete;
  LibvirtdLock& operator=(const LibvirtdLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& error() const { return error_; }  // why not held

 private:
  int fd_ = -1;
  std::string error_;
};

// Makes libvirtd usable for a test, whatever state the machine is in: under
// the lock, prepares the machine (TESTBED.md's folders, user and groups;
// /dev/kvm as udev would leave it), starts virtlogd and libvirtd when they
// are not running, waits until the daemon answers and has probed QEMU
// (`virsh domcapabilities` and `virsh capabilities`; minutes with an empty
// capability cache on a loaded machine), checks that the probe stays cached,
// and removes test domains whose process is gone. Fails with what it saw
// (and the daemon log's tail) if the daemon is not ready within
// kLibvirtdReadySeconds.
// Prints one line of timings to stderr. May block that long.
::testing::AssertionResult EnsureLibvirtd();
// The same, for a caller that already holds the lock.
::testing::AssertionResult EnsureLibvirtd(const LibvirtdLock& held);

// SIGTERM to libvirtd (its pid file names it); waits up to 30 s until the
// process has exited. Running QEMU processes stay. The caller holds the lock
// until EnsureLibvirtd has brought the daemon back.
::testing::AssertionResult StopLibvirtd(const LibvirtdLock& held);

// SIGKILL to libvirtd (a crash: no shutdown of its own); waits up to 30 s
// until the process is gone. Running QEMU processes stay. The caller holds
// the lock until EnsureLibvirtd has brought the daemon back.
::testing::AssertionResult KillLibvirtd(const LibvirtdLock& held);

// `req` run by orchestrate::RunVmBackup in a child process, slowed down
// (each progress report waits 150 ms) and held once `num`/`den` of its
// work is copied, so that a test acts on it at a known point: SIGKILLs it
// (Kill) or lets it go on after changing something under it (Release).
// Killed and reaped by the destructor if still running.
class HeldVmBackup {
 public:
  HeldVmBackup(orchestrate::VmBackupRequest req, uint64_t num, uint64_t den);
  // Any run that reports its copy's progress (done, total bytes), e.g. a
  // policy run (RunOptions::copy.progress): `run` installs `progress` and
  // returns the run's error, "" when it succeeded.
  using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;
  HeldVmBackup(std::function<std::string(ProgressFn progress)> run, uint64_t num, uint64_t den);
  ~HeldVmBackup();
  HeldVmBackup(const HeldVmBackup&) = delete;
  HeldVmBackup& operator=(const HeldVmBackup&) = delete;

  // Waits up to 300 s for the hold, then `settle` more (for the journal to
  // catch up with what was handed to the destination). False when the
  // run never got that far.
  bool WaitHeld(std::chrono::milliseconds settle = std::chrono::milliseconds(0));
  // SIGKILLs the run and reaps it.
  void Kill();
  // Lets the held run go on and waits for its end. Returns its error
  // ("succeeded" when it succeeded); `failed` says whether it failed.
  std::string Release(bool* failed);

 private:
  pid_t child_ = -1;
  int held_ = -1, go_ = -1, said_ = -1;  // this end of each pipe
};

// Destroys and undefines `domain` (with its checkpoint and snapshot
// metadata) and checks that libvirt no longer lists it.
::testing::AssertionResult RemoveDomain(const std::string& domain);

// Removes every domain named like a test domain whose process is no longer
// running (killed runs, timed-out defines); returns how many it removed.
int SweepTestDomains();

#define BARGE_REQUIRE_LIBVIRT()                        \
  do {                                                 \
    BARGE_REQUIRE_TOOL("virsh");                       \
    BARGE_REQUIRE_TOOL("libvirtd");                    \
    BARGE_REQUIRE_TOOL("virtlogd");                    \
    BARGE_REQUIRE_TOOL("qemu-system-x86_64");          \
    ASSERT_TRUE(::barge::testing::EnsureLibvirtd());   \
  } while (0)

// Makes `dir` and its parents up to / traversable by the QEMU user.
inline void OpenForQemu(const std::string& dir) {
  ::chmod(dir.c_str(), 0777);
}

// The entries of `dir` whose name starts with `prefix` (a run's fresh
// folders: "barge-scratch-DOMAIN-" + six random characters), sorted.
inline std::vector<std::string> EntriesStartingWith(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().filename().string().starts_with(prefix)) found.push_back(e.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

struct TestDisk {
  std::string target;  // vda
  std::string path;
  std::string format;  // raw / qcow2
};

// What a domain has beyond the defaults: more memory, elements inside <os>
// (<kernel>, <initrd>, <cmdline> for direct kernel boot) and inside
// <devices> (channels, serial ports).
struct DomainExtras {
  int memory_mib = 64;
  std::string os_xml;
  std::string devices_xml;
};

// A throwaway persistent domain named "barge-test-<pid>-<prefix>-<n>",
// destroyed and undefined (with its checkpoint metadata) on destruction,
// whether the test passed, failed or threw; a removal that does not happen
// is a test failure. One thread at a time.
class TestDomain {
 public:
  TestDomain(const std::string& prefix, std::vector<TestDisk> disks, DomainExtras extras = {});
  ~TestDomain();
  TestDomain(const TestDomain&) = delete;
  TestDomain& operator=(const TestDomain&) = delete;

  const std::string& name() const { return name_; }
  std::string Xml() const;

  // Writes the XML into `dir` and defines it (generous timeout: the first
  // define of a process may still find the daemon busy).
  void Define(const std::string& dir);
  void StartPaused() { RunOk(std::string(kVirsh) + "start " + name_ + " --paused"); }
  void Start() { RunOk(std::string(kVirsh) + "start " + name_); }
  void Destroy() { RunOk(std::string(kVirsh) + "destroy " + name_); }
  // SIGKILL of the QEMU process: persistent bitmaps stay marked in use.
  void Kill9();
  // Guest write of `pattern` through the disk's virtio backend (disk index i).
  void Write(int pattern, const std::string& offset, const std::string& length, int disk = 0) {
    Hmp("write -P " + std::to_string(pattern) + " " + offset + " " + length, disk);
  }
  void Flush(int disk = 0) { Hmp("flush", disk); }
  void Hmp(const std::string& qemu_io, int disk);

 private:
  std::string name_;
  std::vector<TestDisk> disks_;
  DomainExtras extras_;
  // The define ran past its timeout: libvirtd may still complete it after
  // virsh gave up, so the destructor waits for the domain to appear.
  bool define_timed_out_ = false;
};

// Shared fixture of the libvirt tests: a temporary folder open to QEMU, a
// catalog and a backup target in it, and the barge commands they run.
class VmTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_LIBVIRT();
    OpenForQemu(dir_.path().string());
    // An explicit --catalog's folder must exist (barge never creates it).
    std::filesystem::create_directories(dir_ / "state");
    OpenForQemu(dir_ / "state");
    catalog_ = dir_ / "state/catalog.db";
    // The backup target must exist (vm backup refuses a missing one).
    target_ = dir_ / "backups";
    std::filesystem::create_directories(target_);
  }

  std::string Barge(const std::string& args) {
    return BargeBinary() + " " + args + " --catalog " + ShellQuote(catalog_);
  }
  // An empty qcow2 image DIR/name of `size`.
  std::string MakeQcow2(const std::string& name, const std::string& size = "64M") {
    std::string p = dir_ / name;
    RunOk("qemu-img create -q -f qcow2 " + ShellQuote(p) + " " + size);
    return p;
  }
  // libvirt's checkpoint names of `domain`, one per line (no blank lines).
  std::string Checkpoints(const std::string& domain) {
    std::string out = RunOk(std::string(kVirsh) + "checkpoint-list " + domain + " --name");
    std::string names;
    size_t pos = 0;
    while (pos < out.size()) {
      size_t end = out.find('\n', pos);
      if (end == std::string::npos) end = out.size();
      if (end > pos) names += out.substr(pos, end - pos) + "\n";
      pos = end + 1;
    }
    return names;
  }
  // The result event of `barge ARGS --json` (docs/json.md), which must exit 0.
  nlohmann::json BargeJson(const std::string& args) { return ::barge::testing::RunResult(Barge(args) + " --json"); }
  nlohmann::json Backup(const std::string& domain, const std::string& extra = "") {
    return BargeJson("vm backup --domain " + domain + " --target " + ShellQuote(target_) + " --skip-quiesce " +
                     extra);
  }
  // A vm backup request of `domain` into `target` with this test's catalog,
  // without the guest agent's freeze unless `skip_quiesce` is false.
  orchestrate::VmBackupRequest VmRequest(const std::string& domain, const std::string& target,
                                         bool skip_quiesce = true) const {
    orchestrate::VmBackupRequest req;
    req.domain = domain;
    req.target = target;
    req.catalog_path = catalog_;
    req.skip_quiesce = skip_quiesce;
    return req;
  }
  // `vm backup --domain D --target T [--skip-quiesce]` run in this process
  // (the CLI's run, without its hooks) with FailVmBackupOnce at `point`.
  // Returns the run's error as `barge` prints it, "" when it succeeded.
  // Expects the fault to have been reached.
  std::string VmBackupFailingAt(orchestrate::VmBackupFaults::Point point, const std::string& domain,
                                const std::string& target, bool skip_quiesce) {
    FailVmBackupOnce fault(point);
    orchestrate::VmBackupRequest req = VmRequest(domain, target, skip_quiesce);
    req.faults = &fault;
    auto run = orchestrate::RunVmBackup(Env::Default(), req);
    EXPECT_TRUE(fault.fired()) << "the run never reached the injected fault";
    return run.ok() ? std::string() : run.error().ToString();
  }
  // Restores point `at` of `chain` and compares it with `expected` (raw).
  void ExpectRestores(const std::string& chain, int at, const std::string& expected) {
    std::string out = dir_ / ("restored-" + std::to_string(at) + ".raw");
    RunOk(BargeBinary() + " restore " + ShellQuote(chain) + " --at " + std::to_string(at) + " --to " +
          ShellQuote(out) + " --force");
    RunOk("cmp " + ShellQuote(out) + " " + ShellQuote(expected));
    std::filesystem::remove(out);
  }

  TempDir dir_;
  std::string catalog_;
  std::string target_;
};

}  // namespace barge::testing
