// Issue 35, items 3, 6 and 7: a chain folder others can write in, or whose
// manifests lie. A manifest names only its own point's files (verify fails,
// forget deletes nothing of another point); entries planted in the folder
// by another user (a symbolic link as .lock or as a temporary's name) are
// removed, never followed, by backup, verify and forget; a chain folder
// that is a link into another user's folder is refused unless asked for;
// a FIFO named like a manifest fails list, verify and backup at once.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::Barge;
using testing::Has;
using testing::PointIds;
using testing::Q;
using testing::ReadJson;
using testing::RunOk;
using testing::Sh;
using testing::Slurp;
using testing::TempDir;
using testing::WriteJson;
using testing::WriteText;

class ChainFolderHostileTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSize = 4 << 20;

  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    disk_ = dir_ / "disk.raw";
    target_ = dir_ / "bk";
    chain_ = dir_ / "bk/vda";
    testing::WriteFile(disk_, testing::RandomBytes(kSize, 35));
    // A file of root's that no one else may touch: what a planted link
    // points at.
    fs::create_directories(dir_ / "private");
    fs::permissions(dir_ / "private", fs::perms::owner_all);
    secret_ = dir_ / "private/secret";
    WriteText(secret_, "root's own bytes\n");
  }

  // Point `i` of the chain: a full, then incrementals from extents files.
  void Backup(size_t i, const std::string& extra = "") {
    std::string args = " backup --source " + Q(disk_) + " --target " + Q(target_) + " --name vda " + extra;
    if (i > 0) {
      const uint64_t offset = (i * 512) << 10;
      RunOk("qemu-io -f raw -c 'write -P " + std::to_string(0x40 + i) + " " + std::to_string(offset) + " 64k' " +
            Q(disk_) + " >/dev/null");
      const std::string extents = dir_ / ("dirty" + std::to_string(i) + ".json");
      testing::WriteExtentsFile(extents, {{offset, 64 << 10}}, kSize);
      args += " --incremental --dirty-extents " + Q(extents);
    }
    RunOk(Barge() + args);
  }
  void MakeChain(size_t points) {
    for (size_t i = 0; i < points; ++i) Backup(i);
    ids_ = PointIds(chain_);
    ASSERT_EQ(ids_.size(), points);
  }
  // Opens the test folder to other users (mkdtemp made it 0700) and lets
  // `nobody` write in the chain folder: a shared folder.
  void ShareChainFolder() {
    fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    fs::permissions(target_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    fs::permissions(chain_, fs::perms::all);
  }
  // `nobody` runs `command` (a shell line).
  void AsNobody(const std::string& command) { RunOk("runuser -u nobody -- sh -c " + Q(command)); }
  std::string Image(size_t i) const { return chain_ + "/" + ids_[i] + ".qcow2"; }

  TempDir dir_;
  std::string disk_, target_, chain_, secret_;
  std::vector<std::string> ids_;
};

// Item 3: point 0's manifest names point 1's image as its strong digest
// table. verify said OK and forget --keep-last 1 (a merge through point 1)
// deleted point 1's image with point 0's files.
TEST_F(ChainFolderHostileTest, ManifestNamingAnotherPointsFileIsCorruption) {
  MakeChain(2);
  const std::string manifest = chain_ + "/" + ids_[0] + ".json";
  json m = ReadJson(manifest);
  m["strong_digest_table"] = ids_[1] + ".qcow2";
  WriteJson(manifest, m);

  auto verify = Sh(Barge() + " verify --all " + Q(chain_));
  EXPECT_EQ(verify.exit_code, 2) << verify.output;
  EXPECT_TRUE(Has(verify.stderr_text, "Corruption")) << verify.output;
  EXPECT_TRUE(Has(verify.stderr_text, manifest)) << verify.output;
  EXPECT_TRUE(Has(verify.stderr_text, "strong_digest_table")) << verify.output;

  auto forget = Sh(Barge() + " forget --keep-last 1 " + Q(chain_));
  EXPECT_EQ(forget.exit_code, 2) << forget.output;
  EXPECT_TRUE(fs::exists(Image(1))) << forget.output;
  EXPECT_TRUE(fs::exists(Image(0))) << forget.output;

  // A manifest under another point's name is refused the same way.
  m["strong_digest_table"] = nullptr;
  m.erase("strong_digest_table");
  WriteJson(manifest, m);
  RunOk(Barge() + " verify --all " + Q(chain_));
  fs::rename(manifest, chain_ + "/0007-20261122T000000Z.json");
  auto renamed = Sh(Barge() + " verify --all " + Q(chain_));
  EXPECT_EQ(renamed.exit_code, 2) << renamed.output;
  EXPECT_TRUE(Has(renamed.stderr_text, "0007-20261122T000000Z.json")) << renamed.output;
}

// Item 6: `nobody` can write in the chain folder and plants symbolic links
// under the names barge writes (.lock, a verification record's temporary,
// a staged image's temporary, the merge journal's temporary, an export
// lock), each
// pointing at root's file or at a name in root's private folder. backup,
// verify and forget remove them and do their work; root's files are
// untouched and nothing is created in the private folder.
TEST_F(ChainFolderHostileTest, PlantedLinksAreRemovedNeverFollowed) {
  BARGE_REQUIRE_TOOL("runuser");
  MakeChain(2);
  ShareChainFolder();
  const std::string created = dir_ / "private/created";
  AsNobody("rm -f " + Q(chain_ + "/.lock") + " && ln -s " + Q(created) + " " + Q(chain_ + "/.lock"));
  AsNobody("ln -s " + Q(secret_) + " " + Q(chain_ + "/.0099-20261122T000000Z.qcow2.barge-tmp"));
  Backup(2);
  ids_ = PointIds(chain_);
  ASSERT_EQ(ids_.size(), 3u);
  EXPECT_FALSE(fs::exists(created));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(chain_ + "/.lock")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(chain_ + "/.0099-20261122T000000Z.qcow2.barge-tmp")));

  // verify's record of each point: its temporary is a planted link.
  for (const std::string& id : ids_) {
    AsNobody("ln -s " + Q(secret_) + " " + Q(chain_ + "/." + id + ".verified.barge-tmp"));
  }
  AsNobody("rm -f " + Q(chain_ + "/.lock") + " && ln -s " + Q(created) + " " + Q(chain_ + "/.lock"));
  auto verify = Sh(Barge() + " verify --all " + Q(chain_));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_FALSE(Has(verify.output, "could not record")) << verify.output;
  for (const std::string& id : ids_) {
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(chain_ + "/" + id + ".verified"))) << id;
  }

  // forget merges through the newest point: its staged files and journal
  // are written under temporaries.
  AsNobody("ln -s " + Q(secret_) + " " + Q(chain_ + "/..merge-journal.json.barge-tmp"));
  AsNobody("ln -s " + Q(secret_) + " " + Q(chain_ + "/.." + ids_[2] + ".qcow2.merge-new.barge-tmp"));
  AsNobody("ln -s " + Q(secret_) + " " + Q(chain_ + "/.export-1-0.lock"));
  auto forget = Sh(Barge() + " forget --keep-last 1 " + Q(chain_));
  EXPECT_EQ(forget.exit_code, 0) << forget.output;
  EXPECT_EQ(PointIds(chain_), std::vector<std::string>{ids_[2]});
  RunOk(Barge() + " verify " + Q(chain_));

  EXPECT_EQ(Slurp(secret_), "root's own bytes\n");
  EXPECT_FALSE(fs::exists(created));
}

// Item 6: the chain folder is a symbolic link into a folder `nobody` owns
// (who could swap its files for links at any time): forget refuses it,
// naming the folder and the option, and changes nothing; with
// --allow-other-owner it goes ahead. backup refuses it the same way.
TEST_F(ChainFolderHostileTest, ChainFolderOfAnotherUserIsRefusedUnlessAllowed) {
  MakeChain(3);
  const std::string theirs = dir_ / "theirs";
  fs::rename(chain_, theirs);
  fs::remove(theirs + "/.lock");
  RunOk("chown -R nobody " + Q(theirs));
  fs::create_directory_symlink(theirs, chain_);

  auto forget = Sh(Barge() + " forget --keep-last 1 " + Q(chain_));
  EXPECT_EQ(forget.exit_code, 1) << forget.output;
  EXPECT_TRUE(Has(forget.stderr_text, "--allow-other-owner")) << forget.output;
  EXPECT_TRUE(Has(forget.stderr_text, chain_)) << forget.output;
  EXPECT_EQ(PointIds(theirs), ids_);
  EXPECT_FALSE(fs::exists(theirs + "/.lock"));

  auto backup = Sh(Barge() + " backup --source " + Q(disk_) + " --target " + Q(target_) + " --name vda");
  EXPECT_EQ(backup.exit_code, 1) << backup.output;
  EXPECT_TRUE(Has(backup.stderr_text, "--allow-other-owner")) << backup.output;
  EXPECT_EQ(PointIds(theirs), ids_);

  // Reading is no write: list and verify go on (verify keeps no record).
  RunOk(Barge() + " list " + Q(chain_));
  auto verify = Sh(Barge() + " verify " + Q(chain_));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_TRUE(Has(verify.output, "could not record")) << verify.output;
  EXPECT_FALSE(fs::exists(theirs + "/" + ids_[2] + ".verified"));

  RunOk(Barge() + " forget --keep-last 1 --allow-other-owner " + Q(chain_));
  EXPECT_EQ(PointIds(theirs), std::vector<std::string>{ids_[2]});
}

// Item 7: a FIFO named like a manifest hung list, verify and backup (and
// SIGTERM took 30 s). Each fails at once, naming it.
TEST_F(ChainFolderHostileTest, FifoNamedLikeAManifestFailsAtOnce) {
  MakeChain(1);
  const std::string fifo = chain_ + "/0005-20261122T000000Z.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::vector<std::string> commands = {
      " list " + Q(chain_), " verify " + Q(chain_),
      " backup --source " + Q(disk_) + " --target " + Q(target_) + " --name vda"};
  for (const std::string& args : commands) {
    const auto start = std::chrono::steady_clock::now();
    // A hang is a failure (timeout's 124, or 137 after its KILL), not a stuck test.
    auto r = Sh("timeout -k 2 20 " + Barge() + args);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_LT(seconds, 10) << args;
    EXPECT_TRUE(Has(r.stderr_text, fifo)) << args << "\n" << r.output;
    EXPECT_TRUE(Has(r.stderr_text, "not a regular file")) << args << "\n" << r.output;
  }
  // A FIFO named like a verification record is a warning of list, never a wait.
  fs::remove(fifo);
  const std::string record = chain_ + "/" + ids_[0] + ".verified";
  ASSERT_EQ(::mkfifo(record.c_str(), 0644), 0);
  auto listed = Sh("timeout -k 2 20 " + Barge() + " list " + Q(chain_));
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_TRUE(Has(listed.output, record)) << listed.output;
}

// Minor items: verify --all goes on past a point whose layer's backing file
// is refused (outside the chain folder): that point fails, the ones that
// read through it are skipped, the others are reported; exit 2.
TEST_F(ChainFolderHostileTest, VerifyAllReportsEveryPointPastARefusedBackingFile) {
  MakeChain(3);
  RunOk("qemu-img create -q -f qcow2 " + Q(dir_ / "outside.qcow2") + " 4M");
  RunOk("qemu-img rebase -q -u -F qcow2 -b " + Q(dir_ / "outside.qcow2") + " " + Q(Image(1)));
  auto r = Sh(Barge() + " verify --all --json " + Q(chain_));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  json result;
  for (const auto& e : testing::Events(r.stdout_text)) {
    if (e.value("event", "") == "result") result = e;
  }
  ASSERT_TRUE(result.is_object()) << r.output;
  EXPECT_EQ(result["verified"], json::array({ids_[0]})) << result.dump();
  EXPECT_TRUE(Has(result.dump(), ids_[1])) << result.dump();
  EXPECT_TRUE(Has(result.dump(), ids_[2])) << result.dump();
  EXPECT_TRUE(Has(r.stderr_text, "outside")) << r.output;
}

// Minor item: forget on a chain whose parent links form a loop is
// Corruption (exit 2), as merge is; nothing is removed.
TEST_F(ChainFolderHostileTest, ForgetOfALoopedChainIsCorruption) {
  MakeChain(3);
  for (const auto& [child, parent] : std::vector<std::pair<size_t, size_t>>{{1, 2}, {2, 1}}) {
    const std::string manifest = chain_ + "/" + ids_[child] + ".json";
    json m = ReadJson(manifest);
    json p = ReadJson(chain_ + "/" + ids_[parent] + ".json");
    m["parent"] = {{"id", ids_[parent]}, {"image", ids_[parent] + ".qcow2"}, {"image_digest", p["image_digest"]["value"]}};
    WriteJson(manifest, m);
  }
  auto merge = Sh(Barge() + " merge " + Q(chain_) + " --through 2");
  EXPECT_EQ(merge.exit_code, 2) << merge.output;
  auto forget = Sh(Barge() + " forget --keep-last 1 " + Q(chain_));
  EXPECT_EQ(forget.exit_code, 2) << forget.output;
  EXPECT_EQ(PointIds(chain_), ids_);
}

}  // namespace
}  // namespace barge
