// Test helpers.
#include "tests/testing/testing.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cerrno>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace barge::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/var/tmp") + "/barge-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

CommandResult Run(const std::string& command) {
  CommandResult result;
  // Built before fork: the child of a threaded process may only exec.
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return result;
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return result;
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execv("/bin/sh", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    return result;
  }
  // Both pipes drained as data comes, so neither side can fill and block
  // the child; `output` keeps the order the chunks arrived in, stderr's
  // first when both are ready (it is unbuffered: what a tool says there
  // usually came before what its buffered stdout flushes at exit). Parse
  // stdout_text, not output: the interleaving is only approximate.
  struct pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* alone[2] = {&result.stdout_text, &result.stderr_text};
  int open_fds = 2;
  char buf[4096];
  while (open_fds > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i : {1, 0}) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      alone[i]->append(buf, static_cast<size_t>(n));
      result.output.append(buf, static_cast<size_t>(n));
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string RunOk(const std::string& command, int expected_exit) {
  CommandResult r = Run(command);
  if (r.exit_code != expected_exit) {
    ADD_FAILURE() << "command: " << command << "\nexit " << r.exit_code << " (expected "
                  << expected_exit << ")\n" << r.output;
  }
  return r.output;
}

std::string BargeBinary() { return BARGE_CONFIGURED_BINARY; }
const char* SourceDir() { return BARGE_CONFIGURED_SOURCE_DIR; }
const char* GuestKitDir() { return BARGE_CONFIGURED_GUEST_KIT_DIR; }

bool HaveTool(const std::string& tool) {
  return Run("command -v " + ShellQuote(tool) + " >/dev/null").exit_code == 0;
}

bool ToolsRequired() {
  const char* v = std::getenv("BARGE_REQUIRE_TOOLS");
  return v != nullptr && std::string(v) == "1";
}

SocketServer::SocketServer(const std::string& command, const std::string& socket)
    : socket_(socket) {
  // Built before fork: the child of a threaded process may only exec.
  std::string shell = "exec " + command + " >/dev/null 2>&1";
  pid_ = ::fork();
  if (pid_ == 0) {
    ::execl("/bin/sh", "sh", "-c", shell.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
}

void StopChild(int pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

SocketServer::~SocketServer() { StopChild(pid_, std::chrono::seconds(2)); }

namespace {

// True once a Unix socket bound to `path` is listening: the socket file
// shows at bind(), before listen(), and a client connecting in between is
// refused. Read from /proc/net/unix (Flags has __SO_ACCEPTCON, 0x10000),
// not by connecting: qemu-nbd without --persistent would serve the probe
// and exit.
bool Listening(const std::string& path) {
  std::ifstream in("/proc/net/unix");
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string num, refs, protocol, flags, type, state, inode, name;
    if (!(fields >> num >> refs >> protocol >> flags >> type >> state >> inode >> name)) continue;
    if (name == path && (std::stoul(flags, nullptr, 16) & 0x10000) != 0) return true;
  }
  return false;
}

}  // namespace

bool SocketServer::WaitReady() {
  int seen = 0;  // polls since the socket file showed
  for (int i = 0; i < 500; ++i) {
    struct stat st;
    if (::stat(socket_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      // A server that names its socket otherwise than we do never shows in
      // /proc/net/unix under our name: after 2 s, the file is enough.
      if (Listening(socket_) || ++seen > 100) return true;
    }
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::vector<nlohmann::json> Events(const std::string& stdout_text, Stream stream) {
  // "reconnect": an NBD connection was replaced after a drop; "bitmap_missed":
  // a backup's bitmap missed a change its digests found (docs/json.md).
  static const std::set<std::string> kEvents = {"progress", "warning", "reconnect", "bitmap_missed", "result",
                                                "error"};
  static const std::set<std::string> kServeEvents = {"ready", "run"};
  std::vector<nlohmann::json> events;
  if (!stdout_text.empty() && stdout_text.back() != '\n') {
    ADD_FAILURE() << "NDJSON: the last line has no newline:\n" << stdout_text;
  }
  size_t start = 0;
  for (int line_no = 1; start < stdout_text.size(); ++line_no) {
    size_t end = stdout_text.find('\n', start);
    if (end == std::string::npos) end = stdout_text.size();
    std::string line = stdout_text.substr(start, end - start);
    start = end + 1;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      ADD_FAILURE() << "NDJSON: line " << line_no << " is not one JSON object: " << line;
      continue;
    }
    auto event = j.find("event");
    const bool daemon_event = stream == Stream::kServe && event != j.end() && event->is_string() &&
                              kServeEvents.count(event->get<std::string>()) != 0;
    if (event == j.end() || !event->is_string() || (kEvents.count(event->get<std::string>()) == 0 && !daemon_event)) {
      ADD_FAILURE() << "NDJSON: line " << line_no << " has no event progress/warning/reconnect/result/error"
                    << (stream == Stream::kServe ? "/ready/run: " : ": ") << line;
      continue;
    }
    auto command = j.find("command");
    if (command == j.end() || !command->is_string() || command->get<std::string>().empty()) {
      ADD_FAILURE() << "NDJSON: line " << line_no << " has no command: " << line;
      continue;
    }
    if (daemon_event && *command != "serve") {
      ADD_FAILURE() << "NDJSON: line " << line_no << ": a " << *event << " event is serve's only: " << line;
      continue;
    }
    events.push_back(std::move(j));
  }
  return events;
}

namespace {

nlohmann::json ResultOfEvents(const std::vector<nlohmann::json>& events, const std::string& stdout_text) {
  nlohmann::json result = nlohmann::json::object();
  int results = 0;
  for (const nlohmann::json& e : events) {
    const std::string& event = e["event"].get_ref<const std::string&>();
    if (event == "result") {
      ++results;
      result = e;
    } else if (event == "error" && results == 0) {
      ADD_FAILURE() << "an error before the result:\n" << stdout_text;
    }
  }
  if (results != 1) {
    ADD_FAILURE() << results << " result events (one expected):\n" << stdout_text;
    if (results > 1) return nlohmann::json::object();
  }
  return result;
}

}  // namespace

nlohmann::json ResultOf(const std::string& stdout_text, Stream stream) {
  return ResultOfEvents(Events(stdout_text, stream), stdout_text);
}

nlohmann::json ErrorOf(const std::string& stdout_text, Stream stream) {
  std::vector<nlohmann::json> events = Events(stdout_text, stream);
  int errors = 0;
  for (const nlohmann::json& e : events) errors += e["event"] == "error";
  if (errors != 1 || events.empty() || events.back()["event"] != "error") {
    ADD_FAILURE() << errors << " error events (one expected, on the last line):\n" << stdout_text;
    return nlohmann::json::object();
  }
  const nlohmann::json& error = events.back();
  for (const char* key : {"code", "message"}) {
    EXPECT_TRUE(error.contains(key) && error[key].is_string()) << key << " missing: " << error.dump();
  }
  EXPECT_TRUE(error.contains("exit_code") && error["exit_code"].is_number_integer()) << error.dump();
  return error;
}

nlohmann::json RunResult(const std::string& command, int expected_exit) {
  CommandResult r = Run(command);
  if (r.exit_code != expected_exit) {
    ADD_FAILURE() << "command: " << command << "\nexit " << r.exit_code << " (expected "
                  << expected_exit << ")\n" << r.output;
  }
  std::vector<nlohmann::json> events = Events(r.stdout_text);
  if (expected_exit == 0) {
    for (const nlohmann::json& e : events) {
      EXPECT_NE(e["event"], "error") << "an error event from a run that exited 0: " << e.dump();
    }
  }
  return ResultOfEvents(events, r.stdout_text);
}

nlohmann::json RunError(const std::string& command, int expected_exit) {
  CommandResult r = Run(command);
  if (r.exit_code != expected_exit) {
    ADD_FAILURE() << "command: " << command << "\nexit " << r.exit_code << " (expected "
                  << expected_exit << ")\n" << r.output;
  }
  nlohmann::json error = ErrorOf(r.stdout_text);
  if (!error.empty()) {
    EXPECT_EQ(error.value("exit_code", -1), r.exit_code) << r.output;
  }
  return error;
}

std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  uint64_t x = seed;
  for (size_t i = 0; i < n; i += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = std::byte(z >> (8 * j));
  }
  return out;
}

void WriteFile(const std::string& path, const std::vector<std::byte>& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

std::vector<std::byte> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = std::byte(raw[i]);
  return out;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

Status CallLog::ReadAt(uint64_t offset, std::span<std::byte> out) {
  Log({false, offset, out.size()});
  return target_.ReadAt(offset, out);
}

Status CallLog::ReadMany(std::span<ReadRequest> requests) {
  for (const ReadRequest& r : requests) Log({false, r.offset, r.buffer.size()});
  return target_.ReadMany(requests);
}

void CallLog::Log(Call call) {
  std::lock_guard lock(mu_);
  calls_.push_back(call);
}

std::vector<CallLog::Call> CallLog::calls() const {
  std::lock_guard lock(mu_);
  return calls_;
}

std::vector<std::pair<uint64_t, uint64_t>> CallLog::hints() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const Call& c : calls()) {
    if (c.hint) out.emplace_back(c.offset, c.offset + c.length);
  }
  return out;
}

}  // namespace barge::testing
