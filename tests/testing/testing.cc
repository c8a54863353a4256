// Test helpers.
#include "tests/testing/testing.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
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
  std::string full = "(" + command + ") 2>&1";
  FILE* pipe = ::popen(full.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) result.output.append(buf, n);
  int status = ::pclose(pipe);
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

std::string BargeBinary() { return BARGE_BINARY; }

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

SocketServer::~SocketServer() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

bool SocketServer::WaitReady() {
  for (int i = 0; i < 500; ++i) {
    struct stat st;
    if (::stat(socket_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return true;
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

nlohmann::json ResultObject(const std::string& output) {
  std::istringstream in(output);
  std::string line, pending;
  nlohmann::json result;
  while (std::getline(in, line)) {
    if (pending.empty() && (line.empty() || line[0] != '{')) continue;
    pending += line + "\n";
    nlohmann::json j = nlohmann::json::parse(pending, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      if (line == "}") pending.clear();  // a whole object that is not JSON
      continue;
    }
    pending.clear();
    if (j.is_object() && j.value("event", "") == "result") result = j;
  }
  return result;
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
