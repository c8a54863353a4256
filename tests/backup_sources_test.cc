// `barge backup` of every kind of source (raw and qcow2 files, a 3-layer
// qcow2 chain, qemu-nbd and nbdkit exports), judged by qemu's tools:
// qemu-img check (clean), qemu-img compare (identical to the source),
// qemu-img info (zstd), and by `barge verify` with and without --against.
// Also the --json result, the text output, and --source-format raw.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

using nlohmann::json;
using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::RandomBytes;
using ::barge::testing::RunOk;
using ::barge::testing::ShellQuote;
using ::barge::testing::Slurp;
using ::barge::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

using ::barge::testing::ResultOf;

using Server = ::barge::testing::SocketServer;

class BackupSourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    target_ = dir_ / "backups";
  }

  // Backs up `source` into target_/<name> and checks the backup with qemu's
  // tools and barge verify. `qemu_format` is how qemu-img reads the source
  // (raw for NBD URIs); `against_format` is passed to barge verify.
  // Returns the --json result.
  json BackupAndJudge(const std::string& source, const std::string& name,
                      const std::string& qemu_format, const std::string& extra = "") {
    json r = testing::RunResult(Barge("backup --source " + ShellQuote(source) + " --target " +
                                      ShellQuote(target_) + " --name " + name + " --json " + extra));
    if (r.empty()) return r;
    std::string image = r.value("image", "");
    EXPECT_EQ(r.value("type", ""), "full");

    CommandResult check = testing::Run("qemu-img check " + ShellQuote(image));
    EXPECT_EQ(check.exit_code, 0) << check.output;
    EXPECT_NE(check.output.find("No errors were found"), std::string::npos) << check.output;
    EXPECT_EQ(check.output.find("leaked"), std::string::npos) << check.output;

    CommandResult cmp = testing::Run("qemu-img compare -f qcow2 -F " + qemu_format + " " + ShellQuote(image) +
                            " " + ShellQuote(source));
    EXPECT_EQ(cmp.exit_code, 0) << cmp.output;
    EXPECT_NE(cmp.output.find("Images are identical"), std::string::npos) << cmp.output;

    json info = json::parse(RunOk("qemu-img info --output=json " + ShellQuote(image)), nullptr, false);
    EXPECT_EQ(info["format"], "qcow2");
    EXPECT_EQ(info["format-specific"]["data"]["compression-type"], "zstd") << info.dump();

    std::string chain = target_ + "/" + name;
    std::string v = RunOk(Barge("verify " + ShellQuote(chain)));
    EXPECT_NE(v.find("verified " + r.value("id", "?")), std::string::npos) << v;
    std::string va = RunOk(Barge("verify " + ShellQuote(chain) + " --against " + ShellQuote(source)));
    EXPECT_NE(va.find("the source matches"), std::string::npos) << va;
    return r;
  }

  // Starts a server command on a fresh socket in the temp dir.
  std::unique_ptr<Server> Serve(const std::string& command_before_socket, const std::string& socket_flag,
                                const std::string& args) {
    std::string socket = dir_ / ("s" + std::to_string(counter_++) + ".sock");
    auto server = std::make_unique<Server>(
        command_before_socket + " " + socket_flag + ShellQuote(socket) + " " + args, socket);
    EXPECT_TRUE(server->WaitReady()) << command_before_socket << " " << args;
    return server;
  }
  std::unique_ptr<Server> Nbdkit(const std::string& args) {
    return Serve("nbdkit -f --exit-with-parent", "-U ", args);
  }
  std::unique_ptr<Server> QemuNbd(const std::string& args) {
    return Serve("qemu-nbd -r -t", "--socket=", args);
  }

  // A raw disk with random, compressible, zero and hole regions.
  std::string MakeRawDisk(const std::string& name, uint64_t size, uint64_t seed) {
    std::vector<std::byte> bytes = RandomBytes(size, seed);
    for (uint64_t i = size / 4; i < size / 2; ++i) bytes[i] = std::byte("barge text "[i % 11]);
    std::memset(bytes.data() + size / 2, 0, size / 8);  // zero run (becomes a hole in the backup)
    std::string path = dir_ / name;
    testing::WriteFile(path, bytes);
    // A real hole too.
    RunOk("fallocate -p -o " + std::to_string(size * 3 / 4) + " -l " + std::to_string(size / 8) + " " +
          ShellQuote(path));
    return path;
  }

  TempDir dir_;
  std::string target_;
  int counter_ = 0;
};

TEST_F(BackupSourcesTest, RawFile) {
  std::string disk = MakeRawDisk("disk.raw", 32 * kMiB, 1);
  json r = BackupAndJudge(disk, "raw", "raw");
  EXPECT_EQ(r.value("virtual_size", 0ull), 32 * kMiB);
  // The zero run and hole are not stored: the image holds less than the disk.
  EXPECT_LT(r.value("bytes_written", ~0ull), 32 * kMiB);
}

TEST_F(BackupSourcesTest, Qcow2ThreeLayerChain) {
  BARGE_REQUIRE_TOOL("qemu-io");
  std::string base = dir_ / "base.qcow2", mid = dir_ / "mid.qcow2", top = dir_ / "top.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(base) + " 48M");
  RunOk("qemu-io -f qcow2 -c 'write -P 0x11 0 8M' -c 'write -P 0x12 20M 4M' -c 'write -P 0x13 47M 1M' " +
        ShellQuote(base));
  RunOk("qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 " + ShellQuote(mid));
  // Overwrite part of the base, zero another part of it, add new data.
  RunOk("qemu-io -f qcow2 -c 'write -P 0x21 4M 2M' -c 'write -z 20M 1M' -c 'write -P 0x22 30M 3M' " +
        ShellQuote(mid));
  RunOk("qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 " + ShellQuote(top));
  RunOk("qemu-io -f qcow2 -c 'write -P 0x31 5M 64k' -c 'write -z 31M 512k' -c 'discard 0 1M' "
        "-c 'write -P 0x32 40M 2M' " + ShellQuote(top));
  json r = BackupAndJudge(top, "chain", "qcow2");
  EXPECT_EQ(r.value("virtual_size", 0ull), 48 * kMiB);
  // Flattened: the full backup has no backing file.
  json info = json::parse(RunOk("qemu-img info --output=json " + ShellQuote(r.value("image", ""))),
                          nullptr, false);
  EXPECT_FALSE(info.contains("backing-filename")) << info.dump();
}

TEST_F(BackupSourcesTest, QemuNbdQcow2Export) {
  BARGE_REQUIRE_TOOL("qemu-nbd");
  BARGE_REQUIRE_TOOL("qemu-io");
  std::string img = dir_ / "vm.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(img) + " 32M");
  RunOk("qemu-io -f qcow2 -c 'write -P 0x41 1M 3M' -c 'write -P 0x42 17M 64k' " + ShellQuote(img));
  auto server = QemuNbd("-f qcow2 " + ShellQuote(img));
  BackupAndJudge(server->uri(), "qnbd", "raw");
  // The same backup compared with the qcow2 file itself.
  std::string image = testing::Run("ls " + ShellQuote(target_) + "/qnbd/*.qcow2").output;
  image.erase(image.find_last_not_of('\n') + 1);
  EXPECT_EQ(testing::Run("qemu-img compare -f qcow2 -F qcow2 " + ShellQuote(image) + " " + ShellQuote(img)).exit_code,
            0);
}

TEST_F(BackupSourcesTest, QemuNbdRawExport) {
  BARGE_REQUIRE_TOOL("qemu-nbd");
  std::string disk = MakeRawDisk("export.raw", 16 * kMiB, 2);
  auto server = QemuNbd("-f raw " + ShellQuote(disk));
  BackupAndJudge(server->uri(), "qraw", "raw");
}

TEST_F(BackupSourcesTest, NbdkitMemoryWithData) {
  BARGE_REQUIRE_TOOL("nbdkit");
  BARGE_REQUIRE_TOOL("qemu-io");
  auto server = Nbdkit("memory 64M");
  RunOk("qemu-io -f raw -c 'write -P 0x5a 1M 3M' -c 'write -P 0xa5 33M 128k' -c 'write -P 0x01 63M 1M' " +
        ShellQuote(server->uri()));
  json r = BackupAndJudge(server->uri(), "mem", "raw");
  EXPECT_EQ(r.value("virtual_size", 0ull), 64 * kMiB);
  // nbdkit memory reports the untouched rest as holes: little is read.
  EXPECT_LE(r.value("bytes_read", ~0ull), 8 * kMiB);
}

TEST_F(BackupSourcesTest, NbdkitSparseRandom) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("sparse-random 64M seed=7");
  BackupAndJudge(server->uri(), "sparse", "raw");
}

TEST_F(BackupSourcesTest, NbdkitPattern) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("pattern 32M");
  json r = BackupAndJudge(server->uri(), "pattern", "raw");
  // The pattern (each 8-byte offset) compresses well.
  EXPECT_LT(r.value("bytes_written", ~0ull), 32 * kMiB / 2);
}

TEST_F(BackupSourcesTest, NbdUriWithoutExportNameGetsPlainDefaultName) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("pattern 1M");
  RunOk(Barge("backup --source " + ShellQuote(server->uri()) + " --target " + ShellQuote(target_)));
  // Named after the (empty) export, not "nbd+unix:".
  EXPECT_TRUE(std::filesystem::is_directory(target_ + "/disk"))
      << testing::Run("ls -la " + ShellQuote(target_)).output;
}

TEST_F(BackupSourcesTest, JsonResultAndTextOutput) {
  std::string disk = MakeRawDisk("vm1.raw", 16 * kMiB, 3);
  json r = testing::RunResult(Barge("backup --source " + ShellQuote(disk) + " --target " +
                                    ShellQuote(target_) + " --json"));
  ASSERT_FALSE(r.empty());
  for (const char* key : {"id", "type", "image", "manifest", "digest_table", "bytes_read",
                          "bytes_written", "duration_seconds", "peak_rss_bytes", "image_digest"}) {
    EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
  }
  EXPECT_EQ(r["type"], "full");
  EXPECT_EQ(r["disk"], "vm1");  // default name: base name without extension
  EXPECT_TRUE(std::filesystem::exists(r["image"].get<std::string>()));
  EXPECT_TRUE(std::filesystem::exists(r["manifest"].get<std::string>()));
  // Everything but the punched hole is read.
  EXPECT_EQ(r["bytes_read"].get<uint64_t>(), 16 * kMiB - 16 * kMiB / 8) << r.dump();
  EXPECT_GT(r["bytes_written"].get<uint64_t>(), 0u);
  EXPECT_GE(r["duration_seconds"].get<double>(), 0.0);
  EXPECT_GT(r["peak_rss_bytes"].get<uint64_t>(), 1 * kMiB);
  std::string id = r["id"];
  EXPECT_EQ(id.rfind("0000-", 0), 0u) << id;

  // A second (forced) full backup in text form.
  std::string text =
      RunOk(Barge("backup --source " + ShellQuote(disk) + " --target " + ShellQuote(target_)));
  EXPECT_NE(text.find("full backup 0001-"), std::string::npos) << text;
  for (const char* label : {"reason:", "image:", "read:", "written:", "digest:", "duration:"}) {
    EXPECT_NE(text.find(label), std::string::npos) << label << " missing in\n" << text;
  }
  EXPECT_NE(text.find("zstd:1"), std::string::npos) << text;
}

// A raw disk whose first bytes are a qcow2 header: --source-format raw backs
// up the raw bytes; detection reads it as the (bogus) qcow2 image instead.
TEST_F(BackupSourcesTest, SourceFormatRawIsNeverProbed) {
  std::string small = dir_ / "small.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(small) + " 1M");
  std::vector<std::byte> header = testing::ReadFile(small);
  header.resize(4096);
  std::string disk = dir_ / "tricky.raw";
  std::vector<std::byte> bytes = RandomBytes(16 * kMiB, 4);
  std::memcpy(bytes.data(), header.data(), header.size());
  testing::WriteFile(disk, bytes);

  json r = testing::RunResult(Barge("backup --source-format raw --source " + ShellQuote(disk) +
                                    " --target " + ShellQuote(target_) + " --name asraw --json"));
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r["virtual_size"].get<uint64_t>(), 16 * kMiB);
  EXPECT_EQ(testing::Run("qemu-img compare -f qcow2 -F raw " + ShellQuote(r["image"].get<std::string>()) + " " +
                ShellQuote(disk)).exit_code,
            0);
  json manifest = json::parse(Slurp(r["manifest"].get<std::string>()), nullptr, false);
  EXPECT_EQ(manifest["source"]["format"], "raw") << manifest.dump();

  // Without the flag the header wins: an error, or a 1 MiB "qcow2" disk that
  // is not the raw bytes.
  CommandResult probed = testing::Run(Barge("backup --source " + ShellQuote(disk) + " --target " +
                                   ShellQuote(target_) + " --name probed --json"));
  EXPECT_LT(probed.exit_code, 128) << probed.output;  // no crash
  if (probed.exit_code == 0) {
    json p = ResultOf(probed.stdout_text);
    EXPECT_EQ(p["virtual_size"].get<uint64_t>(), 1 * kMiB) << probed.output;
    EXPECT_NE(testing::Run("qemu-img compare -f qcow2 -F raw " + ShellQuote(p["image"].get<std::string>()) + " " +
                  ShellQuote(disk)).exit_code,
              0);
  } else {
    EXPECT_NE(probed.stderr_text.find("barge:"), std::string::npos) << probed.output;
    EXPECT_EQ(testing::ErrorOf(probed.stdout_text).value("exit_code", -1), probed.exit_code) << probed.output;
  }
}

}  // namespace
}  // namespace barge
