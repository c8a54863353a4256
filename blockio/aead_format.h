// The encrypted object format (docs/formats/encryption.md): a 128-byte
// header, then the plaintext in fixed segments, each sealed on its own with
// AES-256-GCM under a random per-object data key, so a plaintext range maps
// to the few segments that cover it.
//
//   object  = header (128 bytes) || segment 0 || segment 1 || ... || segment n-1
//   segment = nonce (12 random bytes) || ciphertext (segment_bytes, the last
//             one 0..segment_bytes) || tag (16 bytes)
//
// n = max(1, ceil(plaintext_bytes / segment_bytes)): an empty object still
// has one (empty, final) segment. Plaintext offset P lies in segment
// P / segment_bytes at byte P % segment_bytes of its ciphertext; segment i
// starts at kAeadHeaderBytes + i * (segment_bytes + kAeadSegmentOverhead).
// Each segment's AAD binds the object identity (the caller's name for the
// object: bucket/key or a path), its index and whether it is the final
// one, so moved, swapped, dropped or appended segments fail their tag.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "blockio/encryption_key.h"
#include "blockio/error.h"

namespace barge {

inline constexpr size_t kAeadHeaderBytes = 128;
inline constexpr size_t kAeadNonceBytes = 12;
inline constexpr size_t kAeadTagBytes = 16;
inline constexpr size_t kAeadSegmentOverhead = kAeadNonceBytes + kAeadTagBytes;
inline constexpr uint32_t kAeadDefaultSegmentBytes = 64 * 1024;
// Segment sizes a header may name: 4 KiB .. 16 MiB, powers of two.
inline constexpr uint32_t kAeadMinSegmentBytes = 4 * 1024;
inline constexpr uint32_t kAeadMaxSegmentBytes = 16 * 1024 * 1024;
inline constexpr uint16_t kAeadVersion = 1;
inline constexpr uint8_t kAeadCipherAes256Gcm = 1;
inline constexpr size_t kDataKeyBytes = 32;
inline constexpr size_t kWrappedKeyBytes = kDataKeyBytes + kAeadTagBytes;

struct AeadHeader {
  uint16_t version = kAeadVersion;
  uint8_t cipher = kAeadCipherAes256Gcm;
  uint32_t segment_bytes = kAeadDefaultSegmentBytes;
  uint64_t plaintext_bytes = 0;
  KdfParams kdf;
  std::array<uint8_t, kKeyIdBytes> key_id{};
  // The data key sealed by AES-256-GCM under the KEK (nonce, ciphertext ||
  // tag); its AAD is the header's bytes 0..52 (all but the wrap itself)
  // with plaintext_bytes zeroed, so every setting of the header is
  // authenticated by the unwrap. plaintext_bytes changes as the object
  // grows; the object's size and the final segment's tag pin it instead.
  std::array<uint8_t, kAeadNonceBytes> wrap_nonce{};
  std::array<uint8_t, kWrappedKeyBytes> wrapped_key{};
};

std::array<std::byte, kAeadHeaderBytes> EncodeAeadHeader(const AeadHeader& header);
// Parses untrusted bytes (at least kAeadHeaderBytes, else kCorruption).
// kCorruption "not a barge encrypted object" for a wrong magic,
// "unsupported version N", "unsupported cipher N", a segment size or KDF
// parameters out of bounds, or non-zero reserved bytes.
Result<AeadHeader> ParseAeadHeader(std::span<const std::byte> bytes);

// Layout arithmetic of an object with this segment size.
struct AeadLayout {
  uint32_t segment_bytes = kAeadDefaultSegmentBytes;
  uint64_t SegmentCount(uint64_t plaintext_bytes) const;
  // Where segment `index` starts in the object.
  uint64_t SegmentOffset(uint64_t index) const;
  // Plaintext bytes in segment `index` of an object of `plaintext_bytes`.
  uint32_t SegmentPlainBytes(uint64_t index, uint64_t plaintext_bytes) const;
  // The object's size for `plaintext_bytes`.
  uint64_t ObjectBytes(uint64_t plaintext_bytes) const;
  // The plaintext size an object of `object_bytes` holds; kCorruption when
  // no plaintext size gives that object size.
  Result<uint64_t> PlaintextBytes(uint64_t object_bytes) const;
};

// An object's unwrapped data key and identity: seals and opens segments.
// Thread-safe (no state changes after creation).
class AeadObjectKey {
 public:
  // A new random data key wrapped by `key` (its write_kdf()): fills
  // `header`'s key fields. `header.segment_bytes` must be set.
  static Result<std::unique_ptr<AeadObjectKey>> Create(const EncryptionKey& key, std::string identity,
                                                       AeadHeader& header);
  // The data key of `header` unwrapped by `key`: kInvalidArgument "wrong
  // key: the data key does not unwrap with key ID (the object names key
  // ID2)" when the ids differ; kCorruption when the ids match but the
  // unwrap fails (a tampered header).
  static Result<std::unique_ptr<AeadObjectKey>> Open(const EncryptionKey& key, std::string identity,
                                                     const AeadHeader& header);
  ~AeadObjectKey();

  const std::string& identity() const { return identity_; }

  // Seals `plain` as segment `index` into `out` (plain.size() +
  // kAeadSegmentOverhead bytes) with a fresh random nonce.
  Status Seal(uint64_t index, bool final, std::span<const std::byte> plain, std::span<std::byte> out) const;
  // Opens a sealed segment into `plain` (sealed.size() - overhead bytes).
  // kCorruption on a failed tag (the caller names the offset).
  Status Open(uint64_t index, bool final, std::span<const std::byte> sealed, std::span<std::byte> plain) const;

 private:
  AeadObjectKey(std::string identity) : identity_(std::move(identity)) {}
  std::string identity_;
  std::array<uint8_t, kDataKeyBytes> data_key_{};
};

}  // namespace barge
