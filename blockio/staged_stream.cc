// StageStream: a stream read once into a private, already unlinked file.
#include "blockio/staged_stream.h"

#include <unistd.h>

#include <cerrno>
#include <vector>

namespace barge {
namespace {

// The staged file under the stream's own name: messages never show the
// staging path, which is gone by the time anyone reads them.
class NamedSource final : public BlockSource {
 public:
  NamedSource(std::unique_ptr<BlockSource> file, std::string name) : file_(std::move(file)), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return file_->size_bytes(); }
  SourceCapabilities capabilities() const override { return file_->capabilities(); }
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    auto st = file_->ReadAt(offset, out);
    if (!st.ok()) return Error(st.error()).set_path(name_);
    return st;
  }
  Status ReadMany(std::span<ReadRequest> requests) override { return file_->ReadMany(requests); }
  void WillNeed(uint64_t offset, uint64_t length) override { file_->WillNeed(offset, length); }
  void DontNeed(uint64_t offset, uint64_t length) override { file_->DontNeed(offset, length); }
  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override { return file_->Extents(offset, length); }

 private:
  const std::unique_ptr<BlockSource> file_;
  const std::string name_;
};

}  // namespace

Result<std::unique_ptr<BlockSource>> StageStream(Env& env, const std::string& dir, const std::string& shown_name,
                                                 const std::function<Status(const StreamWriter&)>& fill) {
  BARGE_ASSIGN_OR_RETURN(std::string folder, env.CreateTempDir(dir, ".barge-stage-"));
  const std::string path = folder + "/stream";
  TempRegistration registered_file(path);
  TempRegistration registered_folder(folder);
  // Removes the file and its folder on every way out; the open source
  // keeps its descriptor.
  struct Remove {
    Env& env;
    const std::string& folder;
    const std::string& path;
    ~Remove() {
      IgnoreError(env.UnlinkIfExists(path), "a staged stream in a private folder; the folder goes next");
      IgnoreError(env.RemoveDir(folder), "a private staging folder (.barge-stage-*), empty by now");
    }
  } remove{env, folder, path};
  {
    FileOptions o;
    o.create_mode = 0600;
    o.write_behind = true;
    o.sync = false;  // a scratch file: unlinked before anyone relies on it
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink, env.OpenSink(path, SinkMode::kCreateNew, o));
    StreamWriter write = [&sink](uint64_t offset, std::span<const std::byte> bytes) -> Status {
      return sink->WriteAt(offset, bytes);
    };
    BARGE_RETURN_IF_ERROR(fill(write));
    BARGE_RETURN_IF_ERROR(sink->Flush());
  }
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, env.OpenSource(path));
  return std::unique_ptr<BlockSource>(new NamedSource(std::move(file), shown_name));
}

Result<uint64_t> ReadFdToEnd(int fd, const std::string& shown_name, const StreamWriter& write) {
  std::vector<std::byte> buffer(1 << 20);
  uint64_t total = 0;
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::FromErrno(errno, "read", shown_name);
    if (n == 0) return total;
    BARGE_RETURN_IF_ERROR(write(total, std::span<const std::byte>(buffer.data(), static_cast<size_t>(n))));
    total += static_cast<uint64_t>(n);
  }
}

}  // namespace barge
