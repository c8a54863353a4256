// sd_notify without libsystemd: messages reach a datagram socket named by
// a path or an @abstract name; without NOTIFY_SOCKET nothing is sent.
#include "cli/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "tests/testing/testing.h"

namespace barge::cli {
namespace {

// A bound datagram socket; Receive() returns one message or "".
class Receiver {
 public:
  // `name`: a path, or "@name" (abstract).
  explicit Receiver(const std::string& name) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, name.data(), name.size());
    if (name[0] == '@') addr.sun_path[0] = '\0';
    timeval tv{2, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr),
                    static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) == 0;
  }
  ~Receiver() { ::close(fd_); }
  bool bound() const { return bound_; }
  std::string Receive() {
    char buf[1024];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

 private:
  int fd_ = -1;
  bool bound_ = false;
};

// Sets NOTIFY_SOCKET for the scope.
class ScopedNotifySocket {
 public:
  explicit ScopedNotifySocket(const char* value) {
    if (value) ::setenv("NOTIFY_SOCKET", value, 1);
    else ::unsetenv("NOTIFY_SOCKET");
  }
  ~ScopedNotifySocket() { ::unsetenv("NOTIFY_SOCKET"); }
};

TEST(SdNotifyTest, PathAndAbstractSockets) {
  barge::testing::TempDir dir;
  const std::string path = dir / "notify";
  Receiver by_path(path);
  ASSERT_TRUE(by_path.bound());
  {
    ScopedNotifySocket env(path.c_str());
    ASSERT_TRUE(SdNotify("READY=1\nSTATUS=serving").ok());
    EXPECT_EQ(by_path.Receive(), "READY=1\nSTATUS=serving");
    ASSERT_TRUE(SdNotify(SdReloadingMessage()).ok());
    EXPECT_EQ(by_path.Receive().rfind("RELOADING=1\nMONOTONIC_USEC=", 0), 0u);
  }
  const std::string abstract = "@barge-sd-notify-test-" + std::to_string(::getpid());
  Receiver by_name(abstract);
  ASSERT_TRUE(by_name.bound());
  {
    ScopedNotifySocket env(abstract.c_str());
    ASSERT_TRUE(SdNotify("STOPPING=1").ok());
    EXPECT_EQ(by_name.Receive(), "STOPPING=1");
  }
}

TEST(SdNotifyTest, WithoutTheVariableNothingIsSentAndBadValuesAreErrors) {
  {
    ScopedNotifySocket env(nullptr);
    EXPECT_TRUE(SdNotify("READY=1").ok());
  }
  {
    ScopedNotifySocket env("relative/path");
    EXPECT_EQ(SdNotify("READY=1").error().code(), ErrorCode::kInvalidArgument);
  }
  {
    ScopedNotifySocket env("/nonexistent-barge-dir/notify");
    auto s = SdNotify("READY=1");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().ToString().find("/nonexistent-barge-dir/notify"), std::string::npos) << s.error().ToString();
  }
}

}  // namespace
}  // namespace barge::cli
