// The resume journal (docs/formats/resume.md), the check of a staged image
// against it, and the destination that writes it.
#include "pipeline/backup_resume.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "formats/extents_file.h"
#include "formats/json_fields.h"
#include "formats/qcow2_compress.h"
#include "formats/units.h"
#include "pipeline/chain_files.h"
#include "pipeline/file_access.h"
#include "pipeline/resume.h"
#include "pipeline/small_file.h"

namespace barge::pipeline {
namespace {

constexpr char kMagic[8] = {'B', 'A', 'R', 'G', 'E', 'R', 'S', 'M'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kRecordMagic = 0x42524350;  // "BRCP"
constexpr size_t kEntryBytes = 40;
constexpr size_t kRecordHead = 24;
// A journal larger than this is not read (a 64 TiB disk at 64 KiB clusters
// journals 40 GiB... far beyond; 4 GiB covers 6 TiB of stored clusters).
constexpr uint64_t kMaxJournalBytes = 4ull << 30;

void Put32(std::vector<std::byte>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(std::byte(v >> (8 * i)));
}
void Put64(std::vector<std::byte>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(std::byte(v >> (8 * i)));
}
uint32_t Get32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint64_t Get64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}
uint64_t Checksum(const std::byte* p, size_t n) { return XXH3_64bits(p, n); }

nlohmann::json KeyJson(const ResumeKey& k) {
  return {{"id", k.id},
          {"started_at", k.started_at},
          {"image", k.image},
          {"type", k.type},
          {"disk", k.disk},
          {"source_stamp", k.source_stamp},
          {"virtual_size", k.virtual_size},
          {"cluster_size", k.cluster_size},
          {"compression", k.compression},
          {"parent", k.parent},
          {"checkpoint", k.checkpoint},
          {"work_digest", k.work_digest},
          {"tool_version", k.tool_version}};
}

ResumeKey KeyFrom(const nlohmann::json& j) {
  using formats::JsonString;
  ResumeKey k;
  k.id = JsonString(j, "id");
  k.started_at = JsonString(j, "started_at");
  k.image = JsonString(j, "image");
  k.type = JsonString(j, "type");
  k.disk = JsonString(j, "disk");
  k.source_stamp = JsonString(j, "source_stamp");
  k.virtual_size = formats::JsonUint(j, "virtual_size");
  k.cluster_size = static_cast<uint32_t>(formats::JsonUint(j, "cluster_size"));
  k.compression = JsonString(j, "compression");
  k.parent = JsonString(j, "parent");
  k.checkpoint = JsonString(j, "checkpoint");
  k.work_digest = JsonString(j, "work_digest");
  k.tool_version = JsonString(j, "tool_version");
  return k;
}

std::vector<std::byte> EncodeRecord(std::span<const JournalEntry> entries, uint64_t next_cluster, uint64_t end_bytes) {
  std::vector<std::byte> out;
  out.reserve(kRecordHead + entries.size() * kEntryBytes + 8);
  Put32(out, kRecordMagic);
  Put32(out, static_cast<uint32_t>(entries.size()));
  Put64(out, next_cluster);
  Put64(out, end_bytes);
  for (const JournalEntry& e : entries) {
    Put64(out, e.stored.cluster_index);
    Put32(out, static_cast<uint32_t>(e.stored.kind));
    Put32(out, e.stored.payload_bytes);
    Put64(out, e.digest.low);
    Put64(out, e.digest.high);
    Put64(out, 0);  // reserved
  }
  Put64(out, Checksum(out.data(), out.size()));
  return out;
}

// Reads [offset, offset + out.size()) of `src`; what lies beyond its end
// reads as zeros (a writer that skipped zero blocks at the end of what it
// synced left the file shorter than its end).
Status ReadZeroFilled(BlockSource& src, uint64_t offset, std::span<std::byte> out) {
  uint64_t size = src.size_bytes();
  uint64_t have = offset >= size ? 0 : std::min<uint64_t>(out.size(), size - offset);
  std::fill(out.begin() + static_cast<ptrdiff_t>(have), out.end(), std::byte{0});
  if (have == 0) return OkStatus();
  return src.ReadAt(offset, out.first(have));
}

}  // namespace

std::string ResumeMismatch(const ResumeKey& staged, const ResumeKey& now) {
  using formats::HumanBytesExact;
  if (staged.tool_version != now.tool_version) return "staged by barge " + staged.tool_version;
  if (staged.type != now.type) return "the staged backup was a " + staged.type + " one";
  if (staged.disk != now.disk) return "staged from another disk (" + staged.disk + ")";
  if (staged.virtual_size != now.virtual_size) {
    return "the source's size changed from " + HumanBytesExact(staged.virtual_size) + " to " +
           HumanBytesExact(now.virtual_size);
  }
  if (staged.source_stamp != now.source_stamp) return "the source file changed since it was staged";
  if (staged.cluster_size != now.cluster_size) {
    return "staged with " + HumanBytesExact(staged.cluster_size) + " clusters, now " +
           HumanBytesExact(now.cluster_size);
  }
  if (staged.compression != now.compression) {
    return "staged with compression " + staged.compression + ", now " + now.compression;
  }
  if (staged.parent != now.parent) return "the chain's latest point changed since";
  if (staged.checkpoint != now.checkpoint) {
    return "staged at checkpoint '" + staged.checkpoint + "', now '" + now.checkpoint + "'";
  }
  if (staged.work_digest != now.work_digest) return "the blocks to copy differ from the staged backup's";
  if (staged.id != now.id || staged.image != now.image) return "the chain changed since";
  return "";
}

std::string RangesDigest(const RangeList& ranges) {
  std::vector<std::byte> bytes;
  bytes.reserve(ranges.size() * 16);
  for (const Range& r : ranges) {
    Put64(bytes, r.offset);
    Put64(bytes, r.length);
  }
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return formats::Digest128{h.low64, h.high64}.ToHex();
}

Result<LoadedJournal> LoadResumeJournal(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(std::string text, ReadChainFile(env, path, kMaxJournalBytes));
  return DecodeResumeJournal(text, path);
}

Result<LoadedJournal> DecodeResumeJournal(std::string_view text, const std::string& path) {
  const auto* p = reinterpret_cast<const std::byte*>(text.data());
  const size_t n = text.size();
  auto bad = [&](const std::string& what) { return Error::Corruption("resume journal: " + what).set_path(path); };
  if (n < 24 || std::memcmp(p, kMagic, 8) != 0) return bad("not a resume journal");
  if (Get32(p + 8) != kVersion) return bad("version " + std::to_string(Get32(p + 8)));
  uint64_t key_bytes = Get32(p + 12);
  if (16 + key_bytes + 8 > n) return bad("header cut short");
  if (Get64(p + 16 + key_bytes) != Checksum(p, 16 + key_bytes)) return bad("header checksum");
  nlohmann::json j = nlohmann::json::parse(text.substr(16, key_bytes), nullptr, false);
  if (!j.is_object()) return bad("header is not a JSON object");
  LoadedJournal out;
  out.key = KeyFrom(j);
  size_t at = 16 + key_bytes + 8;
  while (at < n) {
    if (n - at < kRecordHead + 8 || Get32(p + at) != kRecordMagic) {
      out.torn = true;
      break;
    }
    uint64_t count = Get32(p + at + 4);
    uint64_t length = kRecordHead + count * kEntryBytes;
    if (n - at < length + 8 || Get64(p + at + length) != Checksum(p + at, length)) {
      out.torn = true;
      break;
    }
    out.next_cluster = Get64(p + at + 8);
    out.end_bytes = Get64(p + at + 16);
    for (uint64_t i = 0; i < count; ++i) {
      const std::byte* e = p + at + kRecordHead + i * kEntryBytes;
      JournalEntry entry;
      entry.stored.cluster_index = Get64(e);
      entry.stored.kind = static_cast<formats::StoredKind>(Get32(e + 8));
      entry.stored.payload_bytes = Get32(e + 12);
      entry.digest = {Get64(e + 16), Get64(e + 24)};
      out.entries.push_back(entry);
    }
    at += length + 8;
  }
  return out;
}

std::unique_ptr<EnvLock> SpareResumableImage(Env& env, const std::string& dir) {
  auto src = env.OpenSource(dir + "/" + std::string(kResumeJournalName), ChainFileOptions());
  if (!src.ok() || (*src)->size_bytes() < 24) return nullptr;
  std::byte head[16];
  if (!(*src)->ReadAt(0, head).ok() || std::memcmp(head, kMagic, 8) != 0) return nullptr;
  uint64_t key_bytes = Get32(head + 12);
  if (key_bytes > (1u << 20) || 16 + key_bytes > (*src)->size_bytes()) return nullptr;
  std::string key(key_bytes, '\0');
  if (!(*src)->ReadAt(16, std::as_writable_bytes(std::span(key.data(), key.size()))).ok()) return nullptr;
  nlohmann::json j = nlohmann::json::parse(key, nullptr, false);
  std::string image = formats::JsonString(j, "image");
  if (image.empty() || image.find('/') != std::string::npos) return nullptr;
  return SpareKeptFile(env, TempPathFor(dir + "/" + image));
}

Result<StagedCheck> CheckStaged(Env& env, const std::string& staged_path, const formats::Qcow2WriterOptions& options,
                                const LoadedJournal& journal, const StagedClusterFn& on_cluster) {
  StagedCheck check;
  auto layout = formats::Qcow2Writer::PlanStored(options, StoredClusters(journal.entries));
  if (!layout.ok() || layout->end_bytes != journal.end_bytes) {
    check.problem = "the journal does not match the staged image's layout";
    return check;
  }
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> src, env.OpenSource(staged_path));
  const uint32_t cs = 1u << options.cluster_bits;
  const uint64_t disk_clusters = (options.virtual_size + cs - 1) / cs;
  std::vector<std::byte> cluster(cs);
  std::vector<std::byte> payload(cs);
  const formats::Digest128 zero = formats::ZeroClusterDigest(cs);
  for (size_t i = 0; i < journal.entries.size(); ++i) {
    const JournalEntry& e = journal.entries[i];
    uint64_t index = e.stored.cluster_index;
    uint32_t length = index + 1 == disk_clusters && options.virtual_size % cs != 0
                          ? static_cast<uint32_t>(options.virtual_size % cs)
                          : cs;
    uint64_t host = layout->host_offsets[i];
    Status read;
    formats::Digest128 got = zero;
    switch (e.stored.kind) {
      case formats::StoredKind::kZero:
        break;
      case formats::StoredKind::kData:
        read = ReadZeroFilled(*src, host, std::span(cluster).first(length));
        if (read.ok()) got = formats::HashCluster(std::span(cluster).first(length), cs);
        break;
      case formats::StoredKind::kCompressed:
        read = ReadZeroFilled(*src, host, std::span(payload).first(e.stored.payload_bytes));
        if (read.ok()) {
          read = formats::DecompressCluster(options.compression, std::span(payload).first(e.stored.payload_bytes),
                                            cluster);
        }
        if (read.ok()) got = formats::HashCluster(std::span(cluster).first(length), cs);
        break;
    }
    if (read.ok() && got == e.digest && on_cluster && e.stored.kind != formats::StoredKind::kZero) {
      BARGE_RETURN_IF_ERROR(on_cluster(index, std::span(cluster).first(length)));
    }
    if (!read.ok() || got != e.digest) {
      check.kept_entries = i;
      check.next_cluster = index;
      check.problem = "cluster " + std::to_string(index) + " (guest offset " + std::to_string(index * cs) + ") " +
                      (read.ok() ? "does not match its digest" : "cannot be read: " + read.error().message());
      return check;
    }
  }
  check.kept_entries = journal.entries.size();
  check.next_cluster = journal.next_cluster;
  return check;
}

std::vector<formats::StoredCluster> StoredClusters(std::span<const JournalEntry> entries) {
  std::vector<formats::StoredCluster> stored;
  stored.reserve(entries.size());
  for (const JournalEntry& e : entries) stored.push_back(e.stored);
  return stored;
}

Result<StagedCheck> CheckStagedRaw(Env& env, const std::string& staged_path, uint64_t virtual_size,
                                   uint32_t cluster_bytes, const LoadedJournal& journal,
                                   const StagedClusterFn& on_cluster) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> src, env.OpenSource(staged_path));
  return CheckStagedRaw(*src, virtual_size, cluster_bytes, journal, on_cluster);
}

Result<StagedCheck> CheckStagedRaw(BlockSource& staged, uint64_t virtual_size, uint32_t cluster_bytes,
                                   const LoadedJournal& journal, const StagedClusterFn& on_cluster) {
  BlockSource* src = &staged;
  StagedCheck check;
  const uint64_t cs = cluster_bytes;
  const uint64_t disk_clusters = (virtual_size + cs - 1) / cs;
  if (cs == 0 || journal.next_cluster > disk_clusters) {
    check.problem = "the journal does not match the staged copy's size";
    return check;
  }
  for (size_t i = 0; i < journal.entries.size(); ++i) {
    const JournalEntry& e = journal.entries[i];
    if (e.stored.kind != formats::StoredKind::kData || e.stored.cluster_index >= journal.next_cluster ||
        (i > 0 && e.stored.cluster_index <= journal.entries[i - 1].stored.cluster_index)) {
      check.problem = "the journal does not match a raw copy";
      return check;
    }
  }
  std::vector<std::byte> cluster(cs);
  const formats::Digest128 zero = formats::ZeroClusterDigest(cluster_bytes);
  size_t at = 0;
  for (uint64_t index = 0; index < journal.next_cluster; ++index) {
    uint32_t length = index + 1 == disk_clusters && virtual_size % cs != 0 ? static_cast<uint32_t>(virtual_size % cs)
                                                                           : cluster_bytes;
    const bool journaled = at < journal.entries.size() && journal.entries[at].stored.cluster_index == index;
    Status read = ReadZeroFilled(*src, index * cs, std::span(cluster).first(length));
    formats::Digest128 got = read.ok() ? formats::HashCluster(std::span(cluster).first(length), cluster_bytes) : zero;
    const formats::Digest128 want = journaled ? journal.entries[at].digest : zero;
    if (!read.ok() || got != want) {
      check.kept_entries = at;
      check.next_cluster = index;
      check.problem = "cluster " + std::to_string(index) + " (offset " + std::to_string(index * cs) + ") " +
                      (!read.ok()   ? "cannot be read: " + read.error().message()
                       : journaled ? std::string("does not match its digest")
                                   : std::string("should read as zeros and does not"));
      return check;
    }
    if (journaled) {
      if (on_cluster) BARGE_RETURN_IF_ERROR(on_cluster(index, std::span(cluster).first(length)));
      ++at;
    }
  }
  check.kept_entries = journal.entries.size();
  check.next_cluster = journal.next_cluster;
  return check;
}

LoadedJournal JournalUpTo(const LoadedJournal& journal, uint64_t cluster) {
  LoadedJournal out;
  out.key = journal.key;
  for (const JournalEntry& e : journal.entries) {
    if (e.stored.cluster_index >= cluster) break;
    out.entries.push_back(e);
  }
  out.next_cluster = std::min(cluster, journal.next_cluster);
  out.end_bytes = journal.end_bytes;
  out.torn = journal.torn;
  return out;
}

Result<std::unique_ptr<ResumeJournal>> ResumeJournal::Create(Env& env, const std::string& path, const ResumeKey& key,
                                                             std::span<const JournalEntry> kept, uint64_t next_cluster,
                                                             uint64_t end_bytes) {
  BARGE_ASSIGN_OR_RETURN(std::string key_text, formats::DumpJson(KeyJson(key), -1, "the resume journal"));
  std::vector<std::byte> bytes;
  for (char c : kMagic) bytes.push_back(std::byte(c));
  Put32(bytes, kVersion);
  Put32(bytes, static_cast<uint32_t>(key_text.size()));
  for (char c : key_text) bytes.push_back(std::byte(c));
  Put64(bytes, Checksum(bytes.data(), bytes.size()));
  std::unique_ptr<ResumeJournal> journal(new ResumeJournal(env, path));
  if (!kept.empty() || next_cluster > 0) {
    std::vector<std::byte> record = EncodeRecord(kept, next_cluster, end_bytes);
    bytes.insert(bytes.end(), record.begin(), record.end());
    journal->checkpoints_ = 1;
  }
  BARGE_RETURN_IF_ERROR(WriteFileLikeFolder(env, path, bytes));
  BARGE_ASSIGN_OR_RETURN(journal->sink_, env.OpenSink(path, SinkMode::kExisting, ChainFileOptions()));
  journal->size_bytes_ = bytes.size();
  return journal;
}

Status ResumeJournal::Append(std::span<const JournalEntry> entries, uint64_t next_cluster, uint64_t end_bytes) {
  std::vector<std::byte> record = EncodeRecord(entries, next_cluster, end_bytes);
  BARGE_RETURN_IF_ERROR(sink_->WriteAt(size_bytes_, record));
  BARGE_RETURN_IF_ERROR(sink_->Flush());
  size_bytes_ += record.size();
  ++checkpoints_;
  return OkStatus();
}

Status SaveResumeWork(Env& env, const std::string& path, const RangeList& work, uint64_t virtual_size) {
  std::string text = "{\"format\":\"barge-extents\",\"version\":1,\"virtual_size\":" + std::to_string(virtual_size) +
                     ",\"extents\":[";
  for (size_t i = 0; i < work.size(); ++i) {
    text += (i ? ",{\"offset\":" : "{\"offset\":") + std::to_string(work[i].offset) +
            ",\"length\":" + std::to_string(work[i].length) + "}";
  }
  text += "]}\n";
  return WriteFileLikeFolder(env, path, std::string_view(text));
}

Result<RangeList> LoadResumeWork(Env& env, const std::string& path, uint64_t virtual_size) {
  BARGE_ASSIGN_OR_RETURN(std::string text, ReadChainFile(env, path, 1ull << 30));
  auto file = formats::DecodeExtentsFile(text);
  if (!file.ok()) return Error::Corruption("resume work set: " + file.error().message()).set_path(path);
  if (!file->virtual_size || *file->virtual_size != virtual_size) {
    return Error::Corruption("resume work set is for a disk of another size").set_path(path);
  }
  return std::move(file->dirty);
}

Status ResumeJournal::Remove() {
  sink_.reset();
  return env_.UnlinkIfExists(path_);
}

JournaledDestination::JournaledDestination(Qcow2Destination& inner, ResumeJournal& journal, bool store_zero,
                                           uint64_t checkpoint_bytes, std::chrono::milliseconds checkpoint_interval)
    : JournaledDestination(
          inner, [&inner]() { return inner.writer().Sync(); }, journal, store_zero, checkpoint_bytes,
          checkpoint_interval) {}

JournaledDestination::JournaledDestination(Destination& inner, std::function<Result<uint64_t>()> sync,
                                           ResumeJournal& journal, bool store_zero, uint64_t checkpoint_bytes,
                                           std::chrono::milliseconds checkpoint_interval)
    : inner_(inner),
      sync_(std::move(sync)),
      journal_(journal),
      store_zero_(store_zero),
      checkpoint_bytes_(checkpoint_bytes),
      checkpoint_interval_(checkpoint_interval),
      last_(std::chrono::steady_clock::now()) {}

Status JournaledDestination::Consume(const Chunk& chunk) {
  if (Status st = inner_.Consume(chunk); !st.ok()) {
    failed_ = true;
    return st;
  }
  const bool compressed_ok = inner_.wants_compression();
  for (size_t i = 0; i < chunk.cluster_count(); ++i) {
    if (chunk.states[i] == ClusterState::kSkip) continue;
    bytes_since_ += chunk.ClusterLength(i);
    std::optional<formats::StoredKind> kind = StoredKindOf(chunk.states[i], compressed_ok, store_zero_);
    if (!kind) continue;
    JournalEntry e;
    e.stored.cluster_index = chunk.first_cluster() + i;
    e.stored.kind = *kind;
    e.stored.payload_bytes = *kind == formats::StoredKind::kCompressed ? chunk.payload_bytes[i] : 0;
    e.digest = chunk.digests[i];
    pending_.push_back(e);
  }
  next_cluster_ = chunk.first_cluster() + chunk.cluster_count();
  if (bytes_since_ >= checkpoint_bytes_ || std::chrono::steady_clock::now() - last_ >= checkpoint_interval_) {
    return Checkpoint();
  }
  return OkStatus();
}

Status JournaledDestination::Finish() {
  // Even a failed Finish has begun writing the metadata: nothing to resume.
  failed_ = true;
  return inner_.Finish();
}

Status JournaledDestination::Checkpoint() {
  if (pending_.empty() && next_cluster_ == journaled_next_) return OkStatus();
  if (failed_) return Error::InvalidArgument("resume journal: an earlier write failed");
  // The image first: a checkpoint only ever names bytes already durable.
  auto end = sync_();
  Status appended = end.ok() ? journal_.Append(pending_, next_cluster_, *end) : Status(end.error());
  if (!appended.ok()) {
    failed_ = true;
    return appended;
  }
  pending_.clear();
  journaled_next_ = next_cluster_;
  bytes_since_ = 0;
  last_ = std::chrono::steady_clock::now();
  return OkStatus();
}

}  // namespace barge::pipeline
