// WriteSkippingZeroBlocks: which blocks reach the sink, and in how many writes.
#include "blockio/sink.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <vector>

#include "blockio/fault.h"
#include "blockio/memory.h"

namespace barge {
namespace {

using Kind = SinkOp::Kind;

std::vector<std::byte> Zeros(size_t n) { return std::vector<std::byte>(n); }

void Fill(std::vector<std::byte>& bytes, size_t from, size_t n, uint8_t v) {
  for (size_t i = from; i < from + n; ++i) bytes[i] = std::byte{v};
}

TEST(WriteSkippingZeroBlocksTest, WritesRunsOfNonZeroBlocksOnly) {
  // Blocks 0 and 1 data, 2 zero, 3 data (one byte at its end), 4 zero.
  std::vector<std::byte> data = Zeros(5 * 4096);
  Fill(data, 0, 4096, 1);
  Fill(data, 4096 + 100, 1, 2);
  Fill(data, 4 * 4096 - 1, 1, 3);
  MemorySink sink;
  ASSERT_TRUE(WriteSkippingZeroBlocks(sink, 0, data).ok());
  EXPECT_EQ(sink.ops(), (std::vector<SinkOp>{{Kind::kWrite, 0, 2 * 4096}, {Kind::kWrite, 3 * 4096, 4096}}));
  std::vector<std::byte> back = sink.contents();
  back.resize(data.size());  // the zero tail was never written
  EXPECT_TRUE(back == data);
}

TEST(WriteSkippingZeroBlocksTest, BlocksAlignToTheSinkNotToTheData) {
  // At offset 1000 the first block is the 3096 bytes up to 4096; a byte at
  // data offset 3096 (sink offset 4096) starts the next one.
  std::vector<std::byte> data = Zeros(3096 + 4096 + 50);
  Fill(data, 3096, 1, 7);
  MemorySink sink;
  ASSERT_TRUE(WriteSkippingZeroBlocks(sink, 1000, data).ok());
  EXPECT_EQ(sink.ops(), (std::vector<SinkOp>{{Kind::kWrite, 4096, 4096}}));
  // A partial last block with data is written up to the end of `data`.
  Fill(data, data.size() - 1, 1, 8);
  MemorySink tail;
  ASSERT_TRUE(WriteSkippingZeroBlocks(tail, 1000, data).ok());
  EXPECT_EQ(tail.ops(), (std::vector<SinkOp>{{Kind::kWrite, 4096, 4096 + 50}}));
}

TEST(WriteSkippingZeroBlocksTest, AllZeroWritesNothingAndOtherBlockSizes) {
  MemorySink sink;
  ASSERT_TRUE(WriteSkippingZeroBlocks(sink, 0, Zeros(3 * 4096)).ok());
  ASSERT_TRUE(WriteSkippingZeroBlocks(sink, 0, {}).ok());
  EXPECT_TRUE(sink.ops().empty());
  std::vector<std::byte> data = Zeros(4 * 512);
  Fill(data, 512, 1, 1);
  ASSERT_TRUE(WriteSkippingZeroBlocks(sink, 0, data, 512).ok());
  EXPECT_EQ(sink.ops(), (std::vector<SinkOp>{{Kind::kWrite, 512, 512}}));
}

TEST(WriteSkippingZeroBlocksTest, ReturnsTheFailedWrite) {
  std::vector<std::byte> data = Zeros(3 * 4096);
  Fill(data, 0, 1, 1);
  Fill(data, 2 * 4096, 1, 1);
  MemorySink mem;
  FaultSink sink(mem);
  sink.faults().AddRule(FaultRule::Nth(FaultOp::kWrite, 2, EIO));
  Status s = WriteSkippingZeroBlocks(sink, 0, data);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kIoError);
  EXPECT_EQ(s.error().offset(), 2u * 4096);
  EXPECT_EQ(mem.ops(), (std::vector<SinkOp>{{Kind::kWrite, 0, 4096}}));
}

}  // namespace
}  // namespace barge
