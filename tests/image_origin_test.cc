// Backing images from a URL (issue 39), the catalog's side, end to end
// against a real nginx on 127.0.0.1: `image status` shows bytes and percent
// while a copy downloads (a /slow/ location at 256 KiB/s per answer) and
// why the last add failed; `image sync` downloads the image again from its
// origin URL when no ready copy is left, checked against its SHA-512, and
// names the origin when it is gone; credentials from --header-file (a
// /bearer/ location) reach the server and no output, error or record;
// info, map and compare take the http flags.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/testing/cli_testing.h"
#include "tests/testing/http_server.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::Has;
using ::barge::testing::Nginx;
using ::barge::testing::Q;
using ::barge::testing::Sh;
using ::barge::testing::TempDir;
using ::barge::testing::WriteText;

class ImageOriginTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::HaveTool("nginx") || !testing::HaveTool("certtool") || !testing::HaveTool("qemu-img")) return;
    nginx_ = new Nginx();
    if (!nginx_->ok()) return;
    // A 12 MiB raw image of random bytes (every byte is read: at 256 KiB/s
    // per answer it takes seconds), and a small qcow2.
    const std::string w = nginx_->www();
    testing::RunOk("cd " + Q(w) + " && head -c 12M /dev/urandom > big.raw && qemu-img create -q -f qcow2 "
                   "disk.qcow2 8M && qemu-io -f qcow2 -c 'write -P 0xab 0 1M' -c 'write -P 0x42 7M 64k' "
                   "disk.qcow2 >/dev/null && qemu-img convert -O raw disk.qcow2 disk.raw");
  }
  static void TearDownTestSuite() {
    delete nginx_;
    nginx_ = nullptr;
  }

  void SetUp() override {
    BARGE_REQUIRE_TOOL("nginx");
    BARGE_REQUIRE_TOOL("certtool");
    BARGE_REQUIRE_TOOL("qemu-img");
    ASSERT_NE(nginx_, nullptr);
    ASSERT_TRUE(nginx_->ok()) << nginx_->failure();
  }

  static std::string Www(const std::string& name) { return nginx_->www() + "/" + name; }
  static std::string Sha512(const std::string& file) {
    return testing::RunOk("sha512sum " + Q(file) + " | cut -d' ' -f1").substr(0, 128);
  }
  std::string Image(const std::string& args) { return Barge("image " + args + " --catalog " + Q(catalog_)); }

  static Nginx* nginx_;
  TempDir dir_;
  const std::string catalog_ = dir_ / "catalog.db";
};

Nginx* ImageOriginTest::nginx_ = nullptr;

TEST_F(ImageOriginTest, StatusShowsBytesAndPercentWhileACopyDownloads) {
  const std::string disk = dir_ / "disk1";
  CommandResult add;
  std::thread adder([&] {
    // One reader, little memory: the chunks arrive one after another.
    add = Sh(Image("add big --threads 1 --memory 4M --source " + Q(nginx_->http("slow/big.raw")) + " --disk " + Q(disk) +
                   " --expected-sha512 " + Sha512(Www("big.raw"))));
  });
  bool seen_json = false, seen_text = false;
  std::string last;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((!seen_json || !seen_text) && std::chrono::steady_clock::now() < deadline) {
    CommandResult s = Sh(Image("status big --json"));
    if (s.exit_code == 0) {
      const json status = testing::ResultOf(s.stdout_text);
      const json& copy = status["images"][0]["copies"][0];
      last = copy.dump();
      if (copy["state"] == "in-progress" && copy["percent"].get<double>() > 0 &&
          copy["percent"].get<double>() < 100) {
        EXPECT_GT(copy["bytes_done"].get<uint64_t>(), 0u) << last;
        EXPECT_EQ(copy["bytes_total"].get<uint64_t>(), 12u << 20) << last;
        seen_json = true;
      }
    }
    CommandResult t = Sh(Image("status big"));
    if (t.exit_code == 0 && Has(t.stdout_text, "in-progress") && Has(t.stdout_text, "% (") &&
        Has(t.stdout_text, " of 12 MiB)")) {
      seen_text = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  adder.join();
  EXPECT_TRUE(seen_json) << last;
  EXPECT_TRUE(seen_text);
  ASSERT_EQ(add.exit_code, 0) << add.output;
  const json done = testing::RunResult(Image("status big --json"));
  const json& copy = done["images"][0]["copies"][0];
  EXPECT_EQ(copy["state"], "ready") << done.dump();
  EXPECT_EQ(copy["percent"], 100) << done.dump();
  EXPECT_EQ(copy["bytes_done"], 12u << 20) << done.dump();
}

TEST_F(ImageOriginTest, StatusSaysWhyTheLastAddFailed) {
  const std::string disk = dir_ / "disk1";
  CommandResult r = Sh(Image("add base --source " + Q(nginx_->http("nothere.raw")) + " --disk " + Q(disk)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // The image is not in the catalog (issue 12); status names why.
  CommandResult s = Sh(Image("status base"));
  EXPECT_EQ(s.exit_code, 1) << s.output;
  EXPECT_TRUE(Has(s.stderr_text, "no image 'base' in the catalog; its last add")) << s.output;
  EXPECT_TRUE(Has(s.stderr_text, "failed: NotFound: ")) << s.output;
  EXPECT_TRUE(Has(s.stderr_text, "HTTP 404")) << s.output;
  const json error = testing::RunError(Image("status base --json"), 1);
  EXPECT_TRUE(Has(error.dump(), "HTTP 404")) << error.dump();
  EXPECT_EQ(testing::RunOk(Image("status")), "");
  // A later add that succeeds forgets the failure.
  testing::RunOk(Image("add base --source " + Q(nginx_->http("disk.raw")) + " --disk " + Q(disk)));
  EXPECT_FALSE(Has(testing::RunOk(Image("status base")), "404"));
}

TEST_F(ImageOriginTest, SyncDownloadsAgainFromTheOriginWhenNoReadyCopyIsLeft) {
  const std::string d1 = dir_ / "disk1", d2 = dir_ / "disk2";
  testing::RunOk("cp " + Q(Www("disk.qcow2")) + " " + Q(Www("origin.qcow2")));
  const std::string url = nginx_->http("origin.qcow2");
  testing::RunOk(Image("add base --source " + Q(url) + " --disk " + Q(d1) + " --expected-sha512 " +
                       Sha512(Www("disk.raw"))));
  const std::string copy =
      testing::RunResult(Image("status base --json"))["images"][0]["copies"][0]["path"].get<std::string>();
  ASSERT_TRUE(fs::exists(copy)) << testing::RunOk("ls -la " + Q(d1));
  fs::remove(copy);
  // No ready copy is left: the sync downloads it again to disk1, which sends to disk2.
  const json result = testing::RunResult(Image("sync base --json --disks " + Q(d1) + "," + Q(d2)));
  EXPECT_EQ(result["downloaded_from"], url) << result.dump();
  ASSERT_EQ(result["copies"].size(), 2u) << result.dump();
  for (const auto& c : result["copies"]) {
    EXPECT_EQ(c["state"], "ready") << result.dump();
    EXPECT_EQ(Sh("qemu-img compare " + Q(Www("disk.qcow2")) + " " + Q(c["path"].get<std::string>())).exit_code, 0);
  }
  // The text says so.
  fs::remove(copy);
  fs::remove(result["copies"][1]["path"].get<std::string>());
  EXPECT_TRUE(Has(testing::RunOk(Image("sync base --disks " + Q(d1))), "downloaded base again from its origin " + url));

  // The origin now serves other content: the SHA-512 check refuses it.
  fs::remove(copy);
  testing::RunOk("qemu-img create -q -f qcow2 " + Q(Www("origin.qcow2")) + " 8M");
  CommandResult changed = Sh(Image("sync base --disks " + Q(d1)));
  EXPECT_NE(changed.exit_code, 0) << changed.output;
  EXPECT_TRUE(Has(changed.stderr_text, "mismatch")) << changed.output;
  EXPECT_FALSE(fs::exists(copy));

  // The origin is gone: one clear line naming it.
  fs::remove(Www("origin.qcow2"));
  CommandResult gone = Sh(Image("sync base --disks " + Q(d1)));
  EXPECT_EQ(gone.exit_code, 1) << gone.output;
  EXPECT_TRUE(gone.stderr_text.starts_with("barge: NotFound: " + url + ": ")) << gone.output;
  EXPECT_TRUE(Has(gone.stderr_text, "no ready copy; downloading it again from its origin")) << gone.output;
  EXPECT_TRUE(Has(gone.stderr_text, "HTTP 404")) << gone.output;
  EXPECT_EQ(std::count(gone.stderr_text.begin(), gone.stderr_text.end(), '\n'), 1) << gone.output;
  const json status = testing::RunResult(Image("status base --json"));
  EXPECT_EQ(status["images"][0]["copies"][0]["state"], "failed") << status.dump();
}

TEST_F(ImageOriginTest, SyncWithoutAUrlOriginStillHasNothingToSendFrom) {
  const std::string d1 = dir_ / "disk1";
  testing::RunOk(Image("add base --source " + Q(Www("disk.raw")) + " --disk " + Q(d1)));
  fs::remove(testing::RunResult(Image("status base --json"))["images"][0]["copies"][0]["path"].get<std::string>());
  CommandResult r = Sh(Image("sync base --disks " + Q(d1)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "no ready copy to send from")) << r.output;
}

TEST_F(ImageOriginTest, HeadersComeFromAHeaderFileAndAreNeverShown) {
  const std::string token = Nginx::kBearerToken;
  const std::string url = nginx_->http("bearer/disk.raw");
  TempDir keys;
  const std::string headers = keys / "headers";
  WriteText(headers, "# the registry's token\nAuthorization: Bearer " + token + "\n\nX-Barge-Test: 1\n");
  ::chmod(headers.c_str(), 0600);
  std::string outputs;
  auto run = [&](const std::string& command) {
    CommandResult r = Sh(command);
    outputs += r.output;
    return r;
  };
  // Without the header: 401, and the hint names both ways to give credentials.
  CommandResult refused = run(Barge("convert " + Q(url) + " " + Q(dir_ / "no.raw")));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(Has(refused.stderr_text, "HTTP 401")) << refused.output;
  EXPECT_TRUE(Has(refused.stderr_text, "--header-file")) << refused.output;
  // A file others can read is refused before anything is sent.
  ::chmod(headers.c_str(), 0644);
  CommandResult open = run(Barge("convert --header-file " + Q(headers) + " " + Q(url) + " " + Q(dir_ / "no.raw")));
  EXPECT_EQ(open.exit_code, 1) << open.output;
  EXPECT_TRUE(Has(open.stderr_text, "too open")) << open.output;
  ::chmod(headers.c_str(), 0600);
  // A wrong token: 401 naming the file's headers.
  const std::string wrong = keys / "wrong";
  WriteText(wrong, "Authorization: Bearer not-it\n");
  ::chmod(wrong.c_str(), 0600);
  CommandResult bad = run(Barge("convert --header-file " + Q(wrong) + " " + Q(url) + " " + Q(dir_ / "no.raw")));
  EXPECT_TRUE(Has(bad.stderr_text, "check the headers of --header-file")) << bad.output;
  // A line that is no header: its number, never its text.
  const std::string junk = keys / "junk";
  WriteText(junk, "Bearer " + token + "\n");
  ::chmod(junk.c_str(), 0600);
  CommandResult j = run(Barge("convert --header-file " + Q(junk) + " " + Q(url) + " " + Q(dir_ / "no.raw")));
  EXPECT_TRUE(Has(j.stderr_text, "line 1 of the header file")) << j.output;
  EXPECT_FALSE(fs::exists(dir_ / "no.raw"));

  // With it: convert, image add (and its record), info, map, compare.
  const std::string out = dir_ / "ok.raw";
  EXPECT_EQ(run(Barge("convert --header-file " + Q(headers) + " " + Q(url) + " " + Q(out))).exit_code, 0) << outputs;
  EXPECT_EQ(Sh("qemu-img compare " + Q(Www("disk.raw")) + " " + Q(out)).exit_code, 0);
  CommandResult add = run(Image("add base --json --header-file " + Q(headers) + " --source " + Q(url) + " --disk " +
                                Q(dir_ / "disk1")));
  EXPECT_EQ(add.exit_code, 0) << add.output;
  run(Image("status --json"));
  CommandResult info = run(Barge("info --json --header-file " + Q(headers) + " " + Q(url)));
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_EQ(testing::ResultOf(info.stdout_text)["virtual_size"], 8u << 20) << info.output;
  CommandResult map = run(Barge("map --header-file " + Q(headers) + " " + Q(url)));
  EXPECT_EQ(map.exit_code, 0) << map.output;
  CommandResult compare = run(Barge("compare --header-file " + Q(headers) + " " + Q(url) + " " + Q(out)));
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
  // Without the file, info says 401 too.
  EXPECT_EQ(run(Barge("info " + Q(url))).exit_code, 1);

  EXPECT_FALSE(Has(outputs, token)) << outputs;
  // Nor is it in the catalog or beside the copy.
  for (const auto& e : fs::recursive_directory_iterator(dir_.path())) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    EXPECT_FALSE(Has(bytes.str(), token)) << e.path();
  }
}

}  // namespace
}  // namespace barge
