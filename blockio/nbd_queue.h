// The connections of one NBD export and the request queue they share
// (issue 41): internal to blockio/nbd.cc, split out of it for size.
#pragma once

#include <libnbd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"

namespace barge::nbd_internal {

// Longest a closing connection waits for the server to see NBD_CMD_DISC.
inline constexpr std::chrono::milliseconds kDisconnectWait{2000};

// Turns libnbd's thread-local error of the call that just failed into an
// Error. Must run on the failing thread before any other libnbd call.
Error NbdError(std::string_view operation, const std::string& uri);
// The same, with the command's range.
Error NbdError(std::string_view operation, const std::string& uri, uint64_t offset,
               uint64_t length);

// Owns one nbd_handle; disconnects politely, then closes.
class NbdHandle {
 public:
  static Result<std::unique_ptr<NbdHandle>> Create(const std::string& uri) {
    nbd_handle* h = nbd_create();
    if (h == nullptr) return NbdError("nbd_create", uri);
    return std::unique_ptr<NbdHandle>(new NbdHandle(h));
  }
  ~NbdHandle() {
    // NBD_CMD_DISC lets the server finish cleanly; ignore failures (the
    // connection may already be gone). Not on an abandoned (stalled) one,
    // and never waiting long: a server or path that stopped answering
    // would keep a synchronous nbd_shutdown waiting forever.
    if (!abandoned_ && nbd_aio_is_ready(h_) == 1 && nbd_aio_disconnect(h_, 0) == 0) {
      auto deadline = std::chrono::steady_clock::now() + kDisconnectWait;
      while (nbd_aio_is_closed(h_) != 1 && nbd_aio_is_dead(h_) != 1 &&
             std::chrono::steady_clock::now() < deadline) {
        if (nbd_poll(h_, 100) == -1) break;
      }
    }
    nbd_close(h_);
  }
  // The destructor closes without asking the server.
  void Abandon() { abandoned_ = true; }
  NbdHandle(const NbdHandle&) = delete;
  NbdHandle& operator=(const NbdHandle&) = delete;
  nbd_handle* get() const { return h_; }

 private:
  explicit NbdHandle(nbd_handle* h) : h_(h) {}
  nbd_handle* h_;
  bool abandoned_ = false;
};

// True once the connection is gone: libnbd has retired (failed) every
// command that was in flight on it, and none can be issued.
bool Dropped(nbd_handle* h);

// `ms` in seconds with one decimal, for messages ("1.5").
std::string Seconds(std::chrono::milliseconds ms);

// A lost connection's error: kIoError with `err`, retryable, naming `uri`.
Error LostError(std::string message, const std::string& uri, int err);

// One NBD command of a caller's batch: a piece of one of its requests, at
// most the server's request size.
struct Batch;
struct Command {
  size_t request = 0;  // index of the caller's request it belongs to
  uint64_t offset = 0;
  const std::byte* data = nullptr;
  size_t length = 0;
  Batch* batch = nullptr;
  int64_t cookie = -1;
  bool issued = false;  // in flight on its connection now
  bool done = false;    // completed, well or with the server's error
};

using IssueFn = std::function<int64_t(nbd_handle*, const Command&)>;

// One caller's commands (Connections::RunCommands), queued on one
// connection. Whichever thread drives the connection issues and reaps
// them; the caller waits until `finished`.
struct Batch {
  std::string_view operation;
  const IssueFn* issue = nullptr;
  std::vector<Command> commands;
  std::vector<Status>* status = nullptr;  // per request; the first failure is kept
  size_t in_flight = 0;                   // its commands issued and not reaped
  bool finished = false;                  // guarded by the pool's mutex
};

// Reading callers a source asks for per connection
// (SourceCapabilities::blocking_read_streams): with two, one caller's
// batch is being sent while the other's replies come back.
inline constexpr uint32_t kCallersPerConnection = 2;

// At most this many commands in flight on one connection, from all the
// batches queued on it (nbdcopy keeps 64 per connection; qemu's server
// runs each in a coroutine of its own). Memory stays within the callers'
// buffers: a command is a piece of a buffer a caller lent.
inline constexpr size_t kMaxInFlight = 64;

// The connections of one export. A connection is driven by one thread at
// a time (it issues, polls and reaps; libnbd's poll holds the handle's
// lock, so a second poller would only wait on it). Two ways in:
// - Acquire, for a command run to its end (block status, zero, flush):
//   the lease drives one connection until it is given back;
// - Join + AwaitTurn, for pipelined reads and writes: the batch is queued
//   on the connection with the fewest batches, and whichever of their
//   owners drives it keeps the commands of all of them in flight, so the
//   queue does not drain between one caller's batch and the next (a
//   driver whose own batch is done hands the connection to a waiting
//   owner, its commands still in flight).
// Thread-safe. Only the lease holder touches its slot's handle and
// commands in flight; it may drop the connection (one that stalled) and
// put a new one in its place.
class HandlePool {
 public:
  class Lease {
   public:
    // Adopts slot `index`, whose `driven` the caller has set.
    Lease(HandlePool& pool, size_t index) : pool_(pool), index_(index) {}
    ~Lease() { pool_.Release(index_); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    size_t index() const { return index_; }
    // Null after Drop until Replace.
    nbd_handle* get() const {
      const auto& handle = pool_.slots_[index_].handle;
      return handle ? handle->get() : nullptr;
    }
    // Closes the connection at once, without waiting for the server; its
    // commands in flight are forgotten (their buffers are never touched
    // again) and will be issued again on the next connection.
    void Drop() {
      Slot& slot = pool_.slots_[index_];
      if (slot.handle) slot.handle->Abandon();
      slot.handle.reset();
      for (Command* c : slot.in_flight) {
        c->issued = false;
        --c->batch->in_flight;
      }
      slot.in_flight.clear();
    }
    void Replace(std::unique_ptr<NbdHandle> handle) { pool_.slots_[index_].handle = std::move(handle); }
    // The commands in flight on this connection (the holder's to change).
    std::vector<Command*>& in_flight() { return pool_.slots_[index_].in_flight; }

   private:
    HandlePool& pool_;
    size_t index_;
  };

  explicit HandlePool(std::vector<std::unique_ptr<NbdHandle>> handles) : slots_(handles.size()) {
    for (size_t i = 0; i < handles.size(); ++i) slots_[i].handle = std::move(handles[i]);
  }
  size_t size() const { return slots_.size(); }

  // A connection no one drives, preferring one with no batches queued.
  Lease Acquire() {
    std::unique_lock lock(mu_);
    size_t index = 0;
    cv_.wait(lock, [&] {
      bool found = false;
      for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].driven) continue;
        if (!found || slots_[i].batches.size() < slots_[index].batches.size()) index = i;
        found = true;
      }
      return found;
    });
    slots_[index].driven = true;
    return Lease(*this, index);
  }

  // Queues `batch` on the connection with the fewest batches (the
  // undriven one on a tie); returns its index.
  size_t Join(Batch& batch) {
    std::lock_guard lock(mu_);
    size_t best = 0;
    for (size_t i = 1; i < slots_.size(); ++i) {
      const Slot& a = slots_[i];
      const Slot& b = slots_[best];
      if (a.batches.size() < b.batches.size() || (a.batches.size() == b.batches.size() && b.driven && !a.driven)) {
        best = i;
      }
    }
    slots_[best].batches.push_back(&batch);
    return best;
  }

  // Waits until `batch` is finished (false) or connection `index` has no
  // driver (true: the caller now drives it and must adopt it in a Lease).
  bool AwaitTurn(const Batch& batch, size_t index) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return batch.finished || !slots_[index].driven; });
    if (batch.finished) return false;
    slots_[index].driven = true;
    return true;
  }

  // The batches queued on connection `index`, oldest first.
  void Batches(size_t index, std::vector<Batch*>& out) {
    std::lock_guard lock(mu_);
    out = slots_[index].batches;
  }

  // Takes `batch` off connection `index` and wakes its owner.
  void Finish(size_t index, Batch* batch) {
    {
      std::lock_guard lock(mu_);
      std::erase(slots_[index].batches, batch);
      batch->finished = true;
    }
    cv_.notify_all();
  }

  // The most commands seen in flight on one connection at once.
  void NoteInFlight(size_t n) {
    size_t seen = max_in_flight_.load(std::memory_order_relaxed);
    while (n > seen && !max_in_flight_.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
    }
  }
  size_t max_in_flight() const { return max_in_flight_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    std::unique_ptr<NbdHandle> handle;   // the lease holder's
    std::vector<Command*> in_flight;     // the lease holder's
    bool driven = false;                 // guarded by mu_
    std::vector<Batch*> batches;         // guarded by mu_
  };

  void Release(size_t index) {
    {
      std::lock_guard lock(mu_);
      slots_[index].driven = false;
    }
    cv_.notify_all();
  }

  std::vector<Slot> slots_;  // never changes size
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<size_t> max_in_flight_{0};
};

// Whether nothing of `batch` is left to do: each command completed or its
// request failed, and none still in flight (its buffer is the caller's).
bool BatchComplete(const Batch& batch);

// Fails the request of `c` with `e` unless it failed already.
void FailCommand(const Command& c, const Error& e);

// One turn of a connection's driver (Connections::Drive): tops the
// connection up to kMaxInFlight from `batches` (oldest first; commands of
// a failed request are skipped), polls once, and reaps what completed. A
// failure on a live connection is the server's answer: it becomes the
// request's status, and the request's commands not yet issued are
// skipped. Returns why the connection was lost, when it was: it dropped
// (libnbd then retires its commands with errors, which stay to be sent
// again), or nothing came back for `stall_timeout` since `last_answer`
// (then the connection is dropped here, which forgets its commands). A
// poll that fails on a live connection fails the commands in flight and
// drops it. `progressed` is set when a command completed.
// `last_answer` is the driver's: when a command last completed, or the
// connection last went from idle to busy.
std::optional<Error> DriveTurn(HandlePool& pool, HandlePool::Lease& lease, const std::string& uri,
                               const std::vector<Batch*>& batches, std::chrono::milliseconds stall_timeout,
                               std::chrono::steady_clock::time_point& last_answer, bool& progressed);

}  // namespace barge::nbd_internal
