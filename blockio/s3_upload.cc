// S3Upload: the front part in memory until Publish, the parts after it
// streamed by multipart upload from a queue that a few threads drain.
//
// Offsets map to parts so: part 1 (the front) is [0, F) with F = min(8 MiB,
// P); part k >= 2 is [F + (k-2)P, F + (k-1)P). The part "filling" is the one
// holding the furthest byte written; every part between the front and it is
// queued (a part never written goes as zeros) and may no longer change.
#include "blockio/s3_upload.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "blockio/thread.h"

namespace barge {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kMinPartBytes = 8 * kMiB;
constexpr uint64_t kMaxParts = 10000;

}  // namespace

uint64_t S3PartBytes(uint64_t size_hint) {
  if (size_hint <= kMinPartBytes) return kMinPartBytes;
  // The front is one part of 8 MiB; the rest fits in the other 9,999.
  const uint64_t rest = size_hint - kMinPartBytes;
  uint64_t part = (rest + (kMaxParts - 1) - 1) / (kMaxParts - 1);
  part = (part + kMiB - 1) / kMiB * kMiB;
  return std::max(part, kMinPartBytes);
}

struct S3Upload::State {
  S3Client& client;
  const S3Location at;
  const std::string shown;
  const S3UploadOptions options;
  const uint64_t part_bytes;   // P
  const uint64_t front_bytes;  // F
  const int budget_parts;      // parts (besides the front) held at once

  std::mutex mu;
  std::condition_variable cv;  // parts sent, budget freed, failure
  uint64_t size = 0;
  std::vector<std::byte> front;             // [0, front.size()), grows as written
  std::map<int, std::vector<std::byte>> held;  // filling and queued/in-flight parts
  int filling = 2;                          // the part writes may still land in
  std::deque<int> queue;                    // parts to send, ascending
  int in_flight = 0;
  std::vector<S3Part> sent;                 // parts uploaded (not the front)
  std::optional<Error> failure;             // the first part that failed for good
  bool stopping = false, published = false, aborted = false;
  bool kept = false;            // Keep: let go unaborted
  uint64_t kept_end = 0;        // Continue: where writing went on from
  size_t dropped = 0;           // Continue: journaled parts not kept
  std::string dropped_reason;   // why the first of them was not
  uint64_t bytes_sent = 0;
  int parts_sent = 0;
  std::vector<std::thread> workers;

  std::mutex create_mu;   // guards upload_id while it is created
  std::string upload_id;  // "" until the first part needs it

  State(S3Client& c, S3Location a, S3UploadOptions o, uint64_t p, uint64_t f)
      : client(c),
        at(std::move(a)),
        shown(at.shown()),
        options(o),
        part_bytes(p),
        front_bytes(f),
        budget_parts(static_cast<int>(std::max<uint64_t>(
            1, o.memory_bytes > front_bytes ? (o.memory_bytes - front_bytes) / p : 1))) {}

  int PartOf(uint64_t offset) const {
    if (offset < front_bytes) return 1;
    return static_cast<int>(2 + (offset - front_bytes) / part_bytes);
  }
  uint64_t PartStart(int part) const {
    return part == 1 ? 0 : front_bytes + static_cast<uint64_t>(part - 2) * part_bytes;
  }
  uint64_t PartEnd(int part) const { return part == 1 ? front_bytes : PartStart(part) + part_bytes; }

  Error Behind(uint64_t offset) const {
    return Error::NotSupported("objects in a bucket are written front to back: a write at offset " +
                               std::to_string(offset) + " is behind the part being filled (from offset " +
                               std::to_string(PartStart(filling)) + ")")
        .set_path(shown);
  }

  Result<std::string> UploadId() {
    std::lock_guard lock(create_mu);
    if (upload_id.empty()) {
      BARGE_ASSIGN_OR_RETURN(upload_id, client.CreateMultipart(at, {options.retention}));
    }
    return upload_id;
  }

  // The first failure, after which the upload is aborted (once) and every
  // call returns it. Called with `lock` held; waits for the parts in flight.
  Status FailedLocked(std::unique_lock<std::mutex>& lock) {
    if (!failure) return OkStatus();
    queue.clear();
    cv.wait(lock, [&] { return in_flight == 0; });
    if (!aborted) {
      aborted = true;
      held.clear();
      lock.unlock();
      (void)AbortUpload();
      lock.lock();
    }
    return *failure;
  }

  Status AbortUpload() {
    std::string id;
    {
      std::lock_guard c(create_mu);
      id = std::exchange(upload_id, std::string());
    }
    if (id.empty()) return OkStatus();
    return client.AbortMultipart(at, id);
  }

  void Work() {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      const int part = queue.front();
      queue.pop_front();
      ++in_flight;
      const std::vector<std::byte>& body = held[part];
      lock.unlock();
      Result<std::string> etag = UploadId();
      if (etag.ok()) etag = client.UploadPart(at, *etag, part, body);
      lock.lock();
      --in_flight;
      if (etag.ok()) {
        sent.push_back(S3Part{part, std::move(*etag), held[part].size()});
        bytes_sent += held[part].size();
        ++parts_sent;
      } else if (!failure) {
        failure = std::move(etag).error().Wrap("uploading part " + std::to_string(part));
      }
      held.erase(part);
      cv.notify_all();
    }
  }

  Status StartWorkers() {
    if (!workers.empty()) return OkStatus();
    const int n = std::max(1, options.parts_in_flight);
    for (int i = 0; i < n; ++i) {
      BARGE_ASSIGN_OR_RETURN(std::thread t, StartThread("S3 part upload", [this] { Work(); }));
      workers.push_back(std::move(t));
    }
    return OkStatus();
  }

  // Waits until a buffer for one more part fits in the budget.
  Status WaitBudgetLocked(std::unique_lock<std::mutex>& lock) {
    for (;;) {
      BARGE_RETURN_IF_ERROR(FailedLocked(lock));
      if (static_cast<int>(held.size()) < budget_parts) return OkStatus();
      cv.wait(lock);
    }
  }

  // Queues every part from `filling` up to `part` (excluded), padded with
  // zeros up to its end or `end`, whichever is first, and makes `part` the
  // one filling.
  Status AdvanceLocked(std::unique_lock<std::mutex>& lock, int part, uint64_t end) {
    if (part <= filling) return OkStatus();
    BARGE_RETURN_IF_ERROR(StartWorkers());
    while (filling < part) {
      const int next = filling;
      if (!held.contains(next)) {
        BARGE_RETURN_IF_ERROR(WaitBudgetLocked(lock));
        if (filling != next) continue;  // another writer queued it meanwhile
      }
      std::vector<std::byte>& body = held[next];
      body.resize(std::min(PartEnd(next), end) - PartStart(next), std::byte{0});
      queue.push_back(next);
      ++filling;
      cv.notify_all();
    }
    return OkStatus();
  }

  // Copies `data` (or zeros where it is null) to [offset, offset+length).
  Status Write(uint64_t offset, uint64_t length, const std::byte* data) {
    std::unique_lock lock(mu);
    BARGE_RETURN_IF_ERROR(FailedLocked(lock));
    if (published) return Error::NotSupported("the object is already published").set_path(shown);
    if (length == 0) return OkStatus();
    const uint64_t end = offset + length;
    if (static_cast<uint64_t>(PartOf(end - 1)) > kMaxParts) return TooLarge();
    uint64_t pos = offset;
    while (pos < end) {
      const int part = PartOf(pos);
      if (part != 1 && part < filling) return Behind(pos);
      BARGE_RETURN_IF_ERROR(AdvanceLocked(lock, part, PartStart(part)));
      if (part != 1 && !held.contains(part)) {
        BARGE_RETURN_IF_ERROR(WaitBudgetLocked(lock));
        if (part < filling) return Behind(pos);  // another writer went on while we waited
      }
      std::vector<std::byte>& buffer = part == 1 ? front : held[part];
      const uint64_t start = PartStart(part);
      const uint64_t n = std::min(end, PartEnd(part)) - pos;
      if (buffer.size() < pos - start + n) buffer.resize(pos - start + n, std::byte{0});
      if (data == nullptr) {
        std::fill_n(buffer.begin() + (pos - start), n, std::byte{0});
      } else {
        std::copy_n(data + (pos - offset), n, buffer.begin() + (pos - start));
      }
      pos += n;
    }
    size = std::max(size, end);
    return OkStatus();
  }

  Error TooLarge() const {
    return Error::NotSupported("the object needs more than 10,000 parts of " + std::to_string(part_bytes) +
                               " bytes: give its expected size (size_hint) for larger parts")
        .set_path(shown);
  }

  void Stop() {
    {
      std::lock_guard lock(mu);
      stopping = true;
      queue.clear();
    }
    cv.notify_all();
    for (std::thread& t : workers) t.join();
    workers.clear();
  }
};

S3Upload::S3Upload(std::unique_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<S3Upload>> S3Upload::Start(S3Client& client, S3Location at, S3UploadOptions options) {
  if (at.key.empty() || at.key.back() == '/') {
    return Error::InvalidArgument("an object needs a key (not a bucket or a prefix)").set_path(at.shown());
  }
  const uint64_t part = options.test_part_bytes ? options.test_part_bytes : S3PartBytes(options.size_hint);
  return std::unique_ptr<S3Upload>(
      new S3Upload(std::make_unique<State>(client, std::move(at), options, part, std::min(kMinPartBytes, part))));
}

S3Upload::~S3Upload() {
  state_->Stop();
  if (!state_->published && !state_->kept) (void)state_->AbortUpload();
}

const std::string& S3Upload::name() const { return state_->shown; }

uint64_t S3Upload::size_bytes() const {
  std::lock_guard lock(state_->mu);
  return state_->size;
}

SinkCapabilities S3Upload::capabilities() const {
  SinkCapabilities c;
  c.can_grow = true;
  c.zero_initialized = true;
  return c;
}

Status S3Upload::WriteAt(uint64_t offset, std::span<const std::byte> data) {
  return state_->Write(offset, data.size(), data.data());
}

Status S3Upload::WriteZeroes(uint64_t offset, uint64_t length) { return state_->Write(offset, length, nullptr); }

Status S3Upload::Flush() {
  State& s = *state_;
  std::unique_lock lock(s.mu);
  s.cv.wait(lock, [&] { return (s.queue.empty() && s.in_flight == 0) || s.failure; });
  return s.FailedLocked(lock);
}

Status S3Upload::Truncate(uint64_t size_bytes) {
  State& s = *state_;
  std::unique_lock lock(s.mu);
  BARGE_RETURN_IF_ERROR(s.FailedLocked(lock));
  if (s.published) return Error::NotSupported("the object is already published").set_path(s.shown);
  if (size_bytes < s.size) {
    if (s.filling > 2 && size_bytes < s.PartStart(s.filling)) {
      return Error::NotSupported("objects in a bucket are written front to back: cannot cut to " +
                                 std::to_string(size_bytes) + " bytes, parts after it are sent")
          .set_path(s.shown);
    }
    // Bytes past the new end read as zeros if the object grows again.
    if (s.front.size() > size_bytes) s.front.resize(size_bytes);
    for (auto& [part, body] : s.held) {
      const uint64_t start = s.PartStart(part);
      if (part >= s.filling && body.size() > 0 && start + body.size() > size_bytes) {
        body.resize(size_bytes > start ? size_bytes - start : 0);
      }
    }
  }
  s.size = size_bytes;
  return OkStatus();
}

Status S3Upload::Publish(bool if_absent) {
  State& s = *state_;
  std::unique_lock lock(s.mu);
  BARGE_RETURN_IF_ERROR(s.FailedLocked(lock));
  if (s.published) return Error::NotSupported("the object is already published").set_path(s.shown);
  if (s.filling == 2 && s.size <= s.front_bytes) {
    // Within the front part: one PUT, no multipart upload.
    s.front.resize(s.size, std::byte{0});
    lock.unlock();
    const S3Client::PutOptions put{s.options.retention};
    Status st = if_absent ? s.client.PutIfAbsent(s.at, s.front, put) : s.client.Put(s.at, s.front, put);
    lock.lock();
    if (!st.ok()) return st;
    s.published = true;
    s.bytes_sent += s.size;
    ++s.parts_sent;
    return OkStatus();
  }
  const int last = s.PartOf(s.size - 1);
  if (static_cast<uint64_t>(last) > kMaxParts) return s.TooLarge();
  BARGE_RETURN_IF_ERROR(s.AdvanceLocked(lock, last + 1, s.size));
  s.cv.wait(lock, [&] { return (s.queue.empty() && s.in_flight == 0) || s.failure; });
  BARGE_RETURN_IF_ERROR(s.FailedLocked(lock));
  s.front.resize(s.front_bytes, std::byte{0});
  std::vector<S3Part> parts = s.sent;
  lock.unlock();
  BARGE_ASSIGN_OR_RETURN(std::string id, s.UploadId());
  BARGE_ASSIGN_OR_RETURN(std::string etag, s.client.UploadPart(s.at, id, 1, s.front));
  parts.push_back(S3Part{1, std::move(etag)});
  std::sort(parts.begin(), parts.end(), [](const S3Part& a, const S3Part& b) { return a.number < b.number; });
  if (if_absent) {
    // S3 has no conditional complete on every server: a HEAD right before
    // completing is the check (a writer racing past it is not caught).
    Result<S3ObjectInfo> there = s.client.Head(s.at);
    if (there.ok()) return Error::Busy("already exists").set_path(s.shown);
    if (there.error().code() != ErrorCode::kNotFound) return std::move(there).error();
  }
  BARGE_RETURN_IF_ERROR(s.client.CompleteMultipart(s.at, id, parts));
  if (s.options.retention) {
    // radosgw 16 drops the lock headers of CreateMultipart: the completed
    // object gets its retention here when it lacks it (a moment without).
    Result<S3Retention> has = s.client.GetRetention(s.at);
    if (!has.ok() && has.error().code() != ErrorCode::kNotFound) return std::move(has).error();
    if (!has.ok() || has->until_unix < s.options.retention->until_unix) {
      BARGE_RETURN_IF_ERROR(s.client.PutRetention(s.at, *s.options.retention));
    }
  }
  lock.lock();
  s.published = true;
  s.bytes_sent += s.front.size();
  ++s.parts_sent;
  s.front = {};
  return OkStatus();
}

Status S3Upload::Abort() {
  State& s = *state_;
  {
    std::unique_lock lock(s.mu);
    if (s.published) return Error::NotSupported("the object is already published").set_path(s.shown);
    if (!s.failure) s.failure = Error::Cancelled("the upload was aborted").set_path(s.shown);
    s.queue.clear();
    s.cv.wait(lock, [&] { return s.in_flight == 0; });
    s.aborted = true;
    s.held.clear();
  }
  return s.AbortUpload();
}

S3UploadJournal S3Upload::Journal() const {
  State& s = *state_;
  S3UploadJournal j;
  j.part_bytes = s.part_bytes;
  j.front_bytes = s.front_bytes;
  {
    std::lock_guard c(s.create_mu);
    j.upload_id = s.upload_id;
  }
  std::lock_guard lock(s.mu);
  std::vector<S3Part> sent = s.sent;
  std::sort(sent.begin(), sent.end(), [](const S3Part& a, const S3Part& b) { return a.number < b.number; });
  for (const S3Part& p : sent) {
    if (p.number != static_cast<int>(2 + j.parts.size()) || p.size != s.part_bytes) break;
    j.parts.push_back(p);
  }
  return j;
}

Status S3Upload::Keep() {
  State& s = *state_;
  std::optional<Error> failed;
  {
    std::unique_lock lock(s.mu);
    if (s.published) return Error::NotSupported("the object is already published").set_path(s.shown);
    s.queue.clear();
    s.cv.wait(lock, [&] { return s.in_flight == 0; });
    failed = s.failure;
    if (!s.failure) s.failure = Error::NotSupported("the upload was kept for a later run").set_path(s.shown);
    s.aborted = true;  // FailedLocked must not abort it
    s.kept = true;
    s.held.clear();
    s.front = {};
  }
  s.Stop();
  if (failed) return *failed;
  return OkStatus();
}

namespace {

// An ETag as a header or a listing gives it, without its quotes.
std::string_view Unquoted(std::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') return etag.substr(1, etag.size() - 2);
  return etag;
}

}  // namespace

Result<std::unique_ptr<S3Upload>> S3Upload::Continue(S3Client& client, S3Location at, const S3UploadJournal& journal,
                                                     S3UploadOptions options) {
  if (at.key.empty() || at.key.back() == '/') {
    return Error::InvalidArgument("an object needs a key (not a bucket or a prefix)").set_path(at.shown());
  }
  if (journal.part_bytes == 0 || journal.front_bytes == 0 || journal.front_bytes > journal.part_bytes) {
    return Error::InvalidArgument("the upload's journal gives no part layout").set_path(at.shown());
  }
  std::map<int, S3Part> listed;
  if (!journal.upload_id.empty()) {
    BARGE_ASSIGN_OR_RETURN(std::vector<S3Part> parts, client.ListParts(at, journal.upload_id));
    for (S3Part& p : parts) listed.emplace(p.number, std::move(p));
  }
  std::vector<S3Part> kept;
  std::string reason;
  for (const S3Part& want : journal.parts) {
    const int number = static_cast<int>(2 + kept.size());
    auto it = listed.find(want.number);
    if (want.number != number) {
      reason = "the journal's part " + std::to_string(want.number) + " is out of order";
    } else if (it == listed.end()) {
      reason = "part " + std::to_string(number) + " is no longer in the upload";
    } else if (it->second.size != journal.part_bytes || want.size != journal.part_bytes) {
      reason = "part " + std::to_string(number) + " is of another size (" + std::to_string(it->second.size) + " bytes)";
    } else if (Unquoted(it->second.etag) != Unquoted(want.etag)) {
      reason = "part " + std::to_string(number) + " was replaced (its ETag differs)";
    }
    if (!reason.empty()) break;
    kept.push_back(it->second);
  }
  auto state = std::make_unique<State>(client, std::move(at), options, journal.part_bytes, journal.front_bytes);
  if (kept.empty()) {
    // Nothing to keep: the old upload goes (best effort; a sweep takes it
    // otherwise), and this one starts afresh.
    if (!journal.upload_id.empty()) (void)client.AbortMultipart(state->at, journal.upload_id);
  } else {
    state->upload_id = journal.upload_id;
  }
  state->dropped = journal.parts.size() - kept.size();
  state->dropped_reason = std::move(reason);
  state->filling = static_cast<int>(2 + kept.size());
  state->kept_end = state->PartStart(state->filling);
  state->size = kept.empty() ? 0 : state->kept_end;
  state->sent = std::move(kept);
  return std::unique_ptr<S3Upload>(new S3Upload(std::move(state)));
}

uint64_t S3Upload::kept_end() const { return state_->kept_end; }
size_t S3Upload::dropped_parts() const { return state_->dropped; }
const std::string& S3Upload::dropped_reason() const { return state_->dropped_reason; }

uint64_t S3Upload::bytes_sent() const {
  std::lock_guard lock(state_->mu);
  return state_->bytes_sent;
}

int S3Upload::parts_sent() const {
  std::lock_guard lock(state_->mu);
  return state_->parts_sent;
}

}  // namespace barge
