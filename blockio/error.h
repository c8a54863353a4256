// The one error type of barge: a code the caller can act on, the errno if any,
// and context (operation, file or device, offset, length). See docs/errors.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace barge {

enum class ErrorCode : uint8_t {
  kIoError,          // the disk, file system or peer failed
  kCorruption,       // bytes read from an image break the format's rules
  kNotSupported,     // a feature we do not implement, or a backend lacks
  kInvalidArgument,  // the caller asked for something impossible
  kNotFound,         // a file, bitmap, backup or layer does not exist
  kNoSpace,          // ENOSPC/EDQUOT, or a space estimate that does not fit
  kCancelled,        // the job was stopped before it finished
  kBusy,             // a lock is held by another process (retryable)
  kInternal,         // a broken invariant of barge itself (a bug)
};

std::string_view ErrorCodeName(ErrorCode code);

template <typename T>
class Result;

class Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  // From an errno at the first line that sees it. ENOSPC/EDQUOT map to
  // kNoSpace, ENOENT to kNotFound, EINVAL to kInvalidArgument, EOPNOTSUPP to
  // kNotSupported, EBUSY to kBusy; EINTR/EAGAIN/EBUSY/ETIMEDOUT are marked
  // retryable.
  static Error FromErrno(int err, std::string_view operation, std::string_view path);
  static Error FromErrno(int err, std::string_view operation, std::string_view path,
                         uint64_t offset, uint64_t length);

  static Error Corruption(std::string message) { return {ErrorCode::kCorruption, std::move(message)}; }
  static Error InvalidArgument(std::string message) { return {ErrorCode::kInvalidArgument, std::move(message)}; }
  static Error NotSupported(std::string message) { return {ErrorCode::kNotSupported, std::move(message)}; }
  static Error NotFound(std::string message) { return {ErrorCode::kNotFound, std::move(message)}; }
  static Error IoError(std::string message) { return {ErrorCode::kIoError, std::move(message)}; }
  static Error NoSpace(std::string message) { return {ErrorCode::kNoSpace, std::move(message)}; }
  static Error Cancelled(std::string message) { return {ErrorCode::kCancelled, std::move(message)}; }
  // Always retryable: the holder may let go.
  static Error Busy(std::string message) {
    Error e(ErrorCode::kBusy, std::move(message));
    e.retryable_ = true;
    return e;
  }
  static Error Internal(std::string message) { return {ErrorCode::kInternal, std::move(message)}; }

  ErrorCode code() const { return code_; }
  int errno_value() const { return errno_; }
  bool retryable() const { return retryable_; }
  const std::string& message() const { return message_; }
  const std::string& path() const { return path_; }
  std::optional<uint64_t> offset() const { return offset_; }
  std::optional<uint64_t> length() const { return length_; }

  Error& set_errno(int err) { errno_ = err; return *this; }
  Error& set_retryable(bool r) { retryable_ = r; return *this; }
  Error& set_path(std::string path) { path_ = std::move(path); return *this; }
  Error& set_range(uint64_t offset, uint64_t length) { offset_ = offset; length_ = length; return *this; }
  Error& set_offset(uint64_t offset) { offset_ = offset; return *this; }
  // Prefixes the message with an outer operation: "backup: <old message>".
  Error& Wrap(std::string_view outer);
  // Records a second failure that happened while cleaning up after this
  // one (removing a temporary file, releasing a lock): appended to the
  // message, so that no cleanup failure goes unreported. An ok status
  // changes nothing.
  Error& Also(const Result<void>& cleanup);

  // "Corruption: <path>: <message> (offset 0x..., length N, errno E: text)".
  std::string ToString() const;

 private:
  ErrorCode code_;
  int errno_ = 0;
  bool retryable_ = false;
  std::string message_;
  std::string path_;
  std::optional<uint64_t> offset_;
  std::optional<uint64_t> length_;
};

// Result<T> holds a T or an Error. Result<void> (alias Status) holds nothing
// or an Error. Both must be looked at.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(const T& value) : v_(std::in_place_index<0>, value) {}
  Result(T&& value) : v_(std::in_place_index<0>, std::move(value)) {}
  template <typename U,
            typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                        !std::is_same_v<std::decay_t<U>, T> &&
                                        !std::is_same_v<std::decay_t<U>, Error> &&
                                        !std::is_same_v<std::decay_t<U>, Result>>>
  Result(U&& value) : v_(std::in_place_index<0>, T(std::forward<U>(value))) {}
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}
  static Result Ok() { return {}; }

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const& { return *error_; }
  Error&& error() && { return std::move(*error_); }

 private:
  std::optional<Error> error_;
};

using Status = Result<void>;

inline Status OkStatus() { return Status(); }

// Drops a result on purpose, where nobody could act on a failure: a
// destructor removing a temporary on the way out of an error that is
// already being reported (a sweep removes what it leaves), a best-effort
// progress note. `why` says at the call site why ignoring it is correct.
// Everywhere else a failure is returned, or recorded with Error::Also.
template <typename T>
inline void IgnoreError(const Result<T>& /*result*/, std::string_view /*why*/) {}

}  // namespace barge

#define BARGE_CONCAT_INNER(a, b) a##b
#define BARGE_CONCAT(a, b) BARGE_CONCAT_INNER(a, b)

// BARGE_RETURN_IF_ERROR(expr): returns the expression's error from the caller.
#define BARGE_RETURN_IF_ERROR(expr)                            \
  do {                                                         \
    auto barge_status_ = (expr);                               \
    if (!barge_status_.ok()) return std::move(barge_status_).error(); \
  } while (0)

// BARGE_ASSIGN_OR_RETURN(lhs, expr): lhs = value of expr, or return its error.
#define BARGE_ASSIGN_OR_RETURN(lhs, expr) \
  BARGE_ASSIGN_OR_RETURN_IMPL(BARGE_CONCAT(barge_result_, __LINE__), lhs, expr)
#define BARGE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).error();     \
  lhs = std::move(tmp).value()
