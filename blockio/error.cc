// Error construction from errno and its human-readable form.
#include "blockio/error.h"

#include <cerrno>
#include <cstring>
#include <sstream>

namespace barge {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kIoError: return "IoError";
    case ErrorCode::kCorruption: return "Corruption";
    case ErrorCode::kNotSupported: return "NotSupported";
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kNotFound: return "NotFound";
    case ErrorCode::kNoSpace: return "NoSpace";
    case ErrorCode::kCancelled: return "Cancelled";
    case ErrorCode::kBusy: return "Busy";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Unknown";
}

namespace {

ErrorCode CodeForErrno(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return ErrorCode::kNoSpace;
    case ENOENT:
      return ErrorCode::kNotFound;
    case EINVAL:
      return ErrorCode::kInvalidArgument;
    case EOPNOTSUPP:
    case ENOSYS:
      return ErrorCode::kNotSupported;
    case ECANCELED:
      return ErrorCode::kCancelled;
    case EBUSY:
      return ErrorCode::kBusy;
    default:
      return ErrorCode::kIoError;
  }
}

bool RetryableErrno(int err) {
  return err == EINTR || err == EAGAIN || err == EBUSY || err == ETIMEDOUT;
}

}  // namespace

Error Error::FromErrno(int err, std::string_view operation, std::string_view path) {
  Error e(CodeForErrno(err), std::string(operation) + " failed");
  e.errno_ = err;
  e.retryable_ = RetryableErrno(err);
  e.path_ = std::string(path);
  return e;
}

Error Error::FromErrno(int err, std::string_view operation, std::string_view path,
                       uint64_t offset, uint64_t length) {
  Error e = FromErrno(err, operation, path);
  e.set_range(offset, length);
  return e;
}

Error& Error::Wrap(std::string_view outer) {
  // A layer that wraps with the name an inner layer already gave ("backup"
  // around "backup: read: ...") adds nothing: the prefix is said once.
  const std::string prefix = std::string(outer) + ": ";
  if (message_.starts_with(prefix) || message_ == outer) return *this;
  message_ = prefix + message_;
  return *this;
}

Error& Error::Also(const Result<void>& cleanup) {
  if (!cleanup.ok()) message_ += "; cleanup also failed: " + cleanup.error().ToString();
  return *this;
}

std::string Error::ToString() const {
  std::ostringstream out;
  out << ErrorCodeName(code_) << ": ";
  if (!path_.empty()) out << path_ << ": ";
  out << message_;
  bool open = false;
  auto sep = [&]() {
    out << (open ? ", " : " (");
    open = true;
  };
  if (offset_) {
    sep();
    out << "offset 0x" << std::hex << *offset_ << std::dec;
  }
  if (length_) {
    sep();
    out << "length " << *length_;
  }
  if (errno_ != 0) {
    sep();
    out << "errno " << errno_ << ": " << std::strerror(errno_);
  }
  if (open) out << ")";
  return out.str();
}

}  // namespace barge
