// NBD port leases: ranges, one lease per port across leases and processes,
// ports skipped, a used-up range, and a lease freed by its holder's death.
#include "orchestrate/libvirt/nbd_ports.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

TEST(NbdPortsTest, ParsesRanges) {
  auto r = ParsePortRange("10809-10872");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->low, 10809);
  EXPECT_EQ(r->high, 10872);
  EXPECT_EQ(r->size(), 64);
  EXPECT_EQ(r->ToString(), kDefaultNbdPortRange);
  auto one = ParsePortRange("2000");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1);
  auto def = ParsePortRange(kDefaultNbdPortRange);
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->low, PortRange().low);
  EXPECT_EQ(def->high, PortRange().high);
  for (const char* bad : {"", "-", "10-", "x-20", "20-10", "0-10", "1-65536", "1-2-3", " 5-6"}) {
    auto b = ParsePortRange(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.error().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

TEST(NbdPortsTest, LeasesDistinctPortsUntilTheRangeIsUsedUp) {
  testing::TempDir dir;
  const std::string locks = dir / "locks";  // made by the first lease
  const PortRange range{20000, 20002};
  auto a = LeaseNbdPort(Env::Default(), locks, "10.0.0.2", range);
  auto b = LeaseNbdPort(Env::Default(), locks, "10.0.0.2", range);
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  ASSERT_TRUE(b.ok()) << b.error().ToString();
  EXPECT_EQ((*a)->port(), 20000);
  EXPECT_EQ((*b)->port(), 20001);
  // Another host's ports are its own.
  auto other = LeaseNbdPort(Env::Default(), locks, "10.0.0.3", range);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->port(), 20000);
  // 20002 is in use on the host by something else: nothing left.
  auto none = LeaseNbdPort(Env::Default(), locks, "10.0.0.2", range, {20002});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::kBusy);
  EXPECT_NE(none.error().message().find("20000-20002"), std::string::npos) << none.error().message();
  EXPECT_NE(none.error().message().find("2 held by other backups, 1 in use on the host"), std::string::npos)
      << none.error().message();
  // A lease given back is free again.
  a->reset();
  auto again = LeaseNbdPort(Env::Default(), locks, "10.0.0.2", range, {20002});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->port(), 20000);
  EXPECT_EQ((*again)->lock_path(), NbdPortLockPath(locks, "10.0.0.2", 20000));
}

// Another process's lease counts, and its death (SIGKILL: no destructor
// runs) frees the port.
TEST(NbdPortsTest, AKilledHoldersPortIsFree) {
  testing::TempDir dir;
  const std::string locks = dir / "locks";
  const PortRange range{20100, 20100};
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lease = LeaseNbdPort(Env::Default(), locks, "h", range);
    char c = lease.ok() ? '1' : '0';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  EXPECT_EQ(c, '1');
  auto busy = LeaseNbdPort(Env::Default(), locks, "h", range);
  EXPECT_FALSE(busy.ok());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  auto free_now = LeaseNbdPort(Env::Default(), locks, "h", range);
  ASSERT_TRUE(free_now.ok()) << free_now.error().ToString();
  EXPECT_EQ((*free_now)->port(), 20100);
}

TEST(NbdPortsTest, RecognisesQemusAddressInUse) {
  EXPECT_TRUE(IsAddressInUse("internal error: unable to execute QEMU command 'nbd-server-start': Failed to find an "
                             "available port: Address already in use"));
  EXPECT_FALSE(IsAddressInUse("checkpoint inconsistent for disk 'vda'"));
}

}  // namespace
}  // namespace barge::orchestrate
