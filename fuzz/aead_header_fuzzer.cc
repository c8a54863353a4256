// Fuzzes the encrypted object reader (blockio/aead_format.h,
// blockio/aead_stream.h) with what a hostile bucket may hold: the header
// parser must accept any bytes, what parses must re-encode to the same
// header bytes it read, and opening the bytes as an object under a fixed
// key must end in an error or a source whose reads all stay in bounds
// (never a crash, never an allocation the header asks for).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "blockio/aead_format.h"
#include "blockio/aead_stream.h"
#include "blockio/memory.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto header = barge::ParseAeadHeader(bytes);
  if (header.ok()) {
    const auto again = barge::EncodeAeadHeader(*header);
    if (std::memcmp(again.data(), data, again.size()) != 0) std::abort();
    if (barge::AeadLayout{header->segment_bytes}.SegmentCount(header->plaintext_bytes) == 0) std::abort();
  }
  static const barge::EncryptionKey key = [] {
    std::array<uint8_t, barge::kKekBytes> raw{};
    raw.fill(0x42);
    return barge::EncryptionKey::FromRawKey(raw);
  }();
  // A header naming scrypt would derive a key per input; only key-file
  // objects go on to be opened.
  if (header.ok() && header->kdf.kind != barge::KdfParams::Kind::kNone) return 0;
  std::vector<std::byte> object(bytes.begin(), bytes.end());
  auto source = barge::DecryptingSource::Open(std::make_unique<barge::MemorySource>(std::move(object), "fuzz"),
                                              key, "fuzz");
  if (source.ok()) {
    std::vector<std::byte> out(std::min<uint64_t>((*source)->size_bytes(), 4096));
    (void)(*source)->ReadAt(0, out);
  }
  return 0;
}
