#include "orchestrate/policy/policy_problems.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "blockio/nbd.h"

namespace barge::orchestrate {

std::vector<PolicyProblem> PolicyProblems(const std::string& file, const std::string& text) {
  std::vector<PolicyProblem> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    start = end == std::string::npos ? text.size() + 1 : end + 1;
    if (line.empty()) continue;
    PolicyProblem p;
    line = RedactUrisIn(line);
    p.message = line;
    if (line.starts_with(file + ":")) {
      std::string rest = line.substr(file.size() + 1);
      int l = 0, c = 0, used = 0;
      if (std::sscanf(rest.c_str(), "%d:%d: %n", &l, &c, &used) == 2 && used > 0) {
        p.line = l;
        p.column = c;
        p.message = rest.substr(static_cast<size_t>(used));
      } else if (rest.starts_with(" ")) {
        p.message = rest.substr(1);
      }
    }
    out.push_back(std::move(p));
  }
  std::stable_sort(out.begin(), out.end(), [](const PolicyProblem& x, const PolicyProblem& y) {
    return std::pair(x.line, x.column) < std::pair(y.line, y.column);
  });
  return out;
}

}  // namespace barge::orchestrate
