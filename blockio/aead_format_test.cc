// The encrypted object header, layout arithmetic, data key wrapping and
// key files (blockio/aead_format.h, blockio/encryption_key.h).
#include "blockio/aead_format.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "blockio/encryption_key.h"
#include "blockio/env.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

EncryptionKey KeyOf(uint8_t fill) {
  std::array<uint8_t, kKekBytes> raw{};
  raw.fill(fill);
  return EncryptionKey::FromRawKey(raw);
}

TEST(AeadLayoutTest, OffsetsAndSizes) {
  const AeadLayout l{4096};
  EXPECT_EQ(l.SegmentCount(0), 1u);
  EXPECT_EQ(l.SegmentCount(1), 1u);
  EXPECT_EQ(l.SegmentCount(4096), 1u);
  EXPECT_EQ(l.SegmentCount(4097), 2u);
  EXPECT_EQ(l.SegmentOffset(0), kAeadHeaderBytes);
  EXPECT_EQ(l.SegmentOffset(3), kAeadHeaderBytes + 3 * (4096 + kAeadSegmentOverhead));
  EXPECT_EQ(l.SegmentPlainBytes(1, 4097), 1u);
  EXPECT_EQ(l.SegmentPlainBytes(0, 4097), 4096u);
  EXPECT_EQ(l.ObjectBytes(0), kAeadHeaderBytes + kAeadSegmentOverhead);
  for (uint64_t plain : {0ull, 1ull, 4095ull, 4096ull, 4097ull, 8192ull, 100000ull}) {
    auto back = l.PlaintextBytes(l.ObjectBytes(plain));
    ASSERT_TRUE(back.ok()) << plain;
    EXPECT_EQ(*back, plain);
  }
  EXPECT_FALSE(l.PlaintextBytes(kAeadHeaderBytes + 10).ok());
  // A full segment followed by an empty one is never written.
  EXPECT_FALSE(l.PlaintextBytes(l.ObjectBytes(4096) + kAeadSegmentOverhead).ok());
}

TEST(AeadHeaderTest, RoundTripsAndRefusesForeignBytes) {
  AeadHeader h;
  h.segment_bytes = 1 << 16;
  h.plaintext_bytes = 123456789;
  auto key = AeadObjectKey::Create(KeyOf(7), "bucket/key", h);
  ASSERT_TRUE(key.ok());
  const auto bytes = EncodeAeadHeader(h);
  auto back = ParseAeadHeader(bytes);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->plaintext_bytes, h.plaintext_bytes);
  EXPECT_EQ(back->key_id, h.key_id);
  EXPECT_EQ(back->wrapped_key, h.wrapped_key);

  std::vector<std::byte> qcow2(kAeadHeaderBytes);
  std::memcpy(qcow2.data(), "QFI\xfb", 4);
  auto foreign = ParseAeadHeader(qcow2);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(foreign.error().message(), "not a barge encrypted object");

  auto v2 = bytes;
  v2[8] = std::byte{2};
  auto newer = ParseAeadHeader(v2);
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.error().message().find("unsupported version 2"), std::string::npos);

  // A forged scrypt cost that would take the reader's memory.
  AeadHeader costly = *back;
  costly.kdf = KdfParams{KdfParams::Kind::kScrypt, 20, 16, 1, {}};  // 2 GiB
  EXPECT_EQ(ParseAeadHeader(EncodeAeadHeader(costly)).error().code(), ErrorCode::kCorruption);
  costly.kdf.r = 8;  // 1 GiB: the most a reader accepts
  EXPECT_TRUE(ParseAeadHeader(EncodeAeadHeader(costly)).ok());

  auto odd_segment = bytes;
  odd_segment[12] = std::byte{1};
  EXPECT_FALSE(ParseAeadHeader(odd_segment).ok());
  EXPECT_FALSE(ParseAeadHeader(std::span(bytes).first(100)).ok());
}

TEST(AeadObjectKeyTest, WrongKeyIsNamedAndTamperedHeaderIsCorruption) {
  AeadHeader h;
  auto made = AeadObjectKey::Create(KeyOf(1), "a/b", h);
  ASSERT_TRUE(made.ok());
  EXPECT_TRUE(AeadObjectKey::Open(KeyOf(1), "a/b", h).ok());

  auto wrong = AeadObjectKey::Open(KeyOf(2), "a/b", h);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code(), ErrorCode::kInvalidArgument);
  auto kek1 = KeyOf(1).KekFor({});
  ASSERT_TRUE(kek1.ok());
  EXPECT_NE(wrong.error().message().find("wrong key: the data key does not unwrap with key "),
            std::string::npos);
  EXPECT_NE(wrong.error().message().find("the object names key " + KeyIdHex((*kek1)->id)), std::string::npos);

  AeadHeader tampered = h;
  tampered.segment_bytes *= 2;  // authenticated by the unwrap
  auto bad = AeadObjectKey::Open(KeyOf(1), "a/b", tampered);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kCorruption);
}

TEST(AeadObjectKeyTest, SegmentsBindIndexFinalityAndIdentity) {
  AeadHeader h;
  auto key = AeadObjectKey::Create(KeyOf(3), "bucket/disk.qcow2", h);
  ASSERT_TRUE(key.ok());
  const auto plain = testing::RandomBytes(1000, 5);
  std::vector<std::byte> sealed(plain.size() + kAeadSegmentOverhead), back(plain.size());
  ASSERT_TRUE((*key)->Seal(4, false, plain, sealed).ok());
  EXPECT_TRUE((*key)->Open(4, false, sealed, back).ok());
  EXPECT_EQ(back, plain);
  EXPECT_FALSE((*key)->Open(5, false, sealed, back).ok());
  EXPECT_FALSE((*key)->Open(4, true, sealed, back).ok());
  auto other = AeadObjectKey::Open(KeyOf(3), "bucket/other.qcow2", h);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*other)->Open(4, false, sealed, back).ok());
}

class KeyFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes, mode_t mode) {
    const std::string path = dir_ / name;
    std::ofstream(path, std::ios::binary) << bytes;
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }
  testing::TempDir dir_;
};

TEST_F(KeyFileTest, RawAndHexKeysGiveTheSameKey) {
  std::string raw(32, '\0');
  std::string hex;
  for (int i = 0; i < 32; ++i) {
    raw[i] = char(i * 7);
    char two[3];
    std::snprintf(two, sizeof two, "%02x", uint8_t(i * 7));
    hex += two;
  }
  auto a = LoadEncryptionKeyFile(Env::Default(), Write("raw", raw, 0600));
  auto b = LoadEncryptionKeyFile(Env::Default(), Write("hex", hex + "\n", 0400));
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  ASSERT_TRUE(b.ok()) << b.error().ToString();
  EXPECT_EQ((*a->KekFor({}))->id, (*b->KekFor({}))->id);
}

TEST_F(KeyFileTest, RefusesAKeyOthersCanReadAndBadContents) {
  const std::string path = Write("key", std::string(32, 'k'), 0644);
  auto open = LoadEncryptionKeyFile(Env::Default(), path);
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(open.error().path(), path);
  EXPECT_NE(open.error().message().find("mode 0644"), std::string::npos) << open.error().message();
  EXPECT_NE(open.error().message().find("chmod 600"), std::string::npos);

  auto short_key = LoadEncryptionKeyFile(Env::Default(), Write("short", "secret\n", 0600));
  ASSERT_FALSE(short_key.ok());
  EXPECT_EQ(short_key.error().message().find("secret"), std::string::npos);  // never quoted
  EXPECT_FALSE(LoadEncryptionKeyFile(Env::Default(), Write("nothex", std::string(64, 'z'), 0600)).ok());
  EXPECT_EQ(LoadEncryptionKeyFile(Env::Default(), dir_ / "missing").error().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(LoadEncryptionKeyFile(Env::Default(), dir_.path().string()).ok());  // a folder
}

TEST_F(KeyFileTest, PassphraseDerivesPerSaltAndRefusesTheOtherKind) {
  auto pass = LoadPassphraseFile(Env::Default(), Write("pass", "correct horse\n", 0600), /*log2_n=*/10);
  ASSERT_TRUE(pass.ok()) << pass.error().ToString();
  EXPECT_EQ(pass->write_kdf().kind, KdfParams::Kind::kScrypt);
  AeadHeader h;
  ASSERT_TRUE(AeadObjectKey::Create(*pass, "x", h).ok());
  // Another load of the same passphrase has another salt but opens the object.
  auto again = EncryptionKey::FromPassphrase("correct horse", 10);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->write_kdf().salt, pass->write_kdf().salt);
  EXPECT_TRUE(AeadObjectKey::Open(*again, "x", h).ok());
  auto wrong = EncryptionKey::FromPassphrase("battery staple", 10);
  EXPECT_EQ(AeadObjectKey::Open(*wrong, "x", h).error().code(), ErrorCode::kInvalidArgument);
  auto key_file = AeadObjectKey::Open(KeyOf(1), "x", h);
  ASSERT_FALSE(key_file.ok());
  EXPECT_NE(key_file.error().message().find("wrong key"), std::string::npos);
  EXPECT_FALSE(EncryptionKey::FromPassphrase("", 10).ok());
}

}  // namespace
}  // namespace barge
