// ReadAheadMark: when a forward pass is hinted ahead, and when not.
#include "blockio/source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "blockio/memory.h"
#include "tests/testing/testing.h"


namespace barge {
namespace {

// Hints land in a log; the source behind it is never read.
struct Hinted {
  MemorySource empty{{}};
  testing::CallLog log{empty};
};

constexpr uint64_t kMiB = 1 << 20;

TEST(ReadAheadMarkTest, ForwardPassIsHintedOnceAndAhead) {
  Hinted h;
  ReadAheadMark mark(8 * kMiB);
  for (uint64_t end = kMiB; end <= 64 * kMiB; end += kMiB) mark.Before(h.log, end);
  const auto hints = h.log.hints();
  ASSERT_FALSE(hints.empty());
  EXPECT_EQ(hints.front(), std::make_pair(kMiB, 9 * kMiB));
  for (size_t i = 1; i < hints.size(); ++i) {
    EXPECT_EQ(hints[i].first, hints[i - 1].second) << "hints must continue each other";
  }
  // Every read end was at least 4 MiB inside the hinted stretch when made,
  // and no more than 8 MiB was ever hinted past the last read.
  EXPECT_GE(hints.back().second, 64 * kMiB + 4 * kMiB);
  EXPECT_LE(hints.back().second, 64 * kMiB + 8 * kMiB);
  EXPECT_LT(hints.size(), 64u / 2);  // in stretches, not per read
}

TEST(ReadAheadMarkTest, JumpMovesTheMarkWithoutAHint) {
  Hinted h;
  ReadAheadMark mark(8 * kMiB);
  mark.Before(h.log, kMiB);
  ASSERT_EQ(h.log.hints().size(), 1u);
  mark.Before(h.log, 100 * kMiB);  // far past the mark
  EXPECT_EQ(h.log.hints().size(), 1u);
  mark.Before(h.log, 101 * kMiB);  // on from there
  ASSERT_EQ(h.log.hints().size(), 2u);
  EXPECT_EQ(h.log.hints().back(), std::make_pair(101 * kMiB, 109 * kMiB));
  mark.Before(h.log, 50 * kMiB);  // behind the mark: nothing
  EXPECT_EQ(h.log.hints().size(), 2u);
}

TEST(ReadAheadMarkTest, ConcurrentReadersNeverHintTheSameBytesTwice) {
  Hinted h;
  ReadAheadMark mark(8 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t end = (t + 1) * 64 * 1024; end <= 256 * kMiB; end += 4 * 64 * 1024) mark.Before(h.log, end);
    });
  }
  for (auto& th : threads) th.join();
  auto hints = h.log.hints();
  std::sort(hints.begin(), hints.end());
  for (size_t i = 1; i < hints.size(); ++i) EXPECT_LE(hints[i - 1].second, hints[i].first);
  ASSERT_FALSE(hints.empty());
  EXPECT_GE(hints.back().second, 256 * kMiB);
}

}  // namespace
}  // namespace barge
