// libvirt URIs: parsing, redaction, host keys, and the ssh forward's command line.
#include "orchestrate/libvirt/libvirt_uri.h"

#include <gtest/gtest.h>

#include "orchestrate/libvirt/ssh_forward.h"

namespace barge::orchestrate {
namespace {

TEST(LibvirtUriTest, LocalUriHasNoHost) {
  auto u = ParseLibvirtUri("qemu:///system");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->driver, "qemu");
  EXPECT_EQ(u->transport, "");
  EXPECT_FALSE(u->remote());
  EXPECT_EQ(u->path, "/system");
  EXPECT_EQ(u->HostKey(), "");
  EXPECT_EQ(u->Redacted(), "qemu:///system");
}

TEST(LibvirtUriTest, SshUriWithEverything) {
  auto u = ParseLibvirtUri("qemu+ssh://root:s3cret@Host.example:2222/system?keyfile=/k/id%20a&no_verify=1&socket=/s");
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->ssh());
  EXPECT_TRUE(u->remote());
  EXPECT_EQ(u->user, "root");
  EXPECT_EQ(u->password, "s3cret");
  EXPECT_EQ(u->host, "Host.example");
  EXPECT_EQ(u->port, 2222);
  EXPECT_EQ(u->Param("keyfile"), "/k/id a");
  EXPECT_EQ(u->Param("no_verify"), "1");
  EXPECT_EQ(u->Param("socket"), "/s");
  EXPECT_EQ(u->Param("absent"), "");
  EXPECT_EQ(u->HostKey(), "host.example");
  const std::string redacted = u->Redacted();
  EXPECT_EQ(redacted.find("s3cret"), std::string::npos) << redacted;
  EXPECT_NE(redacted.find("root@Host.example:2222/system"), std::string::npos) << redacted;
}

TEST(LibvirtUriTest, HostKeyIgnoresUserAndParams) {
  EXPECT_EQ(LibvirtHostKey("qemu+ssh://a@h1/system?keyfile=x"), LibvirtHostKey("qemu+ssh://b@h1/system"));
  EXPECT_NE(LibvirtHostKey("qemu+ssh://h1/system"), LibvirtHostKey("qemu+ssh://h2/system"));
  EXPECT_EQ(LibvirtHostKey("qemu+tls://[::1]:16514/system"), "::1");
}

// Issue 36 §8: switching a hypervisor's transport (ssh to tls) or its port
// cost a full backup, the tracker's host key having changed with the port.
TEST(LibvirtUriTest, HostKeyIgnoresTransportAndPort) {
  EXPECT_EQ(LibvirtHostKey("qemu+ssh://h1/system"), "h1");
  EXPECT_EQ(LibvirtHostKey("qemu+ssh://root@H1:2222/system"), LibvirtHostKey("qemu+tls://h1:16514/system"));
  EXPECT_EQ(LibvirtHostKey("qemu+ssh://h1:22/system"), LibvirtHostKey("qemu+ssh://h1:2222/system"));
  EXPECT_EQ(LibvirtHostKey("qemu+tcp://h1/system"), LibvirtHostKey("qemu+tls://h1/system"));
  EXPECT_NE(LibvirtHostKey("qemu+tls://h1:16514/system"), LibvirtHostKey("qemu+tls://h2:16514/system"));
  EXPECT_EQ(LibvirtHostKey("qemu:///system"), "");
}

TEST(LibvirtUriTest, BadUrisAreRefusedWithoutTheirPassword) {
  EXPECT_FALSE(ParseLibvirtUri("system").ok());
  auto bad_port = ParseLibvirtUri("qemu+ssh://u:pw@h:99999/system");
  ASSERT_FALSE(bad_port.ok());
  EXPECT_EQ(bad_port.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad_port.error().message().find("pw@"), std::string::npos) << bad_port.error().message();
  EXPECT_EQ(RedactLibvirtUri("qemu+ssh://u:pw@h:x/system"), "qemu+ssh://...");
  EXPECT_EQ(RedactLibvirtUri("qemu+ssh://u:pw@h/system"), "qemu+ssh://u@h/system");
}

TEST(SshForwardCommandTest, CarriesTheUrisSshSettings) {
  auto u = ParseLibvirtUri("qemu+ssh://root@10.0.0.5:2200/system?keyfile=/k/id&no_verify=1");
  ASSERT_TRUE(u.ok());
  const std::vector<std::string> want = {
      "ssh", "-N", "-n", "-T", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
      "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3", "-p", "2200", "-i", "/k/id",
      "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-L", "/l/nbd.sock:/tmp/r.sock",
      "root@10.0.0.5"};
  EXPECT_EQ(SshForwardCommand(*u, "/l/nbd.sock", "/tmp/r.sock"), want);
}

TEST(SshForwardCommandTest, VerifiesHostKeysUnlessAskedNotTo) {
  auto u = ParseLibvirtUri("qemu+ssh://h/system?known_hosts=/kh&command=/opt/ssh");
  ASSERT_TRUE(u.ok());
  const std::vector<std::string> want = {
      "/opt/ssh", "-N", "-n", "-T", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
      "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
      "-o", "UserKnownHostsFile=/kh", "-L", "/l:/r", "h"};
  EXPECT_EQ(SshForwardCommand(*u, "/l", "/r"), want);
}

// Issue 36 §9: libvirt's ssh transport does not read known_hosts= (only
// its libssh/libssh2 transports do): a run says that the file is barge's
// forward's alone, where it applies.
TEST(SshForwardCommandTest, Issue36KnownHostsIsNamedAsTheForwardsOnly) {
  auto note = [](const std::string& uri) {
    auto u = ParseLibvirtUri(uri);
    EXPECT_TRUE(u.ok()) << uri;
    return u.ok() ? KnownHostsNote(*u) : std::string("?");
  };
  const std::string said = note("qemu+ssh://h/system?known_hosts=/kh");
  EXPECT_NE(said.find("known_hosts= is read by barge's ssh forward of the NBD socket only"), std::string::npos) << said;
  EXPECT_NE(said.find("~/.ssh/known_hosts"), std::string::npos) << said;
  EXPECT_EQ(note("qemu+ssh://h/system"), "");
  EXPECT_EQ(note("qemu+ssh://h/system?known_hosts=/kh&no_verify=1"), "");  // no file is read at all
  EXPECT_EQ(note("qemu+libssh://h/system?known_hosts=/kh"), "");           // libvirt reads it there
  EXPECT_EQ(note("qemu:///system"), "");
}

}  // namespace
}  // namespace barge::orchestrate
