// A quiesced snapshot of a running guest's qcow2 disk through a real QEMU
// guest agent (the tiny guest of tests/guest/make_guest.sh, whose fsfreeze
// hook stamps block N of /dev/vda): the snapshot holds the freeze's stamp
// and not the thaw's, so it was taken between the two, and the guest is
// thawed afterwards; hooks run around it with the snapshot's environment.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "blockio/env.h"
#include "orchestrate/snapshot/snapshot.h"
#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::orchestrate {
namespace {

using barge::testing::DomainExtras;
using barge::testing::kVirsh;
using barge::testing::ReadFile;
using barge::testing::RunOk;
using barge::testing::ShellQuote;
using barge::testing::TestDisk;
using barge::testing::TestDomain;

constexpr size_t kStampBytes = 4096;  // the hook stamps whole 4 KiB blocks

std::string Stamp(const std::string& line) {
  std::string block = line + "\n";
  block.resize(kStampBytes, '\0');
  return block;
}

class SnapshotQuiesceTest : public barge::testing::VmTestBase {
 protected:
  void SetUp() override {
    VmTestBase::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    BARGE_REQUIRE_TOOL("apt-get");
    BARGE_REQUIRE_TOOL("dpkg-deb");
    BARGE_REQUIRE_TOOL("mkfs.ext4");
    auto kit = barge::testing::Run(std::string(BARGE_SOURCE_DIR) + "/tests/guest/make_guest.sh " +
                                   ShellQuote(BARGE_GUEST_KIT_DIR));
    ASSERT_EQ(kit.exit_code, 0) << "tests/guest/make_guest.sh could not build the test guest:\n" << kit.output;
  }

  std::string Block(const std::string& image, const std::string& snapshot, int index) {
    const std::string raw = dir_ / "read.raw";
    RunOk("qemu-img convert -f qcow2 -O raw -l " + ShellQuote("snapshot.name=" + snapshot) + " " +
          ShellQuote(image) + " " + ShellQuote(raw));
    auto bytes = ReadFile(raw);
    EXPECT_GE(bytes.size(), (index + 1) * kStampBytes);
    if (bytes.size() < (index + 1) * kStampBytes) return "";
    return std::string(reinterpret_cast<const char*>(bytes.data()) + index * kStampBytes, kStampBytes);
  }
};

TEST_F(SnapshotQuiesceTest, SnapshotBetweenFreezeAndThaw) {
  const std::string vda = dir_ / "vda.qcow2";
  const std::string vdb = dir_ / "vdb.raw";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(vda) + " 64M");
  RunOk("truncate -s 32M " + ShellQuote(vdb) + " && mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 " +
        ShellQuote(vdb));
  // Private copies: libvirt relabels kernel and initrd for QEMU's user.
  const std::string kernel = dir_ / "vmlinuz", initrd = dir_ / "initrd.img";
  RunOk("cp " + ShellQuote(std::string(BARGE_GUEST_KIT_DIR) + "/vmlinuz") + " " + ShellQuote(kernel));
  RunOk("cp " + ShellQuote(std::string(BARGE_GUEST_KIT_DIR) + "/initrd.img") + " " + ShellQuote(initrd));
  DomainExtras extras;
  extras.memory_mib = 256;
  extras.os_xml = "<kernel>" + kernel + "</kernel><initrd>" + initrd +
                  "</initrd><cmdline>console=ttyS0 quiet</cmdline>";
  extras.devices_xml = "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>";
  TestDomain dom("snapq", {TestDisk{"vda", vda, "qcow2"}, TestDisk{"vdb", vdb, "raw"}}, extras);
  dom.Define(dir_.path().string());
  dom.Start();
  const std::string ping = std::string(kVirsh) + "qemu-agent-command " + dom.name() + " " +
                           ShellQuote(R"({"execute":"guest-ping"})");
  bool up = false;
  for (auto t0 = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120);) {
    if (barge::testing::Run(ping).exit_code == 0) {
      up = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_TRUE(up) << "the guest agent did not answer within 120 s";

  const std::string log = dir_ / "hooks.log";
  SnapshotCreateRequest req;
  req.target.domain = dom.name();
  req.target.disk = "vda";
  req.name = "q1";
  req.consistency.quiesce = true;
  req.consistency.hooks.pre = "echo \"$BARGE_HOOK_PHASE $BARGE_DOMAIN $BARGE_DISK $BARGE_SNAPSHOT\" >> " + log;
  req.consistency.hooks.post = "echo \"$BARGE_HOOK_PHASE $BARGE_HOOK_STATUS\" >> " + log;
  auto made = CreateDiskSnapshot(Env::Default(), req);
  ASSERT_TRUE(made.ok()) << made.error().ToString();
  EXPECT_EQ(made->mode, "online");
  EXPECT_TRUE(made->warnings.empty());
  auto status = RunOk(std::string(kVirsh) + "qemu-agent-command " + dom.name() + " " +
                      ShellQuote(R"({"execute":"guest-fsfreeze-status"})"));
  EXPECT_NE(status.find("thawed"), std::string::npos) << status;
  EXPECT_EQ(*Env::Default().ReadFile(log), "pre " + dom.name() + " vda q1\npost ok\n");

  dom.Destroy();
  RunOk("qemu-img check -f qcow2 " + ShellQuote(vda));
  // The freeze stamped block 0 before the snapshot; the thaw stamped block 1 after it.
  EXPECT_EQ(Block(vda, "q1", 0), Stamp("barge-hook freeze 1"));
  EXPECT_EQ(Block(vda, "q1", 1), std::string(kStampBytes, '\0'));
}

}  // namespace
}  // namespace barge::orchestrate
