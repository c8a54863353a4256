// NBD over TCP with TLS, end to end: qemu-nbd on 127.0.0.1 with
// tls-creds-x509 (verify-peer=on) or tls-creds-psk, certificates and keys
// made here with certtool. barge backup (full and incremental from a dirty
// bitmap), convert, verify --against, replicate and restore --to through
// nbds:// URIs and the --tls-* flags; a plaintext server, a wrong CA and
// loose key permissions refused; no secret in manifests, records, --json or
// error text; several connections read the same bytes as one.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "blockio/env.h"
#include "pipeline/nbd_endpoint.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/http_server.h"

namespace barge {
namespace {

using nlohmann::json;
using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::FreeLoopbackPort;
using ::barge::testing::Has;
using ::barge::testing::ListeningOn;
using ::barge::testing::Q;
using ::barge::testing::Sh;
using ::barge::testing::Slurp;
using ::barge::testing::TempDir;
using ::barge::testing::WriteText;

// The PSK the tests share with qemu-nbd; its hex must appear in no output.
constexpr const char* kPskHex = "7d2fa9c04be31186a5d0c3f7e9b2146d8a5c01e7f3b96d2a";

// A qemu-nbd on 127.0.0.1:port, our child, stopped by its PID (SIGTERM,
// then SIGKILL) when destroyed.
class TcpQemuNbd {
 public:
  // On `port`, or on a free one when 0.
  explicit TcpQemuNbd(const std::string& args, int port = 0)
      : TcpQemuNbd("qemu-nbd -t -b 127.0.0.1 -p", args, port) {}
  // nbdkit (foreground) on 127.0.0.1 with `args` (plugin and its
  // parameters last).
  static std::unique_ptr<TcpQemuNbd> Nbdkit(const std::string& args) {
    return std::unique_ptr<TcpQemuNbd>(new TcpQemuNbd("nbdkit -f -i 127.0.0.1 -p", args, 0));
  }
  // `program` ends with its port option; the port follows it.
  TcpQemuNbd(const std::string& program, const std::string& args, int port) : port_(port != 0 ? port : FreeLoopbackPort()) {
    std::string shell = "exec " + program + " " + std::to_string(port_) + " " + args + " >/dev/null 2>&1";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", shell.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~TcpQemuNbd() {
    ::barge::testing::StopChild(pid_, std::chrono::seconds(5));
  }
  TcpQemuNbd(const TcpQemuNbd&) = delete;
  TcpQemuNbd& operator=(const TcpQemuNbd&) = delete;

  bool WaitReady() {
    for (int i = 0; i < 500; ++i) {
      if (ListeningOn(port_)) return true;
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  std::string hostport() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  int port_;
  int pid_ = -1;
};

class NbdTlsTest : public ::testing::Test {
 protected:
  // Certificates and keys are made once for the suite (certtool takes a
  // moment per key): a CA, a server and a client certificate, a second CA
  // that signed nothing here, a PSK, and two server certificates the client
  // must refuse: one that expired (2020-2021) and one for another host.
  static void SetUpTestSuite() {
    if (!testing::HaveTool("certtool") || !testing::HaveTool("qemu-nbd")) return;
    pki_ = new TempDir();
    const TempDir& d = *pki_;
    for (const char* sub : {"server", "client", "wrongca", "psk", "expired", "otherhost"}) std::filesystem::create_directory(d / sub);
    WriteText(d / "ca.info", "cn = barge test CA\nca\ncert_signing_key\nexpiration_days = 2\n");
    WriteText(d / "server.info",
              "organization = barge test\ncn = 127.0.0.1\nip_address = 127.0.0.1\ntls_www_server\n"
              "signing_key\nexpiration_days = 2\n");
    WriteText(d / "expired.info",
              "organization = barge test\ncn = 127.0.0.1\nip_address = 127.0.0.1\ntls_www_server\nsigning_key\n"
              "activation_date = \"2020-01-01 00:00:00 UTC\"\nexpiration_date = \"2021-01-01 00:00:00 UTC\"\n");
    WriteText(d / "otherhost.info", "organization = barge test\ncn = elsewhere.example\ndns_name = elsewhere.example\n"
                                    "tls_www_server\nsigning_key\nexpiration_days = 2\n");
    WriteText(d / "client.info", "organization = barge test\ncn = client\ntls_www_client\nsigning_key\n"
                                 "expiration_days = 2\n");
    const std::string key = "certtool -q --generate-privkey --key-type=ecdsa --outfile ";
    std::string script =
        "set -e; cd " + Q(d.path().string()) + "\n" + key + "ca-key.pem\n" +
        "certtool -q --generate-self-signed --load-privkey ca-key.pem --template ca.info --outfile ca-cert.pem\n" +
        key + "server/server-key.pem\n" +
        "certtool -q --generate-certificate --load-privkey server/server-key.pem --load-ca-certificate "
        "ca-cert.pem --load-ca-privkey ca-key.pem --template server.info --outfile server/server-cert.pem\n" +
        key + "client/client-key.pem\n" +
        "certtool -q --generate-certificate --load-privkey client/client-key.pem --load-ca-certificate "
        "ca-cert.pem --load-ca-privkey ca-key.pem --template client.info --outfile client/client-cert.pem\n" +
        "cp ca-cert.pem server/ && cp ca-cert.pem client/\n" +
        "for s in expired otherhost; do cp server/server-key.pem ca-cert.pem $s/ && certtool -q "
        "--generate-certificate --load-privkey $s/server-key.pem --load-ca-certificate ca-cert.pem "
        "--load-ca-privkey ca-key.pem --template $s.info --outfile $s/server-cert.pem; done\n" +
        // The wrong CA: a folder like client/ whose CA did not sign the server.
        key + "wrong-ca-key.pem\n" +
        "certtool -q --generate-self-signed --load-privkey wrong-ca-key.pem --template ca.info --outfile "
        "wrongca/ca-cert.pem\n"
        "cp client/client-cert.pem client/client-key.pem wrongca/\n"
        "chmod 600 client/client-key.pem wrongca/client-key.pem\n" +
        "echo alice:" + kPskHex + " > psk/keys.psk\n" +
        "echo alice:" + kPskHex + " > client.psk && chmod 600 client.psk\n";
    CommandResult r = testing::Run(script);
    if (r.exit_code != 0) {
      ADD_FAILURE() << "certtool: " << r.output;
    }
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }

  void SetUp() override {
    BARGE_REQUIRE_TOOL("certtool");
    BARGE_REQUIRE_TOOL("qemu-nbd");
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    ASSERT_NE(pki_, nullptr);
    // An 8 MiB qcow2 disk with data in three places and a bitmap that
    // records what is written after the full backup.
    disk_ = dir_ / "disk.qcow2";
    testing::RunOk("qemu-img create -q -f qcow2 " + Q(disk_) + " 8M && qemu-io -f qcow2 -c 'write -P 0xab 0 1M' "
                   "-c 'write -P 0x17 3M 512k' -c 'write -P 0x42 7M 64k' " + Q(disk_) + " >/dev/null && "
                   "qemu-img bitmap --add --enable " + Q(disk_) + " cbt0");
  }

  std::string Pki(const std::string& name) const { return *pki_ / name; }

  // qemu-nbd serving `image` over TLS x509 (client certificates required)
  // or PSK, or in plaintext; read-only exports allow 4 clients (multi-conn).
  std::unique_ptr<TcpQemuNbd> Serve(const std::string& tls, const std::string& image,
                                    const std::string& extra = "-r --shared=4 -f qcow2 -B cbt0", int port = 0) {
    std::string creds;
    if (tls == "x509") {
      creds = "--object tls-creds-x509,id=t0,endpoint=server,dir=" + Pki("server") + ",verify-peer=on --tls-creds t0 ";
    } else if (tls == "psk") {
      creds = "--object tls-creds-psk,id=t0,endpoint=server,dir=" + Pki("psk") + " --tls-creds t0 ";
    }
    auto server = std::make_unique<TcpQemuNbd>(creds + extra + " " + Q(image), port);
    EXPECT_TRUE(server->WaitReady()) << "qemu-nbd " << tls << " " << image;
    return server;
  }

  // Every text barge wrote or printed must be free of the PSK, the URI's
  // tls-* parameters and the credential paths.
  static void ExpectNoSecret(const std::string& text, const std::string& what) {
    for (const std::string& secret : {std::string(kPskHex), std::string("tls-psk-file"),
                                      std::string("tls-certificates="), std::string("client.psk"),
                                      std::string("alice@")}) {
      EXPECT_FALSE(Has(text, secret)) << what << " holds " << secret << ":\n" << text;
    }
  }
  void ExpectNoSecretInFiles(const std::string& folder) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(folder)) {
      if (!e.is_regular_file()) continue;
      const std::string name = e.path().string();
      if (name.ends_with(".json") || name.ends_with(".txt") || name.ends_with(".record") ||
          name.find(".barge") != std::string::npos) {
        ExpectNoSecret(Slurp(name), name);
      }
    }
  }

  static TempDir* pki_;
  TempDir dir_;
  std::string disk_;
};

TempDir* NbdTlsTest::pki_ = nullptr;

TEST_F(NbdTlsTest, X509BackupIncrementalConvertVerifyReplicate) {
  const std::string target = dir_ / "backups";
  std::string full_out, inc_out;
  int port = 0;  // the same export again for the incremental: the chain's disk
  {
    auto server = Serve("x509", disk_);
    port = server->port();
    const std::string uri = "nbds://" + server->hostport() + "/?tls-certificates=" + Pki("client");
    CommandResult full = Sh(Barge("backup --source " + Q(uri) + " --target " + Q(target) + " --name vda --json"));
    ASSERT_EQ(full.exit_code, 0) << full.output;
    full_out = full.output;
    json r = testing::ResultOf(full.stdout_text);
    EXPECT_EQ(r.value("type", ""), "full");
    testing::RunOk("qemu-img compare -q -f qcow2 -F qcow2 " + Q(disk_) + " " + Q(r.value("image", "")));

    // The flags with a plain nbd:// URI: TLS all the same (the server has
    // no plaintext to offer), several connections.
    const std::string plain_uri = "nbd://" + server->hostport() + "/";
    CommandResult conv = Sh(Barge("convert " + Q(plain_uri) + " " + Q(dir_ / "conv.raw") +
                                  " --tls-certificates " + Q(Pki("client")) + " --nbd-connections 4 --json"));
    ASSERT_EQ(conv.exit_code, 0) << conv.output;
    EXPECT_EQ(testing::ResultOf(conv.stdout_text).value("source", ""), plain_uri);
    testing::RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(disk_) + " " + Q(dir_ / "conv.raw"));
    ExpectNoSecret(conv.output, "convert's output");

    std::filesystem::create_directory(dir_ / "copies");
    CommandResult repl = Sh(Barge("replicate " + Q(uri) + " --to " + Q(dir_ / "copies/a.raw") + " --json"));
    ASSERT_EQ(repl.exit_code, 0) << repl.output;
    testing::RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(disk_) + " " + Q(dir_ / "copies/a.raw"));
    ExpectNoSecret(repl.output, "replicate's output");
    ExpectNoSecretInFiles(dir_ / "copies");
  }
  // Guest writes while no one serves the disk: the bitmap records them.
  testing::RunOk("qemu-io -f qcow2 -c 'write -P 0x5a 5M 256k' " + Q(disk_) + " >/dev/null");
  {
    auto server = Serve("x509", disk_, "-r --shared=4 -f qcow2 -B cbt0", port);
    const std::string uri = "nbds://" + server->hostport() + "/?tls-certificates=" + Pki("client");
    CommandResult inc = Sh(Barge("backup --source " + Q(uri) + " --target " + Q(target) +
                                 " --name vda --incremental --dirty-bitmap cbt0 --json"));
    ASSERT_EQ(inc.exit_code, 0) << inc.output;
    inc_out = inc.output;
    json r = testing::ResultOf(inc.stdout_text);
    EXPECT_EQ(r.value("type", ""), "incremental");
    EXPECT_GE(r.value("dirty_bytes", uint64_t{0}), uint64_t{256 * 1024});
    EXPECT_LT(r.value("bytes_read", uint64_t{0}), uint64_t{2 << 20});

    CommandResult verify = Sh(Barge("verify " + Q(target + "/vda") + " --against " + Q(uri) + " --json"));
    EXPECT_EQ(verify.exit_code, 0) << verify.output;
    EXPECT_TRUE(testing::ResultOf(verify.stdout_text).value("against_source", false));
    ExpectNoSecret(verify.output, "verify's output");
  }
  testing::RunOk(Barge("restore " + Q(target + "/vda") + " --to " + Q(dir_ / "restored.raw")));
  testing::RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(disk_) + " " + Q(dir_ / "restored.raw"));
  ExpectNoSecret(full_out, "backup's output");
  ExpectNoSecret(inc_out, "incremental backup's output");
  ExpectNoSecretInFiles(target);
  // The manifest records the export without its parameters.
  for (const std::string& id : testing::PointIds(target + "/vda")) {
    json m = testing::ReadJson(testing::ManifestPath(target + "/vda", id));
    EXPECT_EQ(m["source"].value("name", ""), "nbds://127.0.0.1:" + std::to_string(port) + "/") << m.dump();
  }
}

TEST_F(NbdTlsTest, PskBackupAndRestoreToTlsExport) {
  auto server = Serve("psk", disk_);
  const std::string target = dir_ / "backups";
  // The identity as the URI's user part, the key file as a parameter.
  const std::string uri = "nbds://alice@" + server->hostport() + "/?tls-psk-file=" + Pki("client.psk");
  CommandResult full = Sh(Barge("backup --source " + Q(uri) + " --target " + Q(target) + " --name vda --json"));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  testing::RunOk("qemu-img compare -q -f qcow2 -F qcow2 " + Q(disk_) + " " +
                 Q(testing::ResultOf(full.stdout_text).value("image", "")));
  ExpectNoSecret(full.output, "backup's output");
  ExpectNoSecretInFiles(target);

  // restore --to a writable export over PSK, the flags' way (--force: an
  // export of a sparse raw file reports its holes as data).
  testing::RunOk("qemu-img create -q -f raw " + Q(dir_ / "target.raw") + " 8M");
  auto writable = Serve("psk", dir_ / "target.raw", "-f raw");
  CommandResult restore = Sh(Barge("restore " + Q(target + "/vda") + " --to " +
                                   Q("nbd://" + writable->hostport() + "/") + " --tls-psk-file " +
                                   Q(Pki("client.psk")) + " --tls-username alice --force --json"));
  ASSERT_EQ(restore.exit_code, 0) << restore.output;
  ExpectNoSecret(restore.output, "restore's output");
  writable.reset();
  testing::RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(disk_) + " " + Q(dir_ / "target.raw"));

  // No identity at all, where libnbd's fallback (the login name) is not
  // there (cron, systemd, this test): "getlogin_r: No such device or
  // address" became a sentence saying what to give.
  if (char login[256]; ::getlogin_r(login, sizeof login) != 0) {
    CommandResult anonymous = Sh(Barge("convert " + Q("nbds://" + server->hostport() + "/") + " " +
                                       Q(dir_ / "y.raw") + " --tls-psk-file " + Q(Pki("client.psk"))));
    EXPECT_EQ(anonymous.exit_code, 1) << anonymous.output;
    EXPECT_TRUE(Has(anonymous.stderr_text, "InvalidArgument")) << anonymous.stderr_text;
    EXPECT_TRUE(Has(anonymous.stderr_text, "a TLS PSK needs an identity: give --tls-username")) << anonymous.stderr_text;
    EXPECT_FALSE(Has(anonymous.stderr_text, "getlogin_r")) << anonymous.stderr_text;
    ExpectNoSecret(anonymous.output, "the refusal of a PSK without an identity");
  }

  // An identity the server knows no key for: the handshake fails.
  const std::string mallory = dir_ / "mallory.psk";
  WriteText(mallory, std::string("mallory:") + kPskHex + "\n");
  ::chmod(mallory.c_str(), 0600);
  CommandResult wrong = Sh(Barge("convert " + Q("nbds://mallory@" + server->hostport() + "/?tls-psk-file=" +
                                                mallory) + " " + Q(dir_ / "x.raw") + " --json"));
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
  EXPECT_TRUE(Has(wrong.stderr_text, "TLS handshake with the NBD server at " + server->hostport()))
      << wrong.stderr_text;
  // Which of the two the server cannot say; the error names both, and
  // neither the identity nor the file.
  const std::string refused = "the server refused the PSK identity or its key (a key that differs from the "
                              "server's, or a user it does not know)";
  EXPECT_TRUE(Has(wrong.stderr_text, refused)) << wrong.stderr_text;
  EXPECT_FALSE(Has(wrong.output, kPskHex)) << wrong.output;
  EXPECT_FALSE(Has(wrong.output, "mallory")) << wrong.output;
  EXPECT_FALSE(Has(wrong.output, "mallory.psk")) << wrong.output;

  // The identity the server knows with another key: the same words.
  const std::string other_key = dir_ / "other-key.psk";
  WriteText(other_key, "alice:00112233445566778899aabbccddeeff0011223344556677\n");
  ::chmod(other_key.c_str(), 0600);
  CommandResult bad_key = Sh(Barge("convert " + Q("nbd://" + server->hostport() + "/") + " " +
                                   Q(dir_ / "y.raw") + " --tls-psk-file " + Q(other_key) +
                                   " --tls-username alice --json"));
  EXPECT_EQ(bad_key.exit_code, 1) << bad_key.output;
  EXPECT_TRUE(Has(bad_key.stderr_text, "TLS handshake with the NBD server at " + server->hostport() + " failed: " +
                                           refused))
      << bad_key.stderr_text;
  EXPECT_FALSE(Has(bad_key.output, "00112233445566778899")) << bad_key.output;
  EXPECT_FALSE(Has(bad_key.output, "other-key.psk")) << bad_key.output;
  EXPECT_FALSE(Has(bad_key.output, "alice")) << bad_key.output;

  // A client with certificates only: the server ends the handshake, and
  // the error says what it may have wanted instead.
  CommandResult x509 = Sh(Barge("convert " + Q("nbds://" + server->hostport() + "/") + " " + Q(dir_ / "z.raw") +
                                " --tls-certificates " + Q(Pki("client"))));
  EXPECT_EQ(x509.exit_code, 1) << x509.output;
  EXPECT_TRUE(Has(x509.stderr_text, "the server ended the handshake: it may expect PSK, or a client certificate"))
      << x509.stderr_text;
}

TEST_F(NbdTlsTest, PlaintextServerRefusedWhenTlsRequested) {
  auto server = Serve("", disk_);
  // The same server in plaintext works without TLS...
  testing::RunOk(Barge("convert " + Q("nbd://" + server->hostport() + "/") + " " + Q(dir_ / "plain.raw")));
  // ...and is refused with nbds://, or with a flag on nbd://.
  for (const std::string& args :
       {"convert " + Q("nbds://" + server->hostport() + "/?tls-certificates=" + Pki("client")) + " " +
            Q(dir_ / "a.raw"),
        "convert " + Q("nbd://" + server->hostport() + "/") + " " + Q(dir_ / "b.raw") + " --tls-psk-file " +
            Q(Pki("client.psk")),
        "backup --source " + Q("nbd://" + server->hostport() + "/") + " --target " + Q(dir_ / "t") +
            " --tls-certificates " + Q(Pki("client"))}) {
    CommandResult r = Sh(Barge(args));
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_TRUE(Has(r.stderr_text, "does not offer TLS")) << r.stderr_text;
    EXPECT_TRUE(Has(r.stderr_text, server->hostport())) << r.stderr_text;
    EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
    ExpectNoSecret(r.stderr_text, "the refusal");
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "a.raw"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "b.raw"));
}

// replicate to a writable export over TLS (x509, client certificates),
// beside a file (--force: qemu-nbd reports a sparse raw file's holes as
// data): the export holds the source's bytes, re-read over TLS
// with --verify; its record and journal live in --state-dir without the
// URI's secrets. A plaintext export is refused when TLS is asked for, a
// qcow2 copy or an export smaller than the source is refused naming it.
TEST_F(NbdTlsTest, ReplicateToTlsExport) {
  testing::RunOk("qemu-img create -q -f raw " + Q(dir_ / "target.raw") + " 16M");
  auto writable = Serve("x509", dir_ / "target.raw", "-f raw");
  const std::string uri = "nbds://" + writable->hostport() + "/?tls-certificates=" + Pki("client");
  const std::string state = dir_ / "state";
  std::filesystem::create_directory(dir_ / "copies");
  const std::string file_copy = dir_ / "copies/a.raw";

  // The source is qcow2: --format keep would make qcow2 copies.
  CommandResult keep = Sh(Barge("replicate " + Q(disk_) + " --to " + Q(uri) + " --state-dir " + Q(state)));
  EXPECT_EQ(keep.exit_code, 1) << keep.output;
  EXPECT_TRUE(Has(keep.stderr_text, "use --format raw")) << keep.stderr_text;
  EXPECT_TRUE(Has(keep.stderr_text, "nbds://" + writable->hostport() + "/")) << keep.stderr_text;
  ExpectNoSecret(keep.output, "the refusal of qcow2");

  CommandResult repl = Sh(Barge("replicate " + Q(disk_) + " --to " + Q(file_copy) + " --to " + Q(uri) +
                                " --format raw --verify --force --state-dir " + Q(state) + " --json"));
  ASSERT_EQ(repl.exit_code, 0) << repl.output;
  json r = testing::ResultOf(repl.stdout_text);
  ASSERT_EQ(r["destinations"].size(), 2u);
  EXPECT_EQ(r["destinations"][1]["path"], "nbds://" + writable->hostport() + "/");
  EXPECT_EQ(r["destinations"][1]["state"], "ready");
  EXPECT_TRUE(r["destinations"][1]["verified"].get<bool>());
  EXPECT_EQ(r["destinations"][1]["file_bytes"], 16u << 20);
  ExpectNoSecret(repl.output, "replicate's output");
  ExpectNoSecretInFiles(state);
  ExpectNoSecretInFiles(dir_ / "copies");
  writable.reset();
  // The export's first 8 MiB are the disk; the rest stays as it was (zeros).
  testing::RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(disk_) + " " + Q(dir_ / "target.raw"));
  testing::RunOk("cmp -n 8388608 " + Q(file_copy) + " " + Q(dir_ / "target.raw"));

  // The same export in plaintext: refused when TLS is asked for.
  auto plain = Serve("", dir_ / "target.raw", "-f raw");
  CommandResult refused = Sh(Barge("replicate " + Q(disk_) + " --to " + Q("nbd://" + plain->hostport() + "/") +
                                   " --format raw --force --state-dir " + Q(state) + " --tls-certificates " +
                                   Q(Pki("client"))));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(Has(refused.stderr_text, "does not offer TLS")) << refused.stderr_text;
  EXPECT_TRUE(Has(refused.stderr_text, plain->hostport())) << refused.stderr_text;
  plain.reset();

  // An export smaller than the disk.
  testing::RunOk("qemu-img create -q -f raw " + Q(dir_ / "small.raw") + " 4M");
  auto small = Serve("x509", dir_ / "small.raw", "-f raw");
  CommandResult too_small =
      Sh(Barge("replicate " + Q(disk_) + " --to " +
               Q("nbds://" + small->hostport() + "/?tls-certificates=" + Pki("client")) + " --format raw --force --state-dir " +
               Q(state)));
  EXPECT_EQ(too_small.exit_code, 1) << too_small.output;
  EXPECT_TRUE(Has(too_small.stderr_text, "NoSpace")) << too_small.stderr_text;
  EXPECT_TRUE(Has(too_small.stderr_text, "nbds://" + small->hostport() + "/")) << too_small.stderr_text;
  ExpectNoSecret(too_small.output, "the refusal of a small export");
}

TEST_F(NbdTlsTest, WrongCaRefused) {
  auto server = Serve("x509", disk_);
  CommandResult r = Sh(Barge("convert " + Q("nbds://" + server->hostport() + "/") + " " + Q(dir_ / "a.raw") +
                             " --tls-certificates " + Q(Pki("wrongca")) + " --json"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // libnbd says only "Error in the certificate verification"; the error
  // names the cause, and the folder without its path.
  EXPECT_TRUE(Has(r.stderr_text, "TLS handshake with the NBD server at " + server->hostport() +
                                     " failed: the server's certificate is not signed by the CA of the "
                                     "certificates folder (its ca-cert.pem) (")) << r.stderr_text;
  EXPECT_FALSE(Has(r.stderr_text, Pki("wrongca"))) << r.stderr_text;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "a.raw"));

  // A PSK offered to a server with certificates only: GnuTLS's
  // "Insufficient credentials for that request" said nothing of why.
  CommandResult psk = Sh(Barge("convert " + Q("nbds://alice@" + server->hostport() + "/") + " " +
                               Q(dir_ / "b.raw") + " --tls-psk-file " + Q(Pki("client.psk"))));
  EXPECT_EQ(psk.exit_code, 1) << psk.output;
  EXPECT_TRUE(Has(psk.stderr_text, "the server does not take a PSK: it may expect x509 certificates"))
      << psk.stderr_text;
  ExpectNoSecret(psk.output, "a PSK offered to an x509 server");
}

// A server certificate for another host, and one that expired, are
// refused, each naming its cause (issue 36: libnbd reports them alike).
TEST_F(NbdTlsTest, RefusedServerCertificateNamesItsCause) {
  {
    TcpQemuNbd server("--object tls-creds-x509,id=t0,endpoint=server,dir=" + Pki("otherhost") +
                      " --tls-creds t0 -r -f qcow2 " + Q(disk_));
    ASSERT_TRUE(server.WaitReady());
    CommandResult r = Sh(Barge("convert " + Q("nbds://" + server.hostport() + "/") + " " + Q(dir_ / "a.raw") +
                               " --tls-certificates " + Q(Pki("client"))));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Has(r.stderr_text, "TLS handshake with the NBD server at " + server.hostport() +
                                       " failed: the server's certificate names elsewhere.example, not 127.0.0.1"))
        << r.stderr_text;
  }
  // qemu-nbd refuses to serve an expired certificate; nbdkit serves it.
  if (!testing::HaveTool("nbdkit")) GTEST_SKIP() << "nbdkit not installed";
  auto server = TcpQemuNbd::Nbdkit("--tls=require --tls-certificates=" + Pki("expired") + " memory 8M");
  ASSERT_TRUE(server->WaitReady());
  CommandResult r = Sh(Barge("convert " + Q("nbds://" + server->hostport() + "/?tls-certificates=" + Pki("client")) +
                             " " + Q(dir_ / "b.raw") + " --json"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "TLS handshake with the NBD server at " + server->hostport() +
                                     " failed: the server's certificate expired on 2021-01-01 00:00:00 UTC"))
      << r.stderr_text;
  ExpectNoSecret(r.output, "the refusal of an expired certificate");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "b.raw"));
}

TEST_F(NbdTlsTest, LooseOrMissingCredentialFilesRefused) {
  // Refused before any connection: no server is needed.
  const std::string loose_psk = dir_ / "loose.psk";
  WriteText(loose_psk, std::string("alice:") + kPskHex + "\n");
  ::chmod(loose_psk.c_str(), 0644);
  CommandResult r = Sh(Barge("convert nbd://127.0.0.1:9/ " + Q(dir_ / "a.raw") + " --tls-psk-file " +
                             Q(loose_psk) + " --json"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "permissions 0644 for TLS PSK file '" + loose_psk + "' are too open"))
      << r.stderr_text;
  EXPECT_EQ(testing::ErrorOf(r.stdout_text).value("file", ""), loose_psk);
  EXPECT_FALSE(Has(r.output, kPskHex));

  // A client key others may read, in a copy of the client folder.
  const std::string certs = dir_ / "certs";
  std::filesystem::copy(Pki("client"), certs);
  ::chmod((certs + "/client-key.pem").c_str(), 0640);
  r = Sh(Barge("backup --source " + Q("nbds://127.0.0.1:9/?tls-certificates=" + certs) + " --target " +
               Q(dir_ / "t")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "permissions 0640 for TLS client key")) << r.stderr_text;

  r = Sh(Barge("convert nbds://127.0.0.1:9/ " + Q(dir_ / "a.raw") + " --tls-psk-file " + Q(dir_ / "missing.psk")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "NotFound")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, dir_ / "missing.psk")) << r.stderr_text;
  r = Sh(Barge("convert nbds://127.0.0.1:9/ " + Q(dir_ / "a.raw") + " --tls-certificates " + Q(dir_ / "nocerts")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "TLS certificates folder not found")) << r.stderr_text;
}

TEST_F(NbdTlsTest, SeveralConnectionsOverTlsReadTheSameBytes) {
  auto server = Serve("x509", disk_);
  const std::string uri = "nbds://" + server->hostport() + "/?tls-certificates=" + Pki("client");
  // The library opens 4 TLS connections to this multi-conn export.
  pipeline::NbdAccess access;
  access.connections = 4;
  auto options = pipeline::NbdOptionsFor(Env::Default(), uri, access);
  ASSERT_TRUE(options.ok()) << options.error().ToString();
  auto source = OpenNbd(uri, *options);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  EXPECT_EQ((*source)->connections(), 4u);
  EXPECT_EQ((*source)->name(), "nbds://" + server->hostport() + "/");
  // Over TLS as in plaintext: 256 KiB requests (1 MiB cost the server
  // twice the CPU; docs/benchmarks.md), 2 callers per connection sharing
  // its queue.
  EXPECT_EQ((*source)->capabilities().preferred_request_bytes, 256u << 10);
  EXPECT_EQ((*source)->capabilities().blocking_read_streams, 8u);
  source->reset();
  {
    // The same export in plaintext: nbdcopy's 256 KiB too.
    auto plain_server = Serve("", disk_);
    const std::string plain_uri = "nbd://" + plain_server->hostport() + "/";
    auto plain_options = pipeline::NbdOptionsFor(Env::Default(), plain_uri, access);
    ASSERT_TRUE(plain_options.ok()) << plain_options.error().ToString();
    auto plain = OpenNbd(plain_uri, *plain_options);
    ASSERT_TRUE(plain.ok()) << plain.error().ToString();
    EXPECT_EQ((*plain)->capabilities().preferred_request_bytes, 256u << 10);
  }
  // And the command reads the same with 1 and with 4.
  std::string digests[2];
  for (int i = 0; i < 2; ++i) {
    const std::string n = i == 0 ? "1" : "4";
    json r = testing::RunResult(Barge("convert " + Q(uri) + " " + Q(dir_ / ("c" + n + ".raw")) +
                                      " --nbd-connections " + n + " --json"));
    digests[i] = r.value("image_digest", "");
  }
  EXPECT_FALSE(digests[0].empty());
  EXPECT_EQ(digests[0], digests[1]);
  testing::RunOk("cmp " + Q(dir_ / "c1.raw") + " " + Q(dir_ / "c4.raw"));
}

TEST_F(NbdTlsTest, AutomaticConnectionsOverTlsFollowTheCores) {
  auto server = Serve("x509", disk_);
  auto plain_server = Serve("", disk_);
  const std::string uri = "nbds://" + server->hostport() + "/?tls-certificates=" + Pki("client");
  const std::string plain_uri = "nbd://" + plain_server->hostport() + "/";
  // The connections a source opens with the flags' count `connections`,
  // assuming `cores` cores.
  auto opened = [&](const std::string& u, uint32_t connections, uint32_t cores) -> uint32_t {
    pipeline::NbdAccess access;
    access.connections = connections;
    auto options = pipeline::NbdOptionsFor(Env::Default(), u, access);
    EXPECT_TRUE(options.ok()) << options.error().ToString();
    if (!options.ok()) return 0;
    options->cores = cores;
    auto source = OpenNbd(u, *options);
    EXPECT_TRUE(source.ok()) << source.error().ToString();
    return source.ok() ? (*source)->connections() : 0;
  };
  EXPECT_EQ(pipeline::NbdAccess().connections, 0u);  // automatic unless a count is given
  // Over TLS: one per core, at most 4.
  EXPECT_EQ(opened(uri, 0, 1), 1u);
  EXPECT_EQ(opened(uri, 0, 2), 2u);
  EXPECT_EQ(opened(uri, 0, 3), 3u);
  EXPECT_EQ(opened(uri, 0, 16), 4u);
  // A count given is used as is, and plaintext keeps 4 whatever the cores.
  EXPECT_EQ(opened(uri, 4, 2), 4u);
  EXPECT_EQ(opened(plain_uri, 0, 2), 4u);
  EXPECT_EQ(opened(plain_uri, 0, 1), 4u);
  // The flag takes 0 (automatic) and refuses what is out of range.
  testing::RunOk(Barge("convert " + Q(uri) + " " + Q(dir_ / "auto.raw") + " --nbd-connections 0"));
  testing::RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(disk_) + " " + Q(dir_ / "auto.raw"));
  auto r = Sh(Barge("convert " + Q(uri) + " " + Q(dir_ / "bad.raw") + " --nbd-connections 65"));
  EXPECT_NE(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace barge
