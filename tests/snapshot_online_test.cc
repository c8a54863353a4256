// Disk snapshots of a running (paused) libvirt domain through QEMU (QMP
// blockdev-snapshot-internal-sync / -delete-internal-sync), and of the same
// domain once shut off through its disk file: qemu-img check clean,
// qemu-img snapshot -l agrees, and each snapshot reads what the guest had
// written at that moment.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "orchestrate/snapshot/snapshot.h"
#include "orchestrate/snapshot/snapshot_apply.h"
#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::orchestrate {
namespace {

using barge::testing::ReadFile;
using barge::testing::RunOk;
using barge::testing::ShellQuote;
using barge::testing::TestDisk;
using barge::testing::TestDomain;

class SnapshotOnlineTest : public barge::testing::VmTestBase {
 protected:
  std::vector<std::string> QemuNames(const std::string& image) {
    std::string out = RunOk("qemu-img info -f qcow2 --output=json " + ShellQuote(image));
    auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
    std::vector<std::string> names;
    if (j.contains("snapshots")) {
      for (const auto& s : j["snapshots"]) names.push_back(s["id"].get<std::string>() + ":" + s["name"].get<std::string>());
    }
    return names;
  }
  std::vector<std::byte> QemuRead(const std::string& image, const std::string& snapshot) {
    const std::string out = dir_ / "read.raw";
    RunOk("qemu-img convert -f qcow2 -O raw -l " + ShellQuote("snapshot.name=" + snapshot) + " " +
          ShellQuote(image) + " " + ShellQuote(out));
    return ReadFile(out);
  }
};

void Fill(std::vector<std::byte>& disk, uint64_t offset, uint64_t length, int pattern) {
  std::fill_n(disk.begin() + offset, length, std::byte(pattern));
}

TEST_F(SnapshotOnlineTest, RunningDomainThenShutOff) {
  constexpr uint64_t kMiB = 1 << 20;
  const std::string img = dir_ / "disk.qcow2";
  RunOk("qemu-img create -f qcow2 " + ShellQuote(img) + " 16M");
  RunOk("qemu-io -f qcow2 -c 'write -P 0x11 0 1M' " + ShellQuote(img));
  std::vector<std::byte> expected(16 * kMiB);
  Fill(expected, 0, kMiB, 0x11);
  TestDomain dom("snap", {TestDisk{"vda", img, "qcow2"}});
  dom.Define(dir_.path().string());
  dom.StartPaused();
  dom.Write(0x22, "1M", "1M");
  Fill(expected, kMiB, kMiB, 0x22);

  SnapshotTarget target;
  target.domain = dom.name();
  target.disk = "vda";
  SnapshotCreateRequest req;
  req.target = target;
  req.name = "s1";
  auto s1 = CreateDiskSnapshot(Env::Default(), req);
  ASSERT_TRUE(s1.ok()) << s1.error().ToString();
  EXPECT_EQ(s1->mode, "online");
  EXPECT_EQ(s1->image, img);
  EXPECT_EQ(s1->snapshot.id, "1");

  dom.Write(0x33, "0", "512k");
  Fill(expected, 0, 512 << 10, 0x33);
  req.name = "s2";
  ASSERT_TRUE(CreateDiskSnapshot(Env::Default(), req).ok());
  // QEMU refuses a name the disk has.
  auto again = CreateDiskSnapshot(Env::Default(), req);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kInvalidArgument);

  auto listing = ListDiskSnapshots(Env::Default(), target);
  ASSERT_TRUE(listing.ok()) << listing.error().ToString();
  EXPECT_EQ(listing->mode, "online");
  ASSERT_EQ(listing->snapshots.size(), 2u);
  EXPECT_EQ(listing->snapshots[1].info.name, "s2");

  // No rename or rollback under a running guest; no quiesce without an agent.
  EXPECT_EQ(RenameDiskSnapshot(Env::Default(), target, "s1", "x").error().code(), ErrorCode::kNotSupported);
  auto rollback = RollbackDiskSnapshot(Env::Default(), target, "s1", false);
  ASSERT_FALSE(rollback.ok());
  EXPECT_EQ(rollback.error().code(), ErrorCode::kBusy);
  EXPECT_NE(rollback.error().message().find("shut the domain off"), std::string::npos);
  req.name = "q";
  req.consistency.quiesce = true;
  auto quiesced = CreateDiskSnapshot(Env::Default(), req);
  ASSERT_FALSE(quiesced.ok());
  EXPECT_NE(quiesced.error().message().find("quiesce"), std::string::npos) << quiesced.error().ToString();
  // The image file itself is QEMU's while the domain runs.
  SnapshotTarget file_target;
  file_target.image = img;
  EXPECT_EQ(DeleteDiskSnapshot(Env::Default(), file_target, "s1").error().code(), ErrorCode::kBusy);

  auto deleted = DeleteDiskSnapshot(Env::Default(), target, "s1");
  ASSERT_TRUE(deleted.ok()) << deleted.error().ToString();
  EXPECT_EQ(deleted->snapshot.name, "s1");

  dom.Destroy();
  RunOk("qemu-img check -f qcow2 " + ShellQuote(img));
  EXPECT_EQ(QemuNames(img), std::vector<std::string>{"2:s2"});
  EXPECT_EQ(QemuRead(img, "s2"), expected);

  // Shut off: the same target edits the file.
  req.name = "s3";
  req.consistency.quiesce = false;
  auto s3 = CreateDiskSnapshot(Env::Default(), req);
  ASSERT_TRUE(s3.ok()) << s3.error().ToString();
  EXPECT_EQ(s3->mode, "offline");
  auto rolled = RollbackDiskSnapshot(Env::Default(), target, "s2", true);
  ASSERT_TRUE(rolled.ok()) << rolled.error().ToString();
  ASSERT_EQ(rolled->discarded.size(), 1u);
  RunOk("qemu-img check -f qcow2 " + ShellQuote(img));
  EXPECT_EQ(QemuNames(img), std::vector<std::string>{"2:s2"});
}

// apply on a running domain: creates and deletes go through QEMU, a rename
// only changes barge's record, a rollback is refused (state error with the
// reason) and done by the next apply once the domain is shut off.
TEST_F(SnapshotOnlineTest, ApplyOnARunningDomain) {
  const std::string img = dir_ / "disk.qcow2";
  RunOk("qemu-img create -f qcow2 " + ShellQuote(img) + " 16M");
  TestDomain dom("apply", {TestDisk{"vda", img, "qcow2"}});
  dom.Define(dir_.path().string());
  dom.StartPaused();
  dom.Write(0x41, "0", "1M");
  auto apply = [&](const std::string& json) {
    auto config = ParseApplyConfig(json);
    EXPECT_TRUE(config.ok());
    ApplyRequest req;
    req.target.domain = dom.name();
    req.target.disk = "vda";
    req.config = *config;
    req.catalog_path = catalog_;
    auto r = ApplySnapshotConfig(Env::Default(), req);
    EXPECT_TRUE(r.ok()) << r.error().ToString();
    return r.ok() ? *r : ApplyResult{};
  };
  ApplyResult r = apply(R"({"snapshots": [{"uuid": "u1", "display_name": "one"}, {"uuid": "u2"}]})");
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.mode, "online");
  dom.Write(0x42, "0", "1M");
  r = apply(R"({"snapshots": [{"uuid": "u1", "display_name": "first", "rollback": {"counter": 1}}]})");
  ASSERT_EQ(r.actions.size(), 3u);  // delete u2, rename u1, rollback u1
  EXPECT_TRUE(r.actions[0].ok && r.actions[1].ok);
  EXPECT_FALSE(r.actions[2].ok);
  ASSERT_EQ(r.snapshots.size(), 1u);
  EXPECT_EQ(r.snapshots[0].stored.display_name, "first");
  EXPECT_EQ(r.snapshots[0].stored.state, SnapshotState::kError);
  EXPECT_NE(r.snapshots[0].stored.message.find("shut the domain off"), std::string::npos);

  dom.Destroy();
  EXPECT_EQ(QemuNames(img), std::vector<std::string>{"1:u1"});
  r = apply(R"({"snapshots": [{"uuid": "u1", "display_name": "first", "rollback": {"counter": 1}}]})");
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.mode, "offline");
  EXPECT_EQ(r.snapshots[0].stored.state, SnapshotState::kCreated);
  EXPECT_EQ(r.snapshots[0].stored.rollback_counter, 1u);
  RunOk("qemu-img check -f qcow2 " + ShellQuote(img));
  RunOk("qemu-io -f qcow2 -r -c 'read -P 0x41 0 1M' " + ShellQuote(img));
}

// The same through the binary: `barge snapshot ... --domain D --disk vda`
// goes through QEMU while the domain runs (rollback and rename refused with
// the reason), through the file once it is shut off.
TEST_F(SnapshotOnlineTest, CliOnARunningDomain) {
  const std::string img = dir_ / "disk.qcow2";
  RunOk("qemu-img create -f qcow2 " + ShellQuote(img) + " 16M");
  TestDomain dom("snapcli", {TestDisk{"vda", img, "qcow2"}});
  dom.Define(dir_.path().string());
  dom.StartPaused();
  dom.Write(0x51, "0", "1M");
  const std::string disk = " --domain " + dom.name() + " --disk vda";
  const std::string barge = ShellQuote(barge::testing::BargeBinary()) + " snapshot ";
  const std::string log = dir_ / "hook.log";

  std::string text = RunOk(barge + "create --name s1" + disk + " --pre-hook " +
                           ShellQuote("echo \"$BARGE_DOMAIN $BARGE_DISK $BARGE_IMAGE\" > " + ShellQuote(log)));
  EXPECT_NE(text.find("created snapshot 's1' (id 1) of " + img + " (online)"), std::string::npos) << text;
  EXPECT_EQ(barge::testing::RunOk("cat " + ShellQuote(log)), dom.name() + " vda " + img + "\n");
  dom.Write(0x52, "0", "512k");
  nlohmann::json s2 = barge::testing::RunResult(barge + "create --json --name s2" + disk);
  EXPECT_EQ(s2["mode"], "online");
  EXPECT_EQ(s2["snapshot"]["id"], "2");

  // A backup of the snapshot while the guest runs and writes on.
  const std::string backups = dir_ / "bk";
  nlohmann::json bk = barge::testing::RunResult(ShellQuote(barge::testing::BargeBinary()) + " backup --json --source " +
                                                ShellQuote(img) + " --snapshot s2 --target " + ShellQuote(backups) +
                                                " --name vda");
  EXPECT_EQ(bk["snapshot"], "s2");
  dom.Write(0x54, "0", "256k");

  nlohmann::json list = barge::testing::RunResult(barge + "list --json" + disk);
  EXPECT_EQ(list["mode"], "online");
  EXPECT_EQ(list["image"], img);
  ASSERT_EQ(list["snapshots"].size(), 2u);
  EXPECT_EQ(list["snapshots"][1]["name"], "s2");

  // Refused while it runs, with the reason; the image file itself is QEMU's.
  nlohmann::json e = barge::testing::RunError(barge + "rollback --json" + disk + " s1", 4);
  EXPECT_EQ(e["code"], "Busy");
  EXPECT_NE(e["message"].get<std::string>().find("shut the domain off"), std::string::npos) << e;
  e = barge::testing::RunError(barge + "rename --json" + disk + " s1 x", 1);
  EXPECT_EQ(e["code"], "NotSupported");
  barge::testing::RunError(barge + "delete --json " + ShellQuote(img) + " s1", 4);
  e = barge::testing::RunError(barge + "create --json --quiesce --name q" + disk, 1);
  EXPECT_NE(e["message"].get<std::string>().find("quiesce"), std::string::npos) << e;

  nlohmann::json deleted = barge::testing::RunResult(barge + "delete --json" + disk + " s1");
  EXPECT_EQ(deleted["mode"], "online");
  EXPECT_EQ(deleted["snapshot"]["name"], "s1");

  dom.Destroy();
  RunOk("qemu-img check -f qcow2 " + ShellQuote(img));
  EXPECT_EQ(QemuNames(img), std::vector<std::string>{"2:s2"});
  // What barge reads at the snapshot is what qemu reads.
  const std::string ours = dir_ / "s2.raw";
  RunOk(ShellQuote(barge::testing::BargeBinary()) + " convert --snapshot s2 " + ShellQuote(img) + " " +
        ShellQuote(ours));
  EXPECT_EQ(barge::testing::ReadFile(ours), QemuRead(img, "s2"));
  const std::string restored = dir_ / "restored.raw";
  RunOk(ShellQuote(barge::testing::BargeBinary()) + " restore " + ShellQuote(backups + "/vda") + " --to " +
        ShellQuote(restored));
  EXPECT_EQ(barge::testing::ReadFile(restored), QemuRead(img, "s2"));

  // Shut off: the same words edit the file.
  RunOk("qemu-io -f qcow2 -c 'write -P 0x53 2M 1M' " + ShellQuote(img));
  nlohmann::json rolled = barge::testing::RunResult(barge + "rollback --json" + disk + " s2");
  EXPECT_EQ(rolled["mode"], "offline");
  RunOk("qemu-img check -f qcow2 " + ShellQuote(img));
  RunOk("qemu-io -f qcow2 -r -c 'read -P 0x52 0 512k' -c 'read -P 0 2M 1M' " + ShellQuote(img));
}

}  // namespace
}  // namespace barge::orchestrate
