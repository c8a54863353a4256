// A point of a chain folder opened for serving (barge export's nbdkit
// plugin, docs/export.md): reads checked cluster by cluster against the
// point's digest table, extents that never claim zeros the digests deny.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"
#include "blockio/extent.h"
#include "pipeline/chain.h"
#include "pipeline/export_lock.h"

namespace barge::pipeline {

// Checks one qcow2 layer's structure (qemu-img check's rules:
// formats/qcow2_check.h). kCorruption naming the file and the first
// problem when it finds errors or leaks.
Status CheckLayerStructure(Env& env, const std::string& path);

// Shared lock, chain and opened point of one served point.
// Thread-safe: Read and Extents may be called from several threads at
// once (nbdkit's parallel thread model). `env` must outlive it.
class PointReader {
 public:
  // Takes an export lock (ExportLock::Take: kBusy while a backup, merge or
  // forget writes the folder; held for the reader's life, so merge and
  // forget are refused meanwhile), which loads the folder (an interrupted
  // merge completed first), resolves `at` (ChainFolder::Resolve), opens the point
  // (OpenPoint: manifests, digest tables, the image chain) and, with
  // `check_structure`, checks every layer's qcow2 structure.
  // Returns: the reader; kNotFound (folder, point), kCorruption (naming the
  // damaged file), kBusy, kInvalidArgument (a bad `at`).
  static Result<std::unique_ptr<PointReader>> Open(Env& env, const std::string& dir, const std::string& at,
                                                   bool check_structure = true);
  ~PointReader();
  PointReader(const PointReader&) = delete;
  PointReader& operator=(const PointReader&) = delete;

  uint64_t size_bytes() const { return size_bytes_; }
  uint32_t cluster_bytes() const { return cluster_bytes_; }
  const formats::BackupManifest& manifest() const { return point_.point->manifest; }
  size_t position() const { return point_.index; }
  // How the folder is locked when the export could make no lock file of
  // its own (ExportLock::note); empty otherwise.
  const std::string& lock_note() const { return lock_->note(); }

  // Reads [offset, offset + out.size()), which must lie inside the disk
  // (kInvalidArgument otherwise). Every cluster the range touches is read
  // whole through the chain and its digest checked before any of its bytes
  // are copied out. Returns: ok with `out` filled; kCorruption naming the
  // layer file that holds the first mismatching cluster and that cluster's
  // guest offset (`out` then holds no bytes of it); the chain's read errors.
  // May block.
  Status Read(uint64_t offset, std::span<std::byte> out);

  // Extents of [offset, offset + length), sorted and contiguous, as the
  // image's tables say (data, zero, hole), except that a cluster whose
  // expected digest is not the zero cluster's is reported as data even
  // where the tables say zero or hole: a client that skips what is
  // reported as zeros must never miss data the digests vouch for.
  Result<ExtentList> Extents(uint64_t offset, uint64_t length);

 private:
  PointReader() = default;
  // The layer file holding the guest byte at `offset` ("" when unknown).
  std::string LayerHolding(uint64_t offset) const;

  std::unique_ptr<ExportLock> lock_;
  ChainFolder chain_;
  OpenedPoint point_;  // points into chain_
  uint64_t size_bytes_ = 0;
  uint32_t cluster_bytes_ = 0;
  formats::Digest128 zero_digest_;
};

}  // namespace barge::pipeline
