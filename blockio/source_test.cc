// ReadAheadMark: when a forward pass is hinted ahead, and when not.
#include "blockio/source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>


namespace barge {
namespace {

// A source that only records its hints.
class HintLog final : public BlockSource {
 public:
  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return 1ull << 40; }
  Status ReadAt(uint64_t, std::span<std::byte>) override { return OkStatus(); }
  void WillNeed(uint64_t offset, uint64_t length) override {
    std::lock_guard lock(mu_);
    hints.emplace_back(offset, offset + length);
  }
  std::vector<std::pair<uint64_t, uint64_t>> hints;  // [begin, end)

 private:
  std::string name_ = "hints";
  std::mutex mu_;
};

constexpr uint64_t kMiB = 1 << 20;

TEST(ReadAheadMarkTest, ForwardPassIsHintedOnceAndAhead) {
  HintLog log;
  ReadAheadMark mark(8 * kMiB);
  for (uint64_t end = kMiB; end <= 64 * kMiB; end += kMiB) mark.Before(log, end);
  ASSERT_FALSE(log.hints.empty());
  EXPECT_EQ(log.hints.front(), std::make_pair(kMiB, 9 * kMiB));
  for (size_t i = 1; i < log.hints.size(); ++i) {
    EXPECT_EQ(log.hints[i].first, log.hints[i - 1].second) << "hints must continue each other";
  }
  // Every read end was at least 4 MiB inside the hinted stretch when made,
  // and no more than 8 MiB was ever hinted past the last read.
  EXPECT_GE(log.hints.back().second, 64 * kMiB + 4 * kMiB);
  EXPECT_LE(log.hints.back().second, 64 * kMiB + 8 * kMiB);
  EXPECT_LT(log.hints.size(), 64u / 2);  // in stretches, not per read
}

TEST(ReadAheadMarkTest, JumpMovesTheMarkWithoutAHint) {
  HintLog log;
  ReadAheadMark mark(8 * kMiB);
  mark.Before(log, kMiB);
  ASSERT_EQ(log.hints.size(), 1u);
  mark.Before(log, 100 * kMiB);  // far past the mark
  EXPECT_EQ(log.hints.size(), 1u);
  mark.Before(log, 101 * kMiB);  // on from there
  ASSERT_EQ(log.hints.size(), 2u);
  EXPECT_EQ(log.hints.back(), std::make_pair(101 * kMiB, 109 * kMiB));
  mark.Before(log, 50 * kMiB);  // behind the mark: nothing
  EXPECT_EQ(log.hints.size(), 2u);
}

TEST(ReadAheadMarkTest, ConcurrentReadersNeverHintTheSameBytesTwice) {
  HintLog log;
  ReadAheadMark mark(8 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t end = (t + 1) * 64 * 1024; end <= 256 * kMiB; end += 4 * 64 * 1024) mark.Before(log, end);
    });
  }
  for (auto& th : threads) th.join();
  auto hints = log.hints;
  std::sort(hints.begin(), hints.end());
  for (size_t i = 1; i < hints.size(); ++i) EXPECT_LE(hints[i - 1].second, hints[i].first);
  ASSERT_FALSE(hints.empty());
  EXPECT_GE(hints.back().second, 256 * kMiB);
}

}  // namespace
}  // namespace barge
