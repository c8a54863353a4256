// "Did you mean ...": the likely intended word of a typo, among the names
// that exist (commands, options, a policy's sources).
#pragma once

#include <string>
#include <vector>

namespace barge::orchestrate {

// The closest of `candidates` to `word` by edit distance (Levenshtein), if
// close enough to be a likely typo: at most 2 edits, and fewer than `word`
// has letters. Empty otherwise; the first of equally close candidates.
std::string ClosestMatch(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace barge::orchestrate
