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
      "ssh", "-N", "-n", "-T", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes", "-p", "2200", "-i", "/k/id",
      "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-L", "/l/nbd.sock:/tmp/r.sock",
      "root@10.0.0.5"};
  EXPECT_EQ(SshForwardCommand(*u, "/l/nbd.sock", "/tmp/r.sock"), want);
}

TEST(SshForwardCommandTest, VerifiesHostKeysUnlessAskedNotTo) {
  auto u = ParseLibvirtUri("qemu+ssh://h/system?known_hosts=/kh&command=/opt/ssh");
  ASSERT_TRUE(u.ok());
  const std::vector<std::string> want = {
      "/opt/ssh", "-N", "-n", "-T", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
      "-o", "UserKnownHostsFile=/kh", "-L", "/l:/r", "h"};
  EXPECT_EQ(SshForwardCommand(*u, "/l", "/r"), want);
}

}  // namespace
}  // namespace barge::orchestrate
