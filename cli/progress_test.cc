// The progress bar redraws its line with "\r": a shorter line must blank
// what the longer one before it drew (issue 18: "ETA 10 s s").
#include "cli/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace barge::cli {
namespace {

// What a terminal shows after `drawn`: each "\r" returns to the start of
// the line, later characters overwrite earlier ones, nothing is erased.
std::string Screen(const std::string& drawn) {
  std::string line;
  size_t cursor = 0;
  for (char c : drawn) {
    if (c == '\r') {
      cursor = 0;
    } else if (c == '\n') {
      break;
    } else {
      if (cursor < line.size()) line[cursor] = c;
      else line.push_back(c);
      ++cursor;
    }
  }
  return line;
}

std::string Drawn(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(static_cast<char>(c));
  return s;
}

TEST(ProgressTest, AShorterLineLeavesNothingOfTheLongerOne) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  Output out("restore", /*json=*/false);
  {
    ProgressReporter progress(out, "restore", f);
    // First: 1 byte of a huge disk (an ETA of days); then done (ETA 0 s).
    progress.Update(1, uint64_t{1} << 50);
    progress.Update(uint64_t{1} << 50, uint64_t{1} << 50);
  }
  const std::string drawn = Drawn(f);
  std::fclose(f);
  ASSERT_EQ(drawn.back(), '\n') << drawn;
  std::vector<std::string> lines;
  for (size_t at = drawn.find('\r'); at != std::string::npos;) {
    size_t next = drawn.find('\r', at + 1);
    lines.push_back(drawn.substr(at + 1, (next == std::string::npos ? drawn.size() - 1 : next) - at - 1));
    at = next;
  }
  ASSERT_EQ(lines.size(), 2u) << drawn;
  std::string last = lines[1];
  while (!last.empty() && last.back() == ' ') last.pop_back();
  ASSERT_LT(last.size(), lines[0].size()) << "the second line must be the shorter one: " << drawn;
  ASSERT_NE(last.find("ETA 0 s"), std::string::npos) << last;
  // What remains on screen is the last line alone, blanks after it.
  std::string screen = Screen(drawn);
  EXPECT_EQ(screen.substr(0, last.size()), last);
  EXPECT_EQ(screen.find_first_not_of(' ', last.size()), std::string::npos) << "[" << screen << "]";
}

}  // namespace
}  // namespace barge::cli
