// Encrypted chains in a bucket (issue 40 §2, blockio/crypt_env.h): the real
// CLI backs a disk up into s3://BUCKET/PREFIX with --encryption-key-file,
// against the binary's one Ceph radosgw (tests/testing/radosgw.h). A full
// and an incremental point are listed, verified and restored equal to the
// disk; a marker string of the disk is in no object a second client
// downloads; a missing key file, no key, a wrong key, a changed key between
// points and a flipped byte in an image object are each one clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <iostream>
#include <sstream>

#include "tests/testing/cli_testing.h"
#include "tests/testing/radosgw.h"

namespace barge {
namespace {

using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::Has;
using ::barge::testing::Q;
using ::barge::testing::Radosgw;
using ::barge::testing::Sh;
using ::barge::testing::TempDir;

constexpr char kMarker[] = "BARGE-CRYPT-MARKER-7f3a9c";

class S3CryptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    BARGE_REQUIRE_TOOL("aws");
    BARGE_REQUIRE_RADOSGW(rgw_);
    bucket_ = testing::TestBucketName("crypt");
    target_ = "s3://" + bucket_ + "/chains";
    chain_ = target_ + "/vm1";
    disk_ = dir_ / "disk.raw";
    key_ = dir_ / "key";
    other_key_ = dir_ / "other.key";
    // The marker, many times at 8 MiB, and data elsewhere.
    testing::RunOk("qemu-img create -q -f raw " + Q(disk_) + " 32M && qemu-io -f raw -c 'write -P 0x33 0 1M' " +
                   Q(disk_) + " >/dev/null && for i in $(seq 1000); do printf '%s ' " + kMarker + "; done > " +
                   Q(dir_ / "marker") + " && dd if=" + Q(dir_ / "marker") + " of=" + Q(disk_) +
                   " bs=1M seek=8 conv=notrunc status=none");
    testing::RunOk("head -c 32 /dev/urandom > " + Q(key_) + " && chmod 600 " + Q(key_) + " && head -c 32 /dev/urandom > " +
                   Q(other_key_) + " && chmod 600 " + Q(other_key_));
    testing::RunOk(Aws("s3 mb s3://" + bucket_));
    ASSERT_FALSE(HasFailure());
  }
  void TearDown() override {
    if (rgw_ != nullptr && rgw_->ok() && !bucket_.empty()) testing::Run(Aws("s3 rb --force s3://" + bucket_));
  }
  std::string Aws(const std::string& args) const { return rgw_->Aws(args); }
  CommandResult BargeS3(const std::string& args) {
    CommandResult r = Sh("env -u AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_ACCESS_KEY_ID=" +
                         rgw_->access_key() + " AWS_SECRET_ACCESS_KEY=" + rgw_->secret_key() +
                         " AWS_ENDPOINT_URL=" + rgw_->endpoint() + " " + Barge(args));
    outputs_ += r.output;
    return r;
  }
  // An uncompressed backup, so that a plain one would show the marker.
  CommandResult Backup(const std::string& extra) {
    return BargeS3("backup --compress none --source " + Q(disk_) + " --target " + target_ + " --name vm1" + extra);
  }
  std::string WithKey(const std::string& key) const { return " --encryption-key-file " + Q(key); }
  // The keys of the chain's images, from the second client.
  std::vector<std::string> Images() {
    std::vector<std::string> out;
    std::istringstream in(Sh(Aws("s3 ls --recursive s3://" + bucket_ + "/")).output);
    for (std::string line; std::getline(in, line);) {
      if (auto at = line.find("chains/vm1/"); at != std::string::npos && line.ends_with(".qcow2")) {
        out.push_back(line.substr(at));
      }
    }
    return out;
  }

  Radosgw* rgw_ = nullptr;
  TempDir dir_;
  std::string bucket_, target_, chain_, disk_, key_, other_key_;
  std::string outputs_;
};

TEST_F(S3CryptTest, EncryptedChainRestoresAndShowsNoPlaintext) {
  CommandResult full = Backup(WithKey(key_));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  testing::RunOk("qemu-io -f raw -c 'write -P 0x5a 20M 1M' " + Q(disk_) + " >/dev/null");
  CommandResult incremental = Backup(" --incremental --changed-by digests" + WithKey(key_));
  ASSERT_EQ(incremental.exit_code, 0) << incremental.output;
  CommandResult list = BargeS3("list --json " + chain_ + WithKey(key_));
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_TRUE(Has(list.stdout_text, "\"type\":\"incremental\"")) << list.output;
  CommandResult verify = BargeS3("verify --all " + chain_ + WithKey(key_));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  const std::string out = dir_ / "out.raw";
  CommandResult restore = BargeS3("restore " + chain_ + " --to " + Q(out) + WithKey(key_));
  ASSERT_EQ(restore.exit_code, 0) << restore.output;
  testing::RunOk("qemu-img compare -q -f raw -F raw " + Q(disk_) + " " + Q(out));
  // A merge publishes ".NAME.merge-new" and copies it to NAME server-side:
  // the copy still opens (its identity is NAME).
  EXPECT_EQ(Images().size(), 2u);
  CommandResult merge = BargeS3("merge --through latest " + chain_ + WithKey(key_));
  ASSERT_EQ(merge.exit_code, 0) << merge.output;
  EXPECT_EQ(Images().size(), 1u);
  CommandResult merged = BargeS3("restore " + chain_ + " --to " + Q(out) + " --force" + WithKey(key_));
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  testing::RunOk("qemu-img compare -q -f raw -F raw " + Q(disk_) + " " + Q(out));

  // Every object a second client downloads: no marker, no qcow2 magic.
  testing::RunOk(Aws("s3 cp --recursive s3://" + bucket_ + "/chains " + Q(dir_ / "all")) + " >/dev/null");
  EXPECT_NE(Sh("grep -rl -- " + std::string(kMarker) + " " + Q(dir_ / "all")).exit_code, 0);
  EXPECT_NE(Sh("grep -rlF QFI " + Q(dir_ / "all") + " | grep qcow2").exit_code, 0);
  EXPECT_EQ(Sh("test -f " + Q(dir_ / "all/barge-encryption")).exit_code, 0);
  EXPECT_FALSE(Has(outputs_, testing::Slurp(key_)));
}

TEST_F(S3CryptTest, KeyMistakesAreOneClearError) {
  ASSERT_EQ(Backup(WithKey(key_)).exit_code, 0);
  // A key file that is not there: a usage error naming it.
  CommandResult missing = Backup(WithKey(dir_ / "nokey"));
  EXPECT_EQ(missing.exit_code, 64) << missing.output;
  EXPECT_TRUE(Has(missing.output, "nokey")) << missing.output;
  // No key: the chain is encrypted, and nothing plain is written into it.
  CommandResult no_key = Backup("");
  EXPECT_NE(no_key.exit_code, 0) << no_key.output;
  EXPECT_TRUE(Has(no_key.output, "the chain is encrypted")) << no_key.output;
  CommandResult list = BargeS3("list " + chain_);
  EXPECT_NE(list.exit_code, 0) << list.output;
  EXPECT_TRUE(Has(list.output, "the chain is encrypted")) << list.output;
  // Another key, reading or adding a point: "wrong key", one line.
  CommandResult wrong = BargeS3("restore " + chain_ + " --to " + Q(dir_ / "x.raw") + WithKey(other_key_));
  EXPECT_NE(wrong.exit_code, 0) << wrong.output;
  EXPECT_TRUE(Has(wrong.output, "wrong key")) << wrong.output;
  CommandResult changed = Backup(WithKey(other_key_));
  EXPECT_NE(changed.exit_code, 0) << changed.output;
  EXPECT_TRUE(Has(changed.output, "wrong key")) << changed.output;
  EXPECT_EQ(Images().size(), 1u);
  // A key given for a plain chain.
  CommandResult plain = BargeS3("backup --source " + Q(disk_) + " --target s3://" + bucket_ + "/plain --name vm1");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  CommandResult keyed = BargeS3("list s3://" + bucket_ + "/plain/vm1" + WithKey(key_));
  EXPECT_NE(keyed.exit_code, 0) << keyed.output;
  EXPECT_TRUE(Has(keyed.output, "not an encrypted chain")) << keyed.output;
  CommandResult start = BargeS3("backup --source " + Q(disk_) + " --target s3://" + bucket_ + "/plain --name vm1" +
                                WithKey(key_));
  EXPECT_NE(start.exit_code, 0) << start.output;
  EXPECT_TRUE(Has(start.output, "plaintext backups")) << start.output;
  // A passphrase (scrypt): its chain opens with it, not with a key file.
  const std::string pass = dir_ / "pass";
  testing::RunOk("printf 'correct horse battery\\n' > " + Q(pass) + " && chmod 600 " + Q(pass));
  const std::string with_pass = " --encryption-passphrase-file " + Q(pass);
  CommandResult pass_backup = BargeS3("backup --source " + Q(disk_) + " --target s3://" + bucket_ +
                                      "/pass --name vm1" + with_pass);
  ASSERT_EQ(pass_backup.exit_code, 0) << pass_backup.output;
  CommandResult pass_list = BargeS3("list s3://" + bucket_ + "/pass/vm1" + with_pass);
  EXPECT_EQ(pass_list.exit_code, 0) << pass_list.output;
  CommandResult pass_wrong = BargeS3("list s3://" + bucket_ + "/pass/vm1" + WithKey(key_));
  EXPECT_NE(pass_wrong.exit_code, 0) << pass_wrong.output;
  EXPECT_TRUE(Has(pass_wrong.output, "wrong key")) << pass_wrong.output;
  EXPECT_TRUE(Has(missing.output, "No such file")) << missing.output;
  std::cerr << pass_wrong.output << missing.output << no_key.output << list.output << wrong.output << changed.output << keyed.output
            << start.output;
}

TEST_F(S3CryptTest, FlippedByteIsCorruptionNamingTheObject) {
  ASSERT_EQ(Backup(WithKey(key_)).exit_code, 0);
  const std::vector<std::string> images = Images();
  ASSERT_EQ(images.size(), 1u);
  const std::string object = dir_ / "object";
  testing::RunOk(Aws("s3 cp s3://" + bucket_ + "/" + images[0] + " " + Q(object)) + " >/dev/null");
  // One byte of the second segment's ciphertext (plaintext offset 65536 +).
  testing::RunOk("python3 -c \"import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[128+65564+100]^=0xff; "
                 "open(p,'wb').write(b)\" " + Q(object));
  testing::RunOk(Aws("s3 cp " + Q(object) + " s3://" + bucket_ + "/" + images[0]) + " >/dev/null");
  CommandResult verify = BargeS3("verify --all " + chain_ + WithKey(key_));
  EXPECT_EQ(verify.exit_code, 2) << verify.output;
  EXPECT_TRUE(Has(verify.output, "Corruption")) << verify.output;
  EXPECT_TRUE(Has(verify.output, "fails authentication")) << verify.output;
  EXPECT_TRUE(Has(verify.output, "plaintext offset 65536")) << verify.output;
  std::cerr << verify.output;
}

}  // namespace
}  // namespace barge
