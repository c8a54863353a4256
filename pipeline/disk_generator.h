// A deterministic, VM-like test disk for benchmarks: a sparse raw file of
// holes, written zero runs, compressible text-like regions and random
// (incompressible) regions, with extent sizes from 4 KiB to 64 MiB. The same
// (size, seed) always gives the same bytes and layout, on any machine, so
// scripts can feed the exact same disk to barge and to its peers.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::pipeline {

enum class ExtentKind : uint8_t { kHole, kZero, kText, kRandom, kCount };
std::string_view ExtentKindName(ExtentKind kind);  // "hole", "zero", "text", "random"

struct DiskMix {
  uint64_t size_bytes = 0;
  uint64_t seed = 0;
  std::array<uint64_t, static_cast<size_t>(ExtentKind::kCount)> bytes{};
  std::array<uint64_t, static_cast<size_t>(ExtentKind::kCount)> extents{};
  uint64_t extent_count() const;
  uint64_t allocated_bytes() const;  // everything but holes
  double percent(ExtentKind kind) const;
};

struct DiskGeneratorOptions {
  uint64_t size_bytes = 4ull << 30;  // CheckGeneratedDiskSize: >= 1 MiB, a multiple of 4 KiB
  uint64_t seed = 1;
  // Shares of each kind, by extent count (they need not sum to anything).
  std::array<uint32_t, static_cast<size_t>(ExtentKind::kCount)> weights{30, 10, 35, 25};
  uint64_t min_extent_bytes = 4 << 10;   // log-uniform sizes in [min, max], 4 KiB aligned
  uint64_t max_extent_bytes = 64 << 20;  // and at most 1/16 of the disk
  // May be null; set true to stop writing (kCancelled). Polled per 1 MiB.
  const std::atomic<bool>* cancel = nullptr;
};

// The generator lays extents out in 4 KiB units, and a disk smaller than
// 1 MiB holds too few of them to be VM-like (or anything at all: 1000
// bytes used to become an empty file).
inline constexpr uint64_t kGeneratedDiskUnitBytes = 4096;
inline constexpr uint64_t kMinGeneratedDiskBytes = 1 << 20;
// OK for a multiple of 4 KiB of at least 1 MiB; kInvalidArgument saying
// why otherwise (sizes in words and bytes).
Status CheckGeneratedDiskSize(uint64_t size_bytes);

// The layout alone (no file written): what GenerateDisk would produce.
DiskMix PlanDisk(const DiskGeneratorOptions& options);

// Writes the disk to `path` (created or truncated; holes are never written,
// zero runs are written as zero bytes), then fsyncs it. Returns the mix.
// Errors: CheckGeneratedDiskSize's (before `path` is touched); the file's
// (kIoError, kNoSpace, ...).
// Writes the disk to `path` (replaced if it exists) through `env`: holes
// are never written, the file is truncated to the size and synced.
Result<DiskMix> GenerateDisk(Env& env, const std::string& path, const DiskGeneratorOptions& options);

}  // namespace barge::pipeline
