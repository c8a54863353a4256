// barge files ls | get: files of an ext4 filesystem out of two points of a
// chain (one file changed between them), on the whole disk and in an MBR
// partition, read through nbdfuse and debugfs over the verified export.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "testing/cli_testing.h"
#include "testing/hostile_tmp.h"

namespace barge {
namespace {

using nlohmann::json;
using testing::Barge;
using testing::Has;
using testing::Q;
using testing::RunOk;
using testing::TempDir;
namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kCluster = 64 * 1024;

// The clusters where two images differ, as barge-extents ranges.
std::vector<std::pair<uint64_t, uint64_t>> ChangedClusters(const std::vector<std::byte>& a,
                                                           const std::vector<std::byte>& b) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t off = 0; off < a.size(); off += kCluster) {
    const uint64_t n = std::min<uint64_t>(kCluster, a.size() - off);
    if (std::memcmp(a.data() + off, b.data() + off, n) == 0) continue;
    if (!ranges.empty() && ranges.back().first + ranges.back().second == off) {
      ranges.back().second += n;
    } else {
      ranges.push_back({off, n});
    }
  }
  return ranges;
}

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* tool : {"nbdkit", "nbdfuse", "debugfs", "mkfs.ext4"}) BARGE_REQUIRE_TOOL(tool);
    if (!fs::exists("/dev/fuse")) {
      if (testing::ToolsRequired()) FAIL() << "/dev/fuse is missing";
      GTEST_SKIP() << "/dev/fuse is missing";
    }
    fs::create_directories(tmp_ / "root/etc");
    fs::create_directories(tmp_ / "root/docs");
    testing::WriteText(tmp_ / "root/etc/motd", "hello v1\n");
    testing::WriteText(tmp_ / "root/docs/notes.txt", std::string(100000, 'n'));
  }

  // An ext4 image of root/ (16 MiB), at `offset` of a disk of `disk_bytes`.
  void MakeDisk(const std::string& disk, uint64_t offset, uint64_t disk_bytes) {
    RunOk("mkfs.ext4 -q -F -d " + Q(tmp_ / "root") + " " + Q(tmp_ / "fs.img") + " 16M");
    std::vector<std::byte> bytes(disk_bytes);
    auto fsbytes = testing::ReadFile(tmp_ / "fs.img");
    std::copy(fsbytes.begin(), fsbytes.end(), bytes.begin() + offset);
    if (offset != 0) {
      // One MBR partition (type 0x83) from `offset` to the end.
      uint8_t* mbr = reinterpret_cast<uint8_t*>(bytes.data());
      uint8_t* entry = mbr + 446;
      entry[4] = 0x83;
      const uint32_t lba = static_cast<uint32_t>(offset / 512), count = static_cast<uint32_t>(fsbytes.size() / 512);
      std::memcpy(entry + 8, &lba, 4);
      std::memcpy(entry + 12, &count, 4);
      mbr[510] = 0x55;
      mbr[511] = 0xaa;
    }
    testing::WriteFile(disk, bytes);
  }

  // Full backup of the disk, then /etc/motd changed in place (debugfs -w)
  // and an incremental of the clusters that changed.
  std::string BackUpTwoPoints(uint64_t offset, uint64_t disk_bytes) {
    const std::string disk = tmp_ / "disk.raw";
    MakeDisk(disk, offset, disk_bytes);
    const std::string backup =
        Barge("backup --compress none --source " + Q(disk) + " --source-format raw --target " + Q(tmp_ / "bk") +
              " --name d");
    RunOk(backup);
    auto before = testing::ReadFile(disk);
    testing::WriteText(tmp_ / "motd2", "hello v2, a longer line\n");
    auto fsbytes = std::vector<std::byte>(before.begin() + offset, before.begin() + offset + 16 * kMiB);
    testing::WriteFile(tmp_ / "fs.img", fsbytes);
    RunOk("debugfs -w -R 'rm /etc/motd' " + Q(tmp_ / "fs.img"));
    RunOk("debugfs -w -R 'write " + tmp_ / "motd2" + " /etc/motd' " + Q(tmp_ / "fs.img"));
    auto after = before;
    fsbytes = testing::ReadFile(tmp_ / "fs.img");
    std::copy(fsbytes.begin(), fsbytes.end(), after.begin() + offset);
    testing::WriteFile(disk, after);
    testing::WriteExtentsFile(tmp_ / "changed.json", ChangedClusters(before, after), disk_bytes);
    RunOk(backup + " --incremental --dirty-extents " + Q(tmp_ / "changed.json"));
    return tmp_ / "bk/d";
  }

  TempDir tmp_;
};

TEST_F(FilesTest, ListsAndGetsBothVersionsOfAChangedFile) {
  const std::string chain = BackUpTwoPoints(0, 16 * kMiB);
  json listing = testing::RunResult(Barge("files ls " + Q(chain) + " / --json"));
  std::vector<std::string> names;
  for (const json& e : listing.at("entries")) names.push_back(e.at("name"));
  EXPECT_NE(std::find(names.begin(), names.end(), "etc"), names.end()) << listing.dump();
  EXPECT_NE(std::find(names.begin(), names.end(), "docs"), names.end()) << listing.dump();
  json docs = testing::RunResult(Barge("files ls " + Q(chain) + " /docs --at 0 --json"));
  ASSERT_EQ(docs.at("entries").size(), 1u) << docs.dump();
  EXPECT_EQ(docs.at("entries")[0].at("name"), "notes.txt");
  EXPECT_EQ(docs.at("entries")[0].at("size"), 100000);
  EXPECT_EQ(docs.at("entries")[0].at("type"), "file");

  RunOk(Barge("files get " + Q(chain) + " /etc/motd " + Q(tmp_ / "old.txt") + " --at 0"));
  RunOk(Barge("files get " + Q(chain) + " /etc/motd " + Q(tmp_ / "new.txt")));
  EXPECT_EQ(testing::Slurp(tmp_ / "old.txt"), "hello v1\n");
  EXPECT_EQ(testing::Slurp(tmp_ / "new.txt"), "hello v2, a longer line\n");
  RunOk(Barge("files get " + Q(chain) + " /docs/notes.txt " + Q(tmp_ / "notes.txt")));
  EXPECT_EQ(testing::Slurp(tmp_ / "notes.txt"), std::string(100000, 'n'));

  // Nothing left behind: no mount, no temporary folder of ours, no lock.
  for (const auto& e : fs::directory_iterator(chain)) {
    EXPECT_FALSE(e.path().filename().string().starts_with(".export-")) << e.path();
  }
  // Errors: a missing file (1), a folder (1), an existing destination (1).
  testing::RunError(Barge("files get " + Q(chain) + " /etc/nope " + Q(tmp_ / "x") + " --json"), 1);
  testing::RunError(Barge("files get " + Q(chain) + " /etc " + Q(tmp_ / "x") + " --json"), 1);
  testing::RunError(Barge("files get " + Q(chain) + " /etc/motd " + Q(tmp_ / "new.txt") + " --json"), 1);
  json missing = testing::RunError(Barge("files ls " + Q(chain) + " /nope --json"), 1);
  EXPECT_EQ(missing.at("code"), "NotFound");
  EXPECT_FALSE(fs::exists(tmp_ / "x"));
}

// A chain folder barge may not write is browsed with nothing written there
// (issue 36): a read-only view of it (a bind mount remounted read-only,
// EROFS, in a mount namespace of its own, gone with it), and a folder
// barge may not write into (root without CAP_DAC_OVERRIDE in a 0555
// folder: EACCES, as for another user's chain; FUSE here is root's only).
TEST_F(FilesTest, AReadOnlyChainIsBrowsed) {
  for (const char* tool : {"unshare", "setpriv", "mount"}) BARGE_REQUIRE_TOOL(tool);
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (a bind mount, dropped capabilities)";
  const std::string chain = BackUpTwoPoints(0, 16 * kMiB);
  auto names_of = [](const json& listing) {
    std::vector<std::string> names;
    for (const json& e : listing.at("entries")) names.push_back(e.at("name"));
    return names;
  };
  const std::string ro = tmp_ / "ro";
  fs::create_directories(ro);
  const std::string mount =
      "mount --bind " + Q(tmp_ / "bk") + " " + Q(ro) + " && mount -o remount,bind,ro " + Q(ro) + " && exec ";
  json listing = testing::RunResult("unshare --mount --propagation private sh -c " +
                                    Q(mount + Barge("files ls " + Q(ro + "/d") + " /etc --json")));
  EXPECT_EQ(names_of(listing), std::vector<std::string>{"motd"}) << listing.dump();
  RunOk("unshare --mount --propagation private sh -c " +
        Q(mount + Barge("files get " + Q(ro + "/d") + " /etc/motd " + Q(tmp_ / "ro-motd.txt") + " --at 0")));
  EXPECT_EQ(testing::Slurp(tmp_ / "ro-motd.txt"), "hello v1\n");

  fs::permissions(chain, fs::perms(0555));
  const std::string unprivileged = "setpriv --inh-caps=-dac_override,-dac_read_search "
                                   "--bounding-set=-dac_override,-dac_read_search ";
  ASSERT_NE(testing::Run(unprivileged + "touch " + Q(chain + "/probe")).exit_code, 0) << "the folder is writable";
  listing = testing::RunResult(unprivileged + Barge("files ls " + Q(chain) + " /etc --json"));
  EXPECT_EQ(names_of(listing), std::vector<std::string>{"motd"}) << listing.dump();
  fs::permissions(chain, fs::perms(0700));
  for (const auto& e : fs::directory_iterator(chain)) {
    EXPECT_FALSE(e.path().filename().string().starts_with(".export-")) << e.path();
  }
}

TEST_F(FilesTest, ADamagedClusterFailsTheCopyNamingTheLayerNeverWrongBytes) {
  BARGE_REQUIRE_TOOL("qemu-img");
  const std::string chain = BackUpTwoPoints(0, 16 * kMiB);
  // The guest offset of /etc/motd's data block (fs.img is the disk now).
  const std::string stats = RunOk("debugfs -R stats " + Q(tmp_ / "fs.img"));
  const size_t at = stats.find("Block size:");
  ASSERT_NE(at, std::string::npos) << stats;
  const uint64_t block_bytes = std::stoull(stats.substr(at + 11));
  const std::string blocks = RunOk("debugfs -R 'blocks /etc/motd' " + Q(tmp_ / "fs.img") + " 2>/dev/null");
  const uint64_t guest = std::stoull(blocks) * block_bytes;
  // Its bytes in the incremental's layer file, damaged.
  const auto ids = testing::PointIds(chain);
  const std::string layer = chain + "/" + ids.back() + ".qcow2";
  json map = json::parse(RunOk("qemu-img map --output=json -f qcow2 " + Q(layer) + " 2>/dev/null"));
  int64_t host = -1;
  for (const json& e : map) {
    const uint64_t start = e.at("start"), length = e.at("length");
    if (guest >= start && guest < start + length && e.at("depth") == 0 && e.contains("offset")) {
      host = e.at("offset").get<int64_t>() + static_cast<int64_t>(guest - start);
    }
  }
  ASSERT_GE(host, 0) << "guest " << guest << " " << map.dump();
  {
    auto bytes = testing::ReadFile(layer);
    bytes[host] ^= std::byte{0x20};
    testing::WriteFile(layer, bytes);
  }
  auto r = testing::Run(Barge("files get " + Q(chain) + " /etc/motd " + Q(tmp_ / "bad.txt")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "Corruption")) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, layer)) << r.output;
  EXPECT_FALSE(fs::exists(tmp_ / "bad.txt"));
  // The older point does not read through the damaged layer.
  RunOk(Barge("files get " + Q(chain) + " /etc/motd " + Q(tmp_ / "old.txt") + " --at 0"));
  EXPECT_EQ(testing::Slurp(tmp_ / "old.txt"), "hello v1\n");
}

// A local user (nobody) planted in the shared temporary folder, for the
// next PIDs, the folders `files` once used there (.barge-files-PID-0 with
// its mnt/) holding links named like its logs and outputs, and a link
// named like `get`'s old temporary beside the destination, all pointing at
// a root-owned file. A root `files ls` and `files get` use none of them
// (fresh private folders of their own): the root file is unchanged, the
// output right, nothing of nobody's removed, nothing of ours left.
TEST_F(FilesTest, NamesPlantedInASharedTemporaryFolderAreNeverUsed) {
  const std::string chain = BackUpTwoPoints(0, 16 * kMiB);
  testing::HostileTmp hostile(tmp_);
  const std::string dest = hostile.shared() + "/motd.txt";
  auto folder = [](int pid) { return ".barge-files-" + std::to_string(pid) + "-0"; };
  hostile.PlantForNextPids(
      1, [](int) { return std::vector<std::string>{}; },
      [](int) { return std::vector<std::string>{".motd.txt.barge-tmp"}; });
  hostile.PlantForNextPids(
      300, [&](int pid) { return std::vector<std::string>{folder(pid), folder(pid) + "/mnt"}; },
      [&](int pid) {
        std::vector<std::string> links;
        for (const char* name : {"nbdfuse.out", "nbdfuse.log", "debugfs.out", "debugfs.err"}) {
          links.push_back(folder(pid) + "/" + name);
        }
        return links;
      });

  json listing = testing::RunResult(Barge("files ls " + Q(chain) + " /etc --json"));
  ASSERT_EQ(listing.at("entries").size(), 1u) << listing.dump();
  EXPECT_EQ(listing.at("entries")[0].at("name"), "motd");
  RunOk(Barge("files get " + Q(chain) + " /etc/motd " + Q(dest)));
  EXPECT_EQ(testing::Slurp(dest), "hello v2, a longer line\n");

  EXPECT_EQ(hostile.VictimText(), testing::HostileTmp::kVictimText);
  hostile.ExpectPlantedUntouched();
  EXPECT_EQ(hostile.NotNobodys(dest), std::vector<std::string>{});
}

// Issue 36 §3: names with a line break (which `files ls` dropped), a
// double quote (which `files get` refused), a backslash, a leading dash,
// spaces and bytes that are not UTF-8 all list and get; links show their
// targets, entries their modes and times; a folder as destination, "-"
// for stdout, and a sparse file stays sparse.
TEST_F(FilesTest, IssueThirtySixEveryNameListsAndGets) {
  const std::vector<std::string> names = {"new\nline", "quo\"te", "back\\slash", "-dash", "two  spaces ",
                                          "not utf-8 \xff\xfe", "trailing line break\n"};
  fs::create_directories(tmp_ / "root/odd");
  for (size_t i = 0; i < names.size(); ++i) {
    testing::WriteText(tmp_ / ("root/odd/" + names[i]), "file " + std::to_string(i) + "\n");
  }
  fs::permissions(tmp_ / "root/odd/-dash", fs::perms(0640));
  fs::create_symlink("quo\"te", tmp_ / "root/odd/link");
  fs::create_symlink("/etc/x\ny", tmp_ / "root/odd/link with line break");
  {
    // 1 MiB, one byte of data in its middle.
    testing::WriteText(tmp_ / "root/odd/sparse", "");
    fs::resize_file(tmp_ / "root/odd/sparse", kMiB);
    RunOk("printf x | dd of=" + Q(tmp_ / "root/odd/sparse") + " bs=1 seek=500000 conv=notrunc status=none");
  }
  const std::string chain = BackUpTwoPoints(0, 16 * kMiB);

  json listing = testing::RunResult(Barge("files ls " + Q(chain) + " /odd --json"));
  std::map<std::string, json> by_name;
  for (const json& e : listing.at("entries")) {
    std::string name = e.at("name");
    if (e.contains("name_bytes")) {
      name.clear();
      const std::string hex = e.at("name_bytes");
      for (size_t i = 0; i + 1 < hex.size(); i += 2) {
        name += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
      }
    }
    by_name[name] = e;
  }
  EXPECT_EQ(by_name.size(), names.size() + 3) << listing.dump();
  for (const auto& name : names) {
    ASSERT_TRUE(by_name.count(name)) << "missing: " << name << " in " << listing.dump();
    EXPECT_EQ(by_name[name].at("type"), "file");
    EXPECT_TRUE(by_name[name].at("mtime").is_string()) << by_name[name].dump();
  }
  EXPECT_TRUE(by_name["not utf-8 \xff\xfe"].contains("name_bytes"));
  EXPECT_FALSE(by_name["new\nline"].contains("name_bytes"));
  EXPECT_EQ(by_name["-dash"].at("mode"), 0640);
  EXPECT_EQ(by_name["link"].at("type"), "link");
  EXPECT_EQ(by_name["link"].at("target"), "quo\"te");
  EXPECT_EQ(by_name["link with line break"].at("target"), "/etc/x\ny");
  // Readable text: one line per entry, each name escaped onto its line.
  const std::string text = RunOk(Barge("files ls " + Q(chain) + " /odd"));
  EXPECT_TRUE(Has(text, "  new\\nline  ")) << text;
  EXPECT_TRUE(Has(text, "  back\\\\slash  ")) << text;
  EXPECT_TRUE(Has(text, "  not utf-8 \\xff\\xfe  ")) << text;
  EXPECT_TRUE(Has(text, "link -> quo\"te\n")) << text;
  EXPECT_TRUE(Has(text, "- 0640 ")) << text;

  // Every name gets, into a folder under its own name.
  fs::create_directories(tmp_ / "out");
  for (size_t i = 0; i < names.size(); ++i) {
    RunOk(Barge("files get " + Q(chain) + " " + Q("/odd/" + names[i]) + " " + Q(tmp_ / "out")));
    EXPECT_EQ(testing::Slurp(tmp_ / ("out/" + names[i])), "file " + std::to_string(i) + "\n") << names[i];
  }
  // A final link is followed; "-" is stdout.
  RunOk(Barge("files get " + Q(chain) + " /odd/link - > " + Q(tmp_ / "via-link.txt")));
  EXPECT_EQ(testing::Slurp(tmp_ / "via-link.txt"), "file 1\n");
  // The sparse file comes back sparse and whole.
  RunOk(Barge("files get " + Q(chain) + " /odd/sparse " + Q(tmp_ / "sparse.out")));
  EXPECT_EQ(testing::Slurp(tmp_ / "sparse.out"), testing::Slurp(tmp_ / "root/odd/sparse"));
  struct stat st {};
  ASSERT_EQ(::stat((tmp_ / "sparse.out").c_str(), &st), 0);
  EXPECT_LT(st.st_blocks * 512, 64 * 1024) << "allocated " << st.st_blocks * 512 << " of " << st.st_size;
  // A file under a file is not a folder; a missing name with a line
  // break fails on one line of stderr.
  auto r = testing::Run(Barge("files ls " + Q(chain) + " " + Q("/odd/-dash/x")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "InvalidArgument")) << r.output;
  r = testing::Run(Barge("files get " + Q(chain) + " " + Q("/odd/no\nsuch") + " " + Q(tmp_ / "out")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.stderr_text, "barge: NotFound: /odd/no\\nsuch: no such file or folder in backup " +
                               testing::PointIds(chain).back() + "\n");
  // A full standard output: one error line, with the reason (there were
  // two, the second a generic "<stdout>: the output could not be written").
  r = testing::Run(Barge("files get " + Q(chain) + " /odd/link - > /dev/full"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "NoSpace")) << r.stderr_text;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  // A destination in a missing folder is named as the user gave it (the
  // error named the private folder barge makes beside the copy).
  const std::string missing = tmp_ / "no-such-folder/x";
  r = testing::Run(Barge("files get " + Q(chain) + " /odd/link " + Q(missing)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.stderr_text, "barge: NotFound: " + missing + ": the destination's folder does not exist\n");
  // Nothing of ours left beside the copies.
  for (const auto& e : fs::directory_iterator(tmp_ / "out")) {
    EXPECT_FALSE(e.path().filename().string().starts_with(".barge-")) << e.path();
  }
}

TEST_F(FilesTest, AFilesystemInAPartition) {
  const std::string chain = BackUpTwoPoints(1 * kMiB, 17 * kMiB);
  RunOk(Barge("files get " + Q(chain) + " /etc/motd " + Q(tmp_ / "p.txt") + " --partition 1"));
  EXPECT_EQ(testing::Slurp(tmp_ / "p.txt"), "hello v2, a longer line\n");
  // Without --partition the disk starts with the partition table.
  json e = testing::RunError(Barge("files ls " + Q(chain) + " / --json"), 1);
  EXPECT_EQ(e.at("code"), "NotSupported");
  EXPECT_TRUE(Has(e.at("message").get<std::string>(), "--partition")) << e.dump();
}

}  // namespace
}  // namespace barge
