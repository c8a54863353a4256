// One writer at a time in a bucket: a lock object created with a
// conditional PUT (If-None-Match: *), its body a small JSON naming the
// owner and an expiry that the holder renews. There is no flock in S3;
// this is the rule a chain folder's lock file keeps, over HTTP. Tested
// against a real radosgw (tests/s3_upload_test.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "blockio/error.h"
#include "blockio/s3_client.h"

namespace barge {

struct S3LockOptions {
  std::chrono::seconds ttl{120};  // a lock not renewed for this long is dead
  std::string busy_message = "locked by another process";
  bool wait = false;  // poll until free (every ~1 s) instead of kBusy
};

// The lock object's body: {"barge_lock":2,"host":H,"boot":B,"pid":P,
// "start":T0,"token":T,"acquired":S,"expires":S} (unix seconds), or
// version 1 without "boot" and "start" (what barge wrote before: such a
// lock is only ever taken over once expired).
struct S3LockBody {
  std::string host;
  int64_t pid = 0;
  std::string token;  // random, 32 hex digits
  int64_t acquired = 0;
  int64_t expires = 0;
  // Which kernel and pid namespace `pid` belongs to: the boot id
  // (/proc/sys/kernel/random/boot_id) and the pid namespace's inode, as
  // "BOOT/NS"; "" = version 1 (unknown). Equal on two runs only when
  // their pids name processes of the same machine, boot and container.
  std::string boot;
  // The owner's start time in clock ticks since boot (/proc/PID/stat's
  // 22nd field), which tells a reused pid from the owner; 0 = unknown.
  int64_t start = 0;
};
std::string FormatS3LockBody(const S3LockBody& body);
// Strict: exactly the fields of version 1 or of version 2 above, of the right types, the host and the
// token printable and short, nothing else; otherwise kInvalidArgument "a
// lock object barge did not write" naming `at`. Untrusted input (fuzzed:
// fuzz/s3_lock_fuzzer.cc).
Result<S3LockBody> ParseS3LockBody(std::span<const std::byte> bytes, const S3Location& at);

class S3Lock {
 public:
  // Creates the lock object at `at` with PutIfAbsent (If-None-Match: *), its
  // body a small JSON: owner (hostname, pid, a random token), acquired and
  // expires (unix seconds). A live holder's lock: kBusy (retryable) with
  // busy_message plus the holder ("held by host H pid P until T"). An
  // expired lock is taken over safely (read it, delete it only if its token
  // is still the one read — re-read right before the delete —, then
  // PutIfAbsent again; losing that race is kBusy). A lock of a dead owner
  // on this machine (same "boot", and its pid gone or now another
  // process: a SIGKILLed run) is taken over at once, unexpired: replaced
  // with a PUT conditional on the ETag read (If-Match), so that of two
  // takers only one wins (the other: kBusy). While held, a thread
  // renews it (PUT with a later expiry, after checking the token is still
  // ours) every ttl/3; the destructor stops renewal and deletes it (only if
  // still ours). A lock body barge did not write is kInvalidArgument.
  static Result<std::unique_ptr<S3Lock>> Acquire(S3Client& client, S3Location at, S3LockOptions options = {});
  ~S3Lock();

  bool took_over() const;                     // an expired or dead owner's lock was replaced
  const std::string& previous_owner() const;  // "host H pid P" when took_over
  // Why it was taken over: "expired" or "dead" (its owner's process is
  // gone from this machine); "" when not taken over.
  const std::string& takeover_reason() const;
  // Whether renewal has failed (the lock may be lost): writers check it
  // before a commit.
  bool lost() const;

  struct State;  // implementation (s3_lock.cc)

 private:
  explicit S3Lock(std::unique_ptr<State> state);
  const std::unique_ptr<State> state_;
};

}  // namespace barge
