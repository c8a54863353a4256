// The shared request queue of an NBD export's connections (nbd_queue.h).
#include "blockio/nbd_queue.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>

namespace barge::nbd_internal {

Error NbdError(std::string_view operation, const std::string& uri) {
  int err = nbd_get_errno();
  const char* text = nbd_get_error();
  Error base = Error::FromErrno(err != 0 ? err : EIO, operation, uri);
  // libnbd's text already names the call ("nbd_pread: ...").
  Error e(base.code(), text != nullptr ? std::string(text) : base.message());
  e.set_errno(base.errno_value()).set_retryable(base.retryable()).set_path(uri);
  return e;
}

Error NbdError(std::string_view operation, const std::string& uri, uint64_t offset,
               uint64_t length) {
  Error e = NbdError(operation, uri);
  e.set_range(offset, length);
  return e;
}

bool Dropped(nbd_handle* h) { return nbd_aio_is_dead(h) == 1 || nbd_aio_is_closed(h) == 1; }

std::string Seconds(std::chrono::milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", static_cast<double>(ms.count()) / 1000.0);
  return text;
}

Error LostError(std::string message, const std::string& uri, int err) {
  return Error::IoError(std::move(message)).set_errno(err).set_retryable(true).set_path(uri);
}

bool BatchComplete(const Batch& batch) {
  if (batch.in_flight != 0) return false;
  for (const Command& c : batch.commands) {
    if (!c.done && (*batch.status)[c.request].ok()) return false;
  }
  return true;
}

void FailCommand(const Command& c, const Error& e) {
  Status& s = (*c.batch->status)[c.request];
  if (s.ok()) s = e;
}

std::optional<Error> DriveTurn(HandlePool& pool, HandlePool::Lease& lease, const std::string& uri,
                               const std::vector<Batch*>& batches, std::chrono::milliseconds stall_timeout,
                               std::chrono::steady_clock::time_point& last_answer, bool& progressed) {
  using Clock = std::chrono::steady_clock;
  nbd_handle* h = lease.get();
  if (h == nullptr) return LostError("the connection was dropped earlier", uri, ENOTCONN);
  std::vector<Command*>& in_flight = lease.in_flight();
  // The stall clock starts with the first command on an idle connection
  // (a new one after a reconnect included).
  if (in_flight.empty()) last_answer = Clock::now();
  for (Batch* b : batches) {
    for (Command& c : b->commands) {
      if (in_flight.size() >= kMaxInFlight) break;
      if (c.done || c.issued || !(*b->status)[c.request].ok()) continue;
      c.cookie = (*b->issue)(h, c);
      if (c.cookie == -1) {
        Error e = NbdError(b->operation, uri, c.offset, c.length);
        // libnbd's text here only says the handle is dead; the cause went
        // with an earlier call (or none, on an idle connection).
        if (Dropped(h)) return LostError("the connection was closed or reset", uri, ECONNRESET);
        // Not queued on a live connection: the rest of its batch neither.
        for (Command& rest : b->commands) {
          if (!rest.done && !rest.issued) FailCommand(rest, e);
        }
        break;
      }
      c.issued = true;
      ++b->in_flight;
      in_flight.push_back(&c);
    }
  }
  pool.NoteInFlight(in_flight.size());
  if (in_flight.empty()) return std::nullopt;
  // A dead connection retires its commands with an error, so reaping
  // always ends. A poll that fails on a live one ends the wait, as
  // libnbd's own synchronous calls do (polling again could spin).
  int timeout_ms = -1;
  if (stall_timeout.count() > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(last_answer + stall_timeout - Clock::now());
    timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
  }
  int polled = nbd_poll(h, timeout_ms);
  if (polled == -1 && !Dropped(h)) {
    Error e = NbdError("nbd_poll", uri);
    for (Command* c : in_flight) FailCommand(*c, e);
    // The commands in flight name the callers' buffers: closing the
    // connection takes them back (the next turn opens a new one).
    lease.Drop();
    return std::nullopt;
  }
  std::optional<Error> lost;
  size_t before = in_flight.size();
  std::erase_if(in_flight, [&](Command* c) {
    int done = nbd_aio_command_completed(h, c->cookie);
    if (done == 0) return false;
    c->issued = false;
    --c->batch->in_flight;
    if (done == -1) {
      Error e = NbdError(c->batch->operation, uri, c->offset, c->length);
      if (Dropped(h)) {
        if (!lost) lost = std::move(e);
        return true;  // retired with the connection: to be sent again
      }
      FailCommand(*c, e);
    }
    c->done = true;
    progressed = true;
    return true;
  });
  if (lost) return lost;
  if (in_flight.size() < before) {
    last_answer = Clock::now();
  } else if (stall_timeout.count() > 0 && Clock::now() - last_answer >= stall_timeout) {
    // Closing the connection is the only way to take the commands back
    // from libnbd: after it, nothing writes into their buffers.
    lease.Drop();
    return LostError("no reply from the NBD server for " + Seconds(stall_timeout) + " s", uri, ETIMEDOUT);
  }
  return std::nullopt;
}

}  // namespace barge::nbd_internal
