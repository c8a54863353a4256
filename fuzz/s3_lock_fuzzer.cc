// Fuzzes the reader of S3 lock objects (blockio/s3_lock.h), whose bytes
// anyone with write access to the bucket may have put there: any bytes
// are accepted or refused as kInvalidArgument, and what parses writes back
// to bytes that parse to the same lock.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "blockio/s3_lock.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const barge::S3Location at{"bucket", ".lock"};
  auto body = barge::ParseS3LockBody(std::span(reinterpret_cast<const std::byte*>(data), size), at);
  if (!body.ok()) {
    if (body.error().code() != barge::ErrorCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (body->pid < 0 || body->acquired < 0 || body->expires < 0 || body->start < 0 || body->token.size() != 32) {
    std::abort();
  }
  const std::string text = barge::FormatS3LockBody(*body);
  auto again = barge::ParseS3LockBody(std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()), at);
  if (!again.ok() || again->host != body->host || again->pid != body->pid || again->token != body->token ||
      again->acquired != body->acquired || again->expires != body->expires || again->boot != body->boot ||
      again->start != body->start) {
    std::abort();
  }
  return 0;
}
