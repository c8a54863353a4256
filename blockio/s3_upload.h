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
#include <vector>

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

// What a later run needs to continue an unfinished upload (Continue): its
// id, its layout (the part sizes), and the parts after the front that were
// sent, from part 2 on without a gap, each whole, with the ETag the store
// gave (the MD5 of its bytes on S3 and radosgw). The front part (part 1) is
// never among them: it is sent only at Publish, so a continuing writer
// writes it again. A resumable job journals this at part boundaries.
struct S3UploadJournal {
  std::string upload_id;      // "" while no part was sent
  uint64_t part_bytes = 0;    // P
  uint64_t front_bytes = 0;   // F
  std::vector<S3Part> parts;  // parts 2, 3, ... in order, each of P bytes
  // The object's bytes the parts hold end here (F + parts * P).
  uint64_t end() const { return front_bytes + parts.size() * part_bytes; }
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

  // Resumable uploads (issue 38 §3).
  //
  // The sent part so far, for a journal: the parts from 2 on without a gap
  // (parts go a few at a time, so one may be done before the one below
  // it). After Flush, every full part written is in it.
  S3UploadJournal Journal() const;
  // Waits for the parts in flight and lets the upload go unaborted (the
  // store keeps it, as after a SIGKILL), for a later Continue; the front
  // part and any part not yet sent are dropped. Every later call but Journal
  // and the counters is kNotSupported. The upload's first failure when a part failed.
  Status Keep();
  // The upload `journal` describes, continued: lists its parts and keeps the
  // longest prefix of the journal's whose number, size and ETag the store
  // still has (a part replaced since, or missing, ends it); writing goes on
  // from the end of that prefix (kept_end()), and anything written below it
  // but in the front part is kNotSupported as a write behind the frontier.
  // The front part starts empty: the caller writes it again. `options`'
  // part sizes are ignored (the journal's are the layout). kNotFound "the
  // multipart upload is gone" when the store no longer has it (aborted,
  // completed, expired); the client's errors otherwise (a store that
  // cannot be reached: kIoError, retryable).
  static Result<std::unique_ptr<S3Upload>> Continue(S3Client& client, S3Location at, const S3UploadJournal& journal,
                                                    S3UploadOptions options = {});
  // Continue: the offset writing goes on from, and the journal's parts
  // that were not kept (0 when all were), with why the first was not.
  uint64_t kept_end() const;
  size_t dropped_parts() const;
  const std::string& dropped_reason() const;

  uint64_t bytes_sent() const;  // payload bytes sent in parts/PUTs so far
  int parts_sent() const;

  struct State;  // implementation (s3_upload.cc)

 private:
  explicit S3Upload(std::unique_ptr<State> state);
  const std::unique_ptr<State> state_;
};

}  // namespace barge
