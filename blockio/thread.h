// Starting a thread without aborting: std::thread throws std::system_error
// when the system cannot start one (EAGAIN: the limit on processes or
// threads, or no memory for its stack). StartThread turns that into an
// Error, so every thread barge starts fails as an error, never as an abort.
#pragma once

#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "blockio/error.h"

namespace barge {

// The error for a thread `what` ("copy watchdog") that could not start.
inline Error ThreadStartError(std::string_view what, int err) {
  return Error::IoError("could not start a thread (" + std::string(what) +
                        "): lower --threads, or raise the limit on processes (ulimit -u) or on memory")
      .set_errno(err)
      .set_retryable(true);
}

// std::thread(f, args...), or ThreadStartError.
template <typename F, typename... Args>
Result<std::thread> StartThread(std::string_view what, F&& f, Args&&... args) {
  try {
    return std::thread(std::forward<F>(f), std::forward<Args>(args)...);
  } catch (const std::system_error& e) {
    return ThreadStartError(what, e.code().value());
  }
}

}  // namespace barge
