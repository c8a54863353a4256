// Typo suggestions: within 2 edits and shorter than the word, else none.
#include "orchestrate/base/closest_match.h"

#include <gtest/gtest.h>

namespace barge::orchestrate {
namespace {

TEST(ClosestMatchTest, SuggestsAWordWithinTwoEdits) {
  EXPECT_EQ(ClosestMatch("restor", {"backup", "restore", "list"}), "restore");
  EXPECT_EQ(ClosestMatch("lsit", {"backup", "restore", "list"}), "list");
}

TEST(ClosestMatchTest, NothingForFarOrTinyWords) {
  EXPECT_EQ(ClosestMatch("zzzzzz", {"backup", "restore"}), "");
  EXPECT_EQ(ClosestMatch("ab", {"xy"}), "");  // 2 edits of a 2-letter word: not a typo
  EXPECT_EQ(ClosestMatch("word", {}), "");
}

TEST(ClosestMatchTest, TheFirstOfEquallyCloseOnes) {
  EXPECT_EQ(ClosestMatch("cat", {"bat", "hat"}), "bat");
}

}  // namespace
}  // namespace barge::orchestrate
