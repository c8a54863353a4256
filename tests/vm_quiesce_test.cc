// Quiesce through a real QEMU guest agent: a tiny guest (Debian kernel,
// busybox, qemu-ga; tests/guest/make_guest.sh) booted under TCG, whose
// fsfreeze hook stamps the disk, so the backup itself shows that the freeze
// came before the job's point in time and the thaw after it, on success and
// on a failure right after the freeze.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kStampBytes = 4096;  // the hook stamps whole 4 KiB blocks

// What the guest's hook writes into a block: its log line, zero-padded.
std::string Stamp(const std::string& line) {
  std::string block = line + "\n";
  block.resize(kStampBytes, '\0');
  return block;
}

std::string ReadBlock(const std::string& path, int index) {
  std::string block(kStampBytes, '\0');
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  if (fd < 0) return "";
  EXPECT_EQ(::pread(fd, block.data(), block.size(), static_cast<off_t>(index) * kStampBytes),
            static_cast<ssize_t>(kStampBytes));
  ::close(fd);
  return block;
}

void WriteBlock(const std::string& path, int index, const std::string& block) {
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  EXPECT_EQ(::pwrite(fd, block.data(), block.size(), static_cast<off_t>(index) * kStampBytes),
            static_cast<ssize_t>(block.size()));
  ::close(fd);
}

class VmQuiesceTest : public VmTestBase {
 protected:
  void SetUp() override {
    VmTestBase::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    BARGE_REQUIRE_TOOL("apt-get");
    BARGE_REQUIRE_TOOL("dpkg-deb");
    BARGE_REQUIRE_TOOL("mkfs.ext4");
    BARGE_REQUIRE_TOOL("e2fsck");
    BARGE_REQUIRE_TOOL("debugfs");
    // Built once per build tree, then cached; a kit that cannot be built is
    // a failure, not a skip (CI has the mirror and scripts/deps.sh's tools).
    auto kit = ::barge::testing::Run(std::string(BARGE_SOURCE_DIR) + "/tests/guest/make_guest.sh " +
                                     ShellQuote(BARGE_GUEST_KIT_DIR));
    ASSERT_EQ(kit.exit_code, 0) << "tests/guest/make_guest.sh could not build the test guest:\n" << kit.output;
  }

  // Boots the guest: vda a zeroed raw disk the hook stamps, vdb a raw disk
  // with ext4 that the guest mounts (the filesystem the agent freezes), both
  // under CBT; returns once the agent answers.
  void BootGuest() {
    vda_ = dir_ / "vda.raw";
    vdb_ = dir_ / "vdb.raw";
    RunOk("truncate -s 64M " + ShellQuote(vda_) + " && truncate -s 32M " + ShellQuote(vdb_));
    // Inode tables and journal written now: no lazy init in the guest.
    RunOk("mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 " + ShellQuote(vdb_));
    // Private copies: libvirt relabels kernel and initrd for QEMU's user.
    std::string kernel = dir_ / "vmlinuz";
    std::string initrd = dir_ / "initrd.img";
    fs::copy_file(std::string(BARGE_GUEST_KIT_DIR) + "/vmlinuz", kernel);
    fs::copy_file(std::string(BARGE_GUEST_KIT_DIR) + "/initrd.img", initrd);
    serial_log_ = dir_ / "serial.log";
    DomainExtras extras;
    extras.memory_mib = 256;
    extras.os_xml = "<kernel>" + kernel + "</kernel><initrd>" + initrd +
                    "</initrd><cmdline>console=ttyS0 quiet</cmdline>";
    extras.devices_xml = "<serial type='file'><source path='" + serial_log_ +
                         "'/><target port='0'/></serial>"
                         "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>";
    dom_ = std::make_unique<TestDomain>("quiesce", std::vector<TestDisk>{{"vda", vda_, "raw"}, {"vdb", vdb_, "raw"}},
                                        extras);
    ASSERT_NO_FATAL_FAILURE(dom_->Define(dir_.path().string()));
    json st = BargeJson("cbt enable --domain " + dom_->name() + " --state-dir " + ShellQuote(dir_ / "cbt"));
    ASSERT_EQ(st["state"], "Enabled") << st.dump();
    OpenForQemu(dir_ / "cbt");
    auto t0 = std::chrono::steady_clock::now();
    dom_->Start();
    // TCG on two cores: the guest needs a few seconds, more on a busy machine.
    std::string ping = std::string(kVirsh) + "qemu-agent-command " + dom_->name() + " " +
                       ShellQuote(R"({"execute":"guest-ping"})");
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
      if (::barge::testing::Run(ping).exit_code == 0) {
        std::cerr << "guest agent answered after "
                  << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s\n";
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    FAIL() << "the guest agent did not answer within 120 s; serial console:\n" << SerialLog();
  }

  // The "return" member of a guest agent command's reply.
  json Agent(const std::string& command) {
    std::string out = RunOk(std::string(kVirsh) + "qemu-agent-command " + dom_->name() + " " +
                            ShellQuote(R"({"execute":")" + command + R"("})"));
    json j = json::parse(out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    return j.is_discarded() ? json() : j["return"];
  }

  // "thawed" or "frozen" (guest-fsfreeze-status), or the reply as it came.
  std::string FreezeStatus() {
    json r = Agent("guest-fsfreeze-status");
    return r.is_string() ? r.get<std::string>() : r.dump();
  }

  std::string SerialLog() {
    std::ifstream in(serial_log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // The hook's lines on the serial console, once there are `count` of them
  // (the guest's tty may still be sending when the agent has answered).
  std::vector<std::string> HookLines(size_t count) {
    std::vector<std::string> lines;
    for (int i = 0; i < 100; ++i) {
      lines.clear();
      std::istringstream in(SerialLog());
      for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.rfind("barge-hook ", 0) == 0) lines.push_back(line);
      }
      if (lines.size() >= count) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return lines;
  }

  json QuiescedBackup() {
    return BargeJson("vm backup --domain " + dom_->name() + " --target " + ShellQuote(target_));
  }

  std::string Copy(const std::string& from, const std::string& name) {
    std::string to = dir_ / name;
    RunOk("cp --sparse=always " + ShellQuote(from) + " " + ShellQuote(to));
    return to;
  }

  std::string Chain(const std::string& disk) { return target_ + "/" + dom_->name() + "/" + disk; }

  std::string vda_;
  std::string vdb_;
  std::string serial_log_;
  std::unique_ptr<TestDomain> dom_;  // destroyed before dir_ (declared later)
};

// Without --skip-quiesce: the agent freezes (the hook stamps block 0 of vda
// and writes a file on vdb's ext4), the job starts, the agent thaws (the hook
// stamps block 1). The backup holds the freeze's stamp and file, not the
// thaw's stamp, and vdb's ext4 is clean as frozen.
TEST_F(VmQuiesceTest, FreezeBeforeTheJobThawAfter) {
  BootGuest();
  if (HasFatalFailure()) return;
  RunOk(Barge("tracker create t1 --domain " + dom_->name()));
  EXPECT_EQ(FreezeStatus(), "thawed");

  json b0 = QuiescedBackup();
  ASSERT_TRUE(b0.contains("backup_type")) << b0.dump();
  EXPECT_EQ(b0["backup_type"], "full") << b0.dump();
  EXPECT_EQ(HookLines(2), (std::vector<std::string>{"barge-hook freeze 1", "barge-hook thaw 1"})) << SerialLog();
  EXPECT_EQ(FreezeStatus(), "thawed");

  // The live disk has both stamps; the backup's point in time lies between.
  std::string expected = Copy(vda_, "vda-expected.raw");
  EXPECT_EQ(ReadBlock(expected, 0), Stamp("barge-hook freeze 1"));
  EXPECT_EQ(ReadBlock(expected, 1), Stamp("barge-hook thaw 1"));
  WriteBlock(expected, 1, std::string(kStampBytes, '\0'));
  ExpectRestores(Chain("vda"), 0, expected);

  // vdb as frozen: no journal to replay, the freeze hook's file in it.
  std::string fs_image = dir_ / "vdb-restored.raw";
  RunOk(BargeBinary() + " restore " + ShellQuote(Chain("vdb")) + " --at 0 --to " + ShellQuote(fs_image) +
        " --force");
  RunOk("e2fsck -fn " + ShellQuote(fs_image));
  EXPECT_EQ(RunOk("dumpe2fs -h " + ShellQuote(fs_image) + " 2>/dev/null").find("needs_recovery"),
            std::string::npos);
  EXPECT_NE(RunOk("debugfs -R 'cat /barge-freeze-1' " + ShellQuote(fs_image)).find("barge-hook freeze 1"),
            std::string::npos);
}

// A failure right after the freeze (the fault seam's kAfterFreeze):
// barge thaws the guest on its way out, commits nothing, and the next
// quiesced backup is an incremental from the previous checkpoint.
TEST_F(VmQuiesceTest, FailureAfterFreezeThawsTheGuest) {
  BootGuest();
  if (HasFatalFailure()) return;
  RunOk(Barge("tracker create t1 --domain " + dom_->name()));
  json b0 = QuiescedBackup();
  ASSERT_TRUE(b0.contains("checkpoint")) << b0.dump();
  std::string cp0 = b0["checkpoint"];
  size_t files_before = std::distance(fs::directory_iterator(Chain("vda")), fs::directory_iterator());

  std::string failed = VmBackupFailingAt(orchestrate::VmBackupFaults::Point::kAfterFreeze, dom_->name(), target_,
                                         /*skip_quiesce=*/false);
  EXPECT_NE(failed, "");
  EXPECT_NE(failed.find("injected fault after freezing"), std::string::npos) << failed;
  EXPECT_EQ(HookLines(4), (std::vector<std::string>{"barge-hook freeze 1", "barge-hook thaw 1",
                                                    "barge-hook freeze 2", "barge-hook thaw 2"}))
      << SerialLog();
  EXPECT_EQ(FreezeStatus(), "thawed");
  EXPECT_EQ(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"]["name"], cp0);
  std::string cps = RunOk(std::string(kVirsh) + "checkpoint-list " + dom_->name() + " --name");
  EXPECT_EQ(cps.find('\n'), cps.rfind('\n')) << "one checkpoint expected: " << cps;
  EXPECT_NE(cps.find(cp0), std::string::npos) << cps;
  EXPECT_EQ(static_cast<size_t>(std::distance(fs::directory_iterator(Chain("vda")), fs::directory_iterator())),
            files_before);
  json recs = BargeJson("vm backups --domain " + dom_->name())["backups"];
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs.back()["result"], "failed");
  EXPECT_NE(recs.back()["error"].get<std::string>().find("injected"), std::string::npos);

  // The guest still answers and freezes: an incremental from cp0 whose point
  // in time holds the third freeze's stamp and the failed run's thaw stamp.
  json b1 = QuiescedBackup();
  ASSERT_TRUE(b1.contains("backup_type")) << b1.dump();
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(b1["parent_checkpoint"], cp0);
  EXPECT_EQ(HookLines(6).size(), 6u) << SerialLog();
  EXPECT_EQ(FreezeStatus(), "thawed");
  std::string expected = Copy(vda_, "vda-expected.raw");
  EXPECT_EQ(ReadBlock(expected, 0), Stamp("barge-hook freeze 3"));
  EXPECT_EQ(ReadBlock(expected, 1), Stamp("barge-hook thaw 3"));
  WriteBlock(expected, 1, Stamp("barge-hook thaw 2"));
  ExpectRestores(Chain("vda"), 1, expected);

  // A thaw that fails once the job has started (the fault seam's kThaw,
  // once): the run stops rather than copy with the guest frozen, its
  // cleanup thaws the guest, and nothing is committed.
  std::string cp1 = b1["checkpoint"];
  std::string unthawed = VmBackupFailingAt(orchestrate::VmBackupFaults::Point::kThaw, dom_->name(), target_,
                                           /*skip_quiesce=*/false);
  EXPECT_NE(unthawed, "");
  EXPECT_NE(unthawed.find("cannot thaw"), std::string::npos) << unthawed;
  EXPECT_EQ(unthawed.find("may still be frozen"), std::string::npos) << unthawed;
  std::vector<std::string> hooks = HookLines(8);
  ASSERT_EQ(hooks.size(), 8u) << SerialLog();
  EXPECT_EQ(hooks[6], "barge-hook freeze 4");
  EXPECT_EQ(hooks[7], "barge-hook thaw 4");
  EXPECT_EQ(FreezeStatus(), "thawed");
  EXPECT_EQ(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"]["name"], cp1);
  cps = RunOk(std::string(kVirsh) + "checkpoint-list " + dom_->name() + " --name");
  EXPECT_EQ(cps.find('\n'), cps.rfind('\n')) << "one checkpoint expected: " << cps;
}

}  // namespace
}  // namespace barge::testing
