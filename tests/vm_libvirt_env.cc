// The libvirt tests' environment (tests/vm_libvirt_env.h): the daemons,
// started once under a lock and ready once QEMU is probed, and the test
// domains, removed by their owner or swept once their owner is gone.
#include "tests/vm_libvirt_env.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>

namespace barge::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kLockPath = "/run/lock/barge-test-libvirtd.lock";
constexpr const char* kLibvirtdPidFile = "/var/run/libvirtd.pid";
constexpr const char* kVirtlogdPidFile = "/var/run/virtlogd.pid";
constexpr const char* kLibvirtdLog = "/var/log/libvirt/libvirtd.log";
constexpr const char* kCapabilityCache = "/var/cache/libvirt/qemu/capabilities";
// The daemons get a clean environment, whichever test process starts them.
constexpr const char* kDaemonEnv = "env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin ";
// What the test domains need probed: their emulator and machine under TCG,
// then every emulator (`capabilities`, which a define consults too).
constexpr const char* kProbes[] = {"domcapabilities --virttype qemu --arch x86_64 --machine pc", "capabilities"};
constexpr const char* kTestDomainPrefix = "barge-test-";
constexpr int kDefineSeconds = 300;
constexpr int kCleanupSeconds = 120;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double Until(Clock::time_point deadline) { return std::chrono::duration<double>(deadline - Clock::now()).count(); }
Clock::time_point After(Clock::time_point t0, double seconds) {
  return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string Virsh(double timeout_seconds) {
  return "timeout " + std::to_string(std::max(1, static_cast<int>(timeout_seconds))) + " virsh -q -c qemu:///system ";
}

// True if `pid` runs (a zombie does not) and, when `comm` is given, is that
// command.
bool ProcessAlive(pid_t pid, const std::string& comm = "") {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (pid <= 0 || !std::getline(in, line)) return false;
  // "pid (comm) state ...": comm may hold spaces or ')', the state follows the last ')'.
  size_t open = line.find('(');
  size_t close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close + 2 >= line.size()) return false;
  char state = line[close + 2];
  if (state == 'Z' || state == 'X') return false;
  return comm.empty() || line.substr(open + 1, close - open - 1) == comm;
}

pid_t PidFromFile(const char* path) {
  std::ifstream in(path);
  long pid = -1;
  return (in >> pid) && pid > 0 ? static_cast<pid_t>(pid) : -1;
}

bool DaemonRunning(const char* pid_file, const std::string& comm) {
  return ProcessAlive(PidFromFile(pid_file), comm);
}

std::string LogTail() {
  return Run("tail -n 25 " + std::string(kLibvirtdLog) + " 2>&1").output;
}

// libvirt probes QEMU with CAP_DAC_OVERRIDE, so a /dev/kvm that only root
// may open (no udev on these machines to apply its rule) yields capabilities
// "with KVM" that QEMU's own user then cannot use. libvirt 9.0 takes that
// cache as outdated at every lookup and probes QEMU again, twice per
// emulator: a define took 32 s on an idle machine and ran past 60 s under
// parallel tests. Give the kvm group (QEMU's user is in it) what udev
// gives it. Returns what it did, or "".
std::string PrepareKvmDevice() {
  struct stat st {};
  if (::stat("/dev/kvm", &st) != 0 || !S_ISCHR(st.st_mode)) return "";
  struct group* kvm = ::getgrnam("kvm");
  if (kvm == nullptr) return "";
  if (st.st_gid == kvm->gr_gid && (st.st_mode & 0060) == 0060) return "";
  if (::chown("/dev/kvm", static_cast<uid_t>(-1), kvm->gr_gid) != 0 ||
      ::chmod("/dev/kvm", (st.st_mode & 07777) | 0060) != 0) {
    return std::string("cannot open /dev/kvm to group kvm: ") + std::strerror(errno);
  }
  return "/dev/kvm group kvm rw";
}

// The capability cache's files and their modification times.
std::map<std::string, fs::file_time_type> CacheFiles() {
  std::map<std::string, fs::file_time_type> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kCapabilityCache, ec)) {
    files[e.path().filename().string()] = e.last_write_time(ec);
  }
  return files;
}

// Runs every probe, retrying until it succeeds or `deadline`; the time of
// each goes to `timings`. Returns the last failure's command and output, or "".
std::string Probe(Clock::time_point deadline, std::ostringstream& timings) {
  for (const char* probe : kProbes) {
    auto t0 = Clock::now();
    for (;;) {
      CommandResult r = Run(Virsh(Until(deadline)) + probe + " >/dev/null");
      if (r.exit_code == 0) break;
      if (Clock::now() >= deadline) {
        return "virsh " + std::string(probe) + " (exit " + std::to_string(r.exit_code) + "): " + r.output;
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    timings << "; " << std::string(probe).substr(0, std::string(probe).find(' ')) << " " << Since(t0) << " s";
  }
  return "";
}

::testing::AssertionResult NotReady(const std::string& what, Clock::time_point t0) {
  return ::testing::AssertionFailure()
         << "libvirtd not ready after " << Since(t0) << " s: " << what
         << std::boolalpha << "\nlibvirtd running: " << DaemonRunning(kLibvirtdPidFile, "libvirtd")
         << ", virtlogd running: " << DaemonRunning(kVirtlogdPidFile, "virtlogd") << "\ntail of " << kLibvirtdLog
         << ":\n"
         << LogTail();
}

::testing::AssertionResult EnsureLibvirtdBy(Clock::time_point t0, Clock::time_point deadline, double lock_seconds) {
  std::ostringstream notes;
  notes << std::fixed << std::setprecision(1) << "lock " << lock_seconds << " s";
  // TESTBED.md's preparations; harmless when done.
  Run("mkdir -p /var/log/libvirt /var/run/libvirt /var/lib/libvirt/qemu;"
      "getent group kvm >/dev/null || groupadd -r kvm;"
      "getent passwd libvirt-qemu >/dev/null || { groupadd -r libvirt-qemu;"
      " useradd -r -g libvirt-qemu -G kvm libvirt-qemu; }");
  if (std::string kvm = PrepareKvmDevice(); !kvm.empty()) notes << "; " << kvm;

  // Started when not running, again if one dies while starting (at most 3).
  int starts = 0;
  auto start_daemons = [&]() -> std::string {
    std::string failed;
    if (!DaemonRunning(kVirtlogdPidFile, "virtlogd")) {
      CommandResult r = Run(std::string(kDaemonEnv) + "virtlogd -d");
      notes << "; started virtlogd";
      if (r.exit_code != 0) failed += "virtlogd -d (exit " + std::to_string(r.exit_code) + "): " + r.output;
    }
    if (!DaemonRunning(kLibvirtdPidFile, "libvirtd")) {
      ++starts;
      CommandResult r = Run(std::string(kDaemonEnv) + "libvirtd -d");
      notes << "; started libvirtd";
      if (r.exit_code != 0) failed += "libvirtd -d (exit " + std::to_string(r.exit_code) + "): " + r.output;
    }
    return failed;
  };
  std::string start_error = start_daemons();

  // Answers: the daemon accepts clients once its drivers are initialized.
  for (;;) {
    CommandResult r = Run(Virsh(std::min(Until(deadline), 30.0)) + "version");
    if (r.exit_code == 0) break;
    if (Clock::now() >= deadline) {
      return NotReady("no answer to virsh version (" + r.output + ")" +
                          (start_error.empty() ? "" : "; start failed: " + start_error),
                      t0);
    }
    if (starts < 3) {
      std::string again = start_daemons();
      if (!again.empty()) start_error = again;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  notes << "; answered " << Since(t0) << " s";

  if (std::string failed = Probe(deadline, notes); !failed.empty()) return NotReady(failed, t0);
  // The probe must stay cached: probing again at every lookup makes every
  // define take many seconds (see PrepareKvmDevice).
  auto probed = CacheFiles();
  std::ostringstream again;
  if (std::string failed = Probe(deadline, again); !failed.empty()) return NotReady(failed, t0);
  if (CacheFiles() != probed) {
    return NotReady(std::string("libvirtd probed QEMU again although nothing changed: its capability cache (") +
                        kCapabilityCache +
                        ") is invalidated at every lookup, so every define would take many seconds; "
                        "is /dev/kvm usable by QEMU's user (group kvm, mode 0660)?",
                    t0);
  }

  if (int swept = SweepTestDomains(); swept > 0) notes << "; swept " << swept << " leftover test domains";
  std::cerr << "libvirtd ready in " << std::fixed << std::setprecision(1) << Since(t0) << " s (" << notes.str()
            << ")\n";
  return ::testing::AssertionSuccess();
}

std::vector<std::string> DomainNames(const CommandResult& listed) {
  std::vector<std::string> names;
  std::istringstream in(listed.output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) names.push_back(line);
  }
  return names;
}

}  // namespace

LibvirtdLock::LibvirtdLock(double timeout_seconds) {
  std::error_code ec;
  fs::create_directories(fs::path(kLockPath).parent_path(), ec);
  // O_CLOEXEC: a daemon started under the lock must not inherit it.
  int fd = ::open(kLockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    error_ = std::string("open ") + kLockPath + ": " + std::strerror(errno);
    return;
  }
  auto t0 = Clock::now();
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      error_ = std::string("flock ") + kLockPath + ": " + std::strerror(errno);
      ::close(fd);
      return;
    }
    if (Since(t0) >= timeout_seconds) {
      error_ = "another test process held " + std::string(kLockPath) + " for " + std::to_string(Since(t0)) + " s";
      ::close(fd);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  fd_ = fd;
}

LibvirtdLock::~LibvirtdLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

::testing::AssertionResult EnsureLibvirtd() {
  auto t0 = Clock::now();
  LibvirtdLock lock(kLibvirtdReadySeconds);
  if (!lock.held()) return ::testing::AssertionFailure() << "libvirtd not ready: " << lock.error();
  return EnsureLibvirtdBy(t0, After(t0, kLibvirtdReadySeconds), Since(t0));
}

::testing::AssertionResult EnsureLibvirtd(const LibvirtdLock& held) {
  if (!held.held()) return ::testing::AssertionFailure() << "EnsureLibvirtd: lock not held: " << held.error();
  auto t0 = Clock::now();
  return EnsureLibvirtdBy(t0, After(t0, kLibvirtdReadySeconds), 0);
}

namespace {

::testing::AssertionResult SignalLibvirtd(const LibvirtdLock& held, int signal) {
  if (!held.held()) return ::testing::AssertionFailure() << "stopping libvirtd: lock not held: " << held.error();
  pid_t pid = PidFromFile(kLibvirtdPidFile);
  if (!ProcessAlive(pid, "libvirtd")) {
    return ::testing::AssertionFailure() << "no running libvirtd named in " << kLibvirtdPidFile;
  }
  if (::kill(pid, signal) != 0) return ::testing::AssertionFailure() << "kill: " << std::strerror(errno);
  for (int i = 0; i < 120; ++i) {
    if (!ProcessAlive(pid)) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return ::testing::AssertionFailure() << "libvirtd " << pid << " still running 30 s after signal " << signal;
}

}  // namespace

::testing::AssertionResult StopLibvirtd(const LibvirtdLock& held) { return SignalLibvirtd(held, SIGTERM); }

::testing::AssertionResult KillLibvirtd(const LibvirtdLock& held) { return SignalLibvirtd(held, SIGKILL); }

::testing::AssertionResult RemoveDomain(const std::string& domain) {
  Run(Virsh(kCleanupSeconds) + "destroy " + ShellQuote(domain));
  CommandResult undefine =
      Run(Virsh(kCleanupSeconds) + "undefine " + ShellQuote(domain) + " --checkpoints-metadata --snapshots-metadata");
  CommandResult listed = Run(Virsh(60) + "list --all --name");
  if (listed.exit_code != 0) {
    return ::testing::AssertionFailure() << "cannot remove domain " << domain
                                         << ": virsh list failed: " << listed.output;
  }
  std::vector<std::string> names = DomainNames(listed);
  if (std::find(names.begin(), names.end(), domain) != names.end()) {
    return ::testing::AssertionFailure() << "domain " << domain << " still defined after undefine: " << undefine.output;
  }
  return ::testing::AssertionSuccess();
}

int SweepTestDomains() {
  CommandResult listed = Run(Virsh(60) + "list --all --name");
  if (listed.exit_code != 0) return 0;
  // The pid of the test process that named the domain. Also the names used
  // before the "barge-test-" prefix (issue 12), so that machines that ran
  // older tests get clean too.
  static const std::regex kCurrent("barge-test-([0-9]+)-.+");
  static const std::regex kLegacy("barge-(?:cbt|offline|redef|crash|refuse|quiesce|restart)-([0-9]+)-[0-9]+");
  int removed = 0;
  for (const std::string& name : DomainNames(listed)) {
    std::smatch m;
    if (!std::regex_match(name, m, kCurrent) && !std::regex_match(name, m, kLegacy)) continue;
    // A live process keeps its domains; a pid reused by another process
    // keeps them until a later sweep.
    if (ProcessAlive(static_cast<pid_t>(std::stol(m[1].str())))) continue;
    ::testing::AssertionResult r = RemoveDomain(name);
    if (r) {
      ++removed;
    } else {
      std::cerr << "sweep of leftover test domains: " << r.message() << "\n";
    }
  }
  return removed;
}

TestDomain::TestDomain(const std::string& prefix, std::vector<TestDisk> disks, DomainExtras extras)
    : disks_(std::move(disks)), extras_(std::move(extras)) {
  static std::atomic<int> counter{0};
  name_ = kTestDomainPrefix + std::to_string(::getpid()) + "-" + prefix + "-" + std::to_string(counter++);
}

TestDomain::~TestDomain() {
  if (define_timed_out_) {
    // libvirtd may still be defining it: wait for it to land, then remove it.
    for (auto t0 = Clock::now(); Since(t0) < kDefineSeconds;) {
      if (Run(Virsh(60) + "domstate " + ShellQuote(name_)).exit_code == 0) break;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  ::testing::AssertionResult removed = RemoveDomain(name_);
  if (!removed) ADD_FAILURE() << removed.message();
}

std::string TestDomain::Xml() const {
  std::string x = "<domain type='qemu'><name>" + name_ + "</name><memory unit='MiB'>" +
                  std::to_string(extras_.memory_mib) +
                  "</memory><vcpu>1</vcpu>"
                  "<os><type arch='x86_64' machine='pc'>hvm</type>" +
                  extras_.os_xml + "</os><devices>";
  for (const auto& d : disks_) {
    x += "<disk type='file' device='disk'><driver name='qemu' type='" + d.format + "'/><source file='" + d.path +
         "'/><target dev='" + d.target + "' bus='virtio'/></disk>";
  }
  return x + extras_.devices_xml + "</devices></domain>";
}

void TestDomain::Define(const std::string& dir) {
  std::string xml_path = dir + "/" + name_ + ".xml";
  {
    std::ofstream out(xml_path);
    out << Xml();
    ASSERT_TRUE(out.good()) << "cannot write " << xml_path;
  }
  auto t0 = Clock::now();
  CommandResult r = Run(Virsh(kDefineSeconds) + "define " + ShellQuote(xml_path));
  define_timed_out_ = r.exit_code == 124;
  std::cerr << "virsh define " << name_ << ": " << std::fixed << std::setprecision(1) << Since(t0) << " s\n";
  ASSERT_EQ(r.exit_code, 0) << "virsh define " << xml_path << ":\n" << r.output;
}

void TestDomain::Kill9() {
  RunOk("kill -9 $(cat /var/run/libvirt/qemu/" + name_ + ".pid)");
  for (int i = 0; i < 40; ++i) {
    if (Run(std::string(kVirsh) + "domstate " + name_).output.find("shut off") != std::string::npos) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

void TestDomain::Hmp(const std::string& qemu_io, int disk) {
  std::string dev = disk == 0 ? "virtio-disk0" : "virtio-disk" + std::to_string(disk);
  std::string out = RunOk(std::string(kVirsh) + "qemu-monitor-command " + name_ + " --hmp " +
                          ShellQuote("qemu-io -d /machine/peripheral/" + dev + "/virtio-backend \"" + qemu_io + "\""));
  EXPECT_EQ(out.find("rror"), std::string::npos) << out;
}

HeldVmBackup::HeldVmBackup(orchestrate::VmBackupRequest req, uint64_t num, uint64_t den)
    : HeldVmBackup(
          [req](ProgressFn progress) mutable {
            req.progress = [progress](const std::string&, uint64_t done, uint64_t total) { progress(done, total); };
            auto r = orchestrate::RunVmBackup(Env::Default(), req);
            return r.ok() ? std::string() : r.error().ToString();
          },
          num, den) {}

HeldVmBackup::HeldVmBackup(std::function<std::string(ProgressFn progress)> run, uint64_t num, uint64_t den) {
  int held[2], go[2], said[2];
  if (::pipe(held) != 0 || ::pipe(go) != 0 || ::pipe(said) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return;
  }
  child_ = ::fork();
  if (child_ == 0) {
    ::close(held[0]);
    ::close(go[1]);
    ::close(said[0]);
    const int held_fd = held[1], go_fd = go[0];
    auto once = std::make_shared<std::atomic<bool>>(false);
    const std::string error = run([held_fd, go_fd, once, num, den](uint64_t done, uint64_t total) {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      if (total > 0 && done * den >= total * num && !once->exchange(true)) {
        char c = 'h';
        (void)!::write(held_fd, &c, 1);
        (void)!::read(go_fd, &c, 1);
      }
    });
    const std::string text = error.empty() ? std::string("succeeded") : error;
    (void)!::write(said[1], text.data(), text.size());
    ::_exit(error.empty() ? 3 : 0);
  }
  ::close(held[1]);
  ::close(go[0]);
  ::close(said[1]);
  held_ = held[0];
  go_ = go[1];
  said_ = said[0];
  if (child_ < 0) ADD_FAILURE() << "fork: " << std::strerror(errno);
}

HeldVmBackup::~HeldVmBackup() {
  if (child_ > 0) Kill();
  for (int fd : {held_, go_, said_}) {
    if (fd >= 0) ::close(fd);
  }
}

bool HeldVmBackup::WaitHeld(std::chrono::milliseconds settle) {
  pollfd p{held_, POLLIN, 0};
  char c = 0;
  const bool reached = ::poll(&p, 1, 300 * 1000) == 1 && ::read(held_, &c, 1) == 1;
  if (reached) std::this_thread::sleep_for(settle);
  return reached;
}

void HeldVmBackup::Kill() {
  if (child_ <= 0) return;
  ::kill(child_, SIGKILL);
  ::waitpid(child_, nullptr, 0);
  child_ = -1;
}

std::string HeldVmBackup::Release(bool* failed) {
  char c = 'g';
  (void)!::write(go_, &c, 1);
  std::string message;
  char buf[4096];
  for (ssize_t n; (n = ::read(said_, buf, sizeof(buf))) > 0;) message.append(buf, static_cast<size_t>(n));
  int status = 0;
  ::waitpid(child_, &status, 0);
  child_ = -1;
  *failed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return message;
}

}  // namespace barge::testing
