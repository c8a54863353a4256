// barge completion bash and barge man, generated from the CLI definitions:
// the script loads in bash and completes commands, subcommands, options and
// option choices; the manual page renders through man/groff without
// warnings and names every command, the exit codes and the environment.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

using testing::Barge;
using testing::Q;
using testing::RunOk;
using testing::Sh;
using testing::TempDir;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

class CompletionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("bash");
    script_ = dir_ / "barge.bash";
    RunOk(Barge() + " completion bash > " + Q(script_));
    RunOk("bash -n " + Q(script_));
  }
  // What bash would offer for `words` (the last one is the word under the
  // cursor; "" for a fresh word), as readline splits them.
  std::set<std::string> Complete(const std::vector<std::string>& words) {
    std::string array;
    for (const auto& w : words) array += " " + Q(w);
    const std::string program = "source " + Q(script_) + " && COMP_WORDS=(" + array +
                                ") && COMP_CWORD=" + std::to_string(words.size() - 1) +
                                " && _barge && printf '%s\\n' \"${COMPREPLY[@]}\"";
    auto lines = Lines(RunOk("bash -c " + Q(program)));
    return std::set<std::string>(lines.begin(), lines.end());
  }
  TempDir dir_;
  std::string script_;
};

using Words = std::set<std::string>;

TEST_F(CompletionTest, CommandsSubcommandsOptionsAndChoices) {
  EXPECT_EQ(Complete({"barge", "res"}), (Words{"restore"}));
  EXPECT_EQ(Complete({"barge", "li"}), (Words{"list"}));
  EXPECT_EQ(Complete({"barge", "bitmap", "c"}), (Words{"clear"}));
  EXPECT_EQ(Complete({"barge", "bitmap", ""}),
            (Words{"add", "clear", "disable", "dump", "enable", "list", "remove"}));
  EXPECT_EQ(Complete({"barge", "catalog", ""}), (Words{"list", "rebuild"}));
  EXPECT_EQ(Complete({"barge", "completion", ""}), (Words{"bash"}));
  Words top = Complete({"barge", ""});
  for (const char* c : {"backup", "restore", "verify", "merge", "list", "info", "map", "bitmap", "catalog", "man",
                        "completion", "vm", "image"}) {
    EXPECT_TRUE(top.count(c)) << c;
  }
  // Options of the command reached, after positionals and option values.
  EXPECT_EQ(Complete({"barge", "restore", "--a"}), (Words{"--at"}));
  Words restore = Complete({"barge", "restore", "bk/vda", "--at", "3", "--to", "out.raw", "-"});
  for (const char* o : {"--force", "--json", "--no-sync", "-O", "--output-format"}) EXPECT_TRUE(restore.count(o)) << o;
  EXPECT_EQ(Complete({"barge", "bitmap", "add", "disk.qcow2", "x", "--dis"}), (Words{"--disable", "--disabled"}));
  // An option's value: its choices, however bash split the word.
  EXPECT_EQ(Complete({"barge", "restore", "bk", "-O", ""}), (Words{"qcow2", "raw"}));
  EXPECT_EQ(Complete({"barge", "restore", "bk", "--output-format", "q"}), (Words{"qcow2"}));
  EXPECT_EQ(Complete({"barge", "restore", "bk", "--output-format", "=", "q"}), (Words{"qcow2"}));
  EXPECT_EQ(Complete({"barge", "restore", "bk", "--output-format", "="}), (Words{"qcow2", "raw"}));
  EXPECT_EQ(Complete({"barge", "info", "-f", ""}), (Words{"qcow2", "raw"}));
  // A value that is a value, not a subcommand: `--at list` stays in restore.
  EXPECT_EQ(Complete({"barge", "restore", "--at", "list", "-O", ""}), (Words{"qcow2", "raw"}));
  // Free values and positionals: nothing offered, so bash completes file names.
  EXPECT_TRUE(Complete({"barge", "restore", "--to", ""}).empty());
  EXPECT_TRUE(Complete({"barge", "list", ""}).empty());
}

TEST_F(CompletionTest, InstallsForBargeWhenSourced) {
  std::string out = RunOk("bash -c " + Q("source <(" + Barge() + " completion bash) && complete -p barge"));
  EXPECT_NE(out.find("-F _barge"), std::string::npos) << out;
  auto j = nlohmann::json::parse(Lines(RunOk(Barge() + " completion bash --json")).back());
  EXPECT_EQ(j["event"], "result");
  EXPECT_EQ(j["shell"], "bash");
  EXPECT_NE(j["script"].get<std::string>().find("complete -o default"), std::string::npos);
}

class ManPageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    page_ = dir_ / "barge.1";
    RunOk(Barge() + " man > " + Q(page_));
  }
  TempDir dir_;
  std::string page_;
};

TEST_F(ManPageTest, RendersWithoutWarnings) {
  BARGE_REQUIRE_TOOL("groff");
  // Every warning groff knows, on stderr; the page must produce none.
  auto groff = Sh("groff -man -Tutf8 -ww -z " + Q(page_) + " 2>&1");
  EXPECT_EQ(groff.exit_code, 0) << groff.output;
  EXPECT_EQ(groff.output, "");
  BARGE_REQUIRE_TOOL("man");
  auto man = Sh("MANWIDTH=80 man --warnings -E UTF-8 -l " + Q(page_) + " 2>&1 >/dev/null");
  EXPECT_EQ(man.exit_code, 0) << man.output;
  EXPECT_EQ(man.output, "");
}

TEST_F(ManPageTest, NamesEveryCommandExitCodeAndVariable) {
  BARGE_REQUIRE_TOOL("man");
  const std::string text = RunOk("MANWIDTH=200 man -P cat -E UTF-8 -l " + Q(page_));
  for (const char* section : {"NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "EXIT STATUS", "ENVIRONMENT",
                              "FILES", "SEE ALSO"}) {
    EXPECT_NE(text.find("\n" + std::string(section) + "\n"), std::string::npos) << section;
  }
  // Every command the parser knows (from the completion script's table of
  // subcommands) has its section with a synopsis line "barge PATH ...".
  const std::string script = RunOk(Barge() + " completion bash");
  const size_t begin = script.find("_barge_commands() {"), end = script.find("_barge_options() {");
  ASSERT_LT(begin, end);
  std::map<std::string, std::vector<std::string>> subcommands;  // "bitmap" -> {"list", "dump", ...}
  for (const auto& line : Lines(script.substr(begin, end - begin))) {
    const size_t q1 = line.find('"'), q2 = line.find('"', q1 + 1), r = line.find("REPLY=\"");
    if (q1 == std::string::npos || r == std::string::npos || line.find("*)") != std::string::npos) continue;
    std::istringstream words(line.substr(r + 7, line.rfind('"') - r - 7));
    for (std::string w; words >> w;) subcommands[line.substr(q1 + 1, q2 - q1 - 1)].push_back(w);
  }
  std::set<std::string> leaves;
  for (const auto& [group, subs] : subcommands) {
    for (const auto& sub : subs) {
      const std::string path = group.empty() ? sub : group + " " + sub;
      if (!subcommands.count(path)) leaves.insert(path);
    }
  }
  EXPECT_GT(leaves.size(), 30u);
  for (const auto& path : leaves) {
    EXPECT_NE(text.find("barge " + path + " "), std::string::npos) << path;
  }
  for (const char* want : {"barge list CHAIN", "barge bench [options]", "barge bench generate", "barge bitmap clear IMAGE NAME...", "--granularity GRANULARITY",
                           "--output-format raw|qcow2", "(default: latest)", "(required)", "--json"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want;
  }
  for (const char* code : {"0 ", "1 ", "2 ", "3 ", "4 ", "64 ", "70 ", "130 "}) {
    EXPECT_NE(text.find("\n       " + std::string(code)), std::string::npos) << code;
  }
  EXPECT_NE(text.find("interrupted (SIGINT)"), std::string::npos);
  for (const char* var : {"BARGE_CATALOG", "BARGE_NO_URING", "BARGE_LIBVIRT_URI", "XDG_STATE_HOME"}) {
    EXPECT_NE(text.find("\n       " + std::string(var) + "\n"), std::string::npos) << var;
  }
  auto j = nlohmann::json::parse(Lines(RunOk(Barge() + " man --json")).back());
  EXPECT_EQ(j["format"], "troff");
  EXPECT_EQ(j["page"].get<std::string>().substr(0, 3), ".\\\"");
}

}  // namespace
}  // namespace barge
