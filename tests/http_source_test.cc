// http(s):// URLs as read-only sources (issue 39), end to end against a real
// nginx on 127.0.0.1: convert, backup --source, replicate and image add
// read a qcow2 by ranged GETs and a raw image as raw, qemu-img compare
// judging the result; TLS verified (--ca-file), credentials from a netrc
// file and never echoed; bad answers (404, redirect loop, an HTML page, no
// ranges, a backing file) refused with one clear line and no output left;
// a fault proxy cuts, stalls, answers 503 and corrupts, and a file changed
// underneath is refused, never mixed.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "tests/testing/cli_testing.h"
#include "tests/testing/http_server.h"

namespace barge {
namespace {

using nlohmann::json;
using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::FaultProxy;
using ::barge::testing::Has;
using ::barge::testing::Nginx;
using ::barge::testing::Q;
using ::barge::testing::Sh;
using ::barge::testing::TempDir;
using ::barge::testing::WriteText;

class HttpSourceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::HaveTool("nginx") || !testing::HaveTool("certtool") || !testing::HaveTool("qemu-img")) return;
    nginx_ = new Nginx();
    if (!nginx_->ok()) return;
    // An 8 MiB qcow2 with data in three places, its raw twin, the raw one
    // where ranges are off and behind basic auth, and a qcow2 naming a
    // backing file.
    const std::string w = nginx_->www();
    testing::RunOk("cd " + Q(w) + " && qemu-img create -q -f qcow2 disk.qcow2 8M && qemu-io -f qcow2 "
                   "-c 'write -P 0xab 0 1M' -c 'write -P 0x17 3M 512k' -c 'write -P 0x42 7M 64k' disk.qcow2 "
                   ">/dev/null && qemu-img convert -O raw disk.qcow2 disk.raw && cp disk.raw disk.qcow2 noranges/ && "
                   "cp disk.raw private/ && qemu-img create -q -f qcow2 -b disk.qcow2 -F qcow2 child.qcow2");
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

  // qemu-img compare of the served file `name` with `out`.
  static void ExpectSame(const std::string& name, const std::string& out) {
    CommandResult c = Sh("qemu-img compare " + Q(Www(name)) + " " + Q(out));
    EXPECT_EQ(c.exit_code, 0) << c.output;
  }

  // A failed command: its exit code, one "barge: CODE: ..." line naming
  // `needle`, no secret, no output file.
  void ExpectRefused(const std::string& args, int exit_code, const std::string& needle) {
    const std::string out = dir_ / "refused.raw";
    CommandResult r = Sh(Barge("convert " + args + " " + Q(out)));
    EXPECT_EQ(r.exit_code, exit_code) << r.output;
    EXPECT_TRUE(Has(r.stderr_text, needle)) << r.output;
    EXPECT_TRUE(r.stderr_text.starts_with("barge: ")) << r.output;
    EXPECT_FALSE(Has(r.output, Nginx::kPassword)) << r.output;
    EXPECT_FALSE(std::filesystem::exists(out));
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path(), ec)) {
      ADD_FAILURE() << "left behind: " << e.path();
    }
  }

  static Nginx* nginx_;
  TempDir dir_;
};

Nginx* HttpSourceTest::nginx_ = nullptr;

TEST_F(HttpSourceTest, ConvertReadsQcow2AsQcow2AndRawAsRaw) {
  const std::string a = dir_ / "a.raw", b = dir_ / "b.qcow2";
  testing::RunOk(Barge("convert " + Q(nginx_->http("disk.qcow2")) + " " + Q(a)));
  ExpectSame("disk.qcow2", a);
  testing::RunOk(Barge("convert -O qcow2 " + Q(nginx_->http("disk.raw")) + " " + Q(b)));
  ExpectSame("disk.raw", b);
  // The guest view, not the container: 8 MiB of guest data.
  EXPECT_EQ(std::filesystem::file_size(a), 8u << 20);
}

TEST_F(HttpSourceTest, HttpsIsVerifiedAgainstTheGivenAuthority) {
  const std::string out = dir_ / "tls.raw";
  // The test CA is in no system store: refused without --ca-file.
  CommandResult r = Sh(Barge("convert " + Q(nginx_->https("disk.qcow2")) + " " + Q(out)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "certificate")) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "--ca-file")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out));
  testing::RunOk(Barge("convert --ca-file " + Q(nginx_->ca_file()) + " " + Q(nginx_->https("disk.qcow2")) + " " +
                       Q(out)));
  ExpectSame("disk.qcow2", out);
}

TEST_F(HttpSourceTest, BackupReplicateAndImageAddTakeAUrl) {
  const std::string chain = dir_ / "backups/vm";
  testing::RunOk(Barge("backup --source " + Q(nginx_->http("disk.qcow2")) + " --target " + Q(dir_ / "backups") +
                       " --name vm"));
  const auto ids = testing::PointIds(chain);
  ASSERT_EQ(ids.size(), 1u);
  ExpectSame("disk.qcow2", chain + "/" + ids[0] + ".qcow2");
  const json manifest = testing::ReadJson(testing::ManifestPath(chain, ids[0]));
  EXPECT_TRUE(Has(manifest.dump(), nginx_->http("disk.qcow2"))) << manifest.dump();

  const std::string copy = dir_ / "copy.raw";
  testing::RunOk(Barge("replicate " + Q(nginx_->http("disk.raw")) + " --to " + Q(copy)));
  ExpectSame("disk.raw", copy);

  const std::string catalog = dir_ / "catalog.db", disk = dir_ / "disk1";
  const std::string sha = testing::RunOk("sha512sum " + Q(Www("disk.raw")) + " | cut -d' ' -f1");
  testing::RunOk(Barge("image add base --source " + Q(nginx_->http("disk.qcow2")) + " --disk " + Q(disk) +
                       " --catalog " + Q(catalog) + " --expected-sha512 " + sha.substr(0, 128)));
  const json status = testing::RunResult(Barge("image status base --json --catalog " + Q(catalog)));
  EXPECT_TRUE(Has(status.dump(), nginx_->http("disk.qcow2"))) << status.dump();
  EXPECT_TRUE(Has(status.dump(), "ready")) << status.dump();
  // Named like a file copy: the URL path's extension.
  EXPECT_TRUE(std::filesystem::exists(disk + "/base.qcow2"));
  EXPECT_FALSE(std::filesystem::exists(disk + "/base"));
}

TEST_F(HttpSourceTest, CredentialsComeFromANetrcFileAndAreNeverShown) {
  const std::string url = nginx_->http("private/disk.raw");
  ExpectRefused(Q(url), 1, "401");
  ExpectRefused(Q("http://alice:" + std::string(Nginx::kPassword) + "@127.0.0.1:" +
                  std::to_string(nginx_->http_port()) + "/private/disk.raw"),
                1, "netrc");
  TempDir keys;
  const std::string netrc = keys / "netrc";
  WriteText(netrc, "machine 127.0.0.1 login alice password " + std::string(Nginx::kPassword) + "\n");
  ::chmod(netrc.c_str(), 0644);
  ExpectRefused("--netrc-file " + Q(netrc) + " " + Q(url), 1, "too open");
  ::chmod(netrc.c_str(), 0600);
  // A wrong password in the file is named as the file's entry, not as a
  // missing --netrc-file.
  const std::string wrong = keys / "wrong";
  WriteText(wrong, "machine 127.0.0.1 login alice password not-it\n");
  ::chmod(wrong.c_str(), 0600);
  ExpectRefused("--netrc-file " + Q(wrong) + " " + Q(url), 1, "check the --netrc-file entry");
  const std::string out = dir_ / "private.raw";
  const std::string text = testing::RunOk(Barge("convert --netrc-file " + Q(netrc) + " " + Q(url) + " " + Q(out)));
  EXPECT_FALSE(Has(text, Nginx::kPassword));
  ExpectSame("disk.raw", out);
}

TEST_F(HttpSourceTest, BadAnswersAreOneClearLineAndLeaveNothing) {
  ExpectRefused(Q(nginx_->http("missing.qcow2")), 1, "not found");
  ExpectRefused(Q(nginx_->http("loop")), 1, "redirect loop");
  ExpectRefused(Q(nginx_->http("page.qcow2")), 1, "web page");
  ExpectRefused(Q(nginx_->http("child.qcow2")), 1, "backing");
  // Nothing listens there: retried, then an I/O error.
  ExpectRefused(Q("http://127.0.0.1:" + std::to_string(1) + "/disk.raw"), 1, "attempts");
}

TEST_F(HttpSourceTest, AServerWithoutRangesIsReadOnceFrontToBackWithANote) {
  TempDir tmp;  // the runs' TMPDIR: nothing staged stays there
  const std::string env = "TMPDIR=" + Q(tmp.path().string()) + " ";
  const std::string url = nginx_->http("noranges/disk.raw");
  const std::string out = dir_ / "seq.raw";
  CommandResult r = Sh(env + Barge("convert " + Q(url) + " " + Q(out)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "barge: sequential read: " + url + ": the server does not serve byte ranges"))
      << r.output;
  ExpectSame("disk.raw", out);

  // A qcow2 too (its tables are read from the staged file), and the note
  // as an event under --json.
  const std::string qurl = nginx_->http("noranges/disk.qcow2");
  CommandResult j = Sh(env + Barge("replicate --json " + Q(qurl) + " --to " + Q(dir_ / "rep.qcow2")));
  ASSERT_EQ(j.exit_code, 0) << j.output;
  bool noted = false;
  std::istringstream lines(j.stdout_text);
  for (std::string line; std::getline(lines, line);) {
    const json e = json::parse(line);
    if (e["event"] != "sequential_read") continue;
    noted = true;
    EXPECT_EQ(e["url"], qurl) << line;
    EXPECT_EQ(e["size"], std::filesystem::file_size(Www("noranges/disk.qcow2"))) << line;
  }
  EXPECT_TRUE(noted) << j.stdout_text;
  ExpectSame("disk.qcow2", dir_ / "rep.qcow2");
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));

  // image add stages beside the catalog, and leaves nothing there either.
  TempDir cat;
  const std::string disk = dir_ / "disk1";
  CommandResult a = Sh(env + Barge("image add base --source " + Q(qurl) + " --disk " + Q(disk) + " --catalog " +
                                   Q(cat / "catalog.db")));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_TRUE(Has(a.stderr_text, "into a private file under " + cat.path().string())) << a.output;
  ExpectSame("disk.qcow2", disk + "/base.qcow2");
  for (const auto& e : std::filesystem::directory_iterator(cat.path())) {
    EXPECT_FALSE(e.path().filename().string().starts_with(".barge-stage")) << e.path();
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
}

TEST_F(HttpSourceTest, ACaFileWithAPlainHttpUrlIsAUsageError) {
  const std::string ca = "--ca-file " + Q(nginx_->ca_file()) + " ";
  const std::string url = Q(nginx_->http("disk.raw"));
  for (const std::string& cmd :
       {"convert " + ca + url + " " + Q(dir_ / "out.raw"), "replicate " + ca + url + " --to " + Q(dir_ / "out.raw"),
        "image add base --source " + url + " " + ca + "--disk " + Q(dir_ / "disk1") + " --catalog " +
            Q(dir_ / "catalog.db")}) {
    CommandResult r = Sh(Barge(cmd));
    EXPECT_EQ(r.exit_code, 64) << cmd << "\n" << r.output;
    EXPECT_TRUE(Has(r.stderr_text, "--ca-file asks for TLS, but the source is a plain http:// URL")) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "out.raw"));
    EXPECT_FALSE(std::filesystem::exists(dir_ / "disk1/base.raw"));
  }
}

TEST_F(HttpSourceTest, SignedUrlsAndLineBreaksNeverReachTheErrorLine) {
  // A signed link's signature is a credential (Azure SAS sig=, S3, Google).
  for (const std::string query : {"?sv=1&sig=SECRETSIG%3D", "?X-Amz-Date=1&X-Amz-Signature=SECRETSIG",
                                  "?X-Goog-Signature=SECRETSIG&x=1"}) {
    CommandResult r = Sh(Barge("info --json " + Q(nginx_->http("missing.qcow2" + query))));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Has(r.stderr_text, "missing.qcow2")) << r.output;
    EXPECT_FALSE(Has(r.output, "SECRETSIG")) << r.output;
  }
  // A line break in the URL is refused on one line that shows it escaped.
  CommandResult r = Sh(Barge("info " + Q(nginx_->http("disk.raw\nbarge: ok"))));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "disk.raw\\nbarge: ok")) << r.stderr_text;
}

TEST_F(HttpSourceTest, CutsStallsAnd503sAreRetriedAndResumedAtTheByte) {
  FaultProxy proxy(nginx_->http_port());
  const std::string out = dir_ / "resumed.raw";
  // Each of the first 3 connections is cut 300 KiB into its answer.
  proxy.Set(FaultProxy::Mode::kCut, 300 << 10, 3);
  testing::RunOk(Barge("convert " + Q(proxy.url("disk.raw")) + " " + Q(out)));
  EXPECT_EQ(proxy.faults(), 3);
  ExpectSame("disk.raw", out);
  std::filesystem::remove(out);

  proxy.Set(FaultProxy::Mode::k503, 0, 2);
  testing::RunOk(Barge("convert " + Q(proxy.url("disk.qcow2")) + " " + Q(out)));
  EXPECT_EQ(proxy.faults(), 5);
  ExpectSame("disk.qcow2", out);
  std::filesystem::remove(out);

  proxy.Set(FaultProxy::Mode::kStall, 200 << 10, 1, {}, 5000);
  testing::RunOk(Barge("convert --http-timeout 1 " + Q(proxy.url("disk.raw")) + " " + Q(out)));
  EXPECT_EQ(proxy.faults(), 6);
  ExpectSame("disk.raw", out);
}

TEST_F(HttpSourceTest, AServerThatKeepsCuttingIsAnIoErrorAndNoOutput) {
  FaultProxy proxy(nginx_->http_port());
  proxy.Set(FaultProxy::Mode::kCut, 100, 1000);
  ExpectRefused(Q(proxy.url("disk.raw")), 1, "IoError");
}

TEST_F(HttpSourceTest, AFileChangedUnderneathIsRefusedNeverMixed) {
  // A copy served from its own name, so the suite's files stay as they are.
  std::filesystem::copy_file(Www("disk.raw"), Www("changing.raw"), std::filesystem::copy_options::overwrite_existing);
  FaultProxy proxy(nginx_->http_port());
  // Every connection is cut 200 KiB into its answers (the probe's short
  // answer passes); at the first cut the file gets a new modification time
  // (a new ETag and Last-Modified), which the reconnection sees.
  const std::string changed = Www("changing.raw");
  proxy.Set(FaultProxy::Mode::kCut, 200 << 10, 1000, [changed] {
    Sh("touch -d '2001-02-03 04:05:06' " + Q(changed));
  });
  ExpectRefused(Q(proxy.url("changing.raw")), 2, "changed");

  // replicate and image add alike: an honest failure, promising no resume
  // (the next run would refuse it: another version), and nothing left,
  // no .NAME.barge-resume journal either.
  std::filesystem::copy_file(Www("disk.raw"), changed, std::filesystem::copy_options::overwrite_existing);
  proxy.Set(FaultProxy::Mode::kCut, 200 << 10, 1000, [changed] {
    Sh("touch -d '2002-02-03 04:05:06' " + Q(changed));
  });
  CommandResult r = Sh(Barge("replicate " + Q(proxy.url("changing.raw")) + " --to " + Q(dir_ / "copy.raw")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "changed")) << r.output;
  EXPECT_FALSE(Has(r.output, "resumes from it")) << r.output;
  EXPECT_FALSE(Has(r.output, "read 0 B")) << r.output;
  std::filesystem::copy_file(Www("disk.raw"), changed, std::filesystem::copy_options::overwrite_existing);
  proxy.Set(FaultProxy::Mode::kCut, 200 << 10, 1000, [changed] {
    Sh("touch -d '2003-02-03 04:05:06' " + Q(changed));
  });
  TempDir cat;
  r = Sh(Barge("image add base --source " + Q(proxy.url("changing.raw")) + " --disk " + Q(dir_.path().string()) +
               " --catalog " + Q(cat / "catalog.db")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_FALSE(Has(r.output, "resumes from it")) << r.output;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) ADD_FAILURE() << "left behind: " << e.path();
  std::filesystem::remove(changed);
}

TEST_F(HttpSourceTest, AChecksumMismatchLeavesTheImageAddFailedNeverReady) {
  FaultProxy proxy(nginx_->http_port());
  proxy.Set(FaultProxy::Mode::kCorrupt, 2 << 20, 1000);
  const std::string catalog = dir_ / "catalog.db", disk = dir_ / "disk1";
  const std::string sha = testing::RunOk("sha512sum " + Q(Www("disk.raw")) + " | cut -d' ' -f1");
  CommandResult r = Sh(Barge("image add base --source " + Q(proxy.url("disk.raw")) + " --disk " + Q(disk) +
                             " --catalog " + Q(catalog) + " --expected-sha512 " + sha.substr(0, 128)));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_GT(proxy.faults(), 0);
  CommandResult s = Sh(Barge("image status base --json --catalog " + Q(catalog)));
  EXPECT_FALSE(Has(s.stdout_text, "\"ready\"")) << s.output;
  EXPECT_FALSE(std::filesystem::exists(disk + "/base.raw"));
}

}  // namespace
}  // namespace barge
