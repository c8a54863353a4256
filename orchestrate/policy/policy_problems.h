// `barge policy check`'s problem list: what LoadPolicy found wrong in a
// policy file, one problem per line with its place.
#pragma once

#include <string>
#include <vector>

namespace barge::orchestrate {

struct PolicyProblem {
  int line = 0;  // 0: the whole file (a missing field)
  int column = 0;
  std::string message;
};

// Splits the message of LoadPolicy's kInvalidArgument for `file` (lines
// "FILE:LINE:COLUMN: message" or "FILE: message"; other lines are whole-
// file problems as they are) into problems, in file order with the whole
// file's first. A location quoted in a message shows no credential
// (RedactUrisIn).
std::vector<PolicyProblem> PolicyProblems(const std::string& file, const std::string& text);

}  // namespace barge::orchestrate
