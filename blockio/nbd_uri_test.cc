// RedactUri, RedactUrisIn and WithoutNbdSecrets: the one redaction every
// shown location and message goes through (issue 35).
#include <gtest/gtest.h>

#include "blockio/nbd.h"

namespace barge {
namespace {

TEST(RedactUriTest, NbdLosesItsUserPartAndTlsParameters) {
  EXPECT_EQ(RedactUri("nbds://user:secret@host:10810/vda?tls-psk-file=/etc/k.psk"), "nbds://host:10810/vda");
  EXPECT_EQ(RedactUri("nbds+unix:///vda?tls-username=u&socket=/run/s.sock&tls-certificates=/p"),
            "nbds+unix:///vda?socket=/run/s.sock");
  EXPECT_EQ(RedactNbdUri("nbd://host/vda"), "nbd://host/vda");
}

TEST(RedactUriTest, OtherUrisKeepTheirUserAndLoseThePasswordAndKeyFiles) {
  EXPECT_EQ(RedactUri("qemu+ssh://root:hunter2@host:2222/system?keyfile=/root/.ssh/id&no_verify=1"),
            "qemu+ssh://root@host:2222/system?no_verify=1");
  EXPECT_EQ(RedactUri("qemu+tls://h/system?pkipath=/etc/pki/x"), "qemu+tls://h/system");
  EXPECT_EQ(RedactUri("https://u:p@example.com/disk.img?token=abc&x=1"), "https://u@example.com/disk.img?x=1");
  // Not a URI: unchanged.
  EXPECT_EQ(RedactUri("/var/lib/disk.raw"), "/var/lib/disk.raw");
  EXPECT_EQ(RedactUri("user:pw@host"), "user:pw@host");
}

TEST(RedactUriTest, UrisInsideMessagesAreRedacted) {
  EXPECT_EQ(RedactUrisIn("cannot open 'nbds://alice:pw@h/x?tls-psk-file=/k' (nbd://b/y): refused"),
            "cannot open 'nbds://h/x' (nbd://b/y): refused");
  EXPECT_EQ(RedactUrisIn("connect to qemu+ssh://root:pw@h/system failed"), "connect to qemu+ssh://root@h/system failed");
  EXPECT_EQ(RedactUrisIn("no uri here: a://"), "no uri here: a://");
  EXPECT_EQ(RedactUrisIn("plain"), "plain");
}

TEST(WithoutNbdSecretsTest, LibnbdsPskMessageLosesThePathAndIdentity) {
  const std::string uri = "nbds+unix://bob:hunter2@/?socket=/run/s&tls-psk-file=/srv/keys/client.psk";
  Error e = Error::IoError("nbd_connect_uri: /srv/keys/client.psk: username bob was not found in PSK file: x");
  e.set_errno(5).set_path(uri).set_range(0, 512);
  Error out = WithoutNbdSecrets(e, uri, NbdTls{});
  EXPECT_EQ(out.message(),
            "nbd_connect_uri: <tls-psk-file>: username <tls-username> was not found in PSK file: x");
  EXPECT_EQ(out.path(), "nbds+unix:///?socket=/run/s");
  EXPECT_EQ(out.code(), ErrorCode::kIoError);
  EXPECT_EQ(out.errno_value(), 5);
  EXPECT_EQ(out.length(), std::optional<uint64_t>(512));
  // A name inside a longer word stays ("bob" in "bobcat").
  NbdTls tls;
  tls.psk_file = "/etc/barge/k.psk";
  tls.username = "bob";
  Error flags = WithoutNbdSecrets(Error::IoError("bobcat: /etc/barge/k.psk: username bob"), "nbds://h/", tls);
  EXPECT_EQ(flags.message(), "bobcat: <tls-psk-file>: username <tls-username>");
}

}  // namespace
}  // namespace barge
