// FaultEnv's wrapped sinks and sources, and the undo log of file data
// (the model is described in fault_env.h).
#include <algorithm>

#include "blockio/fault_env_internal.h"

namespace barge {
namespace {

bool AllZero(const std::vector<std::byte>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

}  // namespace

// A sink that counts and fails calls and saves what its writes overwrite.
class FaultEnv::Impl::Sink final : public BlockSink {
 public:
  Sink(Impl& env, std::unique_ptr<BlockSink> target, std::optional<Id> tracked, bool durable_flush)
      : env_(env), target_(std::move(target)), tracked_(tracked), durable_flush_(durable_flush) {}
  ~Sink() override {
    target_.reset();
    if (tracked_) env_.SinkClosed(*tracked_);
  }

  const std::string& name() const override { return target_->name(); }
  uint64_t size_bytes() const override { return target_->size_bytes(); }
  SinkCapabilities capabilities() const override { return target_->capabilities(); }

  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    BARGE_RETURN_IF_ERROR(BeforeChange(offset, data.size(), offset + data.size()));
    return target_->WriteAt(offset, data);
  }
  Status WriteZeroes(uint64_t offset, uint64_t length) override {
    BARGE_RETURN_IF_ERROR(BeforeChange(offset, length, offset + length));
    return target_->WriteZeroes(offset, length);
  }
  Status Trim(uint64_t offset, uint64_t length) override {
    BARGE_RETURN_IF_ERROR(BeforeChange(offset, length, offset + length));
    return target_->Trim(offset, length);
  }
  Status Truncate(uint64_t size) override {
    // Everything from the new size on may go.
    BARGE_RETURN_IF_ERROR(BeforeChange(size, 0, UINT64_MAX));
    return target_->Truncate(size);
  }
  Status Flush() override {
    Admission a = env_.Admit(EnvOp::kSync, name());
    if (!a.status.ok()) return a.status;
    Status s = target_->Flush();
    if (s.ok() && tracked_ && durable_flush_) env_.MarkFileDurable(*tracked_);
    return Finish(a, std::move(s), name());
  }

 private:
  // Counts a kWrite (the range in an injected error is offset, length) and
  // saves the durable bytes of [offset, end) it is about to change.
  Status BeforeChange(uint64_t offset, uint64_t length, uint64_t end) {
    Admission a = env_.Admit(EnvOp::kWrite, name(), std::pair(offset, length));
    if (!a.status.ok()) return a.status;
    if (!tracked_) return OkStatus();
    return env_.SaveBeforeChange(*tracked_, offset, end);
  }

  Impl& env_;
  std::unique_ptr<BlockSink> target_;
  const std::optional<Id> tracked_;
  const bool durable_flush_;
};

// A source that counts and fails reads.
class FaultEnv::Impl::Source final : public BlockSource {
 public:
  Source(Impl& env, std::unique_ptr<BlockSource> target) : env_(env), target_(std::move(target)) {}

  const std::string& name() const override { return target_->name(); }
  uint64_t size_bytes() const override { return target_->size_bytes(); }
  SourceCapabilities capabilities() const override { return target_->capabilities(); }

  Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    Admission a = env_.Admit(EnvOp::kRead, name(), std::pair(offset, uint64_t{out.size()}));
    if (!a.status.ok()) return a.status;
    return target_->ReadAt(offset, out);
  }

  // Each request is one kRead; the ones that go ahead reach the target's
  // ReadMany together, so batching is kept.
  Status ReadMany(std::span<ReadRequest> requests) override {
    return ReadManyAdmitted(*target_, requests, [this](const ReadRequest& r) {
      return env_.Admit(EnvOp::kRead, name(), std::pair(r.offset, uint64_t{r.buffer.size()})).status;
    });
  }

  void WillNeed(uint64_t offset, uint64_t length) override { target_->WillNeed(offset, length); }

  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override {
    Admission a = env_.Admit(EnvOp::kRead, name(), std::pair(offset, length));
    if (!a.status.ok()) return a.status.error();
    return target_->Extents(offset, length);
  }

 private:
  Impl& env_;
  std::unique_ptr<BlockSource> target_;
};


std::unique_ptr<BlockSink> FaultEnv::Impl::WrapSink(std::unique_ptr<BlockSink> target,
                                                    std::optional<Id> tracked, bool durable_flush) {
  return std::make_unique<Sink>(*this, std::move(target), tracked, durable_flush);
}

std::unique_ptr<BlockSource> FaultEnv::Impl::WrapSource(std::unique_ptr<BlockSource> target) {
  return std::make_unique<Source>(*this, std::move(target));
}

// ---- the undo log ----

Status FaultEnv::Impl::SaveBeforeChange(const Id& id, uint64_t offset, uint64_t end) {
  std::lock_guard lock(mu_);
  return SaveLocked(id, offset, end);
}

void FaultEnv::Impl::MarkFileDurable(const Id& id) {
  std::lock_guard lock(mu_);
  files_.erase(id);
  ReleaseUnneededPins();
}

void FaultEnv::Impl::SinkClosed(const Id& id) {
  std::lock_guard lock(mu_);
  auto it = pins_.find(id);
  if (it == pins_.end()) return;  // forgotten by SimulatePowerLoss meanwhile
  if (--it->second.open_sinks == 0) ReleaseUnneededPins();
}

Status FaultEnv::Impl::SaveLocked(const Id& id, uint64_t offset, uint64_t end) {
  auto it = files_.find(id);
  if (it == files_.end()) {
    // The file was durable up to now: as it is on disk.
    BARGE_ASSIGN_OR_RETURN(FileStat st, target_.Stat(PinPath(id)));
    it = files_.emplace(id, FileData{st.size_bytes, {}}).first;
  }
  FileData& f = it->second;
  end = std::min(end, f.synced_size);
  if (offset >= end) return OkStatus();
  // The parts of [offset, end) not saved yet: a byte is saved once, before
  // its first change since the last sync, so the log holds durable bytes.
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  uint64_t pos = offset;
  auto s = f.saved.upper_bound(offset);
  if (s != f.saved.begin()) --s;
  for (; s != f.saved.end() && s->first < end; ++s) {
    uint64_t saved_end = s->first + s->second.size();
    if (saved_end <= pos) continue;
    if (s->first > pos) gaps.emplace_back(pos, s->first);
    pos = std::max(pos, saved_end);
  }
  if (pos < end) gaps.emplace_back(pos, end);
  if (gaps.empty()) return OkStatus();
  FileOptions o;
  o.use_uring = false;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> src, target_.OpenSource(PinPath(id), o));
  uint64_t size = src->size_bytes();
  for (auto [a, b] : gaps) {
    // Bytes past the end of the file (a shrink this Env did not see) are
    // saved as zeros.
    std::vector<std::byte> old(b - a);
    if (a < size) {
      BARGE_RETURN_IF_ERROR(src->ReadAt(a, std::span(old.data(), std::min(b, size) - a)));
    }
    f.saved.emplace(a, std::move(old));
  }
  return OkStatus();
}

Status FaultEnv::Impl::RestoreFileData(const Id& id, const FileData& data) {
  FileOptions o;
  o.use_uring = false;
  o.write_behind = false;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink,
                         target_.OpenSink(PinPath(id), SinkMode::kExisting, o));
  for (const auto& [offset, old] : data.saved) {
    if (AllZero(old)) {
      BARGE_RETURN_IF_ERROR(sink->WriteZeroes(offset, old.size()));  // a hole, most likely
    } else {
      BARGE_RETURN_IF_ERROR(sink->WriteAt(offset, old));
    }
  }
  BARGE_RETURN_IF_ERROR(sink->Truncate(data.synced_size));
  return sink->Flush();
}

}  // namespace barge
