// In-memory source and sink for tests and fuzzing. The sink logs every call
// and can simulate a crash that forgets everything written since the last
// flush.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "blockio/sink.h"
#include "blockio/source.h"

namespace barge {

// Reads from a byte vector. Optional extents make it advertise allocation.
class MemorySource final : public BlockSource {
 public:
  explicit MemorySource(std::vector<std::byte> bytes, std::string name = "memory");
  // `extents` must cover the whole size; enables has_extents.
  MemorySource(std::vector<std::byte> bytes, ExtentList extents, std::string name = "memory");

  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return bytes_.size(); }
  SourceCapabilities capabilities() const override;
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override;
  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override;

  const std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  std::string name_;
  std::vector<std::byte> bytes_;
  ExtentList extents_;
  bool has_extents_ = false;
};

// One logged sink operation.
struct SinkOp {
  enum class Kind : uint8_t { kWrite, kZero, kTrim, kFlush, kTruncate };
  Kind kind;
  uint64_t offset = 0;
  uint64_t length = 0;
  friend bool operator==(const SinkOp&, const SinkOp&) = default;
};

// A growable in-memory sink. Thread-safe (one mutex).
class MemorySink final : public BlockSink {
 public:
  explicit MemorySink(uint64_t initial_size = 0, std::string name = "memory");

  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override;
  SinkCapabilities capabilities() const override;
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override;
  Status WriteZeroes(uint64_t offset, uint64_t length) override;
  Status Trim(uint64_t offset, uint64_t length) override;
  Status Flush() override;
  Status Truncate(uint64_t size_bytes) override;

  // A copy of the current contents.
  std::vector<std::byte> contents() const;
  // Every call so far, in order.
  std::vector<SinkOp> ops() const;
  // Forgets every change since the last Flush, as a power loss would.
  void SimulateCrash();
  // A source over a copy of the current contents.
  std::unique_ptr<MemorySource> ToSource() const;

 private:
  void Log(SinkOp::Kind kind, uint64_t offset, uint64_t length);

  std::string name_;
  mutable std::mutex mu_;
  std::vector<std::byte> bytes_;    // guarded by mu_
  std::vector<std::byte> durable_;  // contents at the last flush; guarded by mu_
  std::vector<SinkOp> ops_;         // guarded by mu_
};

}  // namespace barge
