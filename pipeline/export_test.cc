// Which nbdkit versions get --threads=1 (NbdkitAbortsOnHangup).
#include "pipeline/export.h"

#include <gtest/gtest.h>

namespace barge::pipeline {
namespace {

TEST(NbdkitAbortsOnHangupTest, EveryVersionBeforeTheUpstreamFix) {
  EXPECT_TRUE(NbdkitAbortsOnHangup("nbdkit 1.32.5\n"));  // Debian 12
  EXPECT_TRUE(NbdkitAbortsOnHangup("nbdkit 1.32.4\n"));
  EXPECT_TRUE(NbdkitAbortsOnHangup("nbdkit 1.30.10\n"));
  EXPECT_TRUE(NbdkitAbortsOnHangup("nbdkit 1.33.9\n"));
  EXPECT_TRUE(NbdkitAbortsOnHangup("nbdkit 0.9.0\n"));
  EXPECT_FALSE(NbdkitAbortsOnHangup("nbdkit 1.33.10\n"));
  EXPECT_FALSE(NbdkitAbortsOnHangup("nbdkit 1.34.0\n"));
  EXPECT_FALSE(NbdkitAbortsOnHangup("nbdkit 1.36.1 (nbdkit-1.36.1-1.fc39)\n"));
  EXPECT_FALSE(NbdkitAbortsOnHangup("nbdkit 2.0.0\n"));
}

TEST(NbdkitAbortsOnHangupTest, TextWithoutAVersionCountsAsAffected) {
  EXPECT_TRUE(NbdkitAbortsOnHangup(""));
  EXPECT_TRUE(NbdkitAbortsOnHangup("nbdkit\n"));
  EXPECT_TRUE(NbdkitAbortsOnHangup("nbdkit unknown\n"));
  EXPECT_TRUE(NbdkitAbortsOnHangup("something else 1.40.0\n"));
}

}  // namespace
}  // namespace barge::pipeline
