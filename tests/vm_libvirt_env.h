// Test environment for libvirt integration tests: starts virtlogd + libvirtd
// as /work/shared/TESTBED.md describes when none answers, and throwaway
// domains (no OS, 64 MiB, pc, TCG, virtio disks) started paused, with guest
// writes through the QEMU monitor's qemu-io on the disk backend. A domain
// may also boot a kernel directly (DomainExtras; the quiesce test's guest).
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"

namespace barge::testing {

inline constexpr const char* kVirsh = "timeout 60 virsh -q -c qemu:///system ";

// True once libvirtd answers (starting it if needed, at most ~30 s).
inline bool EnsureLibvirtd() {
  if (Run(std::string(kVirsh) + "version").exit_code == 0) return true;
  Run("mkdir -p /var/log/libvirt /var/run/libvirt /var/lib/libvirt/qemu;"
      "getent group kvm >/dev/null || groupadd -r kvm;"
      "getent passwd libvirt-qemu >/dev/null || { groupadd -r libvirt-qemu;"
      " useradd -r -g libvirt-qemu -G kvm libvirt-qemu; }");
  Run("pgrep -x virtlogd >/dev/null || virtlogd -d");
  Run("pgrep -x libvirtd >/dev/null || libvirtd -d");
  for (int i = 0; i < 60; ++i) {
    if (Run(std::string(kVirsh) + "version").exit_code == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return false;
}

#define BARGE_REQUIRE_LIBVIRT()                                      \
  do {                                                               \
    BARGE_REQUIRE_TOOL("virsh");                                     \
    BARGE_REQUIRE_TOOL("libvirtd");                                  \
    BARGE_REQUIRE_TOOL("qemu-system-x86_64");                        \
    ASSERT_TRUE(::barge::testing::EnsureLibvirtd()) << "libvirtd did not start"; \
  } while (0)

// Makes `dir` and its parents up to / traversable by the QEMU user.
inline void OpenForQemu(const std::string& dir) {
  ::chmod(dir.c_str(), 0777);
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

// A throwaway persistent domain, destroyed and undefined (with its checkpoint
// metadata) on destruction.
class TestDomain {
 public:
  TestDomain(const std::string& prefix, std::vector<TestDisk> disks, DomainExtras extras = {})
      : disks_(std::move(disks)), extras_(std::move(extras)) {
    static std::atomic<int> counter{0};
    name_ = "barge-" + prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  }
  ~TestDomain() {
    Run(std::string(kVirsh) + "destroy " + name_ + " 2>/dev/null");
    Run(std::string(kVirsh) + "undefine " + name_ + " --checkpoints-metadata 2>/dev/null");
  }
  TestDomain(const TestDomain&) = delete;
  TestDomain& operator=(const TestDomain&) = delete;

  const std::string& name() const { return name_; }

  std::string Xml() const {
    std::string x = "<domain type='qemu'><name>" + name_ + "</name><memory unit='MiB'>" +
                    std::to_string(extras_.memory_mib) +
                    "</memory><vcpu>1</vcpu>"
                    "<os><type arch='x86_64' machine='pc'>hvm</type>" +
                    extras_.os_xml + "</os><devices>";
    for (const auto& d : disks_) {
      x += "<disk type='file' device='disk'><driver name='qemu' type='" + d.format + "'/><source file='" +
           d.path + "'/><target dev='" + d.target + "' bus='virtio'/></disk>";
    }
    return x + extras_.devices_xml + "</devices></domain>";
  }

  void Define(const std::string& dir) {
    std::string xml_path = dir + "/" + name_ + ".xml";
    FILE* f = fopen(xml_path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs(Xml().c_str(), f);
    fclose(f);
    RunOk(std::string(kVirsh) + "define " + xml_path);
  }
  void StartPaused() { RunOk(std::string(kVirsh) + "start " + name_ + " --paused"); }
  void Start() { RunOk(std::string(kVirsh) + "start " + name_); }
  void Destroy() { RunOk(std::string(kVirsh) + "destroy " + name_); }
  // SIGKILL of the QEMU process: persistent bitmaps stay marked in use.
  void Kill9() {
    RunOk("kill -9 $(cat /var/run/libvirt/qemu/" + name_ + ".pid)");
    for (int i = 0; i < 40; ++i) {
      if (Run(std::string(kVirsh) + "domstate " + name_).output.find("shut off") != std::string::npos) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  // Guest write of `pattern` through the disk's virtio backend (disk index i).
  void Write(int pattern, const std::string& offset, const std::string& length, int disk = 0) {
    Hmp("write -P " + std::to_string(pattern) + " " + offset + " " + length, disk);
  }
  void Flush(int disk = 0) { Hmp("flush", disk); }
  void Hmp(const std::string& qemu_io, int disk) {
    std::string dev = disk == 0 ? "virtio-disk0" : "virtio-disk" + std::to_string(disk);
    std::string out = RunOk(std::string(kVirsh) + "qemu-monitor-command " + name_ + " --hmp " +
                            ShellQuote("qemu-io -d /machine/peripheral/" + dev + "/virtio-backend \"" +
                                       qemu_io + "\""));
    EXPECT_EQ(out.find("rror"), std::string::npos) << out;
  }

 private:
  std::string name_;
  std::vector<TestDisk> disks_;
  DomainExtras extras_;
};

// Shared fixture of the libvirt tests: a temporary folder open to QEMU, a
// catalog and a backup target in it, and the barge commands they run.
class VmTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_LIBVIRT();
    OpenForQemu(dir_.path().string());
    catalog_ = dir_ / "state/catalog.db";
    target_ = dir_ / "backups";
  }

  std::string Barge(const std::string& args) {
    return BargeBinary() + " " + args + " --catalog " + ShellQuote(catalog_);
  }
  // The result event of `barge ARGS --json` (docs/json.md), which must exit 0.
  nlohmann::json BargeJson(const std::string& args) { return ::barge::testing::RunResult(Barge(args) + " --json"); }
  nlohmann::json Backup(const std::string& domain, const std::string& extra = "") {
    return BargeJson("vm backup --domain " + domain + " --target " + ShellQuote(target_) + " --skip-quiesce " +
                     extra);
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
