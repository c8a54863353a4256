// Encryption at rest as a wrapper around a store's objects
// (docs/formats/encryption.md): EncryptingSink turns plaintext writes into
// an encrypted object on any BlockSink; DecryptingSource reads any
// plaintext range of such an object from any BlockSource, reading and
// verifying only the segments that cover it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "blockio/aead_format.h"
#include "blockio/encryption_key.h"
#include "blockio/sink.h"
#include "blockio/source.h"

namespace barge {

struct EncryptingSinkOptions {
  uint32_t segment_bytes = kAeadDefaultSegmentBytes;
  // The front of the plaintext that stays in memory until Flush and may be
  // rewritten at any time (a qcow2 writer writes its header at offset 0
  // last). Rounded up to whole segments.
  uint64_t rewritable_front_bytes = 1 << 20;
};

// A BlockSink whose plaintext becomes an encrypted object in `target`.
//
// Write pattern it supports (the qcow2 writer's, and any front-to-back
// stream): writes anywhere in the rewritable front; elsewhere writes at or
// after the segment that holds the current end. A segment past the front
// is sealed and written to the target at its offset once the plaintext's
// end moves past it (bytes never written in it are zeros); the segment
// holding the end stays in memory. A write into a segment already sealed
// past the front is kNotSupported (its plaintext is gone from memory, and
// the target may not be readable). Memory: the front plus one segment.
//
// Flush seals what memory holds (the front, the last segment marked final),
// writes the header with the plaintext size and flushes the target: the
// object is then whole and readable. Writes may go on after a Flush; the
// segments sealed again get fresh random nonces, so no nonce is ever
// reused under the object's data key. Without a Flush the target holds no
// readable object. Thread-safe (one mutex; sealing runs under it).
class EncryptingSink final : public BlockSink {
 public:
  // `identity` names the object in every segment's AAD (bucket/key or a
  // path); a reader must give the same. The key's data key is made here.
  static Result<std::unique_ptr<EncryptingSink>> Create(BlockSink& target, const EncryptionKey& key,
                                                        std::string identity, EncryptingSinkOptions options = {});

  const std::string& name() const override { return target_.name(); }
  // The plaintext size so far.
  uint64_t size_bytes() const override;
  SinkCapabilities capabilities() const override;
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override;
  Status Flush() override;

 private:
  EncryptingSink(BlockSink& target, AeadHeader header, std::unique_ptr<AeadObjectKey> key, uint64_t front_segments);
  // Seals segment `index` (from memory, or zeros) and writes it. mu_ held.
  Status SealOut(uint64_t index, bool final, uint64_t plaintext_bytes);
  // Seals and drops the segments past the front that lie wholly below the
  // end. mu_ held.
  Status SealCompleted();

  BlockSink& target_;
  AeadHeader header_;
  const AeadLayout layout_;
  const std::unique_ptr<AeadObjectKey> key_;
  const uint64_t front_segments_;
  mutable std::mutex mu_;
  uint64_t size_ = 0;                                  // guarded by mu_
  uint64_t next_seal_ = 0;                             // first segment past the front not sealed; mu_
  std::map<uint64_t, std::vector<std::byte>> open_;    // plaintext of segments in memory; mu_
  std::vector<std::byte> sealed_;                      // scratch for one sealed segment; mu_
  std::vector<std::byte> spare_;                       // a sealed segment's buffer, for reuse; mu_
};

// The plaintext of an encrypted object. Open checks the header, unwraps
// the data key, checks that the object's size matches the plaintext size
// the header names and verifies the final segment (a dropped or appended
// tail fails here). ReadAt reads the covering segments in one read of the
// object and verifies each tag: a failure is kCorruption naming the object
// and the plaintext offset of the segment. Thread-safe.
class DecryptingSource final : public BlockSource {
 public:
  // `identity` must be what the writer gave. Errors: kCorruption for a
  // header that is not barge's or is tampered; kInvalidArgument "wrong
  // key: ..." for another key.
  static Result<std::unique_ptr<DecryptingSource>> Open(std::unique_ptr<BlockSource> object,
                                                        const EncryptionKey& key, std::string identity);

  const std::string& name() const override { return object_->name(); }
  uint64_t size_bytes() const override { return header_.plaintext_bytes; }
  SourceCapabilities capabilities() const override;
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override;
  const AeadHeader& header() const { return header_; }

 private:
  DecryptingSource(std::unique_ptr<BlockSource> object, AeadHeader header, std::unique_ptr<AeadObjectKey> key);
  // Opens the sealed bytes of segment `index` into `plain`.
  Status OpenSegment(uint64_t index, std::span<const std::byte> sealed, std::span<std::byte> plain) const;

  const std::unique_ptr<BlockSource> object_;
  const AeadHeader header_;
  const AeadLayout layout_;
  const std::unique_ptr<AeadObjectKey> key_;
  // The last segment a read ended inside, opened: the next read (a qcow2
  // reader's next compressed cluster) mostly starts in it, and would
  // otherwise fetch and open it again.
  std::mutex cache_mu_;
  uint64_t cached_index_ = UINT64_MAX;  // guarded by cache_mu_
  std::vector<std::byte> cached_;       // its plaintext; guarded by cache_mu_
};

}  // namespace barge
