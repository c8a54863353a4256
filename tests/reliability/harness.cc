// The reliability campaign's harness: workspaces, runners, checks, figures.
#include "tests/reliability/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "blockio/path.h"
#include "cli/commands.h"
#include "formats/digest_table.h"
#include "formats/manifest.h"
#include "formats/strong_digest_table.h"
#include "formats/qcow2_check.h"
#include "pipeline/chain.h"
#include "pipeline/endpoints.h"
#include "pipeline/restore.h"
#include "tests/testing/testing.h"

extern char** environ;

namespace barge::reliability {

namespace fs = std::filesystem;

// ---- sizing ----

const Sizing& GetSizing() {
  static const Sizing sizing = [] {
    Sizing s;
    if (const char* l = std::getenv("BARGE_RELIABILITY_LEVEL"); l != nullptr && *l) s.level = l;
    if (const char* seed = std::getenv("BARGE_RELIABILITY_SEED"); seed != nullptr && *seed) {
      s.seed = std::strtoull(seed, nullptr, 10);
    }
    if (const char* k = std::getenv("BARGE_RELIABILITY_KILLS"); k != nullptr && *k) {
      s.kills_override = std::atoi(k);
    }
    return s;
  }();
  return sizing;
}

// ---- findings ----

std::string_view FindingName(Finding f) {
  switch (f) {
    case Finding::kLost: return "lost";
    case Finding::kDamaged: return "damaged";
    case Finding::kNotRecovered: return "not-recovered";
    case Finding::kLeftover: return "leftover";
    case Finding::kBadError: return "bad-error";
  }
  return "?";
}

void Findings::Add(Finding f, std::string what) {
  items_.emplace_back(f, stage_.empty() ? std::move(what) : "[" + stage_ + "] " + what);
}

bool Findings::LostOrDamaged() const {
  for (const auto& [f, what] : items_) {
    if (f == Finding::kLost || f == Finding::kDamaged || f == Finding::kNotRecovered) return true;
  }
  return false;
}

std::string Findings::ToString() const {
  std::string s;
  for (const auto& [f, what] : items_) s += std::string(FindingName(f)) + ": " + what + "\n";
  return s;
}

std::string Outcome::Describe() const {
  std::string s = killed ? "killed" : "exit " + std::to_string(exit_code);
  if (!error.is_null()) s += " " + error.dump();
  else if (!errors.empty()) s += " stderr: " + errors.substr(0, 400);
  return s;
}

// ---- runners ----

namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The events of --json output, one object a line.
void ParseEvents(Outcome& o) {
  std::istringstream lines(o.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.value("event", "") == "error") o.error = j;
    if (j.value("event", "") == "result") o.result = j;
  }
}

std::string g_self_binary;

}  // namespace

void SetSelfBinary(std::string path) { g_self_binary = std::move(path); }

Outcome InProcessRunner::Capture(const std::function<int()>& body) {
  fs::create_directories(capture_dir_);
  std::string out_path = capture_dir_ + "/stdout", err_path = capture_dir_ + "/stderr";
  std::fflush(stdout);
  std::fflush(stderr);
  std::cout.flush();
  std::cerr.flush();
  int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int saved_out = ::dup(1), saved_err = ::dup(2);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  Outcome o;
  try {
    o.exit_code = body();
  } catch (const std::exception& e) {
    std::cerr << "exception: " << e.what() << "\n";
    o.exit_code = 70;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::cout.flush();
  std::cerr.flush();
  ::dup2(saved_out, 1);
  ::dup2(saved_err, 2);
  ::close(saved_out);
  ::close(saved_err);
  ::close(out_fd);
  ::close(err_fd);
  o.output = ReadText(out_path);
  o.errors = ReadText(err_path);
  ParseEvents(o);
  return o;
}

Outcome InProcessRunner::Barge(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"barge"};
  all.insert(all.end(), args.begin(), args.end());
  all.push_back("--json");
  return Capture([&] {
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    return cli::Main(static_cast<int>(all.size()), argv.data());
  });
}

Outcome InProcessRunner::Child(const std::vector<std::string>& args) {
  return Capture([&] { return ChildMain(args); });
}

namespace {

Started StartArgv(const std::string& capture_dir, const std::string& tag, const std::vector<std::string>& argv) {
  fs::create_directories(capture_dir);
  Started p;
  p.out_path = capture_dir + "/stdout" + tag;
  p.err_path = capture_dir + "/stderr" + tag;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, p.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, p.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  p.start = std::chrono::steady_clock::now();
  int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    p.spawn_error = "spawn failed: " + std::string(std::strerror(rc));
    return p;
  }
  p.pid = pid;
  return p;
}

}  // namespace

Started StartBarge(const std::string& capture_dir, const std::string& tag, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::BargeBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--json");
  return StartArgv(capture_dir, tag, argv);
}

Outcome WaitFor(const Started& p, std::optional<std::chrono::microseconds> kill_after) {
  Outcome o;
  if (p.pid < 0) {
    o.errors = p.spawn_error;
    return o;
  }
  int status = 0;
  if (kill_after) {
    // Sleep until the kill time unless the process ends first.
    auto deadline = p.start + *kill_after;
    for (;;) {
      pid_t done = ::waitpid(p.pid, &status, WNOHANG);
      if (done == p.pid) break;
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, &status, 0);
        break;
      }
      auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      std::this_thread::sleep_for(std::min(left, std::chrono::microseconds(200)));
    }
  } else {
    ::waitpid(p.pid, &status, 0);
  }
  if (WIFSIGNALED(status)) {
    o.killed = WTERMSIG(status) == SIGKILL;
    o.exit_code = 128 + WTERMSIG(status);
  } else {
    o.exit_code = WEXITSTATUS(status);
  }
  o.output = ReadText(p.out_path);
  o.errors = ReadText(p.err_path);
  ParseEvents(o);
  return o;
}

Outcome ProcessRunner::Spawn(const std::vector<std::string>& argv) {
  Started p = StartArgv(capture_dir_, "", argv);
  Outcome o = WaitFor(p, kill_after_);
  last_duration_ =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - p.start);
  return o;
}

Outcome ProcessRunner::Barge(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::BargeBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--json");
  return Spawn(argv);
}

Outcome ProcessRunner::Child(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {g_self_binary, "--child"};
  argv.insert(argv.end(), args.begin(), args.end());
  return Spawn(argv);
}

// ---- workspace ----

namespace {

void RunTool(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) {
    ADD_FAILURE() << "cannot run " << argv[0];
    return;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    ADD_FAILURE() << "failed: " << cmd;
  }
}

}  // namespace

Workspace::Workspace(std::string name) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/var/tmp") + "/barge-rel-" + name + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
  root_ = buf.data();
  for (const char* d : {"work", "template", "golden", "scratch", "capture"}) fs::create_directories(root_ + "/" + d);
}

Workspace::~Workspace() {
  if (std::getenv("BARGE_RELIABILITY_KEEP") == nullptr) RemoveTree(root_);
}

void Workspace::SaveTemplate() {
  RemoveTree(root_ + "/template");
  CopyTree(work(), root_ + "/template");
}

void Workspace::ResetWork() {
  RemoveTree(work());
  CopyTree(root_ + "/template", work());
  ClearScratch();
}

void Workspace::ClearScratch() {
  RemoveTree(scratch());
  fs::create_directories(scratch());
}

void CopyTree(const std::string& from, const std::string& to) {
  // cp -a keeps modes, times (checksum records compare mtimes), links and
  // holes.
  fs::create_directories(to);
  RunTool({"cp", "-a", "--sparse=always", from + "/.", to});
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::vector<std::byte> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(bytes.size());
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::string CompareBytes(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  if (a.size() != b.size()) {
    return "sizes differ (" + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + ")";
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return "bytes differ at offset " + std::to_string(i);
  }
  return "";
}

namespace {

std::string Hex128(XXH128_hash_t h) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

}  // namespace

std::string FileDigest(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  std::vector<std::byte> bytes = ReadAll(path);
  return Hex128(XXH3_128bits(bytes.data(), bytes.size()));
}

std::string TreeDigest(const std::string& dir) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  std::error_code ec;
  std::vector<fs::path> entries;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    entries.push_back(it->path());
  }
  std::sort(entries.begin(), entries.end());
  for (const auto& p : entries) {
    std::string name = p.filename().string();
    if (name == ".lock" || name.ends_with(".lock")) continue;
    std::string rel = fs::relative(p, dir, ec).string();
    XXH3_128bits_update(state, rel.data(), rel.size() + 1);
    auto st = fs::symlink_status(p, ec);
    if (fs::is_symlink(st)) {
      std::string target = fs::read_symlink(p, ec).string();
      XXH3_128bits_update(state, "L", 1);
      XXH3_128bits_update(state, target.data(), target.size());
    } else if (fs::is_regular_file(st)) {
      std::vector<std::byte> bytes = ReadAll(p.string());
      XXH3_128bits_update(state, "F", 1);
      XXH3_128bits_update(state, bytes.data(), bytes.size());
    } else {
      XXH3_128bits_update(state, "D", 1);
    }
  }
  std::string out = Hex128(XXH3_128bits_digest(state));
  XXH3_freeState(state);
  return out;
}

std::vector<std::string> ListTree(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) out.push_back(fs::relative(it->path(), dir, ec).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string TreeDiff(const std::string& dir, const std::string& before) {
  std::vector<std::string> now = ListTree(dir), then = ListTree(before);
  std::string diff;
  for (const auto& f : then) {
    if (f.ends_with(".lock")) continue;
    if (!std::binary_search(now.begin(), now.end(), f)) diff += "gone: " + f + "; ";
    else if (FileDigest(dir + "/" + f) != FileDigest(before + "/" + f)) diff += "changed: " + f + "; ";
  }
  for (const auto& f : now) {
    if (!f.ends_with(".lock") && !std::binary_search(then.begin(), then.end(), f)) diff += "new: " + f + "; ";
  }
  return diff;
}

std::vector<std::string> Temporaries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (IsTempName(name) || (name.starts_with(".") && name.ends_with(".merge-new"))) {
      out.push_back(fs::relative(it->path(), dir, ec).string());
    }
  }
  return out;
}

void CheckNoTemporaries(const std::string& dir, Findings& f, const std::string& when,
                        const std::set<std::string>& undeletable) {
  for (const auto& t : Temporaries(dir)) {
    if (undeletable.count(dir + "/" + t)) continue;
    // A committed merge's staged files wait for its journal (the next job
    // completes it): work pending, not a leftover.
    std::error_code ec;
    if (t.ends_with(".merge-new") &&
        fs::exists(fs::path(dir + "/" + t).parent_path() / ".merge-journal.json", ec)) {
      continue;
    }
    f.Add(Finding::kLeftover, when + ": temporary left: " + t);
  }
}

Result<std::vector<std::byte>> ReadImage(const std::string& path, bool allow_any_path) {
  formats::OpenOptions o;
  o.allow_any_path = allow_any_path;
  BARGE_ASSIGN_OR_RETURN(auto image, pipeline::OpenImageFile(PosixEnv(), path, o));
  std::vector<std::byte> out(image->size_bytes());
  BARGE_RETURN_IF_ERROR(image->ReadAt(0, out));
  return out;
}

// ---- oracles ----

Oracles& GetOracles() {
  static Oracles oracles;
  return oracles;
}

std::string Oracles::CheckQcow2(const std::string& path, bool leaks_ok) {
  std::string key = FileDigest(path) + (leaks_ok ? "+leaks" : "");
  if (auto it = qcow2_.find(key); it != qcow2_.end()) return it->second;
  std::string problem;
  {
    FileOptions o;
    o.use_uring = false;
    auto src = PosixEnv().OpenSource(path, o);
    if (!src.ok()) {
      problem = "open: " + src.error().ToString();
    } else {
      auto report = formats::qcow2::CheckQcow2(**src);
      if (!report.ok()) {
        problem = "barge check: " + report.error().ToString();
      } else if (report->corruptions > 0 || (!leaks_ok && report->leaks > 0)) {
        problem = "barge check: " + std::to_string(report->corruptions) + " corruptions, " +
                  std::to_string(report->leaks) + " leaks";
        if (!report->messages.empty()) problem += " (" + report->messages.front() + ")";
      }
    }
  }
  if (problem.empty()) {
    ++qemu_checks_;
    std::string spec = "json:{\"driver\":\"qcow2\",\"backing\":null,\"file\":{\"driver\":\"file\",\"filename\":\"" +
                       path + "\"}}";
    testing::CommandResult r = testing::Run("qemu-img check -U " + testing::ShellQuote(spec));
    bool ok = r.exit_code == 0 || (leaks_ok && r.exit_code == 3);
    if (!ok) problem = "qemu-img check exit " + std::to_string(r.exit_code) + ": " + r.output.substr(0, 300);
  }
  qcow2_[key] = problem;
  return problem;
}

// ---- chain checks ----

std::vector<std::string> ChainIds(const std::string& dir) {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name[0] != '.' && e.path().extension() == ".json") ids.push_back(e.path().stem().string());
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

namespace {

// Verifies and restores point `id` of the chain copied to `copy`.
std::string VerifyAndRestore(Workspace& ws, const std::string& copy, const std::string& id,
                             const std::string& golden) {
  pipeline::VerifyRequest v;
  v.path = copy;
  v.at = id;
  v.copy.threads = 2;
  auto verified = pipeline::RunVerify(PosixEnv(), v);
  if (!verified.ok()) return "verify " + id + ": " + verified.error().ToString();
  if (!verified->ok()) return "verify " + id + ": " + verified->failure->ToString();
  pipeline::RestoreRequest r;
  r.chain_dir = copy;
  r.at = id;
  r.destination = ws.scratch("restored-" + id + ".raw");
  r.sync = false;
  r.force = true;
  r.copy.threads = 2;
  auto restored = pipeline::RunRestore(PosixEnv(), r);
  if (!restored.ok()) return "restore " + id + ": " + restored.error().ToString();
  std::string diff = CompareBytes(ReadAll(r.destination), ReadAll(golden));
  RemoveTree(r.destination);
  if (!diff.empty()) return "restore " + id + ": " + diff + " from the expected contents";
  return "";
}

}  // namespace

void CheckChainFolder(Workspace& ws, const std::string& dir, const ChainExpectation& expect, Findings& f) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    for (const auto& id : expect.required) f.Add(Finding::kLost, "chain folder gone; point " + id + " lost");
    return;
  }
  std::string key = "chain:" + TreeDigest(dir) + ":" + expect.new_golden;
  std::vector<std::string> ids = ChainIds(dir);
  std::map<std::string, formats::BackupManifest> manifests;
  // Every file under a final name: manifests parse, digest tables load,
  // images check.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name[0] == '.') continue;
    std::string ext = e.path().extension().string();
    if (ext == ".json") {
      auto text = pipeline::ReadSmallFile(PosixEnv(), e.path().string());
      auto m = text.ok() ? formats::DecodeManifest(*text) : Result<formats::BackupManifest>(text.error());
      if (!m.ok()) f.Add(Finding::kDamaged, "manifest " + name + ": " + m.error().ToString());
      else manifests[e.path().stem().string()] = *m;
    } else if (ext == ".digests") {
      auto t = pipeline::LoadDigestTable(PosixEnv(), e.path().string());
      if (!t.ok()) f.Add(Finding::kDamaged, "digest table " + name + ": " + t.error().ToString());
    } else if (ext == ".sha256") {
      auto text = pipeline::ReadSmallFile(PosixEnv(), e.path().string(), 1ull << 30);
      auto t = text.ok() ? formats::DecodeStrongDigestTable(std::as_bytes(std::span(text->data(), text->size())))
                         : Result<formats::StrongDigestTable>(text.error());
      if (!t.ok()) f.Add(Finding::kDamaged, "strong digest table " + name + ": " + t.error().ToString());
    } else if (ext == ".qcow2") {
      std::string problem = GetOracles().CheckQcow2(e.path().string());
      if (!problem.empty()) f.Add(Finding::kDamaged, "image " + name + ": " + problem);
    }
  }
  for (const auto& id : expect.required) {
    if (!manifests.count(id)) {
      bool folded = expect.may_vanish.count(id) > 0;
      if (folded && manifests.count(expect.merge_through) &&
          manifests[expect.merge_through].type == formats::BackupType::kFull) {
        continue;  // folded by a merge that committed
      }
      // A merge journal may still have to complete: judged on the copy below.
      if (!folded) f.Add(Finding::kLost, "point " + id + " is gone");
    }
  }
  if (GetOracles().Passed(key)) return;
  // Every point present verifies and restores, on a copy (loading the
  // folder completes a merge journal: that is the recovery step's job).
  std::string copy = ws.scratch("chain");
  RemoveTree(copy);
  CopyTree(dir, copy);
  std::vector<std::string> copy_ids = ChainIds(copy);
  {
    // Load once: completes a journal on the copy.
    auto loaded = pipeline::LoadChainFolder(PosixEnv(), copy);
    if (!loaded.ok()) {
      f.Add(Finding::kDamaged, "chain folder does not load: " + loaded.error().ToString());
      RemoveTree(copy);
      return;
    }
    copy_ids.clear();
    for (const auto& p : loaded->points) copy_ids.push_back(p.manifest.id);
  }
  std::set<std::string> present(copy_ids.begin(), copy_ids.end());
  for (const auto& id : expect.required) {
    if (present.count(id)) continue;
    if (expect.may_vanish.count(id)) {
      auto through = std::find(copy_ids.begin(), copy_ids.end(), expect.merge_through);
      if (through != copy_ids.end()) continue;  // judged by the through point's restore below
    }
    f.Add(Finding::kLost, "point " + id + " is gone (after loading the folder)");
  }
  size_t before = f.items().size();
  for (const auto& id : copy_ids) {
    auto g = expect.golden.find(id);
    std::string golden = g != expect.golden.end() ? g->second : expect.new_golden;
    if (golden.empty()) {
      f.Add(Finding::kDamaged, "unexpected point " + id);
      continue;
    }
    std::string problem = VerifyAndRestore(ws, copy, id, golden);
    if (!problem.empty()) {
      f.Add(g != expect.golden.end() ? Finding::kLost : Finding::kDamaged, problem);
    }
  }
  RemoveTree(copy);
  if (f.items().size() == before && f.empty()) GetOracles().MarkPassed(key);
}

void CheckOutputFile(const std::string& path, const std::string& golden, bool qcow2, bool must_exist,
                     Finding kind, Findings& f) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (must_exist) f.Add(kind, "output " + path + " missing");
    return;
  }
  std::vector<std::byte> want = ReadAll(golden);
  if (!qcow2) {
    std::string diff = CompareBytes(ReadAll(path), want);
    if (!diff.empty()) f.Add(kind, "output " + path + ": " + diff);
    return;
  }
  std::string problem = GetOracles().CheckQcow2(path);
  if (!problem.empty()) {
    f.Add(Finding::kDamaged, "output " + path + ": " + problem);
    return;
  }
  auto guest = ReadImage(path);
  if (!guest.ok()) {
    f.Add(Finding::kDamaged, "output " + path + ": " + guest.error().ToString());
    return;
  }
  std::string diff = CompareBytes(*guest, want);
  if (!diff.empty()) f.Add(kind, "output " + path + ": guest view " + diff);
}

// ---- figures ----

namespace {

std::mutex g_figures_mu;
std::vector<Figure> g_figures;  // guarded by g_figures_mu

}  // namespace

std::string SummaryTable() {
  std::lock_guard lock(g_figures_mu);
  // command -> campaign -> (tried, lost or damaged, other)
  std::map<std::string, std::map<std::string, std::array<uint64_t, 3>>> sum;
  std::vector<std::string> order;
  for (const Figure& f : g_figures) {
    if (!sum.count(f.command)) order.push_back(f.command);
    auto& cell = sum[f.command][f.campaign];
    cell[0] += f.tried;
    cell[1] += f.lost_or_damaged;
    cell[2] += f.other;
  }
  const char* campaigns[] = {"power-loss", "errors", "kill", "full-fs", "concurrency"};
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %14s %14s %10s %10s %12s %10s\n", "command", "crash points",
                "errors inj.", "kills", "full fs", "concurrent", "lost/dmg");
  out << line;
  std::array<uint64_t, 5> total_tried{};
  uint64_t total_lost = 0, total_other = 0;
  for (const auto& cmd : order) {
    std::array<uint64_t, 5> tried{};
    uint64_t lost = 0, other = 0;
    for (size_t k = 0; k < 5; ++k) {
      auto it = sum[cmd].find(campaigns[k]);
      if (it == sum[cmd].end()) continue;
      tried[k] = it->second[0];
      lost += it->second[1];
      other += it->second[2];
      total_tried[k] += tried[k];
    }
    total_lost += lost;
    total_other += other;
    auto cell = [&](size_t k) { return sum[cmd].count(campaigns[k]) ? std::to_string(tried[k]) : std::string("-"); };
    std::snprintf(line, sizeof line, "%-20s %14s %14s %10s %10s %12s %10s\n", cmd.c_str(), cell(0).c_str(),
                  cell(1).c_str(), cell(2).c_str(), cell(3).c_str(), cell(4).c_str(),
                  (std::to_string(lost) + (other ? " (+" + std::to_string(other) + ")" : "")).c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "%-20s %14llu %14llu %10llu %10llu %12llu %10s\n", "total",
                static_cast<unsigned long long>(total_tried[0]), static_cast<unsigned long long>(total_tried[1]),
                static_cast<unsigned long long>(total_tried[2]), static_cast<unsigned long long>(total_tried[3]),
                static_cast<unsigned long long>(total_tried[4]),
                (std::to_string(total_lost) + (total_other ? " (+" + std::to_string(total_other) + ")" : "")).c_str());
  out << line;
  out << "(lost/dmg: runs that lost or damaged anything or did not recover; (+N): leftovers or unclear errors)\n";
  return out.str();
}

void Report(const Figure& fig) {
  {
    std::lock_guard lock(g_figures_mu);
    g_figures.push_back(fig);
  }
  nlohmann::json j = {{"campaign", fig.campaign},
                      {"command", fig.command},
                      {"level", GetSizing().level},
                      {"seed", GetSizing().seed},
                      {"tried", fig.tried},
                      {"lost_or_damaged", fig.lost_or_damaged},
                      {"other", fig.other},
                      {"not_reached", fig.not_reached},
                      {"seconds", fig.seconds},
                      {"failures", fig.failures}};
  if (!fig.extra.is_null()) j["extra"] = fig.extra;
  std::printf("[ figure   ] %s\n", j.dump().c_str());
  std::fflush(stdout);
  if (const char* path = std::getenv("BARGE_RELIABILITY_REPORT"); path != nullptr && *path) {
    static std::mutex mu;
    std::lock_guard lock(mu);
    std::ofstream out(path, std::ios::app);
    out << j.dump() << "\n";
  }
}

// ---- the recovery's Env ----

ProcessGoneEnv::ProcessGoneEnv(Env& target)
    : EnvWrapper(target), self_stat_("/proc/" + std::to_string(::getpid()) + "/stat") {}

Result<std::unique_ptr<BlockSource>> ProcessGoneEnv::OpenSource(const std::string& path,
                                                                const FileOptions& options) {
  if (path == self_stat_) return Error::FromErrno(ENOENT, "open", path);
  return EnvWrapper::OpenSource(path, options);
}

}  // namespace barge::reliability
