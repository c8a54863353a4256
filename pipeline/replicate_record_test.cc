// The replica checksum record (PATH.sha512.json) as untrusted input: it sits
// on a disk beside the copy, and the image catalog's rescan believes it.
#include <gtest/gtest.h>

#include <fstream>

#include "pipeline/replicate.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

const char* kGood = R"({"sha512":"ab","virtual_size":1048576,"format":"qcow2","file_bytes":4096,
  "file_mtime_ns":1795359804570571000,"verified":true,"bitmaps":["b0"]})";

TEST(ReplicaRecordTest, DecodesWhatIsWritten) {
  auto r = DecodeReplicaRecord(kGood);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->virtual_size, 1048576u);
  EXPECT_EQ(r->file_mtime_ns, 1795359804570571000);
  EXPECT_EQ(r->bitmaps, std::vector<std::string>{"b0"});
}

// Found by replica_record_fuzzer (corpus: regress_size_is_float.json): a
// size written as 1e111 went through get<uint64_t>(), a float-to-integer
// conversion out of range (UBSan: undefined behaviour).
TEST(ReplicaRecordTest, FloatSizeIsCorruptionNotUndefinedBehaviour) {
  for (const char* size : {"1e111", "-1", "1.5", "\"10\"", "null"}) {
    std::string text = kGood;
    text.replace(text.find("1048576"), 7, size);
    auto r = DecodeReplicaRecord(text);
    ASSERT_FALSE(r.ok()) << size;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << size;
  }
  std::ifstream in(std::string(BARGE_SOURCE_DIR) + "/fuzz/corpus/replica_record_fuzzer/regress_size_is_float.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(DecodeReplicaRecord(text).error().code(), ErrorCode::kCorruption);
}

TEST(ReplicaRecordTest, WrongTypesAreCorruption) {
  for (const std::string& bad : {std::string("[]"), std::string("{}"), std::string("not json"),
                                 std::string(R"({"sha512":1,"virtual_size":1,"format":"raw","file_bytes":1,"file_mtime_ns":1})"),
                                 std::string(R"({"sha512":"a","virtual_size":1,"format":"raw","file_bytes":1,"file_mtime_ns":1.5})"),
                                 std::string(R"({"sha512":"a","virtual_size":1,"format":"raw","file_bytes":1,"file_mtime_ns":1,"bitmaps":[1]})")}) {
    auto r = DecodeReplicaRecord(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << bad;
  }
}

}  // namespace
}  // namespace barge::pipeline
