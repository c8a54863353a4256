// S3Lock: a lock object made with a conditional create, renewed by a
// thread, taken over once expired; its JSON body read strictly.
#include "blockio/s3_lock.h"

#include <gnutls/crypto.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "blockio/env.h"
#include "blockio/thread.h"

namespace barge {
namespace {

constexpr size_t kMaxBodyBytes = 4096;
constexpr size_t kMaxTextBytes = 255;

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

std::string Utc(int64_t seconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return std::to_string(seconds);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// Printable ASCII without '"' and '\\': what a lock's strings may hold, so
// that the body needs no escapes.
bool PlainText(std::string_view s) {
  if (s.empty() || s.size() > kMaxTextBytes) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 0x7f && c != '"' && c != '\\'; });
}

std::string Hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  std::string out;
  for (char c : std::string_view(name)) {
    out += PlainText(std::string_view(&c, 1)) ? c : '_';
  }
  return out.empty() ? "unknown" : out.substr(0, kMaxTextBytes);
}

Result<std::string> RandomToken() {
  unsigned char bytes[16];
  if (gnutls_rnd(GNUTLS_RND_NONCE, bytes, sizeof bytes) != 0) {
    return Error::Internal("no random bytes for the lock token");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// This process's S3LockBody::boot: the boot id and the inode of its pid
// namespace, "BOOT/NS"; "" when either cannot be read (then no lock is
// ever judged dead by its pid).
std::string BootIdentity() {
  auto boot = PosixEnv().ReadFile("/proc/sys/kernel/random/boot_id", 256);
  auto ns = PosixEnv().ReadLink("/proc/self/ns/pid");  // "pid:[4026531836]"
  if (!boot.ok() || !ns.ok()) return "";
  std::string id;
  for (char c : *boot) {
    if (std::isxdigit(static_cast<unsigned char>(c)) != 0 || c == '-') id += c;
  }
  std::string inode;
  for (char c : *ns) {
    if (std::isdigit(static_cast<unsigned char>(c)) != 0) inode += c;
  }
  if (id.empty() || inode.empty() || id.size() + inode.size() + 1 > kMaxTextBytes) return "";
  return id + "/" + inode;
}

// The start time of process `pid` in clock ticks since boot (field 22 of
// /proc/PID/stat, counted after the command's closing parenthesis);
// nullopt when it cannot be read (gone, or hidden from us).
std::optional<int64_t> ProcessStart(int64_t pid) {
  auto stat = PosixEnv().ReadFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!stat.ok()) return std::nullopt;
  const size_t paren = stat->rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  size_t at = paren + 1;
  for (int field = 3; field <= 22; ++field) {  // fields 3.. follow ") "
    while (at < stat->size() && (*stat)[at] == ' ') ++at;
    const size_t end = std::min(stat->find(' ', at), stat->size());
    if (at >= end) return std::nullopt;
    if (field == 22) {
      int64_t value = 0;
      for (size_t i = at; i < end; ++i) {
        if (std::isdigit(static_cast<unsigned char>((*stat)[i])) == 0 || value > (INT64_MAX - 9) / 10) return std::nullopt;
        value = value * 10 + ((*stat)[i] - '0');
      }
      return value;
    }
    at = end;
  }
  return std::nullopt;
}

// Whether `held` is the lock of a process that is gone from this machine,
// boot and pid namespace (`boot`, ours): its pid exists no more, or names
// a process started at another time (the pid reused). A lock of another
// host, of version 1, or of a process we cannot see: not dead.
bool OwnerIsDead(const S3LockBody& held, const std::string& boot) {
  if (boot.empty() || held.boot != boot || held.pid <= 0 || held.pid > INT_MAX || held.start <= 0) return false;
  if (::kill(static_cast<pid_t>(held.pid), 0) != 0 && errno == ESRCH) return true;
  const std::optional<int64_t> start = ProcessStart(held.pid);
  return start.has_value() && *start != held.start;
}

// A strict reader of the one flat JSON object the lock body is: string
// values without escapes, non-negative integers, no duplicate keys.
class Reader {
 public:
  explicit Reader(std::string_view text) : text_(text) {}

  bool Read(std::map<std::string, std::string, std::less<>>& strings, std::map<std::string, int64_t, std::less<>>& numbers) {
    Space();
    if (!Take('{')) return false;
    Space();
    if (Take('}')) return AtEnd();
    for (;;) {
      std::string key;
      if (!String(key)) return false;
      Space();
      if (!Take(':')) return false;
      Space();
      if (strings.contains(key) || numbers.contains(key)) return false;
      if (Peek() == '"') {
        std::string value;
        if (!String(value)) return false;
        strings[key] = std::move(value);
      } else {
        int64_t value = 0;
        if (!Number(value)) return false;
        numbers[key] = value;
      }
      Space();
      if (Take('}')) return AtEnd();
      if (!Take(',')) return false;
      Space();
    }
  }

 private:
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Take(char c) {
    if (Peek() != c || pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }
  void Space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool AtEnd() {
    Space();
    return pos_ == text_.size();
  }
  bool String(std::string& out) {
    if (!Take('"')) return false;
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != '"') ++pos_;
    if (pos_ >= text_.size()) return false;
    out = std::string(text_.substr(start, pos_ - start));
    ++pos_;
    return PlainText(out);
  }
  bool Number(int64_t& out) {
    const size_t start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])) != 0) ++pos_;
    const size_t n = pos_ - start;
    if (n == 0 || n > 15 || (n > 1 && text_[start] == '0')) return false;
    out = 0;
    for (size_t i = start; i < pos_; ++i) out = out * 10 + (text_[i] - '0');
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

std::string Owner(const S3LockBody& b) { return "host " + b.host + " pid " + std::to_string(b.pid); }

std::vector<std::byte> Bytes(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// A lock object as read: its body and the ETag of the version read.
struct HeldLock {
  S3LockBody body;
  std::string etag;
};

// The lock object's body, or nullopt when there is none.
Result<std::optional<HeldLock>> ReadLock(S3Client& client, const S3Location& at) {
  Result<S3ObjectInfo> info = client.Head(at);
  if (!info.ok()) {
    if (info.error().code() == ErrorCode::kNotFound) return std::optional<HeldLock>();
    return std::move(info).error();
  }
  if (info->size == 0 || info->size > kMaxBodyBytes) {
    return Error::InvalidArgument("a lock object barge did not write (" + std::to_string(info->size) + " bytes)")
        .set_path(at.shown());
  }
  std::vector<std::byte> bytes(info->size);
  Status got = client.Get(at, 0, bytes);
  if (!got.ok()) {
    if (got.error().code() == ErrorCode::kNotFound) return std::optional<HeldLock>();
    return std::move(got).error();
  }
  // Replaced between the HEAD and the GET: the ETag is the older one, and
  // a PutIfMatch with it fails safe (kBusy).
  BARGE_ASSIGN_OR_RETURN(S3LockBody body, ParseS3LockBody(bytes, at));
  return std::optional<HeldLock>(HeldLock{std::move(body), std::move(info->etag)});
}

}  // namespace

std::string FormatS3LockBody(const S3LockBody& b) {
  const bool v2 = !b.boot.empty();
  return "{\"barge_lock\":" + std::string(v2 ? "2" : "1") + ",\"host\":\"" + b.host + "\"" +
         (v2 ? ",\"boot\":\"" + b.boot + "\"" : "") + ",\"pid\":" + std::to_string(b.pid) +
         (v2 ? ",\"start\":" + std::to_string(b.start) : "") + ",\"token\":\"" + b.token +
         "\",\"acquired\":" + std::to_string(b.acquired) + ",\"expires\":" + std::to_string(b.expires) + "}\n";
}

Result<S3LockBody> ParseS3LockBody(std::span<const std::byte> bytes, const S3Location& at) {
  auto bad = [&](std::string_view why) {
    return Error::InvalidArgument("a lock object barge did not write (" + std::string(why) + ")").set_path(at.shown());
  };
  if (bytes.size() > kMaxBodyBytes) return bad("too large");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::map<std::string, std::string, std::less<>> strings;
  std::map<std::string, int64_t, std::less<>> numbers;
  if (!Reader(text).Read(strings, numbers)) return bad("not the JSON object barge writes");
  const auto version_given = numbers.find("barge_lock");
  const bool v2 = version_given != numbers.end() && version_given->second == 2;
  if (strings.size() != (v2 ? 3u : 2u) || numbers.size() != (v2 ? 5u : 4u)) return bad("unexpected fields");
  auto str = [&](std::string_view k) -> const std::string* {
    auto it = strings.find(k);
    return it == strings.end() ? nullptr : &it->second;
  };
  auto num = [&](std::string_view k) -> std::optional<int64_t> {
    auto it = numbers.find(k);
    return it == numbers.end() ? std::nullopt : std::optional<int64_t>(it->second);
  };
  const std::string* host = str("host");
  const std::string* token = str("token");
  const auto version = num("barge_lock"), pid = num("pid"), acquired = num("acquired"), expires = num("expires");
  const std::string* boot = str("boot");
  const auto start = num("start");
  if (!host || !token || !version || !pid || !acquired || !expires) return bad("missing fields");
  if (*version != 1 && *version != 2) return bad("version " + std::to_string(*version));
  if (v2 && (!boot || !start)) return bad("missing fields");
  if (token->size() != 32 || !std::all_of(token->begin(), token->end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0 || (c >= 'a' && c <= 'f');
      })) {
    return bad("bad token");
  }
  return S3LockBody{*host, *pid, *token, *acquired, *expires, v2 ? *boot : "", v2 ? *start : 0};
}

struct S3Lock::State {
  S3Client& client;
  const S3Location at;
  const S3LockOptions options;
  S3LockBody body;
  bool took_over = false;
  std::string previous_owner;
  std::string takeover_reason;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool lost = false;
  std::thread renewer;

  State(S3Client& c, S3Location a, S3LockOptions o) : client(c), at(std::move(a)), options(std::move(o)) {}

  // Renews the expiry while the token is still ours; a lock found gone or
  // another's, or a failed renewal, marks it lost for good.
  void Renew() {
    const auto every = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(200),
                                                           std::chrono::duration_cast<std::chrono::milliseconds>(options.ttl) / 3);
    std::unique_lock lock(mu);
    while (!lost) {
      if (cv.wait_for(lock, every, [&] { return stopping; })) return;
      lock.unlock();
      Result<std::optional<HeldLock>> now = ReadLock(client, at);
      bool ok = now.ok() && now->has_value() && (*now)->body.token == body.token;
      if (ok) {
        S3LockBody renewed = body;
        renewed.expires = Now() + options.ttl.count();
        ok = client.Put(at, Bytes(FormatS3LockBody(renewed))).ok();
      }
      lock.lock();
      if (!ok) lost = true;
    }
  }
};

S3Lock::S3Lock(std::unique_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<S3Lock>> S3Lock::Acquire(S3Client& client, S3Location at, S3LockOptions options) {
  auto state = std::make_unique<State>(client, std::move(at), std::move(options));
  State& s = *state;
  const std::string shown = s.at.shown();
  BARGE_ASSIGN_OR_RETURN(s.body.token, RandomToken());
  s.body.host = Hostname();
  s.body.pid = ::getpid();
  s.body.boot = BootIdentity();
  if (!s.body.boot.empty()) s.body.start = ProcessStart(s.body.pid).value_or(0);
  if (s.body.start <= 0) s.body.boot.clear();  // version 1: never judged dead
  int dead_tries = 0;  // a server ignoring If-Match must not make this spin
  for (;;) {
    s.body.acquired = Now();
    s.body.expires = s.body.acquired + s.options.ttl.count();
    Status put = client.PutIfAbsent(s.at, Bytes(FormatS3LockBody(s.body)));
    if (put.ok()) break;
    if (put.error().code() != ErrorCode::kBusy) return std::move(put).error();
    BARGE_ASSIGN_OR_RETURN(std::optional<HeldLock> read, ReadLock(client, s.at));
    if (!read) continue;  // let go between our create and our read
    const S3LockBody* held = &read->body;
    if (dead_tries < 3 && OwnerIsDead(*held, s.body.boot)) {
      // A killed run of this machine: replaced at once, only if it is still
      // the version read (If-Match), so of two takers one wins.
      ++dead_tries;
      s.body.acquired = Now();
      s.body.expires = s.body.acquired + s.options.ttl.count();
      Status replaced = client.PutIfMatch(s.at, Bytes(FormatS3LockBody(s.body)), read->etag);
      if (replaced.ok()) {
        s.took_over = true;
        s.previous_owner = Owner(*held);
        s.takeover_reason = "dead";
        break;
      }
      const ErrorCode code = replaced.error().code();
      if (code != ErrorCode::kBusy && code != ErrorCode::kNotFound) return std::move(replaced).error();
      continue;  // changed or gone meanwhile: look again
    }
    std::optional<Error> busy;
    if (held->expires > Now()) {
      busy = Error::Busy(s.options.busy_message + ": held by " + Owner(*held) + " until " + Utc(held->expires))
                 .set_path(shown);
    } else {
      // Expired: delete it only if it is still the lock we read (re-read
      // right before the delete), then create ours again. There is no
      // conditional delete: the window is the one re-read.
      BARGE_ASSIGN_OR_RETURN(std::optional<HeldLock> again, ReadLock(client, s.at));
      if (again && again->body.token == held->token) {
        BARGE_RETURN_IF_ERROR(client.Delete(s.at));
        s.body.acquired = Now();
        s.body.expires = s.body.acquired + s.options.ttl.count();
        Status retake = client.PutIfAbsent(s.at, Bytes(FormatS3LockBody(s.body)));
        if (retake.ok()) {
          s.took_over = true;
          s.previous_owner = Owner(*held);
          s.takeover_reason = "expired";
          break;
        }
        if (retake.error().code() != ErrorCode::kBusy) return std::move(retake).error();
      }
      busy = Error::Busy(s.options.busy_message + ": another process took over the expired lock of " + Owner(*held))
                 .set_path(shown);
    }
    if (!s.options.wait) return *busy;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  auto renewer = StartThread("S3 lock renewal", [&s] { s.Renew(); });
  if (!renewer.ok()) {
    (void)client.Delete(s.at);
    return std::move(renewer).error();
  }
  s.renewer = std::move(*renewer);
  return std::unique_ptr<S3Lock>(new S3Lock(std::move(state)));
}

S3Lock::~S3Lock() {
  State& s = *state_;
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
  }
  s.cv.notify_all();
  if (s.renewer.joinable()) s.renewer.join();
  Result<std::optional<HeldLock>> now = ReadLock(s.client, s.at);
  if (now.ok() && now->has_value() && (*now)->body.token == s.body.token) (void)s.client.Delete(s.at);
}

bool S3Lock::took_over() const { return state_->took_over; }

const std::string& S3Lock::previous_owner() const { return state_->previous_owner; }

const std::string& S3Lock::takeover_reason() const { return state_->takeover_reason; }

bool S3Lock::lost() const {
  std::lock_guard lock(state_->mu);
  return state_->lost;
}

}  // namespace barge
