// Builds the barge command line and dispatches subcommands.
#include "cli/commands.h"

#include <CLI/CLI.hpp>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string_view>
#include <vector>

#include "blockio/file.h"
#include "cli/bucket_routing.h"
#include "cli/common.h"
#include "cli/interrupt.h"
#include "cli/output.h"

namespace barge::cli {

namespace {

// The deepest subcommand the parse reached (the app itself if none).
CLI::App* DeepestParsed(CLI::App& app) {
  CLI::App* at = &app;
  for (;;) {
    auto subs = at->get_subcommands();
    if (subs.empty()) return at;
    at = subs.front();
  }
}

std::string CommandPath(const CLI::App* app) {
  std::string name;
  for (const CLI::App* p = app; p != nullptr && p->get_parent() != nullptr; p = p->get_parent()) {
    name = name.empty() ? p->get_name() : p->get_name() + " " + name;
  }
  return name;
}

// "did you mean" for the words CLI11 did not expect (an unknown option or
// subcommand of the deepest command reached), or for the first plain word
// after that command when it wants a subcommand and got none.
// The first word after `at`'s command path on the command line ("" when
// none): the would-be subcommand of a group.
std::string WordAfterPath(const CLI::App* at, int argc, char** argv) {
  std::vector<std::string> path;
  for (const CLI::App* p = at; p != nullptr && p->get_parent() != nullptr; p = p->get_parent()) {
    path.insert(path.begin(), p->get_name());
  }
  size_t matched = 0;
  for (int i = 1; i < argc; ++i) {
    std::string w = argv[i];
    if (w == "--") break;
    if (w.starts_with("-")) continue;
    if (matched < path.size() && w == path[matched]) {
      ++matched;
      continue;
    }
    if (matched == path.size()) return w;
  }
  return "";
}

std::string Suggestion(const CLI::ParseError& e, CLI::App* at, int argc, char** argv) {
  // A group whose subcommand is mistyped: that is the cause, whatever
  // options follow ("barge snapshot craete IMG --name x").
  if (!at->get_subcommands({}).empty()) {
    const std::string word = WordAfterPath(at, argc, argv);
    std::vector<std::string> names;
    for (const CLI::App* s : at->get_subcommands({})) names.push_back(s->get_name());
    if (!word.empty() && std::find(names.begin(), names.end(), word) == names.end()) {
      std::string match = ClosestMatch(word, names);
      return "!unknown command '" + word + "'" + (match.empty() ? "" : "; did you mean '" + match + "'?");
    }
  }
  // An option the command does not have wins: CLI11 reports a missing
  // required option first, though the typo is the cause ("--sorce").
  // --json is every command's (a group's too, for the error's shape), so
  // it is never the typo ("barge infoo --json x": the command is).
  std::vector<std::string> known = {"--help", "-h", "--json"};
  for (const CLI::Option* o : at->get_options()) {
    for (const auto& l : o->get_lnames()) known.push_back("--" + l);
    for (const auto& sn : o->get_snames()) known.push_back("-" + sn);
  }
  for (int i = 1; i < argc; ++i) {
    std::string w = argv[i];
    if (w == "--") break;
    if (!w.starts_with("--")) continue;
    std::string bare = w.substr(0, w.find('='));
    if (std::find(known.begin(), known.end(), bare) != known.end()) continue;
    std::string match = ClosestMatch(bare, known);
    return "!unknown option " + bare + (match.empty() ? "" : "; did you mean " + match + "?");
  }
  std::vector<std::string> unexpected;
  std::string what = e.what();
  if (auto colon = what.find(": "); colon != std::string::npos && dynamic_cast<const CLI::ExtrasError*>(&e)) {
    std::istringstream words(what.substr(colon + 2));
    for (std::string w; words >> w;) unexpected.push_back(w);
  } else if (!at->get_subcommands({}).empty()) {
    // The word after the command path is the would-be subcommand.
    if (std::string w = WordAfterPath(at, argc, argv); !w.empty()) unexpected.push_back(w);
  }
  // An unknown option first: the words after it may be its value
  // ("replicate X --to Y -O raw").
  std::stable_partition(unexpected.begin(), unexpected.end(), [](const std::string& w) { return w.starts_with("-"); });
  for (const std::string& word : unexpected) {
    std::vector<std::string> candidates;
    if (word.starts_with("-")) {
      for (const CLI::Option* o : at->get_options()) {
        for (const auto& l : o->get_lnames()) candidates.push_back("--" + l);
        for (const auto& s : o->get_snames()) candidates.push_back("-" + s);
      }
      std::string bare = word.substr(0, word.find('='));
      std::string match = ClosestMatch(bare, candidates);
      return "!unknown option " + bare + (match.empty() ? "" : "; did you mean " + match + "?");
    } else if (at->get_subcommands({}).empty()) {
      // A command without subcommands got one word more than its
      // positionals take ("snapshot rename IMG a b c").
      return "!unexpected extra argument '" + word + "'";
    } else {
      for (const CLI::App* s : at->get_subcommands({})) candidates.push_back(s->get_name());
      std::string match = ClosestMatch(word, candidates);
      if (!match.empty()) return "!unknown command '" + word + "'; did you mean '" + match + "'?";
      return "!unknown command '" + word + "'";
    }
  }
  return "";
}

// Whether stdout is a pipe or socket whose reader has gone (`| head`).
bool StdoutReaderGone() {
  pollfd p{.fd = STDOUT_FILENO, .events = POLLOUT, .revents = 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0;
}

// A run whose answer could not be written to stdout (a full disk, a
// closed file) has not answered: exit 1 with the reason on stderr, unless
// it failed already. A reader that stopped reading (`barge list | head`)
// ends barge as it would have without barge ignoring SIGPIPE (cli/main.cc
// ignores it for its sockets): by SIGPIPE, with no message.
int CheckStdoutWritten(int exit_code) {
  std::cout.flush();
  const bool failed = std::cout.fail() || std::fflush(stdout) != 0 || std::ferror(stdout) != 0;
  if (!failed) return exit_code;
  const int err = errno;
  if (StdoutReaderGone()) {
    std::cerr.flush();
    ::signal(SIGPIPE, SIG_DFL);
    ::raise(SIGPIPE);
  }
  if (exit_code != kExitOk) return exit_code;  // its own error said it once (files get -)
  std::cerr << "barge: IoError: <stdout>: the output could not be written"
            << (err != 0 ? std::string(" (") + std::strerror(err) + ")" : std::string()) << "\n";
  return exit_code == kExitOk ? kExitError : exit_code;
}

}  // namespace

// cli/export_command.cc and cli/files_command.cc (declared here rather than
// in common.h, which most commands include).
void RegisterExportCommand(CLI::App& app, int& exit_code);
void RegisterFilesCommands(CLI::App& app, int& exit_code);
void RegisterReportCommand(CLI::App& app, int& exit_code);
void RegisterSyncCommand(CLI::App& app, int& exit_code);  // cli/sync_command.cc

int Main(int argc, char** argv) {
  InstallInterruptHandling();
  // User configuration (barge man, ENVIRONMENT). The I/O layers read no
  // environment; orchestrate reads only BARGE_CATALOG and
  // BARGE_LIBVIRT_URI, user settings too (never a test seam).
  if (const char* no_uring = std::getenv("BARGE_NO_URING"); no_uring != nullptr && std::strcmp(no_uring, "1") == 0) {
    SetUringAllowed(false);
  }
  CLI::App app{"barge: fast, verified block data for VM disks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("barge ") + kBargeVersion);
  int exit_code = kExitOk;
  RegisterImageCommands(app, exit_code);
  RegisterConvertCommand(app, exit_code);
  RegisterBitmapCommands(app, exit_code);
  RegisterBackupCommand(app, exit_code);
  RegisterRestoreCommands(app, exit_code);
  RegisterVmCommands(app, exit_code);
  RegisterBenchCommand(app, exit_code);
  RegisterMergeCommand(app, exit_code);
  RegisterReplicateCommand(app, exit_code);
  RegisterStateCommands(app, exit_code);
  RegisterImageCatalogCommands(app, exit_code);
  RegisterSnapshotCommands(app, exit_code);
  RegisterPolicyCommands(app, exit_code);
  RegisterServeCommand(app, exit_code);
  RegisterReportCommand(app, exit_code);  // cli/report_command.cc
  RegisterExportCommand(app, exit_code);
  RegisterFilesCommands(app, exit_code);
  RegisterSyncCommand(app, exit_code);
  RegisterBitmapEditCommands(app, exit_code);
  RegisterListCommands(app, exit_code);
  RegisterDocCommands(app, exit_code);
  // The exit codes and the environment once, in `barge --help` (and the
  // man page): set after the commands, which would otherwise each inherit
  // them as their footer.
  app.footer(ExitCodeTable() + "\n" + EnvironmentTable());
  // `barge --json list X` means `barge list X --json`: --json belongs to
  // every command, so one given before the command moves after it.
  std::vector<char*> args(argv, argv + argc);
  {
    size_t first_word = 1;
    while (first_word < args.size() && std::string_view(args[first_word]).starts_with("-")) ++first_word;
    auto moved = std::stable_partition(args.begin() + 1, args.begin() + static_cast<long>(first_word),
                                       [](const char* w) { return std::string_view(w) != "--json"; });
    if (moved != args.begin() + static_cast<long>(first_word)) {
      std::rotate(moved, args.begin() + static_cast<long>(first_word), args.end());
    }
  }
  argv = args.data();
  // s3:// chain folders: their paths go to a BucketEnv, every other to the POSIX Env.
  std::unique_ptr<ScopedDefaultEnv> routing = InstallBucketRouting(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return CheckStdoutWritten(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return CheckStdoutWritten(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return CheckStdoutWritten(app.exit(e));
  } catch (const CLI::ParseError& e) {
    CLI::App* at = DeepestParsed(app);
    std::string path = CommandPath(at);
    bool json = false;
    for (int i = 1; i < argc; ++i) json |= std::string_view(argv[i]) == "--json";
    std::string message = e.what();
    // A hint starting with '!' replaces CLI11's message ("A subcommand is
    // required" says less than "unknown command 'restor'").
    if (std::string hint = Suggestion(e, at, argc, argv); hint.starts_with("!")) message = hint.substr(1);
    else if (!hint.empty()) message += "; " + hint;
    message += " (see: barge " + (path.empty() ? "" : path + " ") + "--help)";
    Output out(path.empty() ? "barge" : path, json);
    // `barge` alone: the command list first, then why it is not enough.
    if (argc == 1) std::cerr << app.help();
    return CheckStdoutWritten(out.Usage(message));
  }
  return CheckStdoutWritten(exit_code);
}

}  // namespace barge::cli
