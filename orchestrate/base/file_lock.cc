// TryLockFile (Env::LockFile on a lock file) and ProcessOwner (pid + start
// time + boot id + host, read from /proc through the Env).
#include "orchestrate/base/file_lock.h"

#include <unistd.h>

#include <charconv>
#include <mutex>
#include <sstream>
#include <string_view>
#include <vector>

#include "blockio/path.h"

namespace barge::orchestrate {

namespace {

// The first line of a small file ("" when it cannot be read).
std::string ReadFirstLine(Env& env, const std::string& path) {
  auto text = env.ReadFile(path, 1 << 16);
  if (!text.ok()) return "";
  return text->substr(0, text->find('\n'));
}

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown";
  std::string host(buf);
  for (char& c : host) {
    if (c == ' ' || c == '=') c = '_';  // keep the encoding one token per part
  }
  return host;
}

std::string BootId(Env& env) {
  std::string id = ReadFirstLine(env, "/proc/sys/kernel/random/boot_id");
  return id.empty() ? "unknown" : id;
}

template <typename T>
bool ParseNumber(std::string_view text, T& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

struct ProcStat {
  char state = '?';
  uint64_t start_ticks = 0;
};

// /proc/PID/stat: "PID (COMM) STATE PPID ..." where COMM may hold spaces and
// parentheses, so the fields are counted from the last ')'. STATE is field
// 3 and starttime field 22.
Result<ProcStat> ReadProcStat(Env& env, pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  auto text = env.ReadFile(path, 1 << 16);
  if (!text.ok()) return Error::NotFound("no process " + std::to_string(pid)).set_path(path);
  std::string line = text->substr(0, text->find('\n'));
  size_t close = line.rfind(')');
  if (close == std::string::npos) return Error::IoError("unexpected format").set_path(path);
  std::istringstream fields(line.substr(close + 1));
  std::vector<std::string> f;
  for (std::string s; fields >> s;) f.push_back(s);
  ProcStat st;
  if (f.size() < 20 || f[0].size() != 1 || !ParseNumber(f[19], st.start_ticks)) {
    return Error::IoError("unexpected format").set_path(path);
  }
  st.state = f[0][0];
  return st;
}

}  // namespace

std::string EscapeLockName(std::string_view name) {
  if (name.empty()) return "%";
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       std::string_view("_+:@=,-").find(static_cast<char>(c)) != std::string_view::npos ||
                       (c == '.' && i > 0);
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string CatalogLockPath(const std::string& catalog_path, LockKind kind, std::string_view name) {
  std::string_view folder = "domains";
  switch (kind) {
    case LockKind::kDomain: folder = "domains"; break;
    case LockKind::kImage: folder = "images"; break;
    case LockKind::kPolicy: folder = "policies"; break;
    case LockKind::kSnapshotApply: folder = "snapshot-apply"; break;
  }
  return DirName(catalog_path) + "/locks/" + std::string(folder) + "/" + EscapeLockName(name) + ".lock";
}

Result<std::unique_ptr<EnvLock>> TryLockFile(Env& env, const std::string& path, const std::string& busy_message,
                                             bool wait) {
  BARGE_RETURN_IF_ERROR(env.CreateDirs(DirName(path)));
  LockOptions o;
  o.busy_message = busy_message;
  o.wait = wait;
  return env.LockFile(path, o);
}

ProcessOwner ProcessOwner::Self(Env& env) {
  // Cached per pid: a forked child is another process and gets its own.
  static std::mutex mu;
  static ProcessOwner cached;
  std::lock_guard lock(mu);
  pid_t pid = ::getpid();
  if (cached.pid != pid) {
    auto o = Of(env, pid);
    if (o.ok()) {
      cached = *o;
    } else {
      // No /proc: a start time of 0 makes our rows look gone to others on
      // this host, but without /proc no one here can check them anyway.
      cached = ProcessOwner{HostName(), BootId(env), pid, 0};
    }
  }
  return cached;
}

Result<ProcessOwner> ProcessOwner::Of(Env& env, pid_t pid) {
  BARGE_ASSIGN_OR_RETURN(ProcStat st, ReadProcStat(env, pid));
  ProcessOwner o;
  o.host = HostName();
  o.boot_id = BootId(env);
  o.pid = pid;
  o.start_ticks = st.start_ticks;
  return o;
}

std::string ProcessOwner::Encode() const {
  return "pid=" + std::to_string(pid) + " start=" + std::to_string(start_ticks) + " boot=" + boot_id +
         " host=" + host;
}

Result<ProcessOwner> ProcessOwner::Parse(const std::string& text) {
  ProcessOwner o;
  bool have_pid = false, have_start = false;
  std::istringstream in(text);
  for (std::string token; in >> token;) {
    size_t eq = token.find('=');
    if (eq == std::string::npos || eq + 1 == token.size()) {
      return Error::InvalidArgument("not a process owner: '" + text + "'");
    }
    std::string_view key(token.data(), eq), value(token.data() + eq + 1, token.size() - eq - 1);
    if (key == "pid") have_pid = ParseNumber(value, o.pid) && o.pid > 0;
    else if (key == "start") have_start = ParseNumber(value, o.start_ticks);
    else if (key == "boot") o.boot_id = value;
    else if (key == "host") o.host = value;
  }
  if (!have_pid || !have_start || o.boot_id.empty() || o.host.empty()) {
    return Error::InvalidArgument("not a process owner: '" + text + "'");
  }
  return o;
}

bool OwnerIsGone(Env& env, const std::string& owner) {
  auto o = ProcessOwner::Parse(owner);
  if (!o.ok()) return true;
  ProcessOwner self = ProcessOwner::Self(env);
  if (o->host != self.host) return false;
  if (o->boot_id != self.boot_id) return true;
  auto st = ReadProcStat(env, o->pid);
  if (!st.ok()) return st.error().code() == ErrorCode::kNotFound;
  return st->start_ticks != o->start_ticks || st->state == 'Z' || st->state == 'X';
}

}  // namespace barge::orchestrate
