// `barge bitmap add|remove|clear|enable|disable`: qemu-img bitmap's edits
// of a qcow2 file's persistent dirty bitmaps, in place and crash-safe
// (formats/qcow2_bitmap_edit.h), under QEMU's image lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/image.h"

namespace barge::pipeline {

enum class BitmapAction : uint8_t { kAdd, kRemove, kClear, kEnable, kDisable };

struct BitmapEditRequest {
  std::string path;                // a qcow2 file, not open in QEMU
  BitmapAction action = BitmapAction::kAdd;
  std::vector<std::string> names;  // edited in one crash-safe step
  uint64_t granularity = 0;        // kAdd: bytes per bit; 0 = qemu-img's default
  bool disabled = false;           // kAdd: added not tracking writes
};

struct BitmapEditResult {
  std::vector<formats::BitmapInfo> bitmaps;  // the file's, after the edit
  std::vector<std::string> unchanged;        // enable/disable: already so
  uint32_t granularity = 0;                  // kAdd: the one given to the bitmaps
};

// qemu-img's default granularity: the cluster size, within 4 KiB..64 KiB
// (bdrv_get_default_bitmap_granularity).
uint32_t DefaultBitmapGranularity(uint64_t cluster_bytes);

// A granularity a bitmap can have: a power of two from 512 bytes to 2 GiB.
// kInvalidArgument otherwise, quoting `as_given` (the user's text).
Status CheckBitmapGranularity(uint64_t bytes, const std::string& as_given);

// Takes QEMU's write lock on req.path (a running VM keeps its bitmaps in
// memory and would overwrite the edit), reads its qcow2 metadata (no
// backing file, no data file), applies the edit and reads the bitmaps
// back. Returns: kBusy (the image is locked), kNotSupported (not a qcow2
// file: a raw disk takes a CBT overlay), formats::EditBitmaps's errors
// (kNotFound, kInvalidArgument, ...: nothing changed), or the result.
Result<BitmapEditResult> RunBitmapEdit(Env& env, const BitmapEditRequest& req);

}  // namespace barge::pipeline
