// A new S3 object written through a BlockSink: the first part ("front")
// is held in memory until Publish, so that late writes into it (a qcow2
// header written last at offset 0) land there; the bytes after it are
// streamed by multipart upload, in parts sent as they fill, a few at a
// time, within a memory budget. Objects in a bucket are written front to
// back: a write behind the part currently filling is kNotSupported.
// Tested against a real radosgw (tests/s3_upload_test.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "blockio/error.h"
#include "blockio/s3_client.h"
#include "blockio/sink.h"

namespace barge {

struct S3UploadOptions {
  // The object's expected size (0: unknown). Parts are sized so that an
  // object of this size fits in 10,000 parts (S3's limit), at least 8 MiB.
  uint64_t size_hint = 0;
  // Bound on the bytes buffered in memory: the front part plus parts in
  // flight and filling.
  uint64_t memory_bytes = 96ull << 20;
  // Parts uploaded at the same time.
  int parts_in_flight = 4;
  // Retention of the published object (its single PUT or its multipart
  // upload carries it); the bucket must have Object Lock (else Start's
  // CreateMultipart or Publish's PUT fails with kInvalidArgument "bucket B
  // was not created with Object Lock").
  std::optional<S3Retention> retention = std::nullopt;
  // Tests only: the part size itself (0: from size_hint). The server's
  // minimum (5 MiB on AWS, radosgw's rgw_multipart_min_part_size) still
  // applies to every part but the last.
  uint64_t test_part_bytes = 0;
};

// The part size for an object of `size_hint` bytes (0: unknown): at least
// 8 MiB, a multiple of 1 MiB, large enough that the object fits in 10,000
// parts. Pure; public for tests.
uint64_t S3PartBytes(uint64_t size_hint);

// Thread safety: as BlockSink (disjoint WriteAt may run concurrently).
class S3Upload : public BlockSink {
 public:
  static Result<std::unique_ptr<S3Upload>> Start(S3Client& client, S3Location at, S3UploadOptions options = {});
  ~S3Upload() override;  // aborts an upload not published (best effort)

  // BlockSink: name() is at.shown(); capabilities: can_grow,
  // zero_initialized. WriteAt/WriteZeroes land at or after the start of
  // the part currently filling (or anywhere in the front part), else
  // kNotSupported "objects in a bucket are written front to back"; bytes
  // never written read as zeros. Truncate(n) with n at or past the part
  // filling sets the size; below it kNotSupported. Flush waits for the
  // parts in flight (nothing is visible before Publish). After a part
  // failed for good (the HTTP layer retried it) the upload is aborted and
  // every later call returns that error.
  const std::string& name() const override;
  uint64_t size_bytes() const override;
  SinkCapabilities capabilities() const override;
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override;
  Status WriteZeroes(uint64_t offset, uint64_t length) override;
  Status Flush() override;
  Status Truncate(uint64_t size_bytes) override;

  // Makes the object appear whole under its key: the front part and the
  // rest uploaded, the upload completed. An object that stayed within the
  // front part goes as one PUT (PutIfAbsent when if_absent). if_absent:
  // kBusy "already exists" when the key exists; for a multipart upload
  // that is checked with a HEAD just before completing (S3 has no
  // conditional complete on every server), so a writer racing between
  // that HEAD and the complete is not caught: callers that need more hold
  // an S3Lock. Once published, further writes are kNotSupported.
  Status Publish(bool if_absent);
  // Aborts the multipart upload (if one was started); nothing appears.
  Status Abort();

  uint64_t bytes_sent() const;  // payload bytes sent in parts/PUTs so far
  int parts_sent() const;

  struct State;  // implementation (s3_upload.cc)

 private:
  explicit S3Upload(std::unique_ptr<State> state);
  const std::unique_ptr<State> state_;
};

}  // namespace barge
