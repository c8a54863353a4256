// StagedFile: temporary name, flush, rename, sync.
#include "pipeline/staged_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "blockio/file.h"

namespace barge::pipeline {

namespace fs = std::filesystem;

std::string StagedTempPath(const std::string& final_path) {
  fs::path p(final_path);
  return (p.parent_path() / ("." + p.filename().string() + ".barge-tmp")).string();
}

Status SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error::FromErrno(errno, "open folder", dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Error::FromErrno(err, "fsync folder", dir);
  return OkStatus();
}

Result<std::unique_ptr<StagedFile>> StagedFile::Create(const std::string& final_path,
                                                       bool overwrite, bool sync) {
  std::error_code ec;
  if (!overwrite && fs::exists(final_path, ec)) {
    return Error::InvalidArgument("output exists (remove it or choose another name)")
        .set_path(final_path);
  }
  std::string temp = StagedTempPath(final_path);
  // A leftover from a killed run is ours to replace.
  fs::remove(temp, ec);
  FileOptions options;
  options.sync = sync;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink, OpenFileSink(temp, SinkMode::kCreateNew, options));
  return std::unique_ptr<StagedFile>(new StagedFile(final_path, temp, std::move(sink), overwrite, sync));
}

StagedFile::StagedFile(std::string final_path, std::string temp_path,
                       std::unique_ptr<BlockSink> sink, bool overwrite, bool sync)
    : final_path_(std::move(final_path)), temp_path_(std::move(temp_path)),
      sink_(std::move(sink)), overwrite_(overwrite), sync_(sync) {}

StagedFile::~StagedFile() { Abandon(); }

void StagedFile::Abandon() {
  if (done_) return;
  done_ = true;
  sink_.reset();
  std::error_code ec;
  fs::remove(temp_path_, ec);
}

Status StagedFile::Commit() {
  if (done_) return Error::InvalidArgument("staged file already finished").set_path(final_path_);
  BARGE_RETURN_IF_ERROR(sink_->Flush());
  sink_.reset();
  if (!overwrite_) {
    // link() fails if the target appeared meanwhile; rename() would replace it.
    if (::link(temp_path_.c_str(), final_path_.c_str()) != 0) {
      Status s = Error::FromErrno(errno, "link", final_path_);
      Abandon();
      return s;
    }
    ::unlink(temp_path_.c_str());
  } else if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    Status s = Error::FromErrno(errno, "rename", final_path_);
    Abandon();
    return s;
  }
  done_ = true;
  if (!sync_) return OkStatus();
  return SyncDirectory(fs::path(final_path_).parent_path().string());
}

}  // namespace barge::pipeline
