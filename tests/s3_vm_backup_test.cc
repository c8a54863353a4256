// Issue 38 section 1: `vm backup --target s3://BUCKET/PREFIX` through the
// real CLI, a libvirt domain (TCG, paused, no guest OS) backed up into the
// binary's one Ceph radosgw (tests/testing/radosgw.h): a full, then an
// incremental by the tracker's checkpoint; the bucket's chain restores
// equal to the disk and verifies.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"
#include "tests/testing/radosgw.h"
#include "tests/testing/radosgw.h"
#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;

class S3VmBackupTest : public VmTestBase {
 protected:
  void SetUp() override {
    VmTestBase::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("aws");
    BARGE_REQUIRE_RADOSGW(rgw_);
    bucket_ = TestBucketName("vm");
    RunOk(Aws("s3 mb s3://" + bucket_) + " >/dev/null");
    // The target must exist, as a folder must: a prefix with a key under it.
    RunOk(Aws("s3api put-object --bucket " + bucket_ + " --key vms/") + " >/dev/null");
  }
  void TearDown() override {
    if (rgw_ != nullptr && rgw_->ok() && !bucket_.empty()) testing::Run(Aws("s3 rb --force s3://" + bucket_) + " >/dev/null");
  }
  std::string Aws(const std::string& args) const { return rgw_->Aws(args); }

  Radosgw* rgw_ = nullptr;
  std::string bucket_;
};

TEST_F(S3VmBackupTest, FullThenIncrementalIntoABucketRestoreEqual) {
  const std::string disk = MakeQcow2("d.qcow2", "32M");
  TestDomain dom("s3vm", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  const std::string target = "s3://" + bucket_ + "/vms";
  auto backup = [&] {
    CommandResult r = Sh(rgw_->barge_env() + Barge("vm backup --json --skip-quiesce --domain " + dom.name() +
                                                   " --target " + target));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_FALSE(Has(r.output, rgw_->secret_key()));
    return ResultOf(r.stdout_text);
  };
  dom.Write(0xee, "1M", "4M");
  json b0 = backup();
  EXPECT_EQ(b0["backup_type"], "full") << b0.dump();
  dom.Write(0x11, "20M", "1M");
  json b1 = backup();
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  dom.Destroy();  // graceful: the disk file is now complete

  const std::string chain = target + "/" + dom.name() + "/vda";
  RunOk(rgw_->barge_env() + BargeBinary() + " verify --all " + chain);
  const std::string flat = dir_ / "flat.raw", out = dir_ / "out.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(disk) + " " + ShellQuote(flat));
  RunOk(rgw_->barge_env() + BargeBinary() + " restore " + chain + " --to " + ShellQuote(out));
  RunOk("cmp " + ShellQuote(out) + " " + ShellQuote(flat));
}

}  // namespace
}  // namespace barge::testing
